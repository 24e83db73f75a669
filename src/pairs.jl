"""
    AffinePair(A, U)

The affine map `h -> A * h + U`, the element of every ScanWeaver scan.

`A` is a scalar (a diagonal transition, one per lane) or a small dense
`StaticMatrix`; `U` has the state's type (a scalar or a `StaticVector`).
Pairs compose associatively (see [`compose`](@ref)); a segment start is the
pair with `A = 0`.

# Examples
```julia
julia> p = AffinePair(0.5, 1.0);

julia> apply_pair(p, 2.0)
2.0
```
"""
struct AffinePair{TA, TU}
    A::TA
    U::TU
end

"""
    compose(later::AffinePair, earlier::AffinePair) -> AffinePair

The pair applying `earlier` first, then `later`:
`(A2, U2) ∘ (A1, U1) = (A2 * A1, A2 * U1 + U2)`. The composition is
associative but not commutative, so the argument order matters.

# Examples
```julia
julia> compose(AffinePair(2.0, 1.0), AffinePair(3.0, 4.0))
AffinePair{Float64, Float64}(6.0, 9.0)
```
"""
@inline function compose(later::AffinePair, earlier::AffinePair)
    return AffinePair(later.A * earlier.A, later.A * earlier.U + later.U)
end

Base.:∘(later::AffinePair, earlier::AffinePair) = compose(later, earlier)

"""
    apply_pair(p::AffinePair, h)

The state after `p`: `p.A * h + p.U`.

# Examples
```julia
julia> apply_pair(AffinePair(0.5f0, 1.0f0), 4.0f0)
3.0f0
```
"""
@inline apply_pair(p::AffinePair, h) = p.A * h + p.U

"""
    identity_pair(::Type{AffinePair{TA, TU}})

The identity `(one(TA), zero(TU))`: composing with it changes nothing. Blocks
are padded with it past the end of a sequence.

# Examples
```julia
julia> identity_pair(AffinePair{Float32, Float32})
AffinePair{Float32, Float32}(1.0f0, 0.0f0)
```
"""
@inline function identity_pair(::Type{AffinePair{TA, TU}}) where {TA, TU}
    return AffinePair{TA, TU}(one(TA), zero(TU))
end

Base.:(==)(p::AffinePair, q::AffinePair) = p.A == q.A && p.U == q.U

# `isequal` and `hash` agree with each other (as `Dict` and `Set` need): equal
# pairs hash alike whatever their field types, and `-0.0` stays apart from `0.0`
# as it does for numbers.
function Base.isequal(p::AffinePair, q::AffinePair)
    return isequal(p.A, q.A) && isequal(p.U, q.U)
end
Base.hash(p::AffinePair, h::UInt) = hash(p.U, hash(p.A, hash(:AffinePair, h)))

function Base.isapprox(p::AffinePair, q::AffinePair; kwargs...)
    return isapprox(p.A, q.A; kwargs...) && isapprox(p.U, q.U; kwargs...)
end
