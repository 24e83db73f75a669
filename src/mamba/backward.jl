# The fused Mamba-1 backward (the adjoint of `src/mamba/kernels.jl`), as
# `scanweaver.fused.mamba1` defines it. With g_t[n] = dL/dh_t[n]:
#
#     dy_t  = dout_t * silu(z_t);  dz_t = dout_t * ypre_t * silu'(z_t)
#     g_t   = C_t * dy_t + a_{t+1} * g_{t+1}        (g_{L} also gets dh_last)
#     dC_t += dy_t * h_t;  dB_t += g_t * dt_t * u_t;  du_t = D * dy_t + dt_t * sum_n g_t B_t
#     ddt_t = sum_n g_t * (B_t * u_t + a_t * A * h_{t-1});  dA += g_t * a_t * dt_t * h_{t-1}
#     ddelta_t = ddt_t * sigmoid(delta_t + delta_bias) (softplus);  dh0 = a_1 * g_1
#
# One work-item per (batch, channel) walks time forward once, keeping its
# states every `chunk` steps (the checkpoints), then runs the chunks in
# reverse: it rebuilds a chunk's states from its checkpoint into a scratch and
# walks them backwards with g in registers. Per-step gradients (du, ddelta,
# dz) have one writer; dA, dD, ddelta_bias and fixed B/C gradients are summed
# in registers and added to their outputs atomically (sums over batch), as are
# per-step B/C gradients (sums over a group's channels). So sums made with
# atomics are not bit-reproducible between runs on a GPU.

"Steps between the checkpoints of the fused Mamba backward unless given (`scanweaver.fused.mamba1.CHUNK`)."
const DEFAULT_MAMBA_BACKWARD_CHUNK = 64

"""
    MambaGrads(du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0)

The outputs of the fused Mamba backward, in the layouts of the inputs; `dD`,
`dz`, `ddelta_bias` and `dh0` may be `nothing`. `dA`, `dB`, `dC`, `dD` and
`ddelta_bias` are added into, so they start at zero.
"""
struct MambaGrads{U, Δ, TA, TB, TC, TD, Z, DB, H}
    du::U
    ddelta::Δ
    dA::TA
    dB::TB
    dC::TC
    dD::TD
    dz::Z
    ddelta_bias::DB
    dh0::H
end

Adapt.@adapt_structure MambaGrads

"`A[n, I...]` for every `n` as a tuple of `T`, or zeros when `A` is `nothing`."
@inline load_tuple(::Nothing, ::Type{T}, ::Val{N}, I...) where {T, N} = ntuple(
    _ -> zero(T),
    Val(N),
)
@inline function load_tuple(A::AbstractArray, ::Type{T}, ::Val{N}, I...) where {T, N}
    return ntuple(n -> convert(T, @inbounds A[n, I...]), Val(N))
end

"Adds `x` to `A[I...]` atomically (other work-items add to the same element)."
@inline function atomic_add!(A, x, I...)
    i = @inbounds LinearIndices(A)[I...]
    KernelAbstractions.@atomic A[i] += convert(eltype(A), x)
    return nothing
end

"Adds `x` to a per-step `B`/`C` gradient of channel `d` (group `g`) at step `t`, state `n`."
@inline bc_add!(::AbstractArray{<:Any, 2}, x, n, t, d, g, b) = nothing
@inline bc_add!(M::AbstractArray{<:Any, 3}, x, n, t, d, g, b) = atomic_add!(M, x, t, n, b)
@inline bc_add!(M::AbstractArray{<:Any, 4}, x, n, t, d, g, b) = atomic_add!(
    M,
    x,
    t,
    n,
    g,
    b,
)

"Adds the register sums `v` (one per state) of a fixed `(N, D)` gradient; nothing for per-step ones."
@inline function fixed_add!(M::AbstractArray{<:Any, 2}, v::NTuple{N}, d) where {N}
    for n in 1:N
        atomic_add!(M, v[n], n, d)
    end
    return nothing
end
@inline fixed_add!(M, v, d) = nothing

"`(dt, d dt / d delta)` of channel `d` at step `t`."
@inline function step_dt_grad(ops::MambaOperands, ::Type{R}, t, d, b) where {R}
    raw = convert(R, @inbounds ops.delta[t, d, b]) +
        convert(R, optional_at(ops.delta_bias, zero(R), d))
    ops.delta_softplus || return raw, one(R)
    return softplus(raw), one(R) / (one(R) + exp(-raw))
end

"`(dy, dz)` at step `t`: the cotangent before the gate `silu(z)`, and z's (zero without z)."
@inline function mamba_gate_grad(
    ops::MambaOperands,
    ::Type{T},
    dout,
    ypre,
    t,
    d,
    b,
) where {T}
    ops.z === nothing && return dout, zero(T)
    zt = convert(T, @inbounds ops.z[t, d, b])
    sz = one(T) / (one(T) + exp(-zt))
    return dout * zt * sz, dout * ypre * sz * (one(T) + zt * (one(T) - sz))
end

"""
    mamba_backward_step(ops, grads, ch, G, hp, ht, dout, t, d, b) -> (G, gv, q, dt, ut, dy)

One reverse step of channel `d`: writes `du`, `ddelta`, `dz` at `t` and the
per-step B/C gradients, and returns `G = a_t * g_t` for the step before, `g_t`,
`q = g_t * a_t * h_{t-1}`, `dt_t`, `u_t` and `dy_t` for the register sums.
Closures capture arguments only (no `Core.Box`).
"""
@inline function mamba_backward_step(
    ops::MambaOperands,
    grads::MambaGrads,
    ch::MambaChannel{N, T},
    G::NTuple{N},
    hp::NTuple{N},
    ht::NTuple{N},
    dout,
    t,
    d,
    b,
) where {N, T}
    dt, ddt_ddelta = step_dt_grad(ops, T, t, d, b)
    ut = convert(T, @inbounds ops.u[t, d, b])
    keep = !starts_at(ops.reset, t)
    a = map(An -> keep ? exp(dt * An) : zero(T), ch.A)
    Bs = ntuple(n -> convert(T, bc_at(ops.B, n, t, d, ch.group_b, b)), Val(N))
    Cs = ntuple(n -> convert(T, bc_at(ops.C, n, t, d, ch.group_c, b)), Val(N))
    ypre = sum(map(*, Cs, ht)) + ch.skip * ut
    dy, dzt = mamba_gate_grad(ops, T, convert(T, dout), ypre, t, d, b)
    gv = map((Gn, Cn) -> muladd(Cn, dy, Gn), G, Cs)
    q = map((gn, an, hn) -> gn * an * hn, gv, a, hp)
    gB = sum(map(*, gv, Bs))
    ddt = sum(map(*, q, ch.A)) + gB * ut
    @inbounds grads.du[t, d, b] = muladd(ch.skip, dy, gB * dt)
    @inbounds grads.ddelta[t, d, b] = ddt * ddt_ddelta
    grads.dz === nothing || (@inbounds grads.dz[t, d, b] = dzt)
    for n in 1:N
        bc_add!(grads.dC, dy * ht[n], n, t, d, ch.group_c, b)
        bc_add!(grads.dB, gv[n] * dt * ut, n, t, d, ch.group_b, b)
    end
    return map(*, a, gv), gv, q, dt, ut, dy
end

"""
    mamba_backward_item!(w, grads, ckpt, hs, ops, dout, dhlast,
                         Val(N), Val(workgroupsize), Val(chunk))

Work-item `w` of the fused Mamba backward: channel `(w - 1) % D + 1` of batch
element `(w - 1) ÷ D + 1` (see the top of `src/mamba/backward.jl`), with its
checkpoints in `ckpt` `(N, nchunks, D, batch)` and a chunk's states in `hs`
`(N, chunk, D, batch)`.
"""
@inline function mamba_backward_item!(
    w,
    grads,
    ckpt,
    hs,
    ops,
    dout,
    dhlast,
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    L, channels, batch = size(ops.u)
    if w <= channels * batch
        d, b = (w - 1) % channels + 1, (w - 1) ÷ channels + 1
        T = mamba_type(ops)
        ch = MambaChannel(ops, T, Val(nstate), d)
        nchunks = cld(L, chunk)
        h = initial_states(ops, T, Val(nstate), d, b)
        for j in 1:nchunks
            store_tuple!(ckpt, h, j, d, b)
            for t in chunk_range(j, chunk, L)
                h = map(apply_pair, mamba_pairs(ops, ch, t, d, b), h)
            end
        end
        G = load_tuple(dhlast, T, Val(nstate), d, b)
        zero_n = ntuple(_ -> zero(T), Val(nstate))
        dA, dB, dC, sums = zero_n, zero_n, zero_n, (zero(T), zero(T))
        for j in nchunks:-1:1
            steps = chunk_range(j, chunk, L)
            h = load_tuple(ckpt, T, Val(nstate), j, d, b)
            for t in steps
                h = map(apply_pair, mamba_pairs(ops, ch, t, d, b), h)
                store_tuple!(hs, h, t - first(steps) + 1, d, b)
            end
            for t in reverse(steps)
                s = t - first(steps) + 1
                ht = load_tuple(hs, T, Val(nstate), s, d, b)
                hp = s == 1 ?
                    load_tuple(ckpt, T, Val(nstate), j, d, b) :
                    load_tuple(hs, T, Val(nstate), s - 1, d, b)
                G, gv, q, dt, ut, dy = mamba_backward_step(
                    ops,
                    grads,
                    ch,
                    G,
                    hp,
                    ht,
                    @inbounds(dout[t, d, b]),
                    t,
                    d,
                    b,
                )
                dA = map((acc, qn) -> muladd(qn, dt, acc), dA, q)
                dB = map((acc, gn) -> muladd(gn, dt * ut, acc), dB, gv)
                dC = map((acc, hn) -> muladd(dy, hn, acc), dC, ht)
                sums = (muladd(dy, ut, sums[1]), sums[2] + @inbounds(grads.ddelta[t, d, b]))
            end
        end
        store_tuple!(grads.dh0, G, d, b)
        fixed_add!(grads.dA, dA, d)
        fixed_add!(grads.dB, dB, d)
        fixed_add!(grads.dC, dC, d)
        grads.dD === nothing || atomic_add!(grads.dD, sums[1], d)
        grads.ddelta_bias === nothing || atomic_add!(grads.ddelta_bias, sums[2], d)
    end
    return nothing
end

"""
    mamba_backward_kernel!(backend, workgroupsize)(
        grads, ckpt, hs, ops, dout, dhlast, Val(N), Val(workgroupsize), Val(chunk);
        ndrange = D * batch,
    )

[`mamba_backward_item!`](@ref) on a device.
"""
@kernel function mamba_backward_kernel!(
    grads,
    ckpt,
    hs,
    @Const(ops),
    @Const(dout),
    @Const(dhlast),
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    w = @index(Global, Linear)
    vals = (Val(nstate), Val(workgroupsize), Val(chunk))
    mamba_backward_item!(w, grads, ckpt, hs, ops, dout, dhlast, vals...)
end
