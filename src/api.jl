# The user-facing scan: `selective_scan` and `selective_scan!`.

state_storage(::Type{B}, ::Type{T}) where {B <: Number, T} = T
state_storage(::Type{<:StaticVector{K}}, ::Type{T}) where {K, T} = SVector{K, T}

"""
    output_types(a, b, x, c) -> (Ty, Th)

Element types of `y` and `h_last` for these operands: the promoted storage
type of the operands (so `Float16` in gives `Float16` out, accumulated in
`Float32`), a `SVector` state for dense transitions.
"""
function output_types(a, b, x, c)
    Tx = x === nothing ? Bool : scalar_type(eltype(x))
    T = promote_type(scalar_type(eltype(a)), scalar_type(eltype(b)), Tx)
    Th = state_storage(eltype(b), T)
    Ty = c === nothing ? Th : promote_type(T, scalar_type(eltype(c)))
    return Ty, Th
end

as_matrix(::Nothing, L, lanes) = nothing
as_matrix(A::AbstractArray, L, lanes) = reshape(A, L, lanes)
as_lanes(::Nothing, lanes) = nothing
as_lanes(A::AbstractArray, lanes) = reshape(A, lanes)

"""
    selective_scan!(y, a, b, x, c = nothing; h0 = nothing, reset = nothing,
                    reverse = false, h_last = nothing, schedule = :auto,
                    workgroupsize = nothing, items_per_thread = nothing,
                    chunk = nothing, workspace = nothing) -> y

In-place [`selective_scan`](@ref): writes the outputs into `y` (the size of
`a`) and, when `h_last` is given (the lane shape `size(a)[2:end]`), the final
states into `h_last`. A [`ScanWorkspace`](@ref) passed as `workspace` keeps
`:reduce_then_scan`'s buffers from one call to the next. All arrays must live on one device; the kernels run on
`get_backend(a)` and, like any KernelAbstractions launch, may still be
running on a GPU when this returns.

# Examples
```julia-repl
julia> a = fill(0.5f0, 4, 2); b = ones(Float32, 4, 2); x = ones(Float32, 4, 2);

julia> y = similar(a); h = zeros(Float32, 2);

julia> selective_scan!(y, a, b, x; h_last = h); h
2-element Vector{Float32}:
 1.875
 1.875
```
"""
function selective_scan!(
    y,
    a,
    b,
    x,
    c = nothing;
    h0 = nothing,
    reset = nothing,
    reverse::Bool = false,
    h_last = nothing,
    schedule = :auto,
    workgroupsize = nothing,
    items_per_thread = nothing,
    chunk = nothing,
    workspace = nothing,
)
    api = :selective_scan!
    check_arguments(api, y, h_last, a, b, x, c, h0, reset)
    check_schedule(api, schedule, (; workgroupsize, items_per_thread, chunk))
    backend = array_backend(a)
    L = size(a, 1)
    lanes = prod(Base.tail(size(a)))
    if L == 0 && h_last !== nothing
        h0 === nothing ? fill!(h_last, zero(eltype(h_last))) : copyto!(h_last, h0)
    end
    (L == 0 || lanes == 0) && return y
    P = pair_type(a, b, x)
    S = fieldtype(P, :U)
    tunables = (; workgroupsize, items_per_thread, chunk)
    s = scan_schedule(schedule, tunables, backend, L, lanes, P, S)
    check_config(api, s, backend, P, S)
    ops = ScanOperands(
        as_matrix(a, L, lanes),
        as_matrix(b, L, lanes),
        as_matrix(x, L, lanes),
        as_matrix(c, L, lanes),
        as_lanes(h0, lanes),
        as_matrix(reset, L, lanes),
    )
    launch!(
        s,
        backend,
        as_matrix(y, L, lanes),
        as_lanes(h_last, lanes),
        ops,
        reverse;
        workspace = something(workspace, ScanWorkspace()),
    )
    return y
end

"""
    scan_schedule(schedule, tunables, backend, L, lanes, P, S) -> ScanSchedule

The schedule a scan of `lanes` lanes of `L` steps of pairs `P` (state `S`)
runs on `backend`: `schedule` itself when it is a [`ScanSchedule`](@ref), else
the one it names (`:auto`: [`default_schedule`](@ref)) with the `tunables`
(`workgroupsize`, `items_per_thread`, `chunk`). `check_schedule` has checked
the name and the tunables; the caller checks the result with `check_config`.
"""
function scan_schedule(schedule, tunables::NamedTuple, backend, L, lanes, P, S)
    schedule isa ScanSchedule && return schedule
    T = schedule === :auto ? default_schedule(backend, L, lanes, P, S) : SCHEDULES[schedule]
    return make_schedule(T, backend, P, S; tunables...)
end

"""
    selective_scan(a, b, x, c = nothing; h0 = nothing, reset = nothing,
                   reverse = false, return_state = false, schedule = :auto,
                   workgroupsize = nothing, items_per_thread = nothing,
                   chunk = nothing)

The selective scan `h_t = a_t * h_{t-1} + b_t * x_t`, `y_t = c_t * h_t`
(`y = h` when `c` is `nothing`) along the first dimension of arrays of size
`(L, lanes...)`: column-major, so the memory of a C-order `(..., L)` array
from Python.

- `h0`: initial states, size `size(a)[2:end]` (zeros when `nothing`).
- `reset`: `Bool`/integer flags of `a`'s size (a `BitArray` on the CPU too);
  a set flag at `t` starts a new segment (`a_t` is taken as 0).
- `reverse`: scan from `t = L` down to 1 (`h_t = a_t * h_{t+1} + b_t * x_t`).
- `return_state`: also return the final states (`h_1` for reverse scans).
- `schedule`: `:auto`, `:sequential`, `:blelloch`, `:hybrid` or
  `:reduce_then_scan` (see [`SCHEDULES`](@ref)) with its tunables as the
  keywords `workgroupsize`, `items_per_thread` and `chunk`, or a
  [`ScanSchedule`](@ref) that holds them (`Hybrid(128, 8)`). The default workgroup
  size is 256, halved while the schedule's local memory for these element
  types would exceed the device's budget (48 KiB unless the device says
  otherwise; see `ScanWeaver.local_memory_budget`).

Works on `Array`, `CuArray`, `ROCArray`, `oneArray` and `MtlArray` alike
(the kernels run on `get_backend(a)`), for `Float32`, `Float64`, `Float16`
and `BFloat16` (accumulated in `Float32`), complex numbers, and dense
transitions given as `StaticArrays` (`a` of `SMatrix{K,K}`, `b` and `c` of
`SVector{K}`, `x` scalar). Bad input throws `DimensionMismatch` or
`ArgumentError` naming the argument and its size.

# Examples
```julia-repl
julia> a = fill(0.5, 4); b = ones(4); x = ones(4);

julia> selective_scan(a, b, x)
4-element Vector{Float64}:
 1.0
 1.5
 1.75
 1.875

julia> y, h = selective_scan(a, b, x, 2 .* ones(4); return_state = true); h
0-dimensional Array{Float64, 0}:
1.875
```
"""
function selective_scan(a, b, x, c = nothing; return_state::Bool = false, kwargs...)
    if !(a isa AbstractArray) || ndims(a) < 1
        throw(ArgumentError(
            "selective_scan: a must be an array of size (L, lanes...), got $(typeof(a))",
        ))
    end
    Ty, Th = output_types(a, b, x, c)
    y = similar(a, Ty)
    h_last = return_state ? similar(a, Th, Base.tail(size(a))) : nothing
    selective_scan!(y, a, b, x, c; h_last, kwargs...)
    return return_state ? (y, h_last) : y
end

"""
    selective_scan(a, b, x, c, h0; kwargs...)

[`selective_scan`](@ref) with the initial states `h0` as the fifth positional
argument instead of a keyword: the same scan, in the form automatic
differentiation (the `ChainRulesCore.rrule`) differentiates with respect to
`h0`.

# Examples
```julia-repl
julia> selective_scan(fill(0.5, 2), ones(2), ones(2), nothing, fill(4.0))
2-element Vector{Float64}:
 3.0
 2.5
```
"""
function selective_scan(a, b, x, c, h0; kwargs...)
    if haskey(kwargs, :h0)
        throw(ArgumentError(
            "selective_scan: h0 is given both as the fifth argument and as a keyword",
        ))
    end
    return selective_scan(a, b, x, c; h0, kwargs...)
end
