# The matrix-state forward on the CPU, without KernelAbstractions: a work item
# is a block of up to `MATRIX_CPU_COLUMNS` state columns of one head and
# sequence, and each time step updates the block row by row, the columns of a
# row in one SIMD loop (they are contiguous: the state lives in `hlast`, whose
# element `[j, i]` is S[i, j]). So the columns share each row's decay, key and
# query, and the loop runs on vectors of columns, as the C backend's does.
# Scans whose output and state types differ take the per-column items of
# `matrix_state_item!` instead (`launch_matrix_state!`).

"State columns per work item of the CPU forward (a few SIMD vectors of `Float32`)."
const MATRIX_CPU_COLUMNS = 32

"""
    matrix_cpu_item!(w, o, S, q, k, v, g, u, h0, cu_seqlens, Val(decay), Val(bonus), Val(reverse))

Work item `w` of the CPU forward: columns of block `(w - 1) % nblocks + 1` of
head `((w - 1) ÷ nblocks) % H + 1` of sequence `(w - 1) ÷ (nblocks * H) + 1`,
its state kept in `S` (the final states, `(V, K, H, nseq)`) and its readout
summed in `o` in place.
"""
function matrix_cpu_item!(
    w,
    o,
    S,
    q,
    k,
    v,
    g,
    u,
    h0,
    cu_seqlens,
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
) where {decay, bonus, reversed}
    nv, H, nk = size(v, 1), size(v, 2), size(q, 1)
    nblocks = cld(nv, MATRIX_CPU_COLUMNS)
    blk = (w - 1) % nblocks + 1
    h = ((w - 1) ÷ nblocks) % H + 1
    n = (w - 1) ÷ (nblocks * H) + 1
    cols = ((blk - 1) * MATRIX_CPU_COLUMNS + 1):min(blk * MATRIX_CPU_COLUMNS, nv)
    b, start, len = matrix_segment(cu_seqlens, n, size(v, 3))
    hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
    T = eltype(S)
    @inbounds for i in 1:nk, j in cols
        S[j, i, h, n] = h0 === nothing ? zero(T) : T(h0[j, i, h, n])
    end
    @inbounds for step in 1:len
        t = reversed ? start + len - step : start + step - 1
        for j in cols
            o[j, h, t, b] = zero(T)
        end
        dstep = matrix_decay(g, Val(decay === :key ? :none : decay), T, 1, h, t, b)
        for i in 1:nk
            di = decay === :key ? matrix_decay(g, Val(:key), T, i, h, t, b) : dstep
            ki, qi = T(k[i, hq, t, b]), T(q[i, hq, t, b])
            if bonus
                c = qi * T(u[i, h]) * ki
                @simd ivdep for j in cols
                    s, vj = S[j, i, h, n], T(v[j, h, t, b])
                    S[j, i, h, n] = muladd(di, s, ki * vj)
                    o[j, h, t, b] += muladd(qi, s, c * vj)
                end
            else
                @simd ivdep for j in cols
                    s = muladd(di, S[j, i, h, n], ki * T(v[j, h, t, b]))
                    S[j, i, h, n] = s
                    o[j, h, t, b] = muladd(qi, s, o[j, h, t, b])
                end
            end
        end
    end
    return nothing
end

"Vectors of state columns per work item of the CPU forward's vector path (4 AVX registers of `Float32`)."
const MATRIX_CPU_VECTORS = 4

"""
    matrix_row_update(p, vs, acc, d, k, q, Val(bonus)) -> acc

One row `i` of a block of state columns at one step, on SIMD vectors: the
row's `NV` vectors at address `p` become `d * S + k * v` (`vs` the block's
values of `v`), and the readout `acc` gains `q` times the new row (the old one
for the bonus readout). Closures capture arguments only.
"""
@inline function matrix_row_update(
    p::Ptr{T},
    vs::Tuple{V, Vararg{V, rest}},
    acc::Tuple{V, Vararg{V, rest}},
    d,
    k,
    q,
    ::Val{bonus},
) where {T, rest, V, bonus}
    NV = rest + 1 # at least one vector: every type parameter is bound
    W = fieldcount(V)
    dv, kv, qv = vbroadcast(V, d), vbroadcast(V, k), vbroadcast(V, q)
    offsets = ntuple(m -> (m - 1) * W * sizeof(T), Val(NV))
    olds = map(o -> vload(V, p + o), offsets)
    news = map((s, x) -> vmuladd(dv, s, vmul(kv, x)), olds, vs)
    foreach((o, x) -> vstore!(p + o, x), offsets, news)
    return map((a, s) -> vmuladd(qv, s, a), acc, bonus ? olds : news)
end

"""
    matrix_vector_block(w, x, q, cu_seqlens, Val(W)) -> (h, n, j0, b, start, len, hq)

The head `h`, sequence `n`, first column `j0`, row `b`, first step `start`,
length `len` and q/k group `hq` of vector work item `w` over `x` (`(V, H,
T, batch)`): `MATRIX_CPU_VECTORS` vectors of `W` columns per item.
"""
function matrix_vector_block(w, x, q, cu_seqlens, ::Val{W}) where {W}
    NV = MATRIX_CPU_VECTORS
    nv, H = size(x, 1), size(x, 2)
    nblocks = nv ÷ (NV * W)
    blk = (w - 1) % nblocks + 1
    h = ((w - 1) ÷ nblocks) % H + 1
    n = (w - 1) ÷ (nblocks * H) + 1
    j0 = (blk - 1) * NV * W + 1
    b, start, len = matrix_segment(cu_seqlens, n, size(x, 3))
    hq = (h - 1) ÷ (H ÷ size(q, 2)) + 1
    return h, n, j0, b, start, len, hq
end

"""
    matrix_vector_sweep!(out, block, x, q, k, g, u, rowfn, steps, (b, h, hq, j0, start, len),
                         Val(decay), Val(bonus), Val(reversed), Val(W)) -> nothing

The sweep over the steps of one vector work item shared by the forward and
the backward's values pass: at each step (in the order of `steps`) the
`MATRIX_CPU_VECTORS` vectors of `x` (v, or dout) at the block's columns, every
state row of `block` updated by `rowfn` ([`matrix_row_update`](@ref) or
[`matrix_values_row`](@ref)) with its decay, k and q, the rows' sum (plus the
bonus readout's `(q . (u*k)) x`) stored into `out` (o, or dv).
"""
function matrix_vector_sweep!(
    out::Array{T},
    block,
    x::Array{T},
    q,
    k,
    g,
    u,
    rowfn::F,
    steps,
    at,
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{W},
) where {T, F, decay, bonus, reversed, W}
    NV = MATRIX_CPU_VECTORS
    Vt = Vec{W, T}
    b, h, hq, j0, start, len = at
    nk = size(q, 1)
    offsets = ntuple(m -> (m - 1) * W * sizeof(T), Val(NV))
    row = NV * W * sizeof(T)
    zero_block = ntuple(_ -> vbroadcast(Vt, zero(T)), Val(NV))
    GC.@preserve out block x for step in steps
        t = reversed ? start + len - step : start + step - 1
        xp = pointer(x, LinearIndices(x)[j0, h, t, b])
        xs = map(off -> vload(Vt, xp + off), offsets)
        sp = pointer(block)
        acc, bonus_sum = zero_block, zero(T)
        dstep = matrix_decay(g, Val(decay === :key ? :none : decay), T, 1, h, t, b)
        for i in 1:nk
            d = decay === :key ? matrix_decay(g, Val(:key), T, i, h, t, b) : dstep
            ki, qi = T(@inbounds k[i, hq, t, b]), T(@inbounds q[i, hq, t, b])
            acc = rowfn(sp + (i - 1) * row, xs, acc, d, ki, qi, Val(bonus))
            if bonus
                bonus_sum += qi * T(@inbounds u[i, h]) * ki
            end
        end
        if bonus
            bonus_vec = vbroadcast(
                Vt,
                bonus_sum,
            ) # one binding: the closure captures no reassigned variable
            acc = map((a, y) -> vmuladd(bonus_vec, y, a), acc, xs)
        end
        op = pointer(out, LinearIndices(out)[j0, h, t, b])
        foreach((off, x) -> vstore!(op + off, x), offsets, acc)
    end
    return nothing
end

"""
    matrix_vector_item!(w, o, S, q, k, v, g, u, h0, cu_seqlens,
                        Val(decay), Val(bonus), Val(reverse), Val(W))

Work item `w` of the CPU forward where `o`, `S` (the final states) and `v`
are `Array`s of one `Float32`/`Float64` type and `V` is a multiple of
`MATRIX_CPU_VECTORS * W`: [`MATRIX_CPU_VECTORS`](@ref) SIMD vectors of `W`
columns (block `(w - 1) % nblocks + 1`) of one head and sequence, the
readout summed in registers and the state rows updated through
[`matrix_row_update`](@ref); otherwise as [`matrix_cpu_item!`](@ref).
"""
function matrix_vector_item!(
    w,
    o::Array{T},
    S::Array{T},
    q,
    k,
    v::Array{T},
    g,
    u,
    h0,
    cu_seqlens,
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{W},
) where {T, decay, bonus, reversed, W}
    NV = MATRIX_CPU_VECTORS
    nk = size(q, 1)
    h, n, j0, b, start, len, hq = matrix_vector_block(w, v, q, cu_seqlens, Val(W))
    # the block's state rows, contiguous and aligned here (not at hlast's stride and alignment)
    block = Matrix{T}(undef, NV * W, nk)
    @inbounds for i in 1:nk, j in 1:(NV * W)
        block[j, i] = h0 === nothing ? zero(T) : T(h0[j0 + j - 1, i, h, n])
    end
    matrix_vector_sweep!(
        o,
        block,
        v,
        q,
        k,
        g,
        u,
        matrix_row_update,
        1:len,
        (b, h, hq, j0, start, len),
        Val(decay),
        Val(bonus),
        Val(reversed),
        Val(W),
    )
    @inbounds for i in 1:nk, j in 1:(NV * W)
        S[j0 + j - 1, i, h, n] = block[j, i]
    end
    return nothing
end

"""
    launch_matrix_state!(backend, wg, args)

Runs the matrix-state forward for the arguments of
[`matrix_state_kernel!`](@ref): on `CPU()` as SIMD blocks
([`matrix_vector_item!`](@ref)) where the arrays allow, else as
[`matrix_cpu_item!`](@ref) blocks when the output and state types agree,
else as per-column [`matrix_state_item!`](@ref) items; elsewhere as the
kernel.
"""
function launch_matrix_state!(backend::CPU, wg, args::Tuple)
    o, S, q, k, v, g, u, h0, cu, _, decay, bonus, reversed = args
    nv, H, L = size(v, 1), size(v, 2), size(v, 3)
    nseq = size(S, 4)
    T = eltype(S)
    W = T === Float32 ? 8 : 4
    if T <: Union{Float32, Float64} &&
            o isa Array{T} &&
            S isa Array{T} &&
            v isa Array{T} &&
            nv % (MATRIX_CPU_VECTORS * W) == 0
        items = nv ÷ (MATRIX_CPU_VECTORS * W) * H * nseq
        work = L * size(q, 1) * MATRIX_CPU_VECTORS * W ÷ max(nseq, 1)
        vectors = (o, S, q, k, v, g, u, h0, cu, decay, bonus, reversed, Val(W))
        cpu_items!(matrix_vector_item!, items, vectors; work)
    elseif eltype(o) === eltype(S)
        items = cld(nv, MATRIX_CPU_COLUMNS) * H * nseq
        work = L * size(q, 1) * min(nv, MATRIX_CPU_COLUMNS) ÷ max(nseq, 1)
        fast = (o, S, q, k, v, g, u, h0, cu, decay, bonus, reversed)
        cpu_items!(matrix_cpu_item!, items, fast; work)
    else
        cpu_items!(matrix_state_item!, nv * H * nseq, args; work = L * size(q, 1))
    end
    return nothing
end

function launch_matrix_state!(backend, wg, args::Tuple)
    v, S = args[5], args[2]
    items = size(v, 1) * size(v, 2) * size(S, 4)
    launch_checked!(matrix_state_kernel!(backend, wg), wg, items, args)
    return nothing
end
