# The matrix-state scan's backward (the adjoint of `src/matrix/state.jl`),
# recurrent and without stored states, as the OpenCL/CUDA kernels of
# `scanweaver.targets.fused_gpu_matrix_state` do it. With G_t = dL/dS_t:
#
# * values: one work-item per (column j, head, sequence) carries G's column j
#   in reverse and writes dv (and dh0);
# * keys: one work-item per (row i, q/k head, sequence) runs the heads of its
#   group one after another (so dq and dk, sums over a group's heads, have one
#   writer): a forward sweep of S's row i gives dq and leaves x_t = q_t[i] dq'_t[i]
#   (dq without the bonus term) per row; a reverse sweep of G's row i gives dk
#   and the per-row decay gradient
#       dg_t[i] = sum_{s >= t} x_s - sum_{s >= t} k_s[i] dk'_s[i] + sum_j dhlast[i, j] hlast[i, j]
#   (bonus: the x sum starts at s > t). A scalar decay sums that over rows and
#   du sums over sequences afterwards, on the device, so no work-items race.

@inline function matrix_row(::Nothing, ::Type{T}, ::Val{nv}, i, h, n) where {T, nv}
    return ntuple(_ -> zero(T), Val(nv))
end

@inline function matrix_row(A::AbstractArray, ::Type{T}, ::Val{nv}, i, h, n) where {T, nv}
    return ntuple(j -> T(@inbounds A[j, i, h, n]), Val(nv))
end

@inline function matrix_store!(::Nothing, s, j, h, n)
    return nothing
end

@inline function matrix_store!(A::AbstractArray, s::NTuple{nk}, j, h, n) where {nk}
    for i in 1:nk
        @inbounds A[j, i, h, n] = s[i]
    end
    return nothing
end

"""
    matrix_values_step(G, q, k, g, u, dj, Val(decay), Val(bonus), hq, h, t, b) -> (G, dv)

One reverse step of G's column (an `NTuple{K}`): the column before step `t` and
`dv_t[j]`.
"""
@inline function matrix_values_step(
    G::Tuple{T, Vararg{T, rest}},
    q,
    k,
    g,
    u,
    dj,
    ::Val{decay},
    ::Val{bonus},
    hq,
    h,
    t,
    b,
) where {rest, T, decay, bonus}
    nk = rest + 1
    qs = ntuple(i -> T(@inbounds q[i, hq, t, b]), Val(nk))
    ks = ntuple(i -> T(@inbounds k[i, hq, t, b]), Val(nk))
    ds = ntuple(i -> matrix_decay(g, Val(decay), T, i, h, t, b), Val(nk))
    if bonus
        us = ntuple(i -> T(@inbounds u[i, h]), Val(nk))
        dv = sum(ntuple(i -> (G[i] + qs[i] * us[i] * dj) * ks[i], Val(nk)))
        return ntuple(i -> ds[i] * G[i] + qs[i] * dj, Val(nk)), dv
    end
    Gt = ntuple(i -> G[i] + qs[i] * dj, Val(nk))
    return ntuple(i -> ds[i] * Gt[i], Val(nk)), sum(ntuple(i -> Gt[i] * ks[i], Val(nk)))
end

"""
    matrix_keys_forward(S, v, dout, di, ki, Val(bonus), h, t, b) -> (S, dq', w)

One forward step of S's row (an `NTuple{V}`): the new row, `dq'_t[i]` (the
readout's part of dq) and `w_t = v_t . do_t` (bonus only, else zero).
"""
@inline function matrix_keys_forward(
    S::Tuple{T, Vararg{T, rest}},
    v,
    dout,
    di,
    ki,
    ::Val{bonus},
    h,
    t,
    b,
) where {rest, T, bonus}
    nv = rest + 1
    vs = ntuple(j -> T(@inbounds v[j, h, t, b]), Val(nv))
    ds = ntuple(j -> T(@inbounds dout[j, h, t, b]), Val(nv))
    new = ntuple(j -> di * S[j] + ki * vs[j], Val(nv))
    if bonus
        return new,
            sum(ntuple(j -> S[j] * ds[j], Val(nv))),
            sum(ntuple(j -> vs[j] * ds[j], Val(nv)))
    end
    return new, sum(ntuple(j -> new[j] * ds[j], Val(nv))), zero(T)
end

"""
    matrix_keys_reverse(G, v, dout, qi, di, Val(bonus), h, t, b) -> (G, dk', w)

One reverse step of G's row: the row before step `t`, `dk'_t[i]` (G_t's part
of dk) and `w_t` (bonus only, else zero).
"""
@inline function matrix_keys_reverse(
    G::Tuple{T, Vararg{T, rest}},
    v,
    dout,
    qi,
    di,
    ::Val{bonus},
    h,
    t,
    b,
) where {rest, T, bonus}
    nv = rest + 1
    vs = ntuple(j -> T(@inbounds v[j, h, t, b]), Val(nv))
    ds = ntuple(j -> T(@inbounds dout[j, h, t, b]), Val(nv))
    if bonus
        dk = sum(ntuple(j -> G[j] * vs[j], Val(nv)))
        w = sum(ntuple(j -> vs[j] * ds[j], Val(nv)))
        return ntuple(j -> di * G[j] + qi * ds[j], Val(nv)), dk, w
    end
    Gt = ntuple(j -> G[j] + qi * ds[j], Val(nv))
    return ntuple(j -> di * Gt[j], Val(nv)),
        sum(ntuple(j -> Gt[j] * vs[j], Val(nv))),
        zero(T)
end

@inline matrix_row_dot(::Nothing, S, i, h, n) = zero(eltype(S))

@inline function matrix_row_dot(A::AbstractArray, S::NTuple{nv}, i, h, n) where {nv}
    acc = zero(eltype(S))
    for j in 1:nv
        acc += @inbounds A[j, i, h, n] * S[j]
    end
    return acc
end

"""
    matrix_values_item!(w, dv, dh0, q, k, g, u, dout, dhlast, cu_seqlens, nseq,
                        Val(K), Val(decay), Val(bonus), Val(reverse), Val(workgroupsize))

dv (and dh0) of the matrix-state scan: work-item `w` carries column
`(w - 1) % V + 1` of G for head `((w - 1) ÷ V) % H + 1` of sequence
`(w - 1) ÷ (V * H) + 1` from the last step to the first.
"""
@inline function matrix_values_item!(
    w,
    dv,
    dh0,
    q,
    k,
    g,
    u,
    dout,
    dhlast,
    cu_seqlens,
    nseq,
    ::Val{nk},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{workgroupsize},
) where {nk, decay, bonus, reversed, workgroupsize}
    nv, H = size(dv, 1), size(dv, 2)
    if w <= nv * H * nseq
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        n = (w - 1) ÷ (nv * H) + 1
        b, start, len = matrix_segment(cu_seqlens, n, size(dv, 3))
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        T = eltype(dv)
        G = matrix_initial(dhlast, T, Val(nk), j, h, n)
        for step in len:-1:1
            t = reversed ? start + len - step : start + step - 1
            dj = T(@inbounds dout[j, h, t, b])
            G, y = matrix_values_step(
                G,
                q,
                k,
                g,
                u,
                dj,
                Val(decay),
                Val(bonus),
                hq,
                h,
                t,
                b,
            )
            @inbounds dv[j, h, t, b] = y
        end
        matrix_store!(dh0, G, j, h, n)
    end
    return nothing
end

"""
    matrix_values_kernel!(backend, workgroupsize)(
        dv, dh0, q, k, g, u, dout, dhlast, cu_seqlens, nseq,
        Val(K), Val(decay), Val(bonus), Val(reverse), Val(workgroupsize);
        ndrange = V * H * nseq,
    )

[`matrix_values_item!`](@ref) on a device.
"""
@kernel function matrix_values_kernel!(
    dv,
    dh0,
    @Const(q),
    @Const(k),
    @Const(g),
    @Const(u),
    @Const(dout),
    @Const(dhlast),
    @Const(cu_seqlens),
    nseq,
    ::Val{nk},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{workgroupsize},
) where {nk, decay, bonus, reversed, workgroupsize}
    w = @index(Global, Linear)
    flags = (Val(nk), Val(decay), Val(bonus), Val(reversed), Val(workgroupsize))
    matrix_values_item!(w, dv, dh0, q, k, g, u, dout, dhlast, cu_seqlens, nseq, flags...)
end

"""
    matrix_keys_item!(w, dq, dk, rows, du_rows, q, k, v, g, u, h0, dout, dhlast, cu_seqlens, nseq,
                      Val(V), Val(decay), Val(bonus), Val(reverse), Val(workgroupsize))

dq and dk (added into zeroed arrays), the per-row decay gradients `rows`
`(K, H, T, batch)` (or `nothing` without decay) and the per-sequence bonus
gradients `du_rows` `(K, H, nseq)` (or `nothing`): work-item `w` runs row
`(w - 1) % K + 1` of every head of q/k head `((w - 1) ÷ K) % Hq + 1` of
sequence `(w - 1) ÷ (K * Hq) + 1`.
"""
@inline function matrix_keys_item!(
    w,
    dq,
    dk,
    rows,
    du_rows,
    q,
    k,
    v,
    g,
    u,
    h0,
    dout,
    dhlast,
    cu_seqlens,
    nseq,
    ::Val{nv},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{workgroupsize},
) where {nv, decay, bonus, reversed, workgroupsize}
    nk, Hq = size(q, 1), size(q, 2)
    group = size(dout, 2) ÷ Hq
    if w <= nk * Hq * nseq
        i = (w - 1) % nk + 1
        hq = ((w - 1) ÷ nk) % Hq + 1
        n = (w - 1) ÷ (nk * Hq) + 1
        b, start, len = matrix_segment(cu_seqlens, n, size(dout, 3))
        T = eltype(dq)
        for h in ((hq - 1) * group + 1):(hq * group)
            ui = bonus ? T(@inbounds u[i, h]) : zero(T)
            S = matrix_row(h0, T, Val(nv), i, h, n)
            duacc = zero(T)
            for step in 1:len
                t = reversed ? start + len - step : start + step - 1
                qi, ki = T(@inbounds q[i, hq, t, b]), T(@inbounds k[i, hq, t, b])
                di = matrix_decay(g, Val(decay), T, i, h, t, b)
                S, dqt, wt = matrix_keys_forward(S, v, dout, di, ki, Val(bonus), h, t, b)
                duacc += qi * ki * wt
                @inbounds dq[i, hq, t, b] += dqt + ui * ki * wt
                if decay !== :none
                    @inbounds rows[i, h, t, b] = qi * dqt
                end
            end
            hterm = matrix_row_dot(dhlast, S, i, h, n)
            G = matrix_row(dhlast, T, Val(nv), i, h, n)
            rq, rk = zero(T), zero(T)
            for step in len:-1:1
                t = reversed ? start + len - step : start + step - 1
                qi, ki = T(@inbounds q[i, hq, t, b]), T(@inbounds k[i, hq, t, b])
                di = matrix_decay(g, Val(decay), T, i, h, t, b)
                G, dkt, wt = matrix_keys_reverse(G, v, dout, qi, di, Val(bonus), h, t, b)
                @inbounds dk[i, hq, t, b] += dkt + ui * qi * wt
                if decay !== :none
                    x = @inbounds rows[i, h, t, b]
                    rk += ki * dkt
                    bonus || (rq += x)
                    @inbounds rows[i, h, t, b] = rq - rk + hterm
                    bonus && (rq += x)
                end
            end
            if bonus
                @inbounds du_rows[i, h, n] = duacc
            end
        end
    end
    return nothing
end

"""
    matrix_keys_kernel!(backend, workgroupsize)(
        dq, dk, rows, du_rows, q, k, v, g, u, h0, dout, dhlast, cu_seqlens, nseq,
        Val(V), Val(decay), Val(bonus), Val(reverse), Val(workgroupsize);
        ndrange = K * Hq * nseq,
    )

[`matrix_keys_item!`](@ref) on a device.
"""
@kernel function matrix_keys_kernel!(
    dq,
    dk,
    rows,
    du_rows,
    @Const(q),
    @Const(k),
    @Const(v),
    @Const(g),
    @Const(u),
    @Const(h0),
    @Const(dout),
    @Const(dhlast),
    @Const(cu_seqlens),
    nseq,
    ::Val{nv},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{workgroupsize},
) where {nv, decay, bonus, reversed, workgroupsize}
    w = @index(Global, Linear)
    flags = (Val(nv), Val(decay), Val(bonus), Val(reversed), Val(workgroupsize))
    matrix_keys_item!(
        w,
        dq,
        dk,
        rows,
        du_rows,
        q,
        k,
        v,
        g,
        u,
        h0,
        dout,
        dhlast,
        cu_seqlens,
        nseq,
        flags...,
    )
end

"""
    matrix_state_backward!(dq, dk, dv, q, k, v, dout; dg = nothing, du = nothing,
                           dh0 = nothing, g = nothing, u = nothing, h0 = nothing,
                           dhlast = nothing, cu_seqlens = nothing, reverse = false,
                           workgroupsize = nothing, algorithm = :recurrent,
                           chunk = nothing) -> (; dq, dk, dv, dg, du, dh0)

In-place [`matrix_state_backward`](@ref): overwrites `dq`, `dk`, `dv` and,
when given, `dg` (g's size), `du` (`(K, H)`) and `dh0` (`(V, K, H, nseq)`).
`algorithm = :chunked` runs the chunked form (`src/matrix/chunked_backward.jl`:
the chunk-start states recomputed, chunks of `chunk` steps, 64 unless given).
"""
function matrix_state_backward!(
    dq,
    dk,
    dv,
    q,
    k,
    v,
    dout;
    dg = nothing,
    du = nothing,
    dh0 = nothing,
    g = nothing,
    decay::Symbol = g === nothing ? :none : (ndims(g) == 4 ? :key : :scalar),
    u = nothing,
    h0 = nothing,
    dhlast = nothing,
    cu_seqlens = nothing,
    reverse::Bool = false,
    workgroupsize = nothing,
    algorithm::Symbol = :recurrent,
    chunk = nothing,
)
    api = :matrix_state_backward!
    nseq = check_matrix_state(
        api,
        (; dout, dv),
        (; h0, dhlast, dh0),
        q,
        k,
        v,
        g,
        u,
        cu_seqlens,
        decay,
    )
    check_matrix_size(api, :dq, dq, size(q), "q's size (K, Hq, T, batch)")
    check_matrix_size(api, :dk, dk, size(q), "q's size (K, Hq, T, batch)")
    g === nothing || check_matrix_size(api, :dg, dg, size(g), "g's size")
    check_matrix_size(api, :du, du, (size(q, 1), size(v, 2)), "(K, H)")
    check_backends(api, array_backend(v), (; dq, dk, dg, du))
    check_tunables(api, (; workgroupsize))
    check_matrix_algorithm(api, algorithm, chunk)
    backend = array_backend(v)
    wg = something(
        workgroupsize,
        min(DEFAULT_MATRIX_WORKGROUP_SIZE, max_workgroupsize(backend)),
    )
    if wg > max_workgroupsize(backend)
        throw(ArgumentError(
            "$api: workgroupsize = $wg exceeds $(max_workgroupsize(backend)), the largest workgroup on $backend",
        ))
    end
    nk = size(q, 1)
    nv, H, L, batch = size(v)
    foreach(X -> X === nothing || fill!(X, zero(eltype(X))), (dq, dk, dv, dh0))
    if algorithm === :chunked
        grads = (; dq, dk, dv, dg, du, dh0)
        flags = (Val(decay), Val(u !== nothing), Val(reverse))
        C = something(chunk, DEFAULT_MATRIX_CHUNK)
        matrix_chunked_backward!(
            backend,
            wg,
            C,
            grads,
            q,
            k,
            v,
            dout,
            g,
            u,
            h0,
            dhlast,
            cu_seqlens,
            flags...,
        )
        return grads
    end
    rows = decay === :none ?
        nothing :
        decay === :key && dg !== nothing ? dg : similar(v, (nk, H, L, batch))
    rows === nothing || fill!(rows, zero(eltype(rows)))
    du_rows = u === nothing ? nothing : fill!(similar(v, (nk, H, nseq)), 0)
    if nseq * H > 0
        cu = cu_seqlens === nothing ?
            nothing :
            copyto!(
                KernelAbstractions.allocate(backend, Int, length(cu_seqlens)),
                collect(Int, cu_seqlens),
            )
        flags = (Val(decay), Val(u !== nothing), Val(reverse), Val(wg))
        values = (dv, dh0, q, k, g, u, dout, dhlast, cu, nseq, Val(nk), flags...)
        keys = (
            dq,
            dk,
            rows,
            du_rows,
            q,
            k,
            v,
            g,
            u,
            h0,
            dout,
            dhlast,
            cu,
            nseq,
            Val(nv),
            flags...,
        )
        launch_matrix_backward!(backend, wg, values, keys)
    end
    if decay === :scalar && dg !== nothing
        sum!(reshape(dg, 1, size(dg)...), rows)
    end
    du === nothing || du_rows === nothing || sum!(du, du_rows)
    return (; dq, dk, dv, dg, du, dh0)
end

"""
    matrix_state_backward(q, k, v, dout; g = nothing, u = nothing, h0 = nothing,
                          dhlast = nothing, cu_seqlens = nothing, reverse = false,
                          workgroupsize = nothing) -> (; dq, dk, dv, dg, du, dh0)

Every gradient of [`matrix_state_scan`](@ref)'s `o` (and final state) given
`dout` (the size of `v`) and `dhlast` (`(V, K, H, nseq)`), in the layouts of
the inputs (`dg`, `du`, `dh0` are `nothing` without `g`, `u`, `h0`); dq and dk
sum over each group's heads. `workgroupsize` reaches both kernels as a `Val`.

# Examples
```julia-repl
julia> q, k = randn(4, 1, 9, 2), randn(4, 1, 9, 2); v = randn(3, 2, 9, 2);

julia> grads = matrix_state_backward(q, k, v, randn(3, 2, 9, 2); g = -rand(2, 9, 2));

julia> size(grads.dq), size(grads.dg)
((4, 1, 9, 2), (2, 9, 2))
```
"""
function matrix_state_backward(
    q,
    k,
    v,
    dout;
    g = nothing,
    u = nothing,
    h0 = nothing,
    kwargs...,
)
    for (name, X) in pairs((; q, k, v))
        X isa AbstractArray ||
            throw(ArgumentError(
                "matrix_state_backward: $name must be an array, got $(typeof(X))",
            ))
    end
    return matrix_state_backward!(
        similar(q),
        similar(k),
        similar(v),
        q,
        k,
        v,
        dout;
        dg = g isa AbstractArray ? similar(g) : nothing,
        du = u isa AbstractArray ? similar(u) : nothing,
        dh0 = h0 isa AbstractArray ? similar(h0) : nothing,
        g,
        u,
        h0,
        kwargs...,
    )
end
