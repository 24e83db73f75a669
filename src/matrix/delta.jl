# The delta-rule family (DeltaNet, Gated DeltaNet, KDA, RWKV-7) in its
# recurrent form, forward: the matrix-state scan whose transition is a
# diagonal plus a rank-one matrix. Per sequence and value head the state S is
# K x V, with D_t = exp(g_t) (per head, per key row, or 1):
#
#     delta:  S'_t = D_t S_{t-1};  u_t = beta_t (v_t - S'_t' k_t);  S_t = S'_t + k_t u_t'
#     dplr:   S_t = D_t S_{t-1} + b_t (a_t' S_{t-1}) + k_t v_t'
#     o_t = S_t' q_t
#
# (`scanweaver.fused.delta_rule`). Column j of S depends on column j only
# (u_t[j] and a_t' S_{t-1}[:, j] are per column), so the work-items are the
# matrix-state forward's: one per (state column, head, sequence), its column
# in registers while time advances, with the same segments, initial states
# and decays (`src/matrix/state.jl`). Layouts are the Python ones reversed:
# q, k `(K, Hq, T, batch)`, v, o `(V, H, T, batch)`, g `(H, T, batch)` or
# `(K, H, T, batch)`, beta `(H, T, batch)`, a, b `(K, H, T, batch)`, states
# `(V, K, H, nseq)`. With `l2norm` q_t and k_t are divided by
# `sqrt(sum(x .^ 2) + 1e-6)` in the kernel.

"fla's epsilon of the in-kernel L2 normalisation: `x / sqrt(sum(x .^ 2) + DELTA_L2_EPS)`."
const DELTA_L2_EPS = 1.0e-6

"The transitions of [`delta_rule_scan`](@ref): the delta rule (`beta`) and diagonal plus low rank (`a`, `b`)."
const DELTA_FORMS = (:delta, :dplr)

"""
    delta_keys(x, T, Val(K), Val(l2norm), hq, t, b) -> NTuple{K, T}

Column `(hq, t, b)` of `q` or `k` in `T`, L2-normalised when `l2norm`.
"""
@inline function delta_keys(
    x,
    ::Type{T},
    ::Val{nk},
    ::Val{l2norm},
    hq,
    t,
    b,
) where {T, nk, l2norm}
    xs = ntuple(i -> T(@inbounds x[i, hq, t, b]), Val(nk))
    l2norm || return xs
    r = inv(sqrt(sum(ntuple(i -> xs[i] * xs[i], Val(nk))) + T(DELTA_L2_EPS)))
    return ntuple(i -> xs[i] * r, Val(nk))
end

"""
    delta_forward_step(s, qs, ks, g, beta, a, b, vj, Val(gate), Val(form), h, t, bi) -> (s, o)

One time step of one state column `s` (an `NTuple{K}`) given the step's `q_t`
and `k_t` (`qs`, `ks`): the updated column and the readout `o_t[j]`.
"""
@inline function delta_forward_step(
    s::Tuple{T, Vararg{T, rest}},
    qs,
    ks,
    g,
    beta,
    a,
    b,
    vj,
    ::Val{gate},
    form::Val,
    h,
    t,
    bi,
) where {rest, T, gate}
    ds = ntuple(i -> matrix_decay(g, Val(gate), T, i, h, t, bi), Val(rest + 1))
    new = delta_update(s, ds, ks, beta, a, b, vj, form, h, t, bi)
    return new, sum(ntuple(i -> qs[i] * new[i], Val(rest + 1)))
end

# One method per form, so that no closure captures a variable assigned in a branch.
@inline function delta_update(
    s::Tuple{T, Vararg{T, rest}},
    ds,
    ks,
    beta,
    a,
    b,
    vj,
    ::Val{:delta},
    h,
    t,
    bi,
) where {rest, T}
    sp = ntuple(i -> ds[i] * s[i], Val(rest + 1))
    uj = T(@inbounds beta[h, t, bi]) * (vj - sum(ntuple(i -> sp[i] * ks[i], Val(rest + 1))))
    return ntuple(i -> sp[i] + ks[i] * uj, Val(rest + 1))
end

@inline function delta_update(
    s::Tuple{T, Vararg{T, rest}},
    ds,
    ks,
    beta,
    a,
    b,
    vj,
    ::Val{:dplr},
    h,
    t,
    bi,
) where {rest, T}
    p = sum(ntuple(i -> T(@inbounds a[i, h, t, bi]) * s[i], Val(rest + 1)))
    return ntuple(
        i -> ds[i] * s[i] + T(@inbounds b[i, h, t, bi]) * p + ks[i] * vj,
        Val(rest + 1),
    )
end

"""
    delta_rule_item!(w, o, hlast, q, k, v, g, beta, a, b, h0, cu_seqlens,
                     Val(K), Val(gate), Val(form), Val(l2norm), Val(workgroupsize))

Work-item `w` of the recurrent delta-rule forward: column `(w - 1) % V + 1` of
head `((w - 1) ÷ V) % H + 1` of sequence `(w - 1) ÷ (V * H) + 1`, over its
whole length; writes `o` and `hlast`. [`delta_rule_kernel!`](@ref) runs it on
a device (see `src/items.jl`).
"""
@inline function delta_rule_item!(
    w,
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
    ::Val{nk},
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
    ::Val{workgroupsize},
) where {nk, gate, form, l2norm, workgroupsize}
    nv, H = size(v, 1), size(v, 2)
    if w <= nv * H * size(hlast, 4)
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        n = (w - 1) ÷ (nv * H) + 1
        bi, start, len = matrix_segment(cu_seqlens, n, size(v, 3))
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        T = eltype(hlast)
        s = matrix_initial(h0, T, Val(nk), j, h, n)
        for t in start:(start + len - 1)
            qs = delta_keys(q, T, Val(nk), Val(l2norm), hq, t, bi)
            ks = delta_keys(k, T, Val(nk), Val(l2norm), hq, t, bi)
            vj = T(@inbounds v[j, h, t, bi])
            s, y = delta_forward_step(
                s,
                qs,
                ks,
                g,
                beta,
                a,
                b,
                vj,
                Val(gate),
                Val(form),
                h,
                t,
                bi,
            )
            @inbounds o[j, h, t, bi] = convert(eltype(o), y)
        end
        for i in 1:nk
            @inbounds hlast[j, i, h, n] = s[i]
        end
    end
    return nothing
end

"""
    delta_rule_kernel!(backend, workgroupsize)(
        o, hlast, q, k, v, g, beta, a, b, h0, cu_seqlens,
        Val(K), Val(gate), Val(form), Val(l2norm), Val(workgroupsize);
        ndrange = V * H * nseq,
    )

The recurrent delta-rule forward on a device: one work-item per state column
([`delta_rule_item!`](@ref)).
"""
@kernel function delta_rule_kernel!(
    o,
    hlast,
    @Const(q),
    @Const(k),
    @Const(v),
    @Const(g),
    @Const(beta),
    @Const(a),
    @Const(b),
    @Const(h0),
    @Const(cu_seqlens),
    ::Val{nk},
    ::Val{gate},
    ::Val{form},
    ::Val{l2norm},
    ::Val{workgroupsize},
) where {nk, gate, form, l2norm, workgroupsize}
    w = @index(Global, Linear)
    flags = (Val(nk), Val(gate), Val(form), Val(l2norm), Val(workgroupsize))
    delta_rule_item!(w, o, hlast, q, k, v, g, beta, a, b, h0, cu_seqlens, flags...)
end

"""
    check_delta_rule(api, v, q, beta, a, b) -> form

The delta-rule operands beyond the matrix-state scan's (checked by
[`check_matrix_state`](@ref)): `beta` `(H, T, batch)` for the delta form, or
`a` and `b` `(K, H, T, batch)` for the dplr form, real floats on `v`'s device.
Returns `:delta` or `:dplr`; throws `ArgumentError` or `DimensionMismatch`
naming the argument, what it got and what it needs.
"""
function check_delta_rule(api::Symbol, v, q, beta, a, b)
    named = (; beta, a, b)
    for (name, X) in pairs(named)
        X === nothing && continue
        if !(X isa AbstractArray) || !(eltype(X) <: AbstractFloat)
            throw(ArgumentError(
                "$api: $name must be an array of real floats, got $(typeof(X))",
            ))
        end
    end
    form = if beta !== nothing && a === nothing && b === nothing
        :delta
    elseif beta === nothing && a !== nothing && b !== nothing
        :dplr
    else
        given = join((String(n) for (n, X) in pairs(named) if X !== nothing), ", ")
        throw(ArgumentError(
            "$api: give beta (the delta rule) or both a and b (diagonal plus low rank), " *
                "got $(isempty(given) ? "none of them" : given)",
        ))
    end
    _, H, T, batch = size(v)
    check_matrix_size(api, :beta, beta, (H, T, batch), "(H, T, batch)")
    for (name, X) in ((:a, a), (:b, b))
        check_matrix_size(api, name, X, (size(q, 1), H, T, batch), "(K, H, T, batch)")
    end
    check_backends(api, array_backend(v), named)
    return form
end

"""
    delta_rule_scan!(o, q, k, v; beta = nothing, a = nothing, b = nothing, g = nothing,
                     gate = ..., l2norm = false, h0 = nothing, hlast = nothing,
                     cu_seqlens = nothing, workgroupsize = nothing,
                     algorithm = :recurrent, chunk = nothing) -> o

In-place [`delta_rule_scan`](@ref): writes `o` (the size of `v`) and, when
given, the final states `hlast` `(V, K, H, nseq)`. `algorithm = :chunked` runs
the chunked (WY) form of either transition (`src/matrix/delta_chunked.jl`)
with chunks of `chunk` steps (32 unless given; 1 to 1024, results do not
depend on it). The recurrence ignores `chunk`.
"""
function delta_rule_scan!(
    o,
    q,
    k,
    v;
    beta = nothing,
    a = nothing,
    b = nothing,
    g = nothing,
    gate::Symbol = g === nothing ? :none : (ndims(g) == 4 ? :key : :scalar),
    l2norm::Bool = false,
    h0 = nothing,
    hlast = nothing,
    cu_seqlens = nothing,
    workgroupsize = nothing,
    algorithm::Symbol = :recurrent,
    chunk = nothing,
)
    api = :delta_rule_scan!
    nseq = check_matrix_state(
        api,
        (; o),
        (; h0, hlast),
        q,
        k,
        v,
        g,
        nothing,
        cu_seqlens,
        gate,
    )
    form = check_delta_rule(api, v, q, beta, a, b)
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
    nv, H, L = size(v, 1), size(v, 2), size(v, 3)
    nk = size(q, 1)
    out = something(hlast, similar(v, eltype(o), (nv, nk, H, nseq)))
    items = nv * H * nseq
    if items == 0
        hlast === nothing ||
            (h0 === nothing ? fill!(hlast, zero(eltype(hlast))) : copyto!(hlast, h0))
        return o
    end
    if algorithm === :chunked
        C = something(chunk, DEFAULT_DELTA_CHUNK)
        delta_chunk_forward!(
            backend,
            wg,
            C,
            o,
            out,
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
        return o
    end
    cu = cu_seqlens === nothing ?
        nothing :
        copyto!(
            KernelAbstractions.allocate(backend, Int, length(cu_seqlens)),
            collect(Int, cu_seqlens),
        )
    flags = (Val(nk), Val(gate), Val(form), Val(l2norm), Val(wg))
    args = (o, out, q, k, v, g, beta, a, b, h0, cu, flags...)
    launch_items!(
        delta_rule_item!,
        delta_rule_kernel!,
        backend,
        wg,
        items,
        args;
        work = L * nk ÷ max(nseq, 1),
    )
    return o
end

"""
    delta_rule_scan(q, k, v; beta = nothing, a = nothing, b = nothing, g = nothing,
                    l2norm = false, h0 = nothing, return_state = false,
                    cu_seqlens = nothing, workgroupsize = nothing,
                    algorithm = :recurrent, chunk = nothing)

The delta-rule family of `scanweaver.fused.delta_rule` in its recurrent form,
with the Python layouts reversed (see the top of `src/matrix/delta.jl`):
`beta` `(H, T, batch)` selects the delta rule (DeltaNet; with `g` Gated
DeltaNet, `g` `(K, H, T, batch)` KDA), `a` and `b` `(K, H, T, batch)` the
diagonal-plus-low-rank form (RWKV-7 with a per-key `g`). `g` of size `(H, T,
batch)` is a log decay per head and step, `(K, H, T, batch)` one per key row.
No scale is applied. Returns `o` (and the final states `(V, K, H, nseq)` with
`return_state`). `algorithm = :chunked` (with `chunk` steps per chunk)
computes either form in the chunked (WY) form; see
[`delta_rule_scan!`](@ref).

# Examples
```julia-repl
julia> q, k = randn(Float32, 4, 1, 9, 2), randn(Float32, 4, 1, 9, 2); v = randn(Float32, 3, 2, 9, 2);

julia> o, h = delta_rule_scan(q, k, v; beta = rand(Float32, 2, 9, 2), l2norm = true, return_state = true);

julia> size(o), size(h)
((3, 2, 9, 2), (3, 4, 2, 2))
```
"""
function delta_rule_scan(
    q,
    k,
    v;
    return_state::Bool = false,
    cu_seqlens = nothing,
    kwargs...,
)
    return allocating_scan(
        delta_rule_scan!,
        "delta_rule_scan",
        q,
        k,
        v,
        return_state,
        cu_seqlens;
        kwargs...,
    )
end
