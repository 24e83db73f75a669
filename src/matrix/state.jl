# The matrix-state scan (Mamba-2 / SSD, GLA, RetNet, RWKV-6) in its recurrent
# form, forward. Per sequence and head the state S is K x V:
#
#     S_t = D_t * S_{t-1} + k_t v_t'       D_t = exp(g_t): per head, per key row, or 1
#     o_t = S_t' q_t                       (readout after the update)
#     o_t = S_{t-1}' q_t + (q_t . (u .* k_t)) v_t   (bonus readout, RWKV-6)
#
# One work-item per (state column j, head, sequence) keeps column j of S (K
# values, an NTuple) in registers while time advances; q and k are read by
# every work-item of a head (neighbouring work-items read the same values, and
# v and o are read and written contiguously along V). Layouts are the Python
# ones (`scanweaver.fused.matrix_state`) with the dimensions reversed: q, k
# `(K, Hq, T, batch)`, v, o `(V, H, T, batch)`, g `(H, T, batch)` or
# `(K, H, T, batch)`, u `(K, H)`, states `(V, K, H, nseq)` (element `[j, i]` is
# S[i, j]). Head h reads q/k head `(h - 1) ÷ (H ÷ Hq) + 1` (groups).

"Work-items per workgroup of the matrix-state kernel unless given."
const DEFAULT_MATRIX_WORKGROUP_SIZE = 64

"The decay forms of [`matrix_state_scan`](@ref): none, one per head and step, one per key row."
const MATRIX_DECAYS = (:none, :scalar, :key)

@inline function matrix_segment(::Nothing, n, T)
    return n, 1, T
end

@inline function matrix_segment(cu::AbstractVector, n, T)
    first = Int(@inbounds cu[n])
    return 1, first + 1, Int(@inbounds cu[n + 1]) - first
end

@inline function matrix_initial(::Nothing, ::Type{T}, ::Val{nk}, j, h, n) where {T, nk}
    return ntuple(_ -> zero(T), Val(nk))
end

@inline function matrix_initial(
    h0::AbstractArray,
    ::Type{T},
    ::Val{nk},
    j,
    h,
    n,
) where {T, nk}
    return ntuple(i -> T(@inbounds h0[j, i, h, n]), Val(nk))
end

@inline function matrix_decay(g, ::Val{decay}, ::Type{T}, i, h, t, b) where {decay, T}
    if decay === :key
        return exp(T(@inbounds g[i, h, t, b]))
    elseif decay === :scalar
        return exp(T(@inbounds g[h, t, b]))
    end
    return one(T)
end

"""
    matrix_forward_step(s, q, k, g, u, vj, Val(decay), Val(bonus), hq, h, t, b) -> (s, o)

One time step of one state column `s` (an `NTuple{K}`): the updated column and
the readout `o_t[j]`. Every closure here captures only arguments, never a
reassigned variable, so kernels hold no `Core.Box`.
"""
@inline function matrix_forward_step(
    s::Tuple{T, Vararg{T, rest}},
    q,
    k,
    g,
    u,
    vj,
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
    new = ntuple(i -> ds[i] * s[i] + ks[i] * vj, Val(nk))
    if bonus
        us = ntuple(i -> T(@inbounds u[i, h]), Val(nk))
        return new, sum(ntuple(i -> qs[i] * (s[i] + us[i] * ks[i] * vj), Val(nk)))
    end
    return new, sum(ntuple(i -> qs[i] * new[i], Val(nk)))
end

"""
    matrix_state_item!(w, o, hlast, q, k, v, g, u, h0, cu_seqlens,
                       Val(K), Val(decay), Val(bonus), Val(reverse), Val(workgroupsize))

Work-item `w` of the recurrent matrix-state forward: column `(w - 1) % V + 1`
of head `((w - 1) ÷ V) % H + 1` of sequence `(w - 1) ÷ (V * H) + 1`, over its
whole length; writes `o` and `hlast`. [`matrix_state_kernel!`](@ref) runs it on
a device (see `src/items.jl`).
"""
@inline function matrix_state_item!(
    w,
    o,
    hlast,
    q,
    k,
    v,
    g,
    u,
    h0,
    cu_seqlens,
    ::Val{nk},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{workgroupsize},
) where {nk, decay, bonus, reversed, workgroupsize}
    nv, H = size(v, 1), size(v, 2)
    if w <= nv * H * size(hlast, 4)
        j = (w - 1) % nv + 1
        h = ((w - 1) ÷ nv) % H + 1
        n = (w - 1) ÷ (nv * H) + 1
        b, start, len = matrix_segment(cu_seqlens, n, size(v, 3))
        hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
        T = eltype(hlast)
        s = matrix_initial(h0, T, Val(nk), j, h, n)
        for step in 1:len
            t = reversed ? start + len - step : start + step - 1
            vj = T(@inbounds v[j, h, t, b])
            s, y = matrix_forward_step(
                s,
                q,
                k,
                g,
                u,
                vj,
                Val(decay),
                Val(bonus),
                hq,
                h,
                t,
                b,
            )
            @inbounds o[j, h, t, b] = convert(eltype(o), y)
        end
        for i in 1:nk
            @inbounds hlast[j, i, h, n] = s[i]
        end
    end
    return nothing
end

"""
    matrix_state_kernel!(backend, workgroupsize)(
        o, hlast, q, k, v, g, u, h0, cu_seqlens,
        Val(K), Val(decay), Val(bonus), Val(reverse), Val(workgroupsize);
        ndrange = V * H * nseq,
    )

The recurrent matrix-state forward on a device: one work-item per state
column ([`matrix_state_item!`](@ref)).
"""
@kernel function matrix_state_kernel!(
    o,
    hlast,
    @Const(q),
    @Const(k),
    @Const(v),
    @Const(g),
    @Const(u),
    @Const(h0),
    @Const(cu_seqlens),
    ::Val{nk},
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{workgroupsize},
) where {nk, decay, bonus, reversed, workgroupsize}
    w = @index(Global, Linear)
    flags = (Val(nk), Val(decay), Val(bonus), Val(reversed), Val(workgroupsize))
    matrix_state_item!(w, o, hlast, q, k, v, g, u, h0, cu_seqlens, flags...)
end

function check_matrix_size(api, name, A, want, layout)
    A === nothing && return nothing
    if size(A) != want
        throw(DimensionMismatch(
            "$api: $name has size $(size(A)); it needs $layout = $want",
        ))
    end
    return nothing
end

"""
    check_matrix_state(api, outs, states, q, k, v, g, u, cu_seqlens, decay) -> nseq

Shapes, real float element types and one device for the matrix-state scan;
throws `DimensionMismatch` or `ArgumentError` naming the argument, what it got
and what it needs. `outs` are named arrays of `v`'s size (`(; o)`, `(; dout)`),
`states` named `(V, K, H, nseq)` arrays (`(; h0, hlast)`). Returns the number
of sequences (rows of the states).
"""
function check_matrix_state(
    api::Symbol,
    outs::NamedTuple,
    states::NamedTuple,
    q,
    k,
    v,
    g,
    u,
    cu_seqlens,
    decay,
)
    named = (; outs..., states..., q, k, v, g, u)
    for (name, X) in pairs(named)
        X === nothing && continue
        if !(X isa AbstractArray) || !(eltype(X) <: AbstractFloat)
            throw(ArgumentError(
                "$api: $name must be an array of real floats, got $(typeof(X))",
            ))
        end
    end
    ndims(v) == 4 ||
        throw(ArgumentError(
            "$api: v must be a (V, H, T, batch) array, got size $(size(v))",
        ))
    nv, H, T, batch = size(v)
    ndims(q) == 4 ||
        throw(ArgumentError(
            "$api: q must be a (K, Hq, T, batch) array, got size $(size(q))",
        ))
    nk, Hq = size(q, 1), size(q, 2)
    if Hq < 1 || H % Hq != 0
        throw(DimensionMismatch("$api: q has $Hq heads; they must divide v's H = $H"))
    end
    check_matrix_size(api, :q, q, (nk, Hq, T, batch), "(K, Hq, T, batch)")
    check_matrix_size(api, :k, k, (nk, Hq, T, batch), "q's size (K, Hq, T, batch)")
    for (name, X) in pairs(outs)
        check_matrix_size(api, name, X, size(v), "v's size (V, H, T, batch)")
    end
    decay in MATRIX_DECAYS ||
        throw(ArgumentError(
            "$api: decay = $(repr(decay)) must be one of $(join(MATRIX_DECAYS, ", "))",
        ))
    (decay === :none) == (g === nothing) ||
        throw(ArgumentError(
            "$api: decay = :$decay needs g $(decay === :none ? "absent" : "given")",
        ))
    gshape = decay === :key ? (nk, H, T, batch) : (H, T, batch)
    check_matrix_size(
        api,
        :g,
        g,
        gshape,
        decay === :key ? "(K, H, T, batch)" : "(H, T, batch)",
    )
    check_matrix_size(api, :u, u, (nk, H), "(K, H)")
    nseq = batch
    if cu_seqlens !== nothing
        offsets = collect(Int, cu_seqlens)
        if batch != 1 ||
                length(offsets) < 2 ||
                first(offsets) != 0 ||
                last(offsets) != T ||
                !issorted(offsets)
            throw(ArgumentError(
                "$api: cu_seqlens = $(repr(cu_seqlens)) must rise from 0 to T = $T with batch 1 " *
                    "(zero-based offsets of the packed sequences)",
            ))
        end
        nseq = length(offsets) - 1
    end
    for (name, X) in pairs(states)
        check_matrix_size(api, name, X, (nv, nk, H, nseq), "(V, K, H, nseq)")
    end
    check_backends(api, array_backend(v), named)
    return nseq
end

"""
    matrix_state_scan!(o, q, k, v; g = nothing, decay = g === nothing ? :none : :scalar,
                       u = nothing, h0 = nothing, hlast = nothing, cu_seqlens = nothing,
                       reverse = false, workgroupsize = nothing,
                       algorithm = :recurrent, chunk = nothing) -> o

In-place [`matrix_state_scan`](@ref): writes `o` (the size of `v`) and, when
given, the final states `hlast` `(V, K, H, nseq)`. `algorithm = :chunked` runs
the chunked (matmul) form (`src/matrix/chunked.jl`) with chunks of `chunk`
steps (64 unless given; 1 to 1024, results do not depend on it); the
recurrence ignores `chunk`.
"""
function matrix_state_scan!(
    o,
    q,
    k,
    v;
    g = nothing,
    decay::Symbol = g === nothing ? :none : (ndims(g) == 4 ? :key : :scalar),
    u = nothing,
    h0 = nothing,
    hlast = nothing,
    cu_seqlens = nothing,
    reverse::Bool = false,
    workgroupsize = nothing,
    algorithm::Symbol = :recurrent,
    chunk = nothing,
)
    api = :matrix_state_scan!
    nseq = check_matrix_state(api, (; o), (; h0, hlast), q, k, v, g, u, cu_seqlens, decay)
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
    nv, H = size(v, 1), size(v, 2)
    nk = size(q, 1)
    out = something(hlast, similar(v, eltype(o), (nv, nk, H, nseq)))
    items = nv * H * nseq
    if items == 0
        hlast === nothing ||
            (h0 === nothing ? fill!(hlast, zero(eltype(hlast))) : copyto!(hlast, h0))
        return o
    end
    if algorithm === :chunked
        flags = (Val(decay), Val(u !== nothing), Val(reverse))
        C = something(chunk, DEFAULT_MATRIX_CHUNK)
        matrix_chunked!(backend, wg, C, o, out, q, k, v, g, u, h0, cu_seqlens, flags...)
        return o
    end
    cu = cu_seqlens === nothing ?
        nothing :
        copyto!(
            KernelAbstractions.allocate(backend, Int, length(cu_seqlens)),
            collect(Int, cu_seqlens),
        )
    args = (
        o,
        out,
        q,
        k,
        v,
        g,
        u,
        h0,
        cu,
        Val(nk),
        Val(decay),
        Val(u !== nothing),
        Val(reverse),
        Val(wg),
    )
    launch_matrix_state!(backend, wg, args)
    return o
end

"""
    matrix_state_scan(q, k, v; g = nothing, u = nothing, h0 = nothing,
                      return_state = false, cu_seqlens = nothing, reverse = false,
                      workgroupsize = nothing, algorithm = :recurrent, chunk = nothing)

The matrix-state scan of `scanweaver.fused.matrix_state` (Mamba-2 / SSD,
gated linear attention, RetNet, RWKV-6 with `u`) in its recurrent form, with
the Python layouts reversed (see the top of `src/matrix/state.jl`): `g` of
size `(H, T, batch)` is a log decay per head and step, `(K, H, T, batch)` one
per key row; `u` `(K, H)` switches to the bonus readout. No scale is applied.
Returns `o` (and the final states `(V, K, H, nseq)` with `return_state`).
`workgroupsize` reaches the kernel as a `Val`. `algorithm = :chunked` (with
`chunk` steps per chunk) computes the same result in the chunked (matmul)
form; see [`matrix_state_scan!`](@ref).

# Examples
```julia-repl
julia> q, k = randn(Float32, 4, 1, 9, 2), randn(Float32, 4, 1, 9, 2); v = randn(Float32, 3, 2, 9, 2);

julia> o, h = matrix_state_scan(q, k, v; g = -rand(Float32, 2, 9, 2), return_state = true);

julia> size(o), size(h)
((3, 2, 9, 2), (3, 4, 2, 2))
```
"""
function matrix_state_scan(
    q,
    k,
    v;
    return_state::Bool = false,
    cu_seqlens = nothing,
    kwargs...,
)
    return allocating_scan(
        matrix_state_scan!,
        "matrix_state_scan",
        q,
        k,
        v,
        return_state,
        cu_seqlens;
        kwargs...,
    )
end

"""
    allocating_scan(scan!, name, q, k, v, return_state, cu_seqlens; kwargs...)

`o` (and, with `return_state`, the final states `(V, K, H, nseq)`) allocated
like `v` and filled by `scan!(o, q, k, v; ...)`: the allocating form shared by
[`matrix_state_scan`](@ref) and [`delta_rule_scan`](@ref).
"""
function allocating_scan(scan!, name, q, k, v, return_state, cu_seqlens; kwargs...)
    if !(v isa AbstractArray) || ndims(v) != 4 || !(q isa AbstractArray)
        throw(ArgumentError("$name: v must be a (V, H, T, batch) array, got $(typeof(v))"))
    end
    o = similar(v)
    if !return_state
        scan!(o, q, k, v; cu_seqlens, kwargs...)
        return o
    end
    nseq = cu_seqlens === nothing ? size(v, 4) : length(cu_seqlens) - 1
    hlast = similar(v, (size(v, 1), size(q, 1), size(v, 2), nseq))
    scan!(o, q, k, v; hlast, cu_seqlens, kwargs...)
    return o, hlast
end

"""
    matrix_state_scan(q, k, v, g, u = nothing, h0 = nothing; kwargs...)

[`matrix_state_scan`](@ref) with `g`, `u` and `h0` positional (`nothing`
where absent), the form whose ChainRules rule differentiates them too.
"""
function matrix_state_scan(q, k, v, g, u = nothing, h0 = nothing; kwargs...)
    return matrix_state_scan(q, k, v; g, u, h0, kwargs...)
end
