# Argument checks at the API boundary: every error names the function, the
# argument, what it got and what it needs.

const FLOAT_HELP = "use Float16, BFloat16, Float32, Float64, ComplexF32, ComplexF64 or SVector/SMatrix " *
    "(StaticArrays.SArray) of these"

scalar_type(::Type{T}) where {T <: Number} = T
scalar_type(::Type{<:StaticArray{S, T}}) where {S, T} = T
scalar_type(::Type{T}) where {T} = T

is_scan_scalar(::Type{T}) where {T} = T <: AbstractFloat || T <: Complex{<:AbstractFloat}

"""
    check_eltype(api, name, A)

`A`'s elements are floating-point numbers or `SArray`s (`SVector`, `SMatrix`)
of them: immutable, so they live in device arrays and `@localmem`, and the
element types [`accumulator_type`](@ref) maps. Other `StaticArray`s
(`MMatrix`, `SizedMatrix`, ...) are refused here with an `ArgumentError`
naming `name`, not with a `MethodError` from inside the scan.
"""
function check_eltype(api::Symbol, name::Symbol, A)
    A === nothing && return nothing
    T = eltype(A)
    if !(is_scan_scalar(scalar_type(T)) && (T <: Number || T <: SArray))
        throw(ArgumentError("$api: $name has element type $T; $FLOAT_HELP"))
    end
    return nothing
end

function check_same_size(api::Symbol, name::Symbol, A, a)
    A === nothing && return nothing
    if size(A) != size(a)
        throw(DimensionMismatch(
            "$api: $name has size $(size(A)) but a has size $(size(a)); " *
                "operands share one size (L, lanes...), scanned along the first dimension",
        ))
    end
    return nothing
end

function check_state_size(api::Symbol, name::Symbol, h, a)
    h === nothing && return nothing
    lanes_shape = Base.tail(size(a))
    lanes = prod(lanes_shape)
    if size(h) != lanes_shape && !(ndims(h) == 1 && length(h) == lanes)
        throw(DimensionMismatch(
            "$api: $name has size $(size(h)); it needs the lane shape $lanes_shape " *
                "of a (size $(size(a))), or a vector of $lanes lanes",
        ))
    end
    return nothing
end

function check_reset(api::Symbol, reset, a)
    reset === nothing && return nothing
    check_same_size(api, :reset, reset, a)
    if !(eltype(reset) <: Union{Bool, Integer})
        throw(ArgumentError(
            "$api: reset has element type $(eltype(reset)); it needs Bool or integer flags",
        ))
    end
    return nothing
end

supports_float64(backend) = KernelAbstractions.supports_float64(backend)

"""
    array_backend(A) -> Backend

`get_backend(A)`, except that a `BitArray` (what `rand(L, n) .< p` gives for
reset flags) is a CPU array: KernelAbstractions has no `get_backend` for it,
and the CPU kernels read it as it is.
"""
array_backend(A) = get_backend(A)
array_backend(::BitArray) = CPU()

"""
    foreach_named(f, named::NamedTuple)

`f(name, value)` for each entry of `named`, unrolled at compile time. A `for`
loop over a `NamedTuple` of arrays of different types dispatches dynamically
on every entry: that made `check_arguments` cost about 6 us and 1.4 KB a
call, more than a small scan.
"""
@inline foreach_named(f, named::NamedTuple) = (map(f, keys(named), values(named)); nothing)

function check_backends(api::Symbol, backend, named)
    foreach_named(named) do name, A
        A === nothing && return nothing
        other = array_backend(A)
        if other != backend
            throw(ArgumentError(
                "$api: $name lives on $other but a lives on $backend; move every array to one device",
            ))
        end
        if !supports_float64(backend) &&
                scalar_type(eltype(A)) <: Union{Float64, ComplexF64}
            throw(ArgumentError(
                "$api: $name is $(eltype(A)) but $backend has no Float64; convert to Float32",
            ))
        end
        return nothing
    end
    return nothing
end

function check_schedule(api::Symbol, schedule, tunables::NamedTuple)
    if schedule isa ScanSchedule
        given = [name for (name, value) in pairs(tunables) if value !== nothing]
        isempty(given) && return nothing
        throw(ArgumentError(
            "$api: schedule = $schedule already holds its tunables; " *
                "drop the keywords $(join(given, ", ")) or pass a schedule name",
        ))
    end
    if !(schedule === :auto || (schedule isa Symbol && haskey(SCHEDULES, schedule)))
        known = join((":auto", (":$s" for s in keys(SCHEDULES))...), ", ")
        throw(ArgumentError(
            "$api: unknown schedule $(repr(schedule)); choose one of $known " *
                "or pass a ScanSchedule such as Hybrid(256, 4)",
        ))
    end
    check_tunables(api, tunables)
    return nothing
end

dense_size(::Type{<:StaticMatrix{K, K}}) where {K} = K
dense_size(::Type) = nothing
is_vector_of(::Type{<:StaticVector{N}}, K) where {N} = N == K
is_vector_of(::Type, K) = false

"""
    check_state_kinds(api, a, b, x, c, h0)

Diagonal and dense operands do not mix: scalar transitions `a` need scalar
`b`, `c`, `h0`; `K x K` `StaticMatrix` transitions need `StaticVector{K}` `b`,
`c`, `h0`; `x` is scalar either way. Throws an `ArgumentError` naming the
first operand that does not match `a`.
"""
function check_state_kinds(api::Symbol, a, b, x, c, h0)
    Ta = eltype(a)
    K = dense_size(Ta)
    if K === nothing && Ta <: StaticArray
        throw(ArgumentError(
            "$api: a has element type $Ta; dense transitions must be square K x K StaticMatrix elements",
        ))
    end
    foreach_named((; b, c, h0)) do name, A
        A === nothing && return nothing
        T = eltype(A)
        ok = K === nothing ? T <: Number : is_vector_of(T, K)
        ok && return nothing
        need = K === nothing ?
            "a scalar element type, as a has scalar transitions ($Ta)" :
            "element type StaticVector{$K} (SVector{$K}), as a has dense $K x $K transitions ($Ta)"
        throw(ArgumentError("$api: $name has element type $T; it needs $need"))
    end
    if x !== nothing && !(eltype(x) <: Number)
        throw(ArgumentError(
            "$api: x has element type $(eltype(x)); x is a scalar per element",
        ))
    end
    return nothing
end

"""
    check_tunables(api, tunables::NamedTuple)

Each tunable given as a keyword (not `nothing`) is a positive integer.
"""
function check_tunables(api::Symbol, tunables::NamedTuple)
    foreach_named(tunables) do name, value
        value === nothing && return nothing
        if !(value isa Integer) || value < 1
            throw(ArgumentError("$api: $name = $(repr(value)) must be a positive integer"))
        end
        return nothing
    end
    return nothing
end

function check_config(api::Symbol, s::ScanSchedule, backend, P, S)
    problem = config_problem(s, backend, P, S)
    problem === nothing || throw(ArgumentError("$api: $problem"))
    return nothing
end

"""
    check_arguments(api, y, h_last, a, b, x, c, h0, reset)

Checks shapes, element types and devices of a scan's arrays; throws
`DimensionMismatch` or `ArgumentError` naming the argument and its shape.
"""
function check_arguments(api::Symbol, y, h_last, a, b, x, c, h0, reset)
    if !(a isa AbstractArray) || ndims(a) < 1
        throw(ArgumentError(
            "$api: a must be an array of size (L, lanes...), got $(typeof(a))",
        ))
    end
    named = (; y, h_last, a, b, x, c, h0, reset)
    foreach_named(named) do name, A
        if !(A === nothing || A isa AbstractArray)
            throw(ArgumentError(
                "$api: $name must be an array or nothing, got $(typeof(A))",
            ))
        end
        return nothing
    end
    foreach_named((name, A) -> check_eltype(api, name, A), (; a, b, x, c, h0))
    foreach_named((name, A) -> check_same_size(api, name, A, a), (; y, b, x, c))
    check_state_size(api, :h0, h0, a)
    check_state_size(api, :h_last, h_last, a)
    check_reset(api, reset, a)
    check_state_kinds(api, a, b, x, c, h0)
    check_backends(api, array_backend(a), named)
    return nothing
end
