# The delta-rule family's backward on the CPU (`scanweaver.fused.delta_rule`):
# with G_t = dL/dS_t, from the last step, q and k the normalised ones,
#
#     G_t += q_t do_t';  dq_t = S_t do_t
#     delta:  du = G_t' k_t;  r = v_t - S'_t' k_t;  u = beta_t r
#             dv_t = beta_t du;  dbeta_t = du . r;  dk_t = G_t u - beta_t S'_t du
#             Gs = G_t - beta_t k_t du';  dg_t = rows(S'_t .* Gs);  G_{t-1} = D_t Gs
#     dplr:   p = S_{t-1}' a_t;  dp = G_t' b_t
#             dv_t = G_t' k_t;  dk_t = G_t v_t;  db_t = G_t p;  da_t = S_{t-1} dp
#             dg_t = D_t rows(G_t .* S_{t-1});  G_{t-1} = D_t G_t + a_t dp'
#     dh0 = G_{-1}
#
# Unlike the forward, the gradients of q, k, beta, g, a and b are sums over a
# head's state columns, so one work-item holds a whole K x V state: one Julia
# task per (head, sequence), the states saved every `checkpoint` steps and
# each chunk's recomputed from its checkpoint in the reverse sweep. dq and dk
# are summed over each group's heads, then passed back through the
# normalisation: `dx = (dy - y (y . dy)) / sqrt(sum(x .^ 2) + 1e-6)`.

"The delta rule's per-step operands of head `h` at `(t, bi)` in `T`: `q`, `k` (normalised), `d` (K decays)."
@inline function delta_step_operands(
    q,
    k,
    g,
    ::Type{T},
    ::Val{gate},
    l2norm,
    hq,
    h,
    t,
    bi,
) where {T, gate}
    nk = size(q, 1)
    qs = T[q[i, hq, t, bi] for i in 1:nk]
    ks = T[k[i, hq, t, bi] for i in 1:nk]
    if l2norm
        qs ./= sqrt(sum(abs2, qs) + T(DELTA_L2_EPS))
        ks ./= sqrt(sum(abs2, ks) + T(DELTA_L2_EPS))
    end
    d = T[matrix_decay(g, Val(gate), T, i, h, t, bi) for i in 1:nk]
    return qs, ks, d
end

"S_t from `S` = S_{t-1} (K x V, in place) for head `h` at `(t, bi)`."
function delta_state_step!(S, ks, d, v, beta, a, b, h, t, bi, form)
    T = eltype(S)
    vt = T[v[j, h, t, bi] for j in axes(S, 2)]
    if form === :dplr
        at = T[a[i, h, t, bi] for i in axes(S, 1)]
        bt = T[b[i, h, t, bi] for i in axes(S, 1)]
        p = S' * at
        S .= d .* S .+ bt .* p' .+ ks .* vt'
    else
        S .*= d
        u = T(beta[h, t, bi]) .* (vt .- S' * ks)
        S .+= ks .* u'
    end
    return S
end

"""
    delta_backward_item!(w, grads, q, k, v, dout, g, beta, a, b, h0, dhlast, segs,
                         Val(gate), Val(form), l2norm, checkpoint)

The reverse sweep of head `(w - 1) % H + 1` of segment `n = (w - 1) ÷ H + 1`
(`segs[:, n]`: its batch row, first step and length; a sequence, or a chunk
of the chunked backward with its start state in `h0` and end adjoint in
`dhlast`):
writes `grads.dqh`, `grads.dkh` (per value head, normalised q/k), `dv` and
the present ones of `dg`, `dbeta`, `da`, `db`, `dh0`.
"""
function delta_backward_item!(
    w,
    grads,
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
    segs,
    ::Val{gate},
    ::Val{form},
    l2norm,
    checkpoint,
) where {gate, form}
    nv, H = size(v, 1), size(v, 2)
    nk = size(q, 1)
    h, n = (w - 1) % H + 1, (w - 1) ÷ H + 1
    bi, start, len = segs[1, n], segs[2, n], segs[3, n]
    hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
    T = eltype(grads.dqh)
    S = h0 === nothing ? zeros(T, nk, nv) : T.(permutedims(view(h0, :, :, h, n)))
    saved = Matrix{T}[]
    for step in 1:len
        t = start + step - 1
        (step - 1) % checkpoint == 0 && push!(saved, copy(S))
        _, ks, d = delta_step_operands(q, k, g, T, Val(gate), l2norm, hq, h, t, bi)
        delta_state_step!(S, ks, d, v, beta, a, b, h, t, bi, form)
    end
    G = dhlast === nothing ? zeros(T, nk, nv) : T.(permutedims(view(dhlast, :, :, h, n)))
    for c in length(saved):-1:1
        from = start + (c - 1) * checkpoint
        steps = from:min(start + len - 1, from + checkpoint - 1)
        states = [saved[c]]
        for t in steps
            _, ks, d = delta_step_operands(q, k, g, T, Val(gate), l2norm, hq, h, t, bi)
            push!(
                states,
                delta_state_step!(copy(states[end]), ks, d, v, beta, a, b, h, t, bi, form),
            )
        end
        for i in length(steps):-1:1
            t = steps[i]
            prev, cur = states[i], states[i + 1]
            qs, ks, d = delta_step_operands(q, k, g, T, Val(gate), l2norm, hq, h, t, bi)
            dos = T[dout[j, h, t, bi] for j in 1:nv]
            vt = T[v[j, h, t, bi] for j in 1:nv]
            G .+= qs .* dos'
            grads.dqh[:, h, t, bi] .= cur * dos
            if form === :dplr
                at = T[a[j, h, t, bi] for j in 1:nk]
                bt = T[b[j, h, t, bi] for j in 1:nk]
                p, dp = prev' * at, G' * bt
                grads.dv[:, h, t, bi] .= G' * ks
                grads.dkh[:, h, t, bi] .= G * vt
                grads.db[:, h, t, bi] .= G * p
                grads.da[:, h, t, bi] .= prev * dp
                delta_decay_grad!(
                    grads.dg,
                    vec(sum(G .* prev; dims = 2)) .* d,
                    Val(gate),
                    h,
                    t,
                    bi,
                )
                G .= d .* G .+ at .* dp'
            else
                bt = T(beta[h, t, bi])
                Sp = d .* prev
                r = vt .- Sp' * ks
                du = G' * ks
                grads.dv[:, h, t, bi] .= bt .* du
                grads.dbeta === nothing || (grads.dbeta[h, t, bi] = sum(du .* r))
                grads.dkh[:, h, t, bi] .= G * (bt .* r) .- bt .* (Sp * du)
                G .-= bt .* ks .* du'
                delta_decay_grad!(
                    grads.dg,
                    vec(sum(Sp .* G; dims = 2)),
                    Val(gate),
                    h,
                    t,
                    bi,
                )
                G .*= d
            end
        end
    end
    grads.dh0 === nothing || (grads.dh0[:, :, h, n] .= permutedims(G))
    return nothing
end

"Writes the gradient of step `(t, bi)`'s log decays of head `h` from the per-row sums `rows`."
function delta_decay_grad!(dg, rows, ::Val{gate}, h, t, bi) where {gate}
    if gate === :key
        dg[:, h, t, bi] .= rows
    elseif gate === :scalar
        dg[h, t, bi] = sum(rows)
    end
    return nothing
end

"`dx` (q's layout) from the per-value-head `dxh`: summed over each group's heads, then through the norm."
function delta_key_grad!(dx, dxh, x, l2norm)
    nk, Hq, L, batch = size(x)
    per = size(dxh, 2) ÷ Hq
    for bi in 1:batch, t in 1:L, hq in 1:Hq
        dy = vec(sum(view(dxh, :, ((hq - 1) * per + 1):(hq * per), t, bi); dims = 2))
        if l2norm
            xs = eltype(dxh)[x[i, hq, t, bi] for i in 1:nk]
            rstd = inv(sqrt(sum(abs2, xs) + eltype(dxh)(DELTA_L2_EPS)))
            y = xs .* rstd
            dy = rstd .* (dy .- y .* sum(y .* dy))
        end
        dx[:, hq, t, bi] .= dy
    end
    return dx
end

"""
    delta_rule_backward!(dq, dk, dv, q, k, v, dout; beta, a, b, g, gate, l2norm, h0,
                         dhlast, cu_seqlens, dg, dbeta, da, db, dh0, checkpoint,
                         algorithm = :recurrent, chunk = nothing) -> nothing

The gradients of `sum(o .* dout) + sum(hlast .* dhlast)` for
[`delta_rule_scan`](@ref)'s `o` and `hlast`, on the CPU: writes `dq`, `dk`,
`dv` and, when given, `dg`, `dbeta` (delta form), `da`, `db` (dplr form),
`dh0`. States are saved every `checkpoint` steps (default about the square
root of the longest sequence, or of the chunk) and recomputed in the reverse
sweep. `algorithm = :chunked` runs the chunked backward
(`src/matrix/delta_chunked_backward.jl`: the chunk-start states from the
chunked forward, the adjoints at the chunks' ends carried in reverse, then
the recurrence's gradients on every chunk at once) with chunks of `chunk`
steps (32 unless given); the results do not depend on either.
"""
function delta_rule_backward!(
    dq,
    dk,
    dv,
    q,
    k,
    v,
    dout;
    beta = nothing,
    a = nothing,
    b = nothing,
    g = nothing,
    gate::Symbol = g === nothing ? :none : (ndims(g) == 4 ? :key : :scalar),
    l2norm::Bool = false,
    h0 = nothing,
    dhlast = nothing,
    cu_seqlens = nothing,
    dg = nothing,
    dbeta = nothing,
    da = nothing,
    db = nothing,
    dh0 = nothing,
    checkpoint = nothing,
    algorithm::Symbol = :recurrent,
    chunk = nothing,
)
    api = :delta_rule_backward!
    nseq = check_matrix_state(
        api,
        (; dout, dv),
        (; h0, dhlast, dh0),
        q,
        k,
        v,
        g,
        nothing,
        cu_seqlens,
        gate,
    )
    form = check_delta_rule(api, v, q, beta, a, b)
    for (name, X, like) in (
            (:dq, dq, q),
            (:dk, dk, k),
            (:dg, dg, g),
            (:dbeta, dbeta, beta),
            (:da, da, a),
            (:db, db, b),
        )
        X === nothing && continue
        like === nothing &&
            throw(ArgumentError("$api: $name is given but its operand is not"))
        check_matrix_size(api, name, X, size(like), "the size of its operand")
    end
    check_matrix_algorithm(api, algorithm, chunk)
    array_backend(v) isa CPU ||
        throw(ArgumentError(
            "$api: the delta rule's backward runs on the CPU, got arrays on $(array_backend(v))",
        ))
    _, H, L, batch = size(v)
    nk = size(q, 1)
    checkpoint === nothing ||
        checkpoint >= 1 ||
        throw(ArgumentError("$api: checkpoint = $checkpoint must be at least 1"))
    T = promote_type(eltype(v), Float32)
    foreach(X -> X === nothing || fill!(X, zero(eltype(X))), (dg, dbeta, da, db, dh0))
    grads = (
        dqh = zeros(T, nk, H, L, batch),
        dkh = zeros(T, nk, H, L, batch),
        dv,
        dg = g === nothing ? nothing : something(dg, zeros(T, size(g))),
        dbeta = form === :delta ? dbeta : nothing,
        da = form === :dplr ? something(da, zeros(T, size(a))) : nothing,
        db = form === :dplr ? something(db, zeros(T, size(b))) : nothing,
        dh0,
    )
    fill!(dv, zero(eltype(dv)))
    cu = cu_seqlens === nothing ? nothing : collect(Int, cu_seqlens)
    if algorithm === :chunked
        delta_chunked_backward!(
            grads,
            something(chunk, DEFAULT_DELTA_CHUNK),
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
            cu,
            Val(gate),
            Val(form),
            l2norm,
            checkpoint,
        )
    else
        delta_recurrent_backward!(
            grads,
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
            cu,
            nseq,
            gate,
            form,
            l2norm,
            checkpoint,
        )
    end
    delta_key_grad!(dq, grads.dqh, q, l2norm)
    delta_key_grad!(dk, grads.dkh, k, l2norm)
    return nothing
end

"The recurrent backward: one task per head and sequence (`cu` a host vector or `nothing`)."
function delta_recurrent_backward!(
    grads,
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
    cu,
    nseq,
    gate,
    form,
    l2norm,
    checkpoint,
)
    H, L = size(v, 2), size(v, 3)
    segs = Int[x for n in 1:nseq for x in matrix_segment(cu, n, L)]
    longest = nseq == 0 ? 0 : maximum(n -> segs[3 * n], 1:nseq)
    args = (
        grads,
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
        reshape(segs, 3, nseq),
        Val(gate),
        Val(form),
        l2norm,
        something(checkpoint, isqrt(max(longest - 1, 0)) + 1),
    )
    work = L * size(q, 1) * size(v, 1) ÷ max(nseq, 1)
    cpu_items!(delta_backward_item!, H * nseq, args; work)
    return nothing
end
