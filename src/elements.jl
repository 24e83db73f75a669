# Reading scan elements from the operand arrays and writing results back.
#
# Operands are matrices of size (L, lanes): time runs down the first
# (contiguous) dimension. Optional operands are `nothing` and are resolved by
# dispatch, so a kernel specialises on which ones are present.

"""
    accumulator_type(T)

The type ScanWeaver accumulates in for storage type `T`: `Float32` for
16-bit floats (`Float16`, `BFloat16`), `T` itself for wider floats; complex
and `StaticArray` element types map their components.

# Examples
```julia
julia> accumulator_type(Float16)
Float32

julia> accumulator_type(ComplexF16)
ComplexF32
```
"""
function accumulator_type(::Type{T}) where {T <: AbstractFloat}
    return sizeof(T) < sizeof(Float32) ? Float32 : T
end
function accumulator_type(::Type{Complex{T}}) where {T <: AbstractFloat}
    return Complex{accumulator_type(T)}
end
function accumulator_type(::Type{SArray{S, T, N, M}}) where {S, T, N, M}
    return SArray{S, accumulator_type(T), N, M}
end

"""
    state_type(TA, TU)

The state's accumulator type for transitions of type `TA` and offsets of type
`TU` (both accumulator types): a promoted scalar for diagonal transitions, an
`SVector` for dense `K x K` ones.
"""
state_type(::Type{TA}, ::Type{TU}) where {TA <: Number, TU <: Number} = promote_type(TA, TU)
function state_type(
    ::Type{<:StaticMatrix{K, K, TA}},
    ::Type{<:StaticVector{K, TU}},
) where {K, TA, TU}
    return SVector{K, promote_type(TA, TU)}
end

offset_type(::Type{TB}, ::Nothing) where {TB} = accumulator_type(TB)
function offset_type(::Type{TB}, x::AbstractArray) where {TB <: Number}
    return promote_type(accumulator_type(TB), accumulator_type(eltype(x)))
end
function offset_type(::Type{SVector{K, TB}}, x::AbstractArray) where {K, TB}
    return SVector{K, promote_type(accumulator_type(TB), accumulator_type(eltype(x)))}
end

"""
    pair_type(a, b, x)
    pair_type(ops::ScanOperands)

The [`AffinePair`](@ref) type of the elements read from operands `a`, `b`, `x`
(`x` may be `nothing`, meaning `U = b`).
"""
function pair_type(a, b, x)
    TA = accumulator_type(eltype(a))
    TS = state_type(TA, offset_type(eltype(b), x))
    return AffinePair{TA, TS}
end
pair_type(ops::ScanOperands) = pair_type(ops.a, ops.b, ops.x)

"The state type of the pairs of `ops`."
state_of(ops::ScanOperands) = fieldtype(pair_type(ops), :U)

@inline widen_to(::Type{S}, v) where {S} = convert(S, v)
@inline widen_acc(v) = convert(accumulator_type(typeof(v)), v)

@inline offset_value(b, ::Nothing, t, l) = widen_acc(@inbounds b[t, l])
@inline function offset_value(b, x, t, l)
    return widen_acc(@inbounds b[t, l]) * widen_acc(@inbounds x[t, l])
end

@inline is_reset(::Nothing, t, l) = false
@inline is_reset(reset, t, l) = @inbounds !iszero(reset[t, l])

"""
    load_pair(P, ops::ScanOperands, t, l) -> P

The element at time `t` of lane `l` as an `AffinePair` of type `P`:
`(a[t, l], b[t, l] * x[t, l])` in the accumulator type, with `A = 0` where
`reset[t, l]` is set.
"""
@inline function load_pair(
    ::Type{AffinePair{TA, TS}},
    ops::ScanOperands,
    t,
    l,
) where {TA, TS}
    A = widen_to(TA, @inbounds ops.a[t, l])
    A = is_reset(ops.reset, t, l) ? zero(A) : A
    U = widen_to(TS, offset_value(ops.b, ops.x, t, l))
    return AffinePair{TA, TS}(A, U)
end

"""
    initial_state(S, h0, l)

Lane `l`'s initial state in accumulator type `S`: `h0[l]`, or zero.
"""
@inline initial_state(::Type{S}, ::Nothing, l) where {S} = zero(S)
@inline initial_state(::Type{S}, h0, l) where {S} = widen_to(S, @inbounds h0[l])

"""
    project(c, h, t, l)

The output at time `t` of lane `l` for state `h`: `h` itself when `c` is
`nothing`, else [`contract`](@ref)`(c[t, l], h)`. Only the first argument is
dispatched on here (and `nothing` is the more specific method), so no pair of
methods is ambiguous; the state's kind is dispatched on in `contract`.
"""
@inline project(::Nothing, h, t, l) = h
@inline project(c, h, t, l) = contract(@inbounds(c[t, l]), h)

"""
    contract(c, h)

`c * h` for a scalar state, the dot product `sum(c .* h)` for a vector state.
"""
@inline contract(c::Number, h::Number) = c * h
@inline contract(c::StaticVector, h::StaticVector) = sum(c .* h)

"""
    store_output!(y, c, h, t, l)

Writes `y[t, l] = c[t, l] * h` (or `h` when `c` is `nothing`; a dot product
for vector states), converted to `eltype(y)`.
"""
@inline function store_output!(y, c, h, t, l)
    @inbounds y[t, l] = convert(eltype(y), project(c, h, t, l))
    return nothing
end

@inline store_state!(::Nothing, h, l) = nothing
@inline function store_state!(hlast, h, l)
    @inbounds hlast[l] = convert(eltype(hlast), h)
    return nothing
end

"""
    time_index(k, L, reverse) -> t

The time index of the `k`-th element in scan order (`L + 1 - k` for reverse
scans).
"""
@inline time_index(k, L, reverse::Bool) = ifelse(reverse, L + 1 - k, k)
