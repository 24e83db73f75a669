# The chunked matrix-state backward (`algorithm = :chunked` of
# `matrix_state_backward!`): the forward's chunk kernels (`src/matrix/chunked.jl`)
# run again for the chunk-start states S_0 and the intra-chunk weights A, then,
# with dA_ij = do_i . v_j (j <= i) and dS the adjoint at a chunk's end (a
# reverse carry over the chunks: dS <- e^{G_last} o dS + (Q o e^{Gq})^T dO,
# from dhlast), per position:
#
#     dq_i = e^{Gq_i} o (S_0 do_i) + sum_{j <= i} dA_ij (k_j o e^{Gq_i - G_j})
#     dk_j = e^{G_last - G_j} o (dS v_j) + sum_{i >= j} dA_ij (q_i o e^{Gq_i - G_j})
#     dv_j = sum_{i >= j} A_ij do_i + dS^T (k_j o e^{G_last - G_j})
#
# (j < i in the sums for the bonus readout, whose terms are added with
# w_i = dA_ii: dq += w u o k, dk += w u o q, du = sum w q o k). The decay
# gradient is the identity of the recurrent backward, a reverse running sum per
# row over each sequence: dg_t = sum_{s >= t} (q_s o dq_s - k_s o dk_s) + c
# (the state parts; c the rows of dhlast o hlast; minus q_t o dq_t for the
# bonus readout), restarted at 0 on a reset step, whose dg is exactly 0.
# Per-head gradients of q and k are summed over each group's heads last.

"""
    matrix_chunk_dA_kernel!(backend, wg)(dAw, dout, v, chunks, slot, Val(reversed);
        ndrange = C * H * T * batch)

Per (chunk-local step `j`, head, position of step `i`): `dA_ij = do_i . v_j`
for `j <= i`, else 0.
"""
@kernel function matrix_chunk_dA_kernel!(
    dAw,
    @Const(dout),
    @Const(v),
    @Const(chunks),
    @Const(slot),
    ::Val{reversed},
) where {reversed}
    w = @index(Global, Linear)
    C, H, L = size(dAw, 1), size(dAw, 2), size(dAw, 3)
    if w <= length(dAw)
        A = eltype(dAw)
        j = (w - 1) % C + 1
        h = ((w - 1) ÷ C) % H + 1
        t = ((w - 1) ÷ (C * H)) % L + 1
        b = (w - 1) ÷ (C * H * L) + 1
        c, i = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        acc = zero(A)
        if j <= i
            tj = chunk_position(@inbounds(chunks[3, c]), j, Val(reversed))
            for x in axes(v, 1)
                acc += A(@inbounds dout[x, h, t, b]) * A(@inbounds v[x, h, tj, b])
            end
        end
        @inbounds dAw[j, h, t, b] = acc
    end
end

"""
    matrix_chunk_dq_kernel!(backend, wg)(dqh, qa, q, k, u, S0, dAw, dout, G, seg,
        chunks, slot, Val(decay), Val(bonus), Val(reversed); ndrange = K * H * T * batch)

Per (key row, head, position): the head's `dq` and its state part times `q`
(`qa`, for the decay gradient).
"""
@kernel function matrix_chunk_dq_kernel!(
    dqh,
    qa,
    @Const(q),
    @Const(k),
    @Const(u),
    @Const(S0),
    @Const(dAw),
    @Const(dout),
    @Const(G),
    @Const(seg),
    @Const(chunks),
    @Const(slot),
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
) where {decay, bonus, reversed}
    w = @index(Global, Linear)
    nk, H, L = size(dqh, 1), size(dqh, 2), size(dqh, 3)
    if w <= length(dqh)
        A = eltype(dqh)
        x, h, t, b = chunk_cell(w, nk, H, L)
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        r = decay === :key ? x : 1
        c, i = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        t0 = @inbounds chunks[3, c]
        tp = bonus ? chunk_position(t0, i - 1, Val(reversed)) : t
        fq = bonus && i == 1 ? one(A) : chunk_start_factor(G, seg, r, h, tp, b)
        acc = zero(A)
        for y in axes(dout, 1)
            acc += @inbounds(S0[y, x, h, c]) * A(@inbounds dout[y, h, t, b])
        end
        acc *= fq
        for j in 1:(bonus ? i - 1 : i)
            tj = chunk_position(t0, j, Val(reversed))
            f = chunk_factor(G, seg, r, h, tp, tj, j, b)
            acc += @inbounds(dAw[j, h, t, b]) * A(@inbounds k[x, hq, tj, b]) * f
        end
        @inbounds qa[x, h, t, b] = A(@inbounds q[x, hq, t, b]) * acc
        if bonus
            acc += A(@inbounds u[x, h]) *
                A(@inbounds k[x, hq, t, b]) *
                @inbounds(dAw[i, h, t, b])
        end
        @inbounds dqh[x, h, t, b] = acc
    end
end

"""
    matrix_chunk_dk_kernel!(backend, wg)(dkh, kb, q, k, u, v, dS, dAw, G, seg,
        chunks, slot, Val(decay), Val(bonus), Val(reversed); ndrange = K * H * T * batch)

Per (key row, head, position): the head's `dk` and its state part times `k`
(`kb`, for the decay gradient).
"""
@kernel function matrix_chunk_dk_kernel!(
    dkh,
    kb,
    @Const(q),
    @Const(k),
    @Const(u),
    @Const(v),
    @Const(dS),
    @Const(dAw),
    @Const(G),
    @Const(seg),
    @Const(chunks),
    @Const(slot),
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
) where {decay, bonus, reversed}
    w = @index(Global, Linear)
    nk, H, L = size(dkh, 1), size(dkh, 2), size(dkh, 3)
    if w <= length(dkh)
        A = eltype(dkh)
        x, h, t, b = chunk_cell(w, nk, H, L)
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        r = decay === :key ? x : 1
        c, s = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        t0, len = @inbounds(chunks[3, c]), @inbounds(chunks[4, c])
        acc = zero(A)
        for y in axes(v, 1)
            acc += @inbounds(dS[y, x, h, c]) * A(@inbounds v[y, h, t, b])
        end
        acc *= chunk_factor(G, seg, r, h, chunk_position(t0, len, Val(reversed)), t, s, b)
        for i in (bonus ? s + 1 : s):len
            ti = chunk_position(t0, i, Val(reversed))
            tp = bonus ? chunk_position(t0, i - 1, Val(reversed)) : ti
            f = chunk_factor(G, seg, r, h, tp, t, s, b)
            acc += @inbounds(dAw[s, h, ti, b]) * A(@inbounds q[x, hq, ti, b]) * f
        end
        @inbounds kb[x, h, t, b] = A(@inbounds k[x, hq, t, b]) * acc
        if bonus
            acc += A(@inbounds u[x, h]) *
                A(@inbounds q[x, hq, t, b]) *
                @inbounds(dAw[s, h, t, b])
        end
        @inbounds dkh[x, h, t, b] = acc
    end
end

"""
    matrix_chunk_dv_kernel!(backend, wg)(dv, kd, dS, Aw, dout, chunks, slot, Val(reversed);
        ndrange = V * H * T * batch)

Per (value column, head, position `j`): `dv_j = sum_{i >= j} A_ij do_i + dS^T kd_j`.
"""
@kernel function matrix_chunk_dv_kernel!(
    dv,
    @Const(kd),
    @Const(dS),
    @Const(Aw),
    @Const(dout),
    @Const(chunks),
    @Const(slot),
    ::Val{reversed},
) where {reversed}
    w = @index(Global, Linear)
    nv, H, L = size(dv, 1), size(dv, 2), size(dv, 3)
    if w <= length(dv)
        A = eltype(kd)
        y = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        t = ((w - 1) ÷ (nv * H)) % L + 1
        b = (w - 1) ÷ (nv * H * L) + 1
        c, s = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        t0, len = @inbounds(chunks[3, c]), @inbounds(chunks[4, c])
        acc = zero(A)
        for x in axes(kd, 1)
            acc += @inbounds(kd[x, h, t, b]) * @inbounds(dS[y, x, h, c])
        end
        for i in s:len
            ti = chunk_position(t0, i, Val(reversed))
            acc += @inbounds(Aw[s, h, ti, b]) * A(@inbounds dout[y, h, ti, b])
        end
        @inbounds dv[y, h, t, b] = convert(eltype(dv), acc)
    end
end

"`sum(X[x, h, t, b] for x in rows)` (one row `r` for decays per key, all rows else)."
@inline function chunk_rows(X, ::Val{decay}, r, h, t, b) where {decay}
    decay === :key && return @inbounds X[r, h, t, b]
    acc = zero(eltype(X))
    for x in axes(X, 1)
        acc += @inbounds X[x, h, t, b]
    end
    return acc
end

"""
    matrix_chunk_dg_kernel!(backend, wg)(dg, qa, kb, g, hl, dhlast, chunks, firsts,
        Val(S), Val(decay), Val(bonus), Val(reversed); ndrange = Kd * H * nseq)

Per (row, head, sequence), backwards over its steps: the decay gradient as a
running sum (see the top of this file), 0 on a reset step and restarted there.
"""
@kernel function matrix_chunk_dg_kernel!(
    dg,
    @Const(qa),
    @Const(kb),
    @Const(g),
    @Const(hl),
    @Const(dhlast),
    @Const(chunks),
    @Const(firsts),
    ::Val{S},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
) where {S, decay, bonus, reversed}
    w = @index(Global, Linear)
    Kd, H, nseq = decay === :key ? size(qa, 1) : 1, size(qa, 2), length(firsts) - 1
    if w <= Kd * H * nseq
        A = eltype(qa)
        r = (w - 1) % Kd + 1
        h = ((w - 1) ÷ Kd) % H + 1
        n = (w - 1) ÷ (Kd * H) + 1
        total = zero(A)
        if dhlast !== nothing
            for x in (decay === :key ? r : 1):(decay === :key ? r : size(qa, 1)), y in axes(
                    hl,
                    1,
                )
                total += A(@inbounds dhlast[y, x, h, n]) * @inbounds(hl[y, x, h, n])
            end
        end
        later = zero(A)
        for c in @inbounds(firsts[n + 1]):-1:(@inbounds(firsts[n]) + 1)
            b, t0, len = @inbounds(chunks[2, c]),
                @inbounds(chunks[3, c]),
                @inbounds(chunks[4, c])
            for s in len:-1:1
                t = chunk_position(t0, s, Val(reversed))
                a = chunk_rows(qa, Val(decay), r, h, t, b)
                total += (bonus ? later : a) - chunk_rows(kb, Val(decay), r, h, t, b)
                later = a
                chunk_reset(chunk_log_decay(g, Val(decay), A, r, h, t, b), S) &&
                    (total = zero(A))
                if decay === :key
                    @inbounds dg[r, h, t, b] = total
                else
                    @inbounds dg[h, t, b] = total
                end
            end
        end
    end
end

"""
    matrix_chunk_du_kernel!(backend, wg)(du, q, k, dAw, slot; ndrange = K * H)

Per (key row, head): `du = sum_t q_t o k_t w_t`, `w_t = v_t . do_t` (`dA_tt`).
"""
@kernel function matrix_chunk_du_kernel!(
    du,
    @Const(q),
    @Const(k),
    @Const(dAw),
    @Const(slot),
)
    w = @index(Global, Linear)
    nk, H = size(du, 1), size(du, 2)
    if w <= nk * H
        A = eltype(dAw)
        x = (w - 1) % nk + 1
        h = (w - 1) ÷ nk + 1
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        acc = zero(A)
        for b in axes(dAw, 4), t in axes(dAw, 3)
            i = @inbounds slot[2, t, b]
            acc += A(@inbounds q[x, hq, t, b]) *
                A(@inbounds k[x, hq, t, b]) *
                @inbounds(dAw[i, h, t, b])
        end
        @inbounds du[x, h] = convert(eltype(du), acc)
    end
end

"""
    matrix_chunk_group_kernel!(backend, wg)(dq, dk, dqh, dkh; ndrange = length(dq))

`dq` and `dk` per q/k head: the per-head gradients summed over each group's heads.
"""
@kernel function matrix_chunk_group_kernel!(dq, dk, @Const(dqh), @Const(dkh))
    w = @index(Global, Linear)
    nk, Hq, L = size(dq, 1), size(dq, 2), size(dq, 3)
    if w <= length(dq)
        A = eltype(dqh)
        x = (w - 1) % nk + 1
        hq = ((w - 1) ÷ nk) % Hq + 1
        t = ((w - 1) ÷ (nk * Hq)) % L + 1
        b = (w - 1) ÷ (nk * Hq * L) + 1
        group = size(dqh, 2) ÷ Hq
        aq, ak = zero(A), zero(A)
        for h in ((hq - 1) * group + 1):(hq * group)
            aq += @inbounds dqh[x, h, t, b]
            ak += @inbounds dkh[x, h, t, b]
        end
        @inbounds dq[x, hq, t, b] = convert(eltype(dq), aq)
        @inbounds dk[x, hq, t, b] = convert(eltype(dk), ak)
    end
end
