# The matrix-state backward on the CPU in SIMD vectors, as the forward
# (`src/matrix/cpu.jl`): the same two passes as the kernels of
# `src/matrix/backward.jl`, each work item a block of contiguous elements
# advanced together.
#
# * values: [`MATRIX_CPU_VECTORS`](@ref) vectors of state columns of one head
#   and sequence; G's rows for those columns live in `Gs` (`dh0`'s layout),
#   and each reverse step updates them row by row, summing dv in registers.
# * keys: one vector of `W` rows of S (and then of G) for one q/k head and
#   sequence, kept column by column in a scratch of `V` vectors: each step
#   walks the columns, so dq and dk (sums over columns) are vector sums, and q,
#   k, the key decays, dq, dk and the decay gradients are contiguous along the
#   rows.
#
# Taken where the arrays are dense `Array`s of one `Float32`/`Float64` type and
# the block divides `V` (values) or `K` (keys); otherwise the per-column and
# per-row items of `src/matrix/backward.jl` run.

"`W` values of `A` along its first dimension from index `i`, as a SIMD vector (`nothing`: zeros)."
@inline function vgather(::Type{V}, A, i, I...) where {V}
    T = vec_eltype(V)
    return ntuple(m -> VecElement(T(@inbounds A[i + m - 1, I...])), Val(fieldcount(V)))
end
@inline vgather(::Type{V}, ::Nothing, i, I...) where {V} = vbroadcast(
    V,
    zero(vec_eltype(V)),
)

"Rows `i:i+W-1` of column `j` of a state array (`(V, K, H, nseq)`) as a SIMD vector (`nothing`: zeros)."
@inline function vstate(::Type{V}, A, j, i, h, n) where {V}
    T = vec_eltype(V)
    return ntuple(m -> VecElement(T(@inbounds A[j, i + m - 1, h, n])), Val(fieldcount(V)))
end
@inline vstate(::Type{V}, ::Nothing, j, i, h, n) where {V} = vbroadcast(
    V,
    zero(vec_eltype(V)),
)

"The decays of rows `i:i+W-1` at step `t` as a vector (one per row for `:key`, else the step's)."
@inline function vdecay(::Type{V}, g, ::Val{decay}, i, h, t, b) where {V, decay}
    decay === :key ||
        return vbroadcast(V, matrix_decay(g, Val(decay), vec_eltype(V), i, h, t, b))
    return map(e -> VecElement(exp(e.value)), vgather(V, g, i, h, t, b))
end

"""
    matrix_values_vector_item!(w, dv, Gs, q, k, g, u, dout, dhlast, cu_seqlens,
                               Val(decay), Val(bonus), Val(reverse), Val(W))

Work item `w` of the values pass: `MATRIX_CPU_VECTORS` vectors of `W` columns
(block `(w - 1) % nblocks + 1`) of one head and sequence, from the last step
to the first; writes `dv` and, unless `Gs` is `nothing`, dh0 into `Gs`.
"""
function matrix_values_vector_item!(
    w,
    dv::Array{T},
    Gs,
    q,
    k,
    g,
    u,
    dout::Array{T},
    dhlast,
    cu_seqlens,
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{W},
) where {T, decay, bonus, reversed, W}
    NV = MATRIX_CPU_VECTORS
    nk = size(q, 1)
    h, n, j0, b, start, len, hq = matrix_vector_block(w, dv, q, cu_seqlens, Val(W))
    block = Matrix{T}(undef, NV * W, nk) # G's rows for the block, contiguous and aligned
    @inbounds for i in 1:nk, j in 1:(NV * W)
        block[j, i] = dhlast === nothing ? zero(T) : T(dhlast[j0 + j - 1, i, h, n])
    end
    matrix_vector_sweep!(
        dv,
        block,
        dout,
        q,
        k,
        g,
        u,
        matrix_values_row,
        len:-1:1,
        (b, h, hq, j0, start, len),
        Val(decay),
        Val(bonus),
        Val(reversed),
        Val(W),
    )
    if Gs !== nothing
        @inbounds for i in 1:nk, j in 1:(NV * W)
            Gs[j0 + j - 1, i, h, n] = block[j, i]
        end
    end
    return nothing
end

"""
    matrix_values_row(p, ds, acc, d, k, q, Val(bonus)) -> acc

One reverse step of row `i` of G for a block of columns (`NV` vectors at `p`,
`ds` the block of `dout`): after the readout `Gt = G + q * dout`, `dv += k *
Gt`, `G = d * Gt`; with the bonus readout `dv += k * G`, `G = d * G + q *
dout`. Closures capture arguments only.
"""
@inline function matrix_values_row(
    p::Ptr{T},
    ds::Tuple{V, Vararg{V, rest}},
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
    if bonus
        foreach((o, G, x) -> vstore!(p + o, vmuladd(dv, G, vmul(qv, x))), offsets, olds, ds)
        return map((a, G) -> vmuladd(kv, G, a), acc, olds)
    end
    Gt = map((G, x) -> vmuladd(qv, x, G), olds, ds)
    foreach((o, x) -> vstore!(p + o, vmul(dv, x)), offsets, Gt)
    return map((a, x) -> vmuladd(kv, x, a), acc, Gt)
end

"""
    matrix_keys_vector_item!(w, dq, dk, rows, du_rows, q, k, v, g, u, h0, dout,
                             dhlast, cu_seqlens, Val(decay), Val(bonus), Val(reverse),
                             Val(W))

Work item `w` of the keys pass: rows `i0:i0+W-1` (block `(w - 1) % (K ÷ W) + 1`)
of every head of one q/k head and sequence, as [`matrix_keys_item!`](@ref)
does for one row: a forward sweep of S gives dq and leaves `q * dq'` in
`rows`, a reverse sweep of G gives dk and the decay gradients.
"""
function matrix_keys_vector_item!(
    w,
    dq::Array{T},
    dk::Array{T},
    rows,
    du_rows,
    q::Array{T},
    k::Array{T},
    v::Array{T},
    g,
    u,
    h0,
    dout::Array{T},
    dhlast,
    cu_seqlens,
    ::Val{decay},
    ::Val{bonus},
    ::Val{reversed},
    ::Val{W},
) where {T, decay, bonus, reversed, W}
    Vt = Vec{W, T}
    nk, Hq, nv = size(q, 1), size(q, 2), size(v, 1)
    group = size(dout, 2) ÷ Hq
    nblocks = nk ÷ W
    i0 = ((w - 1) % nblocks) * W + 1
    hq = ((w - 1) ÷ nblocks) % Hq + 1
    n = (w - 1) ÷ (nblocks * Hq) + 1
    b, start, len = matrix_segment(cu_seqlens, n, size(dout, 3))
    scratch = Vector{T}(undef, nv * W)
    vsize = W * sizeof(T)
    zero_v = vbroadcast(Vt, zero(T))
    GC.@preserve dq dk q k v dout scratch for h in ((hq - 1) * group + 1):(hq * group)
        sp = pointer(scratch)
        for j in 1:nv
            vstore!(sp + (j - 1) * vsize, vstate(Vt, h0, j, i0, h, n))
        end
        us = bonus ? vgather(Vt, u, i0, h) : zero_v
        duacc = zero_v
        for step in 1:len
            t = reversed ? start + len - step : start + step - 1
            qs = vload(Vt, pointer(q, LinearIndices(q)[i0, hq, t, b]))
            ks = vload(Vt, pointer(k, LinearIndices(k)[i0, hq, t, b]))
            ds = vdecay(Vt, g, Val(decay), i0, h, t, b)
            dqt, wt = matrix_keys_sweep(sp, v, dout, ds, ks, nv, h, t, b, Val(bonus))
            duacc = vmuladd(vmul(qs, ks), vbroadcast(Vt, wt), duacc)
            dqp = pointer(dq, LinearIndices(dq)[i0, hq, t, b])
            vstore!(
                dqp,
                vmuladd(vmul(us, ks), vbroadcast(Vt, wt), vadd(vload(Vt, dqp), dqt)),
            )
            if decay !== :none
                vstore!(pointer(rows, LinearIndices(rows)[i0, h, t, b]), vmul(qs, dqt))
            end
        end
        hterm = zero_v
        for j in 1:nv
            Sj = vload(Vt, sp + (j - 1) * vsize)
            Gj = vstate(Vt, dhlast, j, i0, h, n)
            hterm = vmuladd(Gj, Sj, hterm)
            vstore!(sp + (j - 1) * vsize, Gj)
        end
        rq, rk = zero_v, zero_v
        for step in len:-1:1
            t = reversed ? start + len - step : start + step - 1
            qs = vload(Vt, pointer(q, LinearIndices(q)[i0, hq, t, b]))
            ks = vload(Vt, pointer(k, LinearIndices(k)[i0, hq, t, b]))
            ds = vdecay(Vt, g, Val(decay), i0, h, t, b)
            dkt, wt = matrix_keys_sweep_reverse(
                sp,
                v,
                dout,
                ds,
                qs,
                nv,
                h,
                t,
                b,
                Val(bonus),
            )
            dkp = pointer(dk, LinearIndices(dk)[i0, hq, t, b])
            vstore!(
                dkp,
                vmuladd(vmul(us, qs), vbroadcast(Vt, wt), vadd(vload(Vt, dkp), dkt)),
            )
            if decay !== :none
                rp = pointer(rows, LinearIndices(rows)[i0, h, t, b])
                x = vload(Vt, rp)
                rk = vmuladd(ks, dkt, rk)
                bonus || (rq = vadd(rq, x))
                vstore!(rp, vadd(vsub(rq, rk), hterm))
                bonus && (rq = vadd(rq, x))
            end
        end
        if bonus
            vstore!(pointer(du_rows, LinearIndices(du_rows)[i0, h, n]), duacc)
        end
    end
    return nothing
end

"""
    matrix_keys_sweep(sp, v, dout, ds, ks, V, h, t, b, Val(bonus)) -> (dq', w)

One forward step of a block of rows of S, kept column by column at `sp`:
each column becomes `d * S + k * v_t[j]`, and `dq'` sums `S * dout_t[j]`
over the columns (the new S after the readout, the old one with the bonus
readout, which also returns `w = v_t . dout_t`).
"""
@inline function matrix_keys_sweep(
    sp::Ptr{T},
    v,
    dout,
    ds::V,
    ks::V,
    nv,
    h,
    t,
    b,
    ::Val{bonus},
) where {T, V, bonus}
    acc, w = vbroadcast(V, zero(T)), zero(T)
    vsize = fieldcount(V) * sizeof(T)
    for j in 1:nv
        vj, dj = T(@inbounds v[j, h, t, b]), T(@inbounds dout[j, h, t, b])
        p = sp + (j - 1) * vsize
        old = vload(V, p)
        new = vmuladd(ds, old, vmul(ks, vbroadcast(V, vj)))
        vstore!(p, new)
        acc = vmuladd(bonus ? old : new, vbroadcast(V, dj), acc)
        w = muladd(vj, dj, w)
    end
    return acc, bonus ? w : zero(T)
end

"""
    matrix_keys_sweep_reverse(sp, v, dout, ds, qs, V, h, t, b, Val(bonus)) -> (dk', w)

One reverse step of a block of rows of G, column by column at `sp`: after the
readout `Gt = G + q * dout_t[j]`, `dk' += Gt * v_t[j]`, `G = d * Gt`; with the
bonus readout `dk' += G * v_t[j]`, `G = d * G + q * dout_t[j]`.
"""
@inline function matrix_keys_sweep_reverse(
    sp::Ptr{T},
    v,
    dout,
    ds::V,
    qs::V,
    nv,
    h,
    t,
    b,
    ::Val{bonus},
) where {T, V, bonus}
    acc, w = vbroadcast(V, zero(T)), zero(T)
    vsize = fieldcount(V) * sizeof(T)
    for j in 1:nv
        vj, dj = T(@inbounds v[j, h, t, b]), T(@inbounds dout[j, h, t, b])
        p = sp + (j - 1) * vsize
        G = vload(V, p)
        if bonus
            acc = vmuladd(G, vbroadcast(V, vj), acc)
            vstore!(p, vmuladd(ds, G, vmul(qs, vbroadcast(V, dj))))
        else
            Gt = vmuladd(qs, vbroadcast(V, dj), G)
            acc = vmuladd(Gt, vbroadcast(V, vj), acc)
            vstore!(p, vmul(ds, Gt))
        end
        w = muladd(vj, dj, w)
    end
    return acc, bonus ? w : zero(T)
end

"""
    launch_matrix_backward!(backend, wg, values, keys)

Runs the values and keys passes of the backward for the arguments of
[`matrix_values_kernel!`](@ref) and [`matrix_keys_kernel!`](@ref): on
`CPU()` as SIMD blocks where the arrays allow (else as the per-column and
per-row items), elsewhere as the kernels.
"""
function launch_matrix_backward!(backend, wg, values::Tuple, keys::Tuple)
    dv, q, nseq = values[1], values[3], values[10]
    nv, H, nk, Hq = size(dv, 1), size(dv, 2), size(q, 1), size(q, 2)
    launch_items!(
        matrix_values_item!,
        matrix_values_kernel!,
        backend,
        wg,
        nv * H * nseq,
        values,
    )
    launch_items!(matrix_keys_item!, matrix_keys_kernel!, backend, wg, nk * Hq * nseq, keys)
    return nothing
end

function launch_matrix_backward!(::CPU, wg, values::Tuple, keys::Tuple)
    dv, dh0, q, k, g, u, dout, dhlast, cu, nseq, _, decay, bonus, reversed, _ = values
    dq, dk, rows, du_rows, _, _, v, _, _, h0 = keys
    nv, H, L = size(dv, 1), size(dv, 2), size(dv, 3)
    nk, Hq = size(q, 1), size(q, 2)
    T = eltype(dv)
    W = T === Float32 ? 8 : 4
    simd = T <: Union{Float32, Float64}
    dense(A) = A isa Array{T}
    if simd && dense(dv) && dense(dout) && nv % (MATRIX_CPU_VECTORS * W) == 0
        Gs = dh0 isa Array{T} ? dh0 : Array{T}(undef, nv, nk, H, nseq)
        args = (dv, Gs, q, k, g, u, dout, dhlast, cu, decay, bonus, reversed, Val(W))
        items = nv ÷ (MATRIX_CPU_VECTORS * W) * H * nseq
        cpu_items!(
            matrix_values_vector_item!,
            items,
            args;
            work = L * nk * MATRIX_CPU_VECTORS * W,
        )
        dh0 === nothing || dh0 === Gs || copyto!(dh0, Gs)
    else
        cpu_items!(matrix_values_item!, nv * H * nseq, values; work = L * nk)
    end
    if simd &&
            all(dense, (dq, dk, q, k, v, dout)) &&
            (rows === nothing || dense(rows)) &&
            (du_rows === nothing || dense(du_rows)) &&
            nk % W == 0
        args = (
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
            decay,
            bonus,
            reversed,
            Val(W),
        )
        cpu_items!(
            matrix_keys_vector_item!,
            nk ÷ W * Hq * nseq,
            args;
            work = L * nv * W * (H ÷ Hq),
        )
    else
        cpu_items!(matrix_keys_item!, nk * Hq * nseq, keys; work = L * nv * (H ÷ Hq))
    end
    return nothing
end
