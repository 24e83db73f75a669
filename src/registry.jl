# The schedules by name, how `:auto` and keyword tunables become a schedule,
# and the launchers Kernel Tuner's Julia backend calls.

"""
    SCHEDULES

The schedule names `selective_scan` accepts besides `:auto`, and their types;
a type's fields are its tunables, in `Val` order:

- `:sequential`: [`Sequential`](@ref)`(workgroupsize)`
- `:blelloch`: [`Blelloch`](@ref)`(workgroupsize)`
- `:hybrid`: [`Hybrid`](@ref)`(workgroupsize, items_per_thread)`
- `:reduce_then_scan`: [`ReduceThenScan`](@ref)`(workgroupsize, chunk)`
"""
const SCHEDULES = (
    sequential = Sequential,
    blelloch = Blelloch,
    hybrid = Hybrid,
    reduce_then_scan = ReduceThenScan,
)

"""
    schedule_name(s::ScanSchedule) -> Symbol

The name `s`'s type has in [`SCHEDULES`](@ref).
"""
function schedule_name(s::ScanSchedule)
    name = findfirst(T -> s isa T, SCHEDULES)
    name === nothing &&
        throw(ArgumentError("$(typeof(s)) is not listed in ScanWeaver.SCHEDULES"))
    return name
end

"""
    default_schedule(backend, L, lanes, P, S) -> Type{<:ScanSchedule}

The schedule `:auto` picks: [`Sequential`](@ref) on CPUs, for short sequences
and for very many lanes; [`ReduceThenScan`](@ref) for long sequences, and for
pairs so large that [`Hybrid`](@ref)'s local memory would leave less than a
warp per workgroup; `Hybrid` otherwise.
"""
function default_schedule(backend::Backend, L::Integer, lanes::Integer, P, S)
    if backend isa CPU || L <= SHORT_SEQUENCE || lanes >= MANY_LANES
        return Sequential
    end
    L >= LONG_SEQUENCE && return ReduceThenScan
    hybrid = Hybrid(DEFAULT_WORKGROUP_SIZE, DEFAULT_ITEMS_PER_THREAD)
    wg = default_workgroupsize(hybrid, backend, P, S)
    return wg < MIN_COOPERATIVE_WORKGROUP ? ReduceThenScan : Hybrid
end

"""
    make_schedule(T, backend, P, S; workgroupsize, items_per_thread, chunk) -> T

Schedule type `T` with the given tunables, the others at their defaults:
`items_per_thread` [`DEFAULT_ITEMS_PER_THREAD`](@ref), `chunk`
[`DEFAULT_CHUNK`](@ref), and `workgroupsize` [`default_workgroupsize`](@ref)
for pairs `P` and states `S` on `backend`. Tunables `T` does not have are
ignored.

# Examples
```julia
julia> ScanWeaver.make_schedule(Hybrid, CPU(), AffinePair{Float32, Float32}, Float32; items_per_thread = 8)
Hybrid(256, 8)
```
"""
function make_schedule(
    ::Type{T},
    backend,
    P,
    S;
    workgroupsize = nothing,
    items_per_thread = nothing,
    chunk = nothing,
) where {T <: ScanSchedule}
    given = (
        items_per_thread = something(items_per_thread, DEFAULT_ITEMS_PER_THREAD),
        chunk = something(chunk, DEFAULT_CHUNK),
    )
    rest = map(n -> getfield(given, n), Base.tail(fieldnames(T)))
    schedule = T(something(workgroupsize, DEFAULT_WORKGROUP_SIZE), rest...)
    workgroupsize === nothing || return schedule
    return with_workgroupsize(schedule, default_workgroupsize(schedule, backend, P, S))
end

"""
    ScheduleLauncher{T}(backend, workgroupsize)

Schedule type `T` as Kernel Tuner's Julia backend launches a kernel: built by
`entry(backend, workgroupsize)` ([`sequential_scan!`](@ref),
[`blelloch_scan!`](@ref), [`hybrid_scan!`](@ref), [`reduce_then_scan!`](@ref)),
then called with the arguments `(y, h_last, a, b, x, c, h0, reset, reversed)`
and one `Val` per tunable in the order of `T`'s fields. It bundles the operands
in a [`ScanOperands`](@ref), refuses a configuration [`config_problem`](@ref)
objects to (a `:blelloch` workgroup that is not a power of two would scan
wrongly, without an error) with an `ArgumentError`, which Kernel Tuner records
as a failed configuration, checks the arrays as `selective_scan!` does (the
kernels index with `@inbounds`), and calls [`launch!`](@ref); buffers persist in its
[`ScanWorkspace`](@ref), so Kernel Tuner's timing loop allocates nothing. The
`ndrange` keyword is accepted and ignored (each schedule sizes its launches).
"""
struct ScheduleLauncher{T <: ScanSchedule, B <: Backend}
    backend::B
    workgroupsize::Int
    workspace::ScanWorkspace
end

function ScheduleLauncher{T}(backend::B, workgroupsize) where {T <: ScanSchedule, B <:
    Backend}
    return ScheduleLauncher{T, B}(backend, Int(prod(workgroupsize)), ScanWorkspace())
end

unval(::Val{v}) where {v} = v

"""
    launch_flag(api, name, flag) -> Bool

A flag argument of a Kernel Tuner launcher as a `Bool`. Kernel Tuner's Julia
backend turns every scalar argument into a NumPy scalar, which reaches Julia
as a 0-dimensional array (`Array{Bool, 0}`), so that is accepted too;
anything else is an `ArgumentError` naming the argument.

# Examples
```julia-repl
julia> ScanWeaver.launch_flag(:demo, :reversed, fill(true))
true
```
"""
launch_flag(api, name, flag::Bool) = flag
launch_flag(api, name, flag::AbstractArray{Bool, 0}) = flag[]
function launch_flag(api, name, flag)
    throw(ArgumentError(
        "$api: $name must be a Bool (or a 0-dimensional array of one), got $(typeof(flag))",
    ))
end

function (launch::ScheduleLauncher{T})(
    y,
    h_last,
    a,
    b,
    x,
    c,
    h0,
    reset,
    reversed,
    tunables::Val...;
    ndrange = nothing,
) where {T}
    schedule = T(map(unval, tunables)...)
    if schedule.workgroupsize != launch.workgroupsize
        throw(ArgumentError(
            "$T launcher: built for workgroupsize = $(launch.workgroupsize) but called with " *
                "Val($(schedule.workgroupsize)); pass the same value to both",
        ))
    end
    api = Symbol(nameof(T), " launcher")
    flag = launch_flag(api, :reversed, reversed)
    # The kernels index with @inbounds: arrays of other sizes than `a`'s would be
    # written out of bounds (heap corruption), so they are refused here as in
    # `selective_scan!`.
    check_arguments(api, y, h_last, a, b, x, c, h0, reset)
    ops = ScanOperands(a, b, x, c, h0, reset)
    P = pair_type(ops)
    check_config(api, schedule, launch.backend, P, fieldtype(P, :U))
    launch!(schedule, launch.backend, y, h_last, ops, flag; workspace = launch.workspace)
    return nothing
end

"""
    sequential_scan!(backend, workgroupsize) -> ScheduleLauncher{Sequential}

Kernel Tuner's entry point for [`Sequential`](@ref) (see
[`ScheduleLauncher`](@ref)).

# Examples
```julia-repl
julia> a = rand(500, 2); y = similar(a);

julia> ScanWeaver.sequential_scan!(CPU(), 64)(y, nothing, a, a, a, nothing, nothing, nothing, false, Val(64));
```
"""
sequential_scan!(backend::Backend, workgroupsize) = ScheduleLauncher{Sequential}(
    backend,
    workgroupsize,
)

"""
    blelloch_scan!(backend, workgroupsize) -> ScheduleLauncher{Blelloch}

Kernel Tuner's entry point for [`Blelloch`](@ref) (see [`ScheduleLauncher`](@ref)).
"""
blelloch_scan!(backend::Backend, workgroupsize) = ScheduleLauncher{Blelloch}(
    backend,
    workgroupsize,
)

"""
    hybrid_scan!(backend, workgroupsize) -> ScheduleLauncher{Hybrid}

Kernel Tuner's entry point for [`Hybrid`](@ref) (see [`ScheduleLauncher`](@ref)).
"""
hybrid_scan!(backend::Backend, workgroupsize) = ScheduleLauncher{Hybrid}(
    backend,
    workgroupsize,
)

"""
    reduce_then_scan!(backend, workgroupsize) -> ScheduleLauncher{ReduceThenScan}

Kernel Tuner's entry point for [`ReduceThenScan`](@ref) (see
[`ScheduleLauncher`](@ref)).

# Examples
```julia-repl
julia> a = rand(5000, 2); y = similar(a);

julia> ScanWeaver.reduce_then_scan!(CPU(), 64)(y, nothing, a, a, a, nothing, nothing, nothing, false, Val(64), Val(1024));
```
"""
reduce_then_scan!(backend::Backend, workgroupsize) = ScheduleLauncher{ReduceThenScan}(
    backend,
    workgroupsize,
)
