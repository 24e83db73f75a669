# Argument checks at the API boundary: every error names the function, the
# argument, what it got and what it needs.

const FLOAT_HELP = "use Float16, BFloat16, Float32, Float64, ComplexF32, ComplexF64 or StaticArrays of these"

scalar_type(::Type{T}) where {T <: Number} = T
scalar_type(::Type{<:StaticArray{S, T}}) where {S, T} = T
scalar_type(::Type{T}) where {T} = T

is_scan_scalar(::Type{T}) where {T} = T <: AbstractFloat || T <: Complex{<:AbstractFloat}

function check_eltype(api::Symbol, name::Symbol, A)
    A === nothing && return nothing
    T = eltype(A)
    if !(is_scan_scalar(scalar_type(T)) && (T <: Number || T <: StaticArray))
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

function check_backends(api::Symbol, backend, named)
    for (name, A) in pairs(named)
        A === nothing && continue
        other = get_backend(A)
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
    end
    return nothing
end

function check_schedule(api::Symbol, schedule)
    if !(schedule === :auto || (schedule isa Symbol && haskey(SCHEDULES, schedule)))
        known = join((":auto", (":$s" for s in keys(SCHEDULES))...), ", ")
        throw(ArgumentError(
            "$api: unknown schedule $(repr(schedule)); choose one of $known",
        ))
    end
    return nothing
end

function check_config(api::Symbol, schedule::Symbol, config::NamedTuple)
    for (name, value) in pairs(config)
        if !(value isa Integer) || value < 1
            throw(ArgumentError("$api: $name = $(repr(value)) must be a positive integer"))
        end
    end
    wg = config.workgroup_size
    if wg > MAX_WORKGROUP_SIZE
        throw(ArgumentError(
            "$api: workgroupsize = $wg exceeds $MAX_WORKGROUP_SIZE, the largest GPU workgroup",
        ))
    end
    if schedule === :blelloch && !ispow2(wg)
        throw(ArgumentError(
            "$api: workgroupsize = $wg must be a power of two for schedule :blelloch",
        ))
    end
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
    for (name, A) in pairs(named)
        if !(A === nothing || A isa AbstractArray)
            throw(ArgumentError(
                "$api: $name must be an array or nothing, got $(typeof(A))",
            ))
        end
    end
    for (name, A) in pairs((; a, b, x, c, h0))
        check_eltype(api, name, A)
    end
    for (name, A) in pairs((; y, b, x, c))
        check_same_size(api, name, A, a)
    end
    check_state_size(api, :h0, h0, a)
    check_state_size(api, :h_last, h_last, a)
    check_reset(api, reset, a)
    check_backends(api, get_backend(a), named)
    return nothing
end
