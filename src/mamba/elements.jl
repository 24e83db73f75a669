# The fused Mamba-1 selective scan: its operands and what one channel does at
# one time step. Gu & Dao (2023), "Mamba: Linear-Time Sequence Modeling with
# Selective State Spaces", Algorithm 2, with the semantics of mamba_ssm's
# `selective_scan_ref`. Per batch element b, channel d and state n:
#   dt_t   = softplus(delta_t[d] + delta_bias[d])   (bias and softplus optional)
#   h_t[n] = exp(dt_t * A[d, n]) * h_{t-1}[n] + dt_t * B_t[n] * u_t[d]
#   y_t[d] = (sum_n C_t[n] * h_t[n] + D[d] * u_t[d]) * silu(z_t[d])
# Julia layouts are the Python ones with the dimensions reversed: u, delta, z,
# y are (L, D, batch); A is (N, D); h0 and h_last are (N, D, batch); B and C
# are (N, D) when fixed, (L, N, batch) per step, or (L, N, G, batch) in G groups
# of D / G channels.

"""
    MambaOperands(u, delta, A, B, C, D, z, delta_bias, h0, reset, delta_softplus)

The inputs of one fused Mamba-1 scan in Julia layout (see
[`mamba_selective_scan`](@ref)); `D`, `z`, `delta_bias`, `h0` and `reset` (a
vector of `L` flags: a packed sequence starts there, from a zero state) may be
`nothing`. Converted for the device field by field (Adapt.jl), like
[`ScanOperands`](@ref).
"""
struct MambaOperands{U, Δ, TA, TB, TC, TD, Z, DB, H, R}
    u::U
    delta::Δ
    A::TA
    B::TB
    C::TC
    D::TD
    z::Z
    delta_bias::DB
    h0::H
    reset::R
    delta_softplus::Bool
end

Adapt.@adapt_structure MambaOperands

mamba_length(ops::MambaOperands) = size(ops.u, 1)
mamba_channels(ops::MambaOperands) = size(ops.u, 2)
mamba_batch(ops::MambaOperands) = size(ops.u, 3)

operand_eltype(::Nothing) = Union{}
operand_eltype(A) = eltype(A)

"""
    mamba_type(ops::MambaOperands) -> Type

The type the kernel computes in: the promoted element type of the operands,
widened like [`accumulator_type`](@ref) (`Float16` computes in `Float32`).
"""
function mamba_type(ops::MambaOperands)
    fields = (ops.u, ops.delta, ops.A, ops.B, ops.C, ops.D, ops.z, ops.delta_bias, ops.h0)
    return accumulator_type(promote_type(map(operand_eltype, fields)...))
end

"`log(1 + exp(x))` without overflow (NumPy's `logaddexp(0, x)`)."
@inline softplus(x) = max(x, zero(x)) + log1p(exp(-abs(x)))

"`x * sigmoid(x)`."
@inline silu(x) = x / (one(x) + exp(-x))

"`A[I...]`, or `fallback` when `A` is `nothing`."
@inline optional_at(::Nothing, fallback, I...) = fallback
@inline optional_at(A, fallback, I...) = @inbounds A[I...]

"Whether a packed sequence starts at step `t`."
@inline starts_at(::Nothing, t) = false
@inline starts_at(reset, t) = @inbounds !iszero(reset[t])

"""
    group_of(M, d, channels) -> Int

The group of channel `d` in a grouped `(L, N, G, batch)` operand `M` (`G`
groups of `channels ÷ G` channels); 1 for fixed and per-step operands.
"""
@inline group_of(M::AbstractArray{<:Any, 4}, d, channels) = (d - 1) ÷
    (channels ÷ size(M, 3)) +
    1
@inline group_of(M, d, channels) = 1

"""
    bc_at(M, n, t, d, g, b)

`B_t[n]` (or `C_t[n]`) of channel `d` (in group `g`) of batch element `b`, for
a fixed `(N, D)`, per-step `(L, N, batch)` or grouped `(L, N, G, batch)` `M`.
"""
@inline bc_at(M::AbstractArray{<:Any, 2}, n, t, d, g, b) = @inbounds M[n, d]
@inline bc_at(M::AbstractArray{<:Any, 3}, n, t, d, g, b) = @inbounds M[t, n, b]
@inline bc_at(M::AbstractArray{<:Any, 4}, n, t, d, g, b) = @inbounds M[t, n, g, b]

"The step size `dt_t` of channel `d`: `delta` plus `delta_bias`, through `softplus` when asked."
@inline function step_dt(ops::MambaOperands, ::Type{R}, t, d, b) where {R}
    dt = convert(R, @inbounds ops.delta[t, d, b]) +
        convert(R, optional_at(ops.delta_bias, zero(R), d))
    return ops.delta_softplus ? softplus(dt) : dt
end

"""
    MambaChannel(ops, T, Val(N), d)

What is fixed for channel `d` over time: `A[:, d]` as a tuple of `N`, the skip
`D[d]`, and the groups of `B` and `C`.
"""
struct MambaChannel{N, T}
    A::NTuple{N, T}
    skip::T
    group_b::Int
    group_c::Int
end

@inline function MambaChannel(ops::MambaOperands, ::Type{T}, ::Val{N}, d) where {T, N}
    channels = mamba_channels(ops)
    A = ntuple(n -> convert(T, @inbounds ops.A[n, d]), Val(N))
    skip = convert(T, optional_at(ops.D, zero(T), d))
    return MambaChannel{N, T}(
        A,
        skip,
        group_of(ops.B, d, channels),
        group_of(ops.C, d, channels),
    )
end

"""
    mamba_pairs(ops, ch::MambaChannel, t, d, b) -> NTuple{N, AffinePair}

Step `t` of channel `d` of batch element `b` as one affine pair per state:
`(exp(dt_t * A[d, n]), dt_t * B_t[n] * u_t[d])`, with a zero gate where a
packed sequence starts.
"""
@inline function mamba_pairs(
    ops::MambaOperands,
    ch::MambaChannel{N, T},
    t,
    d,
    b,
) where {N, T}
    dt = step_dt(ops, real(T), t, d, b)
    input = dt * convert(T, @inbounds ops.u[t, d, b])
    keep = !starts_at(ops.reset, t)
    return ntuple(Val(N)) do n
        gate = keep ? exp(dt * ch.A[n]) : zero(T)
        AffinePair{T, T}(gate, input * convert(T, bc_at(ops.B, n, t, d, ch.group_b, b)))
    end
end

"""
    mamba_output(ops, ch::MambaChannel, h, t, d, b)

`y_t[d] = (sum_n C_t[n] * h[n] + D[d] * u_t[d]) * silu(z_t[d])` for states `h`.
"""
@inline function mamba_output(
    ops::MambaOperands,
    ch::MambaChannel{N, T},
    h::NTuple{N},
    t,
    d,
    b,
) where {N, T}
    ut = convert(T, @inbounds ops.u[t, d, b])
    contracted = sum(ntuple(
        n -> convert(T, bc_at(ops.C, n, t, d, ch.group_c, b)) * h[n],
        Val(N),
    ))
    y = contracted + ch.skip * ut
    ops.z === nothing && return y
    return y * convert(T, silu(convert(real(T), @inbounds ops.z[t, d, b])))
end

"Channel `d`'s initial states: `h0[:, d, b]`, or zeros."
@inline function initial_states(ops::MambaOperands, ::Type{T}, ::Val{N}, d, b) where {T, N}
    return ntuple(n -> convert(T, optional_at(ops.h0, zero(T), n, d, b)), Val(N))
end

"Writes `v[n]` to `A[n, I...]` for every `n` (nothing for `A === nothing`)."
@inline store_tuple!(::Nothing, v, I...) = nothing
@inline function store_tuple!(A::AbstractArray, v::NTuple{N}, I...) where {N}
    ntuple(Val(N)) do n
        @inbounds A[n, I...] = convert(eltype(A), v[n])
        return nothing
    end
    return nothing
end
