# The delta rule (`src/matrix/delta.jl`: the `delta` form of DeltaNet, Gated
# DeltaNet and KDA, the `dplr` form of RWKV-7) in its chunked (WY / UT
# transform) form, forward, in
# KernelAbstractions kernels that run on every backend. Each sequence is cut
# into chunks of `C` steps; inside a chunk, with the cumulative log decays G
# since the last reset (per head or per key row; `src/matrix/chunked.jl`'s
# prefix), Gamma_ij = e^{G_i - G_j} (0 across a reset), S_0 the state at the
# chunk's start and u_t = beta_t (v_t - S'_t' k_t) the recurrence's new values:
#
#     N     = strict-lower(K K' o Gamma)
#     U     = (I + diag(beta) N)^{-1} diag(beta) (V - (K o e^G) S_0)
#           = Uv - W S_0,  Uv = T V,  W = T (K o e^G),  T = (I + diag(beta) N)^{-1} diag(beta)
#     O     = (Q o e^G) S_0 + (Q K' o Gamma o M_incl) U
#     S_end = e^{G_last} o S_0 + (K o e^{G_last - G})' U
#
# `T` is applied by forward substitution, one work-item per right-hand column
# (a key row of K o e^G, or a value column), all chunks at once; only the
# chunk-start states cross chunks. The chunk transition is dense in the keys
# (S_end = (e^{G_last} - (K o e^{G_last - G})' W) S_0 + ...), but a column j of
# the state still depends on column j only, so the carry is one work-item per
# (value column, head, sequence) walking its chunks in order: u_i[j] =
# Uv_i[j] - W_i . S_0[:, j], then S_end[:, j]. The outputs are the matrix
# chunked form's with U in place of V. Every factor of a chunk whose log
# decays are all non-positive (or -inf) has a non-positive exponent; a chunk
# with a positive or NaN log decay (growth) runs the recurrence itself in the
# carry (its work-item writes the chunk's outputs), so growth is computed as
# the recurrence defines it. Sums are held in the accumulator type `A` of
# [`chunk_accumulator`](@ref).
#
# The `dplr` form (S_t = D_t S_{t-1} + b_t p_t' + k_t v_t', p_t = S_{t-1}' a_t)
# has the same shape with the projections p in place of u. With a'_i = a_i o
# e^{G_{i-1}} (the decay before step i: the state a_i reads is S_{i-1}),
#
#     L_ab  = strict-lower(A B' o Gamma_prev),  L_ak = strict-lower(A K' o Gamma_prev)
#     P     = (I - L_ab)^{-1} (A' S_0 + L_ak V) = Pv + W S_0
#     O     = (Q o e^G) S_0 + (Q B' o Gamma o M_incl) P + (Q K' o Gamma o M_incl) V
#     S_end = e^{G_last} o S_0 + (B o e^{G_last - G})' P + (K o e^{G_last - G})' V
#
# with Gamma_prev_ij = e^{G_{i-1} - G_j} (j < i, so still a non-positive
# exponent), Pv = (I - L_ab)^{-1} L_ak V and W = (I - L_ab)^{-1} A'; the
# carry forms p_i[j] = Pv_i[j] + W_i . S_0[:, j].
#
# Scratch beyond the matrix chunked form's (`src/matrix/chunked.jl`): `qn`, `kn`
# `(K, Hq, T, batch)` (q and k L2-normalised, with `l2norm`); `grow` `(H,
# nchunks)` (1 where a chunk grows); `kg` `(K, H, T, batch)` (k times its decay
# from the chunk's start); `N` `(C, H, T, batch)` (K K' o Gamma, read below the
# diagonal); `W` `(K, H, T, batch)`, `Uv`, `U` `(V, H, T, batch)`. The dplr
# form has no `kg`; its `N` holds L_ab, and `Lak`, `Bq` `(C, H, T, batch)` (L_ak
# and Q B' o Gamma o M_incl), `ad`, `bd` `(K, H, T, batch)` (a' and b o
# e^{G_last - G}) are added; `U` holds P.

"Time steps per chunk of the delta rule's chunked form unless given."
const DEFAULT_DELTA_CHUNK = 32

"""
    delta_chunk_norm_kernel!(backend, wg)(qn, kn, q, k; ndrange = Hq * T * batch)

Per (q/k head, position): `q` and `k` L2-normalised as the recurrence does
(`x / sqrt(sum(x .^ 2) + DELTA_L2_EPS)`), in the accumulator type.
"""
@kernel function delta_chunk_norm_kernel!(qn, kn, @Const(q), @Const(k))
    w = @index(Global, Linear)
    nk, Hq, L = size(qn, 1), size(qn, 2), size(qn, 3)
    if w <= Hq * L * size(qn, 4)
        A = eltype(qn)
        hq = (w - 1) % Hq + 1
        t = ((w - 1) ÷ Hq) % L + 1
        b = (w - 1) ÷ (Hq * L) + 1
        sq, sk = zero(A), zero(A)
        for x in 1:nk
            sq += A(@inbounds q[x, hq, t, b])^2
            sk += A(@inbounds k[x, hq, t, b])^2
        end
        rq, rk = inv(sqrt(sq + A(DELTA_L2_EPS))), inv(sqrt(sk + A(DELTA_L2_EPS)))
        for x in 1:nk
            @inbounds qn[x, hq, t, b] = A(q[x, hq, t, b]) * rq
            @inbounds kn[x, hq, t, b] = A(k[x, hq, t, b]) * rk
        end
    end
end

"Whether the log decay of row `r` at `(h, t, b)` grows the state (positive or NaN); never without decay."
@inline function delta_grows(g, ::Val{decay}, r, h, t, b) where {decay}
    decay === :none && return false
    x = decay === :key ? @inbounds(g[r, h, t, b]) : @inbounds(g[h, t, b])
    return x > 0 || isnan(x)
end

"""
    delta_chunk_grow_kernel!(backend, wg)(grow, g, chunks, Val(decay); ndrange = H * nchunks)

Per (head, chunk): 1 when a log decay of the chunk (any key row) is positive
or NaN (the chunk runs the recurrence), else 0.
"""
@kernel function delta_chunk_grow_kernel!(
    grow,
    @Const(g),
    @Const(chunks),
    ::Val{decay},
) where {decay}
    w = @index(Global, Linear)
    H = size(grow, 1)
    if w <= length(grow)
        h = (w - 1) % H + 1
        c = (w - 1) ÷ H + 1
        b, t0, len = @inbounds(chunks[2, c]),
            @inbounds(chunks[3, c]),
            @inbounds(chunks[4, c])
        rows = decay === :key ? size(g, 1) : 1
        flag = Int32(0)
        for s in 1:len, r in 1:rows
            delta_grows(g, Val(decay), r, h, t0 + s - 1, b) && (flag = Int32(1))
        end
        @inbounds grow[h, c] = flag
    end
end

"""
    delta_solve_column!(X, x, R, rx, N, beta, h, b, t0, len)

Forward substitution of one right-hand column over one chunk: `X[x, h, t, b] =
beta_i (R[rx, h, t, b] - sum_{j < i} N_ij X[x, h, t_j, b])` for the chunk's
steps `i` in order (`N_ij = N[j, h, t_i, b]`).
"""
@inline function delta_solve_column!(X, x, R, rx, N, beta, h, b, t0, len)
    A = eltype(X)
    for i in 1:len
        t = t0 + i - 1
        acc = A(@inbounds R[rx, h, t, b])
        for j in 1:(i - 1)
            acc -= @inbounds(N[j, h, t, b]) * @inbounds(X[x, h, t0 + j - 1, b])
        end
        @inbounds X[x, h, t, b] = A(beta[h, t, b]) * acc
    end
    return nothing
end

"""
    dplr_solve_column!(X, x, R, rx, N, M, h, b, t0, len)

The dplr form's forward substitution of one right-hand column over one chunk:
`X_i = R_i + sum_{j < i} N_ij X_j` with `R_i = R[rx, h, t_i, b]`, or, with a
matrix `M`, `R_i = sum_{j < i} M_ij R[rx, h, t_j, b]` (`L_ak V`).
"""
@inline function dplr_solve_column!(X, x, R, rx, N, M, h, b, t0, len)
    A = eltype(X)
    for i in 1:len
        t = t0 + i - 1
        acc = M === nothing ? A(@inbounds R[rx, h, t, b]) : zero(A)
        for j in 1:(i - 1)
            tj = t0 + j - 1
            if M !== nothing
                acc += @inbounds(M[j, h, t, b]) * A(@inbounds R[rx, h, tj, b])
            end
            acc += @inbounds(N[j, h, t, b]) * @inbounds(X[x, h, tj, b])
        end
        @inbounds X[x, h, t, b] = acc
    end
    return nothing
end

"""
    delta_chunk_solve_kernel!(backend, wg)(W, Uv, N, kg, v, beta, grow, chunks, M,
        Val(form); ndrange = (K + V) * H * nchunks)

Per right-hand column (a key row of `kg`, then a value column of `v`), head and
chunk: `W = T kg` and `Uv = T V` with `T = (I + diag(beta) N)^{-1} diag(beta)`
(the delta form; `M` is `nothing`), or `W = (I - N)^{-1} kg` and `Uv = (I -
N)^{-1} M V` (dplr: `N` = L_ab, `kg` = a', `M` = L_ak; `beta` unused); zeros
in a chunk that grows, which the carry runs itself.
"""
@kernel function delta_chunk_solve_kernel!(
    W,
    Uv,
    @Const(N),
    @Const(kg),
    @Const(v),
    @Const(beta),
    @Const(grow),
    @Const(chunks),
    @Const(M),
    ::Val{form},
) where {form}
    w = @index(Global, Linear)
    nk, nv, H = size(W, 1), size(Uv, 1), size(W, 2)
    cols = nk + nv
    if w <= cols * H * size(chunks, 2)
        x = (w - 1) % cols + 1
        h = ((w - 1) ÷ cols) % H + 1
        c = (w - 1) ÷ (cols * H) + 1
        b, t0, len = @inbounds(chunks[2, c]),
            @inbounds(chunks[3, c]),
            @inbounds(chunks[4, c])
        if @inbounds(grow[h, c]) != 0
            for i in 1:len
                if x <= nk
                    @inbounds W[x, h, t0 + i - 1, b] = zero(eltype(W))
                else
                    @inbounds Uv[x - nk, h, t0 + i - 1, b] = zero(eltype(Uv))
                end
            end
        elseif form === :dplr
            if x <= nk
                dplr_solve_column!(W, x, kg, x, N, nothing, h, b, t0, len)
            else
                dplr_solve_column!(Uv, x - nk, v, x - nk, N, M, h, b, t0, len)
            end
        elseif x <= nk
            delta_solve_column!(W, x, kg, x, N, beta, h, b, t0, len)
        else
            delta_solve_column!(Uv, x - nk, v, x - nk, N, beta, h, b, t0, len)
        end
    end
end

"`sum_x W[x, h, t, b] * s[x]` over the state column `s`."
@inline function delta_chunk_dot(W, s::Tuple{A, Vararg{A, rest}}, h, t, b) where {A, rest}
    return sum(ntuple(x -> @inbounds(W[x, h, t, b]) * s[x], Val(rest + 1)))
end

"The state column `s` times the chunk's total decay `D` (per key row or one value)."
@inline function delta_chunk_decayed(
    s::Tuple{A, Vararg{A, rest}},
    D,
    ::Val{decay},
    h,
    c,
) where {A, rest, decay}
    return ntuple(x -> @inbounds(D[decay === :key ? x : 1, h, c]) * s[x], Val(rest + 1))
end

"`e + kd[:, h, t, b] * u`: one step's contribution to the chunk's end state."
@inline function delta_chunk_add(
    e::Tuple{A, Vararg{A, rest}},
    kd,
    u,
    h,
    t,
    b,
) where {A, rest}
    return ntuple(x -> e[x] + @inbounds(kd[x, h, t, b]) * u, Val(rest + 1))
end

"""
    delta_chunk_recurrent(s, o, q, k, v, g, beta, a, bb, j, h, hq, b, t0, len,
                          Val(K), Val(gate), Val(form), Val(l2norm)) -> s

The recurrence itself over one chunk of one state column (a chunk that grows):
writes `o[j, h, t, b]` for its steps and returns the column after them.
"""
@inline function delta_chunk_recurrent(
    s,
    o,
    q,
    k,
    v,
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
    ::Val{form},
    ::Val{l2norm},
) where {nk, gate, form, l2norm}
    A = eltype(s)
    for t in t0:(t0 + len - 1)
        qs = delta_keys(q, A, Val(nk), Val(l2norm), hq, t, b)
        ks = delta_keys(k, A, Val(nk), Val(l2norm), hq, t, b)
        vj = A(@inbounds v[j, h, t, b])
        s, y = delta_forward_step(
            s,
            qs,
            ks,
            g,
            beta,
            a,
            bb,
            vj,
            Val(gate),
            Val(form),
            h,
            t,
            b,
        )
        @inbounds o[j, h, t, b] = convert(eltype(o), y)
    end
    return s
end

"""
    delta_chunk_carry_kernel!(backend, wg)(S0, U, o, hlast, W, Uv, kd, D, grow, h0,
        q, k, v, g, beta, a, b, bd, chunks, firsts, Val(K), Val(gate), Val(form),
        Val(l2norm); ndrange = V * H * nseq)

Per (value column `j`, head, sequence), in order over the sequence's chunks:
the state column at each chunk's start (`S0`), the chunk's new values `u_i[j]
= Uv_i[j] - W_i . S_0[:, j]` (`U`) and `S_end = e^{G_last} o S_0 + sum_i kd_i
u_i[j]` (dplr: the projections `p_i[j] = Uv_i[j] + W_i . S_0[:, j]` and
`S_end = e^{G_last} o S_0 + sum_i bd_i p_i[j] + kd_i v_i[j]`); a chunk that
grows runs the recurrence and writes its outputs. The final column goes to
`hlast`.
"""
@kernel function delta_chunk_carry_kernel!(
    S0,
    U,
    o,
    hlast,
    @Const(W),
    @Const(Uv),
    @Const(kd),
    @Const(D),
    @Const(grow),
    @Const(h0),
    @Const(q),
    @Const(k),
    @Const(v),
    @Const(g),
    @Const(beta),
    @Const(a),
    @Const(bb),
    @Const(bd),
    @Const(chunks),
    @Const(firsts),
    ::Val{nk},
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
) where {nk, gate, form, l2norm}
    w = @index(Global, Linear)
    delta_chunk_carry_item!(
        w,
        S0,
        U,
        o,
        hlast,
        W,
        Uv,
        kd,
        D,
        grow,
        h0,
        q,
        k,
        v,
        g,
        beta,
        a,
        bb,
        bd,
        chunks,
        firsts,
        Val(nk),
        Val(gate),
        Val(form),
        Val(l2norm),
    )
end

"""
The work-item `w` of [`delta_chunk_carry_kernel!`](@ref): on the CPU a plain
loop ([`launch_items!`](@ref)), where KernelAbstractions' CPU backend ran this
loop of `K`-tuples about 80 times slower.
"""
@inline function delta_chunk_carry_item!(
    w,
    S0,
    U,
    o,
    hlast,
    W,
    Uv,
    kd,
    D,
    grow,
    h0,
    q,
    k,
    v,
    g,
    beta,
    a,
    bb,
    bd,
    chunks,
    firsts,
    ::Val{nk},
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
) where {nk, gate, form, l2norm}
    nv, H = size(hlast, 1), size(hlast, 3)
    if w <= nv * H * size(hlast, 4)
        A = eltype(S0)
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        n = (w - 1) ÷ (nv * H) + 1
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        s = matrix_initial(h0, A, Val(nk), j, h, n)
        c0, nc = @inbounds(firsts[n]), @inbounds(firsts[n + 1]) - @inbounds(firsts[n])
        for c in (c0 + 1):(c0 + nc)
            b, t0, len = @inbounds(chunks[2, c]),
                @inbounds(chunks[3, c]),
                @inbounds(chunks[4, c])
            for x in 1:nk
                @inbounds S0[j, x, h, c] = s[x]
            end
            if @inbounds(grow[h, c]) != 0
                s = delta_chunk_recurrent(
                    s,
                    o,
                    q,
                    k,
                    v,
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
                e = delta_chunk_decayed(s, D, Val(gate), h, c)
                for t in t0:(t0 + len - 1)
                    if form === :dplr
                        p = @inbounds(Uv[j, h, t, b]) + delta_chunk_dot(W, s, h, t, b)
                        @inbounds U[j, h, t, b] = p
                        e = delta_chunk_add(e, bd, p, h, t, b)
                        e = delta_chunk_add(e, kd, A(@inbounds v[j, h, t, b]), h, t, b)
                    else
                        u = @inbounds(Uv[j, h, t, b]) - delta_chunk_dot(W, s, h, t, b)
                        @inbounds U[j, h, t, b] = u
                        e = delta_chunk_add(e, kd, u, h, t, b)
                    end
                end
                s = e
            end
        end
        for x in 1:nk
            @inbounds hlast[j, x, h, n] = s[x]
        end
    end
end

"""
    delta_chunk_output_kernel!(backend, wg)(o, qd, S0, Aw, U, grow, chunks, slot,
        Bq, v, Val(form); ndrange = V * H * T * batch)

Per (value column, head, position) of a chunk that does not grow:
`o_i = qd_i . S_0 + sum_{j <= i} A_ij u_j` (dplr: `o_i = qd_i . S_0 + sum_{j <=
i} Bq_ij p_j + A_ij v_j`; the carry wrote the others).
"""
@kernel function delta_chunk_output_kernel!(
    o,
    @Const(qd),
    @Const(S0),
    @Const(Aw),
    @Const(U),
    @Const(grow),
    @Const(chunks),
    @Const(slot),
    @Const(Bq),
    @Const(v),
    ::Val{form},
) where {form}
    w = @index(Global, Linear)
    nv, H, L = size(o, 1), size(o, 2), size(o, 3)
    if w <= length(o)
        A = eltype(qd)
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        t = ((w - 1) ÷ (nv * H)) % L + 1
        b = (w - 1) ÷ (nv * H * L) + 1
        c, i = @inbounds(slot[1, t, b]), @inbounds(slot[2, t, b])
        if c > 0 && @inbounds(grow[h, c]) == 0
            t0 = @inbounds chunks[3, c]
            acc = zero(A)
            for x in axes(qd, 1)
                acc += @inbounds(qd[x, h, t, b]) * @inbounds(S0[j, x, h, c])
            end
            for s in 1:i
                ts = t0 + s - 1
                if form === :dplr
                    acc += @inbounds(Bq[s, h, t, b]) * @inbounds(U[j, h, ts, b]) +
                        @inbounds(Aw[s, h, t, b]) * A(@inbounds v[j, h, ts, b])
                else
                    acc += @inbounds(Aw[s, h, t, b]) * @inbounds(U[j, h, ts, b])
                end
            end
            @inbounds o[j, h, t, b] = convert(eltype(o), acc)
        end
    end
end

"""
    delta_chunk_forward!(backend, wg, C, o, hlast, q, k, v, g, beta, a, b, h0,
                         cu_seqlens, Val(gate), Val(form), Val(l2norm)) -> parts

The chunked delta-rule forward (the `delta` form with `beta`, or the `dplr`
form with `a` and `b`; `src/matrix/delta_chunked.jl`) with chunks of `C`
steps: writes `o` and the final states `hlast` `(V, K, H, nseq)`;
`cu_seqlens` is a host vector or `nothing`. Returns the chunk products its
kernels built (`parts`: the chunk tables `chunks`, `firsts`, `slot`, the
chunk-start states `S0` `(V, K, H, nchunks)`, `grow`, `D`, `qd`, `kd`, `W`,
`Aw`, and the dplr form's `Bq`, `bd`, else `nothing`), which the chunked
backward (`src/matrix/delta_chunked_backward.jl`) reads.
"""
function delta_chunk_forward!(
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
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
) where {gate, form, l2norm}
    nk, Hq, (nv, H, L, batch) = size(q, 1), size(q, 2), size(v)
    S = eltype(hlast)
    A = chunk_accumulator(backend, S)
    chunks, firsts, slot, nch, Cw = matrix_chunk_tables_on(
        backend,
        cu_seqlens,
        batch,
        L,
        C,
        false,
    )
    Kd = gate === :key ? nk : 1
    dplr = form === :dplr
    alloc(T, dims...) = KernelAbstractions.allocate(backend, T, dims)
    qn, kn = if l2norm
        qn_, kn_ = alloc(A, nk, Hq, L, batch), alloc(A, nk, Hq, L, batch)
        launch_chunk_kernel!(
            delta_chunk_norm_kernel!,
            backend,
            wg,
            Hq * L * batch,
            (qn_, kn_, q, k),
        )
        qn_, kn_
    else
        q, k
    end
    G, seg, D = alloc(A, Kd, H, L, batch),
        alloc(Int32, Kd, H, L, batch),
        alloc(A, Kd, H, nch)
    grow = alloc(Int32, H, nch)
    qd, kd, kg = ntuple(_ -> alloc(A, nk, H, L, batch), 3)
    N, Aw = alloc(A, Cw, H, L, batch), alloc(A, Cw, H, L, batch)
    W, Uv, U = alloc(A, nk, H, L, batch),
        alloc(A, nv, H, L, batch),
        alloc(A, nv, H, L, batch)
    S0 = alloc(A, nv, nk, H, nch)
    flags = (Val(gate), Val(false), Val(false))
    launch_chunk_kernel!(
        matrix_chunk_prefix_kernel!,
        backend,
        wg,
        Kd * H * nch,
        (G, seg, D, g, chunks, Val(S), Val(gate), Val(false)),
    )
    launch_chunk_kernel!(
        delta_chunk_grow_kernel!,
        backend,
        wg,
        H * nch,
        (grow, g, chunks, Val(gate)),
    )
    scale = (G, seg, chunks, slot, flags...)
    prev = (G, seg, chunks, slot, Val(gate), Val(true), Val(false))
    launch_chunk_kernel!(
        matrix_chunk_scale_kernel!,
        backend,
        wg,
        length(qd),
        (qd, kd, qn, kn, scale...),
    )
    # the rows the solve takes (delta: kg = K o e^G; dplr: kg = a', bd = b o e^{G_last - G})
    bd, Lak, Bq = if dplr
        bd_ = alloc(A, nk, H, L, batch)
        launch_chunk_kernel!(
            matrix_chunk_scale_kernel!,
            backend,
            wg,
            length(kg),
            (kg, bd_, a, b, prev...),
        )
        Lak_, Bq_ = alloc(A, Cw, H, L, batch), alloc(A, Cw, H, L, batch)
        launch_chunk_kernel!(
            matrix_chunk_intra_kernel!,
            backend,
            wg,
            length(Lak_),
            (Lak_, a, kn, nothing, prev...),
        )
        launch_chunk_kernel!(
            matrix_chunk_intra_kernel!,
            backend,
            wg,
            length(Bq_),
            (Bq_, qn, b, nothing, scale...),
        )
        bd_, Lak_, Bq_
    else
        launch_chunk_kernel!(
            matrix_chunk_scale_kernel!,
            backend,
            wg,
            length(kg),
            (kg, kd, kn, kn, scale...),
        )
        nothing, nothing, nothing
    end
    launch_chunk_kernel!(
        matrix_chunk_intra_kernel!,
        backend,
        wg,
        length(N),
        dplr ? (N, a, b, nothing, prev...) : (N, kn, kn, nothing, scale...),
    )
    launch_chunk_kernel!(
        matrix_chunk_intra_kernel!,
        backend,
        wg,
        length(Aw),
        (Aw, qn, kn, nothing, scale...),
    )
    launch_chunk_kernel!(
        delta_chunk_solve_kernel!,
        backend,
        wg,
        (nk + nv) * H * nch,
        (W, Uv, N, kg, v, beta, grow, chunks, Lak, Val(form)),
    )
    launch_items!(
        delta_chunk_carry_item!,
        delta_chunk_carry_kernel!,
        backend,
        wg,
        length(hlast) ÷ nk,
        (
            S0,
            U,
            o,
            hlast,
            W,
            Uv,
            kd,
            D,
            grow,
            h0,
            q,
            k,
            v,
            g,
            beta,
            a,
            b,
            bd,
            chunks,
            firsts,
            Val(nk),
            Val(gate),
            Val(form),
            Val(l2norm),
        );
        work = L * nk,
    )
    launch_chunk_kernel!(
        delta_chunk_output_kernel!,
        backend,
        wg,
        length(o),
        (o, qd, S0, Aw, U, grow, chunks, slot, Bq, v, Val(form)),
    )
    return (; chunks, firsts, slot, S0, grow, D, qd, kd, W, Aw, Bq, bd)
end
