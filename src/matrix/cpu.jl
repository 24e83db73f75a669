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
        for i in 1:nk
            di = matrix_decay(g, Val(decay), T, i, h, t, b)
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

"""
    launch_matrix_state!(backend, wg, args)

Runs the matrix-state forward for the arguments of
[`matrix_state_kernel!`](@ref): on `CPU()` as [`matrix_cpu_item!`](@ref)
blocks when the output and state types agree (else per-column
[`matrix_state_item!`](@ref) items), elsewhere as the kernel.
"""
function launch_matrix_state!(backend::CPU, wg, args::Tuple)
    o, S, q, k, v, g, u, h0, cu, _, decay, bonus, reversed = args
    nv, H, L = size(v, 1), size(v, 2), size(v, 3)
    nseq = size(S, 4)
    if eltype(o) === eltype(S)
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
