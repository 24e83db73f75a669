# The matrix-state scan (`src/matrix/state.jl`) in its chunked (matmul) form,
# forward: the same result as the recurrence, in KernelAbstractions kernels
# that run on every backend. Each sequence is cut into chunks of `C` steps in
# scan order; inside a chunk, with cumulative log decays G (per head or per key
# row) and the state S_0 at the chunk's start:
#
#     o_i   = (q_i o e^{Gq_i}) S_0 + sum_{j <= i} A_ij v_j
#     A_ij  = sum_k q_ik k_jk e^{Gq_ik - G_jk}          (j < i for the bonus readout,
#                                                        A_ii = q_i . (u o k_i))
#     S_end = e^{G_last} o S_0 + (K o e^{G_last - G})^T V
#
# and only the chunk-start states cross chunks (a sequential carry per state
# column). Gq_i is G_i (readout after the update) or G_{i-1} (the bonus
# readout of the previous state, G_0 = 0). Exactness: a log decay of -inf, or
# one whose exponential is 0 in the state's element type, is an exact reset:
# the cumulative sum restarts at 0 after it (the reset's index is stored
# beside the sum) and every factor across it is 0, so no difference is ever
# -inf - -inf; a factor is exponentiated only when the mask keeps it, and is
# the exponential of the exact log-decay sum between its two positions
# (positive sums included: nothing is clamped). Sums are held in the
# accumulator type `A` (Float64 on the CPU, Float32 or better elsewhere).
#
# Scratch, in the layouts of `src/matrix/state.jl`: `G`, `seg` `(Kd, H, T,
# batch)` (Kd = K for decays per key, else 1; `seg` the chunk-local index of
# the last reset at or before the step, 0 for none); `qd`, `kd` `(K, H, T,
# batch)` (q and k times their factors from the chunk's start and to its end);
# `D` `(Kd, H, nchunks)`; `E`, `S0` `(V, K, H, nchunks)`; `Aw` `(C, H, T,
# batch)`. Tables (Int32, built on the host): `chunks` `(4, nchunks)` (sequence,
# batch row, data position of the first step, length), `firsts` `(nseq + 1,)`
# (each sequence's chunks, offsets), `slot` `(2, T, batch)` (chunk and
# chunk-local step of each position).

"The cell `(x, h, t, b)` of work-item `w` over an array of size `(n, H, L, batch)`."
@inline function chunk_cell(w, n, H, L)
    x, h = (w - 1) % n + 1, ((w - 1) ÷ n) % H + 1
    return x, h, ((w - 1) ÷ (n * H)) % L + 1, (w - 1) ÷ (n * H * L) + 1
end

"Data position of chunk-local step `s` of a chunk that starts at `t0`."
@inline chunk_position(t0, s, ::Val{reversed}) where {reversed} = reversed ?
    t0 - (s - 1) :
    t0 + (s - 1)

"The log decay of row `r` (key row for `:key`) at `(h, t, b)` in `A`; 0 without decay."
@inline function chunk_log_decay(g, ::Val{decay}, ::Type{A}, r, h, t, b) where {decay, A}
    decay === :key && return A(@inbounds g[r, h, t, b])
    decay === :scalar && return A(@inbounds g[h, t, b])
    return zero(A)
end

"True when log decay `x` resets the state: `-inf`, or `exp(x)` is 0 in the state's type `S`."
@inline chunk_reset(x, ::Type{S}) where {S} = iszero(exp(S(x)))

"""
    chunk_factor(G, seg, r, h, tp, tj, j, b) -> A

The decay from after chunk-local step `j` (position `tj`) to position `tp`
(a later step of the same chunk): 0 when a reset lies between them (the
mask, applied before any exponential), else `exp(G_p - G_j)`.
"""
@inline function chunk_factor(G, seg, r, h, tp, tj, j, b)
    A = eltype(G)
    (@inbounds seg[r, h, tp, b]) <= j || return zero(A)
    return exp(@inbounds(G[r, h, tp, b]) - @inbounds(G[r, h, tj, b]))
end

"The decay from the chunk's start to position `tp`: 0 across a reset, else `exp(G_p)`."
@inline function chunk_start_factor(G, seg, r, h, tp, b)
    A = eltype(G)
    (@inbounds seg[r, h, tp, b]) == 0 || return zero(A)
    return exp(@inbounds G[r, h, tp, b])
end

"""
    matrix_chunk_prefix_kernel!(backend, wg)(G, seg, D, g, chunks, Val(S),
        Val(decay), Val(reversed); ndrange = Kd * H * nchunks)

Per (row, head, chunk): the cumulative log decays since the last reset and the
reset indices of the chunk's steps, and its total decay `D`.
"""
@kernel function matrix_chunk_prefix_kernel!(
    G,
    seg,
    D,
    @Const(g),
    @Const(chunks),
    ::Val{S},
    ::Val{decay},
    ::Val{reversed},
) where {S, decay, reversed}
    w = @index(Global, Linear)
    Kd, H = size(G, 1), size(G, 2)
    if w <= Kd * H * size(chunks, 2)
        A = eltype(G)
        r = (w - 1) % Kd + 1
        h = ((w - 1) ÷ Kd) % H + 1
        c = (w - 1) ÷ (Kd * H) + 1
        b, t0, len = @inbounds(chunks[2, c]),
            @inbounds(chunks[3, c]),
            @inbounds(chunks[4, c])
        total = zero(A)
        last = Int32(0)
        for s in 1:len
            t = chunk_position(t0, s, Val(reversed))
            x = chunk_log_decay(g, Val(decay), A, r, h, t, b)
            if decay !== :none && chunk_reset(x, S)
                total = zero(A)
                last = Int32(s)
            else
                total += x
            end
            @inbounds G[r, h, t, b] = total
            @inbounds seg[r, h, t, b] = last
        end
        @inbounds D[r, h, c] = last == 0 ? exp(total) : zero(A)
    end
end

"""
    matrix_chunk_scale_kernel!(backend, wg)(qd, kd, q, k, G, seg, chunks, slot,
        Val(decay), Val(bonus), Val(reversed); ndrange = K * H * T * batch)

Per (key row, head, position): `q` times its decay from the chunk's start
(`Gq`) and `k` times its decay to the chunk's end.
"""
@kernel function matrix_chunk_scale_kernel!(
    qd,
    kd,
    @Const(q),
    @Const(k),
    @Const(G),
    @Const(seg),
    @Const(chunks),
    @Const(slot),
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
) where {decay, bonus, reversed}
    w = @index(Global, Linear)
    nk, H, L = size(qd, 1), size(qd, 2), size(qd, 3)
    if w <= length(qd)
        A = eltype(qd)
        i, h, t, b = chunk_cell(w, nk, H, L)
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        r = decay === :key ? i : 1
        c, s = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        t0, len = @inbounds(chunks[3, c]), @inbounds(chunks[4, c])
        fq = if bonus && s == 1
            one(A)
        else
            chunk_start_factor(
                G,
                seg,
                r,
                h,
                bonus ? chunk_position(t0, s - 1, Val(reversed)) : t,
                b,
            )
        end
        tl = chunk_position(t0, len, Val(reversed))
        fk = chunk_factor(G, seg, r, h, tl, t, s, b)
        @inbounds qd[i, h, t, b] = A(q[i, hq, t, b]) * fq
        @inbounds kd[i, h, t, b] = A(k[i, hq, t, b]) * fk
    end
end

"""
    matrix_chunk_state_kernel!(backend, wg)(E, kd, v, chunks, Val(reversed);
        ndrange = V * K * H * nchunks)

Per state element `(j, i)`, head and chunk: the chunk's own contribution to its
end state, `E = (K o e^{G_last - G})^T V`.
"""
@kernel function matrix_chunk_state_kernel!(
    E,
    @Const(kd),
    @Const(v),
    @Const(chunks),
    ::Val{reversed},
) where {reversed}
    w = @index(Global, Linear)
    nv, nk, H = size(E, 1), size(E, 2), size(E, 3)
    if w <= length(E)
        A = eltype(E)
        j = (w - 1) % nv + 1
        i = ((w - 1) ÷ nv) % nk + 1
        h = ((w - 1) ÷ (nv * nk)) % H + 1
        c = (w - 1) ÷ (nv * nk * H) + 1
        b, t0, len = @inbounds(chunks[2, c]),
            @inbounds(chunks[3, c]),
            @inbounds(chunks[4, c])
        e = zero(A)
        for s in 1:len
            t = chunk_position(t0, s, Val(reversed))
            e += @inbounds(kd[i, h, t, b]) * A(@inbounds v[j, h, t, b])
        end
        @inbounds E[j, i, h, c] = e
    end
end

"""
    matrix_chunk_carry_kernel!(backend, wg)(S0, hlast, E, D, h0, firsts, Val(decay),
        Val(backward); ndrange = V * K * H * nseq)

Per state element `(j, i)`, head and sequence, in order over the sequence's
chunks: the state at each chunk's start, `S_end = D o S_0 + E` (`E` alone where
the state is 0, so a decay that overflows never meets a zero state), and the
final state. With `backward` the chunks run from the last: the same map carries
the adjoint of the chunks' end states from `dhlast` (as `h0`) to `dh0` (as
`hlast`).
"""
@kernel function matrix_chunk_carry_kernel!(
    S0,
    hlast,
    @Const(E),
    @Const(D),
    @Const(h0),
    @Const(firsts),
    ::Val{decay},
    ::Val{backward},
) where {decay, backward}
    w = @index(Global, Linear)
    nv, nk, H = size(hlast, 1), size(hlast, 2), size(hlast, 3)
    if w <= length(hlast)
        A = eltype(S0)
        j = (w - 1) % nv + 1
        i = ((w - 1) ÷ nv) % nk + 1
        h = ((w - 1) ÷ (nv * nk)) % H + 1
        n = (w - 1) ÷ (nv * nk * H) + 1
        s = h0 === nothing ? zero(A) : A(@inbounds h0[j, i, h, n])
        c0, nc = @inbounds(firsts[n]), @inbounds(firsts[n + 1]) - @inbounds(firsts[n])
        for cc in 1:nc
            c = backward ? c0 + nc - cc + 1 : c0 + cc
            @inbounds S0[j, i, h, c] = s
            e = @inbounds E[j, i, h, c]
            s = iszero(s) ? e : @inbounds(D[decay === :key ? i : 1, h, c]) * s + e
        end
        @inbounds hlast[j, i, h, n] = s
    end
end

"""
    matrix_chunk_intra_kernel!(backend, wg)(Aw, q, k, u, G, seg, chunks, slot,
        Val(decay), Val(bonus), Val(reversed); ndrange = C * H * T * batch)

Per (chunk-local step `j`, head, position of step `i`): the masked intra-chunk
weight `A_ij` (0 above the diagonal, and on it for the bonus readout, whose
diagonal is `q_i . (u o k_i)`, or 0 when `u` is `nothing`). Decays per key weigh
each key's product by its own factor; decays per head weigh the dot product.
`q` and `k` may have different head counts (each a divisor of `H`).
"""
@kernel function matrix_chunk_intra_kernel!(
    Aw,
    @Const(q),
    @Const(k),
    @Const(u),
    @Const(G),
    @Const(seg),
    @Const(chunks),
    @Const(slot),
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
) where {decay, bonus, reversed}
    w = @index(Global, Linear)
    C, H, L = size(Aw, 1), size(Aw, 2), size(Aw, 3)
    if w <= length(Aw)
        A = eltype(Aw)
        j, h, t, b = chunk_cell(w, C, H, L)
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        hk = (h - 1) ÷ (H ÷ size(k, 2)) + 1
        nk = size(q, 1)
        c, i = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        t0 = @inbounds chunks[3, c]
        tj = chunk_position(t0, j, Val(reversed))
        acc = zero(A)
        if bonus && j == i
            if u !== nothing
                for x in 1:nk
                    acc += A(@inbounds q[x, hq, t, b]) *
                        A(@inbounds u[x, h]) *
                        A(@inbounds k[x, hk, t, b])
                end
            end
        elseif j < i || (!bonus && j == i)
            tp = bonus ? chunk_position(t0, i - 1, Val(reversed)) : t
            if decay === :key
                for x in 1:nk
                    f = chunk_factor(G, seg, x, h, tp, tj, j, b)
                    acc += A(@inbounds q[x, hq, t, b]) * A(@inbounds k[x, hk, tj, b]) * f
                end
            else
                for x in 1:nk
                    acc += A(@inbounds q[x, hq, t, b]) * A(@inbounds k[x, hk, tj, b])
                end
                acc *= chunk_factor(G, seg, 1, h, tp, tj, j, b)
            end
        end
        @inbounds Aw[j, h, t, b] = acc
    end
end

"""
    matrix_chunk_output_kernel!(backend, wg)(o, qd, S0, Aw, v, chunks, slot, Val(reversed);
        ndrange = V * H * T * batch)

Per (value column, head, position): `o_i = qd_i . S_0 + sum_{j <= i} A_ij v_j`.
"""
@kernel function matrix_chunk_output_kernel!(
    o,
    @Const(qd),
    @Const(S0),
    @Const(Aw),
    @Const(v),
    @Const(chunks),
    @Const(slot),
    ::Val{reversed},
) where {reversed}
    w = @index(Global, Linear)
    nv, H, L = size(o, 1), size(o, 2), size(o, 3)
    if w <= length(o)
        A = eltype(qd)
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        t = ((w - 1) ÷ (nv * H)) % L + 1
        b = (w - 1) ÷ (nv * H * L) + 1
        c, i = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        t0 = @inbounds chunks[3, c]
        acc = zero(A)
        for x in axes(qd, 1)
            acc += @inbounds(qd[x, h, t, b]) * @inbounds(S0[j, x, h, c])
        end
        for s in 1:i
            ts = chunk_position(t0, s, Val(reversed))
            acc += @inbounds(Aw[s, h, t, b]) * A(@inbounds v[j, h, ts, b])
        end
        @inbounds o[j, h, t, b] = convert(eltype(o), acc)
    end
end
