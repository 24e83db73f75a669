# The delta rule's chunked backward (`algorithm = :chunked` of
# `delta_rule_backward!`), in three stages, no state ever stored per step:
#
# 1. the chunked forward (`src/matrix/delta_chunked.jl`) runs again for the
#    state at each chunk's start, S_0, and the chunk products it built;
# 2. the adjoint at each chunk's end, L_c = dL/dS_end (`dhlast` at a
#    sequence's end), carried over the chunks in reverse by the transpose of
#    the chunk's affine map. With the forward's
#        O = (Q o e^G) S_0 + A U,  U = Uv - W S_0,  S_end = e^{G_last} o S_0 + Kd' U
#    (delta form; A = Q K' o Gamma o M_incl, Kd = K o e^{G_last - G}):
#        dU = A' dO + Kd dS,   dS <- e^{G_last} o dS + (Q o e^G)' dO - W' dU
#    and with the dplr form's
#        O = (Q o e^G) S_0 + Bq P + A V,  P = Pv + W S_0,
#        S_end = e^{G_last} o S_0 + Bd' P + Kd' V:
#        dP = Bq' dO + Bd dS,  dS <- e^{G_last} o dS + (Q o e^G)' dO + W' dP.
#    The readout's part of W' dU is the same for every column: with
#    Y_l = (Q o e^G)_l -+ sum_{i <= l} A_li W_i (Bq for dplr; one kernel, per
#    key row, head and step),
#        dS <- e^{G_last} o dS + sum_l dO_l Y_l -+ sum_i W_i (Kd_i . dS)
#    (Bd for dplr), so a column's chunk costs 3 C K, not C^2.
#    The columns of the state are independent, so one work-item per (value
#    column, head, sequence) walks its chunks from the last; a chunk the
#    forward leaves to the recurrence (growth) runs the recurrence's adjoint
#    over its steps instead (`G += q do_j`; delta: `G <- D (G - beta k (G . k))`;
#    dplr: `G <- D G + a (b . G)`), which reads no state;
# 3. the recurrent backward (`src/matrix/delta_backward.jl`) on every chunk as
#    a sequence of its own, with S_0 as its initial state and L_c as its
#    final adjoint: each chunk is a genuine instance of the recurrence, so
#    the gradients of its steps are the recurrence's, and the chunks run in
#    parallel (one task per head and chunk), not only the heads and sequences.
#    The first chunk's initial-state gradient is the sequence's `dh0`.
#
# Stages 1 and 2 are KernelAbstractions kernels; stage 3 is the recurrent
# backward's CPU code, so the backward runs on the CPU as the recurrent one.

"""
    delta_adjoint_update(G, ds, ks, beta, a, bb, Val(form), h, t, b) -> G

The adjoint of one state column before step `(t, b)` of head `h` from `G`, the
adjoint after it with the step's readout already added (`ds` the step's decays).
"""
@inline function delta_adjoint_update(
    G::Tuple{T, Vararg{T, rest}},
    ds,
    ks,
    beta,
    a,
    bb,
    ::Val{:delta},
    h,
    t,
    b,
) where {T, rest}
    du = sum(ntuple(x -> G[x] * ks[x], Val(rest + 1))) * T(@inbounds beta[h, t, b])
    return ntuple(x -> ds[x] * (G[x] - ks[x] * du), Val(rest + 1))
end

@inline function delta_adjoint_update(
    G::Tuple{T, Vararg{T, rest}},
    ds,
    ks,
    beta,
    a,
    bb,
    ::Val{:dplr},
    h,
    t,
    b,
) where {T, rest}
    dp = sum(ntuple(x -> G[x] * T(@inbounds bb[x, h, t, b]), Val(rest + 1)))
    return ntuple(x -> ds[x] * G[x] + T(@inbounds a[x, h, t, b]) * dp, Val(rest + 1))
end

"`s + x * y` for the state column `s` and key vector `x` (no closure captures the caller's reassigned `s`)."
@inline function delta_column_axpy(s::Tuple{A, Vararg{A, rest}}, x, y) where {A, rest}
    return ntuple(i -> s[i] + x[i] * y, Val(rest + 1))
end

"""
    delta_chunk_adjoint_recurrent(s, dout, q, k, g, beta, a, bb, j, h, hq, b, t0,
        len, Val(K), Val(gate), Val(form), Val(l2norm)) -> s

The recurrence's adjoint of one state column over one chunk (a chunk that
grows), from its end to its start.
"""
@inline function delta_chunk_adjoint_recurrent(
    s,
    dout,
    q,
    k,
    g,
    beta,
    a,
    bb,
    j,
    h,
    hq,
    b,
    t0,
    len,
    ::Val{nk},
    ::Val{gate},
    form::Val,
    ::Val{l2norm},
) where {nk, gate, l2norm}
    A = eltype(s)
    for t in (t0 + len - 1):-1:t0
        qs = delta_keys(q, A, Val(nk), Val(l2norm), hq, t, b)
        ks = delta_keys(k, A, Val(nk), Val(l2norm), hq, t, b)
        G = delta_column_axpy(s, qs, A(@inbounds dout[j, h, t, b]))
        ds = ntuple(x -> matrix_decay(g, Val(gate), A, x, h, t, b), Val(nk))
        s = delta_adjoint_update(G, ds, ks, beta, a, bb, form, h, t, b)
    end
    return s
end

"`delta` for the delta form, `dplr` for the dplr form (its readout and carry weights, the sign of `W S_0`)."
@inline delta_form_pick(::Val{:delta}, delta, dplr) = delta
@inline delta_form_pick(::Val{:dplr}, delta, dplr) = dplr

"""
    delta_chunk_readout_kernel!(backend, wg)(Y, qd, W, Aw, Bq, grow, chunks, slot,
        Val(form); ndrange = K * H * T * batch)

Per (key row, head, position `l` of a chunk that does not grow): `Y_l =
qd_l - sum_{i <= l} A_li W_i` (delta), `qd_l + sum_{i <= l} Bq_li W_i` (dplr),
the weight of `dO_l` in the adjoint of the chunk's start state.
"""
@kernel function delta_chunk_readout_kernel!(
    Y,
    @Const(qd),
    @Const(W),
    @Const(Aw),
    @Const(Bq),
    @Const(grow),
    @Const(chunks),
    @Const(slot),
    ::Val{form},
) where {form}
    w = @index(Global, Linear)
    delta_chunk_readout_item!(w, Y, qd, W, Aw, Bq, grow, chunks, slot, Val(form))
end

"The work-item `w` of [`delta_chunk_readout_kernel!`](@ref) (on the CPU a plain loop, [`launch_items!`](@ref))."
@inline function delta_chunk_readout_item!(
    w,
    Y,
    qd,
    W,
    Aw,
    Bq,
    grow,
    chunks,
    slot,
    ::Val{form},
) where {form}
    nk, H, L = size(Y, 1), size(Y, 2), size(Y, 3)
    if w <= length(Y)
        A = eltype(Y)
        x = (w - 1) % nk + 1
        h = ((w - 1) ÷ nk) % H + 1
        t = ((w - 1) ÷ (nk * H)) % L + 1
        b = (w - 1) ÷ (nk * H * L) + 1
        c, l = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        if c > 0 && @inbounds(grow[h, c]) == 0
            M = delta_form_pick(Val(form), Aw, Bq)
            t0 = @inbounds chunks[3, c]
            acc = zero(A)
            for i in 1:l
                acc += @inbounds(M[i, h, t, b]) * @inbounds(W[x, h, t0 + i - 1, b])
            end
            @inbounds Y[x, h, t, b] = @inbounds(qd[x, h, t, b]) +
                delta_form_pick(Val(form), -acc, acc)
        end
    end
end

"""
    delta_chunk_adjoint_kernel!(backend, wg)(Lc, dout, dhlast, W, kd, Y, bd, D, grow,
        q, k, g, beta, a, b, chunks, firsts, Val(K), Val(gate), Val(form),
        Val(l2norm); ndrange = V * H * nseq)

Per (value column `j`, head, sequence), over the sequence's chunks from the
last: `Lc[j, :, h, c]`, the adjoint of the state column at chunk `c`'s end
(`dhlast`, or zeros, at the sequence's end), then the adjoint at its start by
the transpose of the chunk's map (`src/matrix/delta_chunked_backward.jl`), or
by the recurrence's adjoint in a chunk that grows.
"""
@kernel function delta_chunk_adjoint_kernel!(
    Lc,
    @Const(dout),
    @Const(dhlast),
    @Const(W),
    @Const(kd),
    @Const(Y),
    @Const(bd),
    @Const(D),
    @Const(grow),
    @Const(q),
    @Const(k),
    @Const(g),
    @Const(beta),
    @Const(a),
    @Const(bb),
    @Const(chunks),
    @Const(firsts),
    ::Val{nk},
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
) where {nk, gate, form, l2norm}
    w = @index(Global, Linear)
    delta_chunk_adjoint_item!(
        w,
        Lc,
        dout,
        dhlast,
        W,
        kd,
        Y,
        bd,
        D,
        grow,
        q,
        k,
        g,
        beta,
        a,
        bb,
        chunks,
        firsts,
        Val(nk),
        Val(gate),
        Val(form),
        Val(l2norm),
    )
end

"The work-item `w` of [`delta_chunk_adjoint_kernel!`](@ref) (on the CPU a plain loop, [`launch_items!`](@ref))."
@inline function delta_chunk_adjoint_item!(
    w,
    Lc,
    dout,
    dhlast,
    W,
    kd,
    Y,
    bd,
    D,
    grow,
    q,
    k,
    g,
    beta,
    a,
    bb,
    chunks,
    firsts,
    ::Val{nk},
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
) where {nk, gate, form, l2norm}
    nv, H = size(dout, 1), size(dout, 2)
    nseq = length(firsts) - 1
    if w <= nv * H * nseq
        A = eltype(Lc)
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        n = (w - 1) ÷ (nv * H) + 1
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        s = matrix_initial(dhlast, A, Val(nk), j, h, n)
        c0, c1 = @inbounds(firsts[n]) + 1, @inbounds(firsts[n + 1])
        for c in c1:-1:c0
            b, t0, len = @inbounds(chunks[2, c]),
                @inbounds(chunks[3, c]),
                @inbounds(chunks[4, c])
            for x in 1:nk
                @inbounds Lc[j, x, h, c] = s[x]
            end
            if @inbounds(grow[h, c]) != 0
                s = delta_chunk_adjoint_recurrent(
                    s,
                    dout,
                    q,
                    k,
                    g,
                    beta,
                    a,
                    bb,
                    j,
                    h,
                    hq,
                    b,
                    t0,
                    len,
                    Val(nk),
                    Val(gate),
                    Val(form),
                    Val(l2norm),
                )
            else
                R = delta_form_pick(Val(form), kd, bd)
                e = delta_chunk_decayed(s, D, Val(gate), h, c)
                for t in t0:(t0 + len - 1)
                    e = delta_chunk_add(e, Y, A(@inbounds dout[j, h, t, b]), h, t, b)
                    r = delta_chunk_dot(R, s, h, t, b)
                    e = delta_chunk_add(e, W, delta_form_pick(Val(form), -r, r), h, t, b)
                end
                s = e
            end
        end
    end
end

"""
    delta_chunked_backward!(grads, C, q, k, v, dout, g, beta, a, b, h0, dhlast,
        cu_seqlens, Val(gate), Val(form), l2norm, checkpoint) -> nothing

The chunked backward of [`delta_rule_backward!`](@ref) with chunks of `C`
steps (`src/matrix/delta_chunked_backward.jl`): fills `grads` as
[`delta_backward_item!`](@ref) does for every sequence (`cu_seqlens` a host
vector or `nothing`), on the CPU.
"""
function delta_chunked_backward!(
    grads,
    C,
    q,
    k,
    v,
    dout,
    g,
    beta,
    a,
    b,
    h0,
    dhlast,
    cu_seqlens,
    ::Val{gate},
    ::Val{form},
    l2norm,
    checkpoint,
) where {gate, form}
    backend = CPU()
    wg = min(DEFAULT_MATRIX_WORKGROUP_SIZE, max_workgroupsize(backend))
    nk, (nv, H, _, batch) = size(q, 1), size(v)
    T = eltype(grads.dqh)
    nseq = length(something(cu_seqlens, 0:batch)) - 1
    o, hlast = similar(v, T), zeros(T, nv, nk, H, nseq)
    parts = delta_chunk_forward!(
        backend,
        wg,
        C,
        o,
        hlast,
        q,
        k,
        v,
        g,
        beta,
        a,
        b,
        h0,
        cu_seqlens,
        Val(gate),
        Val(form),
        Val(l2norm),
    )
    nch = size(parts.chunks, 2)
    Lc, Y = similar(parts.S0), similar(parts.qd)
    launch_items!(
        delta_chunk_readout_item!,
        delta_chunk_readout_kernel!,
        backend,
        wg,
        length(Y),
        (
            Y,
            parts.qd,
            parts.W,
            parts.Aw,
            parts.Bq,
            parts.grow,
            parts.chunks,
            parts.slot,
            Val(form),
        );
        work = C,
    )
    launch_items!(
        delta_chunk_adjoint_item!,
        delta_chunk_adjoint_kernel!,
        backend,
        wg,
        nv * H * nseq,
        (
            Lc,
            dout,
            dhlast,
            parts.W,
            parts.kd,
            Y,
            parts.bd,
            parts.D,
            parts.grow,
            q,
            k,
            g,
            beta,
            a,
            b,
            parts.chunks,
            parts.firsts,
            Val(nk),
            Val(gate),
            Val(form),
            Val(l2norm),
        );
        work = size(v, 3) * nk,
    )
    segs = Int.(parts.chunks[2:4, :])
    dh0 = grads.dh0 === nothing ? nothing : zeros(T, nv, nk, H, nch)
    args = (
        merge(grads, (; dh0)),
        q,
        k,
        v,
        dout,
        g,
        beta,
        a,
        b,
        parts.S0,
        Lc,
        segs,
        Val(gate),
        Val(form),
        l2norm,
        something(checkpoint, isqrt(max(C - 1, 0)) + 1),
    )
    cpu_items!(delta_backward_item!, H * nch, args; work = C * nk * nv)
    if dh0 !== nothing
        for n in 1:nseq
            first, last = parts.firsts[n] + 1, parts.firsts[n + 1]
            if first <= last
                grads.dh0[:, :, :, n] .= view(dh0, :, :, :, first)
            else
                # an empty sequence: its state passes through
                grads.dh0[:, :, :, n] .= dhlast === nothing ?
                    zero(T) :
                    view(dhlast, :, :, :, n)
            end
        end
    end
    return nothing
end
