# The host side of the chunked matrix-state forward (`src/matrix/chunked.jl`):
# the chunk tables, the scratch and the six launches.

"The algorithms of [`matrix_state_scan!`](@ref): the fused recurrence, or the chunked (matmul) form."
const MATRIX_ALGORITHMS = (:recurrent, :chunked)

"Time steps per chunk of the chunked form unless given."
const DEFAULT_MATRIX_CHUNK = 64

"The longest chunk of the chunked form (its intra-chunk weights grow with the chunk's length)."
const MAX_MATRIX_CHUNK = 1024

"""
    chunk_accumulator(backend, T) -> Type

The element type of the chunked form's sums and scratch for states stored in
`T`: `Float64` on the CPU, `Float32` or `T` if wider on other devices.
"""
chunk_accumulator(::CPU, ::Type{T}) where {T} = Float64
chunk_accumulator(backend, ::Type{T}) where {T} = promote_type(Float32, T)

"""
    check_matrix_algorithm(api, algorithm, chunk)

`algorithm` one of [`MATRIX_ALGORITHMS`](@ref) and `chunk` (or `nothing`) an
integer from 1 to [`MAX_MATRIX_CHUNK`](@ref); else an `ArgumentError` naming it.
"""
function check_matrix_algorithm(api::Symbol, algorithm, chunk)
    algorithm in MATRIX_ALGORITHMS ||
        throw(ArgumentError(
            "$api: algorithm = $(repr(algorithm)) must be one of $(join(MATRIX_ALGORITHMS, ", "))",
        ))
    if chunk !== nothing && (!(chunk isa Integer) || !(1 <= chunk <= MAX_MATRIX_CHUNK))
        throw(ArgumentError(
            "$api: chunk = $(repr(chunk)) must be an integer from 1 to $MAX_MATRIX_CHUNK",
        ))
    end
    return nothing
end

"""
    matrix_chunk_tables_on(backend, cu_seqlens, batch, L, C, reversed) -> (chunks, firsts, slot, nch, Cw)

[`matrix_chunk_tables`](@ref) on `backend`, with the number of chunks `nch` and
the longest chunk `Cw` (at least 1), read from the host tables.
"""
function matrix_chunk_tables_on(backend, cu_seqlens, batch, L, C, reversed)
    host = matrix_chunk_tables(cu_seqlens, batch, L, C, reversed)
    chunks, firsts, slot = map(X -> on_backend(backend, X), host)
    return chunks,
        firsts,
        slot,
        size(host[1], 2),
        max(1, maximum(view(host[1], 4, :); init = 1))
end

"""
    matrix_chunk_tables(cu_seqlens, batch, L, C, reversed) -> (chunks, firsts, slot)

The chunks of every sequence in scan order, as `Int32` host arrays: `chunks`
`(4, nchunks)` (sequence, batch row, data position of the chunk's first step,
its length), `firsts` `(nseq + 1,)` (offsets of each sequence's chunks) and
`slot` `(2, L, batch)` (chunk and chunk-local step of each position).

# Examples
```julia-repl
julia> chunks, firsts, slot = ScanWeaver.matrix_chunk_tables(nothing, 1, 5, 2, false);

julia> chunks[3:4, :], firsts
(Int32[1 3 5; 2 2 1], Int32[0, 3])
```
"""
function matrix_chunk_tables(cu_seqlens, batch, L, C, reversed)
    segs = if cu_seqlens === nothing
        [(b, 1, L) for b in 1:batch]
    else
        cu = collect(Int, cu_seqlens)
        [(1, cu[n] + 1, cu[n + 1] - cu[n]) for n in 1:(length(cu) - 1)]
    end
    chunks, firsts = Int32[], Int32[0]
    slot = zeros(Int32, 2, L, batch)
    for (n, (b, start, len)) in enumerate(segs)
        for before in 0:C:(len - 1)
            clen = min(C, len - before)
            t0 = reversed ? start + len - 1 - before : start + before
            append!(chunks, (n, b, t0, clen))
            c = length(chunks) ÷ 4
            for s in 1:clen
                t = reversed ? t0 - (s - 1) : t0 + (s - 1)
                slot[1, t, b], slot[2, t, b] = c, s
            end
        end
        push!(firsts, length(chunks) ÷ 4)
    end
    return reshape(chunks, 4, :), firsts, slot
end

"`X` (a host array) copied to `backend`."
function on_backend(backend, X::Array)
    return copyto!(KernelAbstractions.allocate(backend, eltype(X), size(X)), X)
end

"Launches `kernel` over `n` work-items unless `n` is 0."
function launch_chunk_kernel!(kernel, backend, wg, n, args::Tuple)
    n > 0 && launch_checked!(kernel(backend, wg), wg, n, args)
    return nothing
end

"""
    matrix_chunk_states(backend, wg, C, hlast, q, k, v, g, u, h0, cu_seqlens,
                        Val(decay), Val(bonus), Val(reversed)) -> NamedTuple

The chunked form up to the outputs: the chunk tables (`chunks`, `firsts`,
`slot`), the prefix (`G`, `seg`, `D`), `qd`, `kd`, the chunk-start states `S0`
(with the final states written to `hlast`) and the intra-chunk weights `Aw`,
in the accumulator type `A` (see `src/matrix/chunked.jl`).
"""
function matrix_chunk_states(
    backend,
    wg,
    C,
    hlast,
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
    nk, (nv, H, L, batch) = size(q, 1), size(v)
    S = eltype(hlast)
    A = chunk_accumulator(backend, S)
    chunks, firsts, slot, nch, Cw = matrix_chunk_tables_on(
        backend,
        cu_seqlens,
        batch,
        L,
        C,
        reversed,
    )
    Kd = decay === :key ? nk : 1
    alloc(T, dims...) = KernelAbstractions.allocate(backend, T, dims)
    G, seg, D = alloc(A, Kd, H, L, batch),
        alloc(Int32, Kd, H, L, batch),
        alloc(A, Kd, H, nch)
    qd, kd = alloc(A, nk, H, L, batch), alloc(A, nk, H, L, batch)
    E, S0 = alloc(A, nv, nk, H, nch), alloc(A, nv, nk, H, nch)
    Aw = alloc(A, Cw, H, L, batch)
    flags = (Val(decay), Val(bonus), Val(reversed))
    launch_chunk_kernel!(
        matrix_chunk_prefix_kernel!,
        backend,
        wg,
        Kd * H * nch,
        (G, seg, D, g, chunks, Val(S), Val(decay), Val(reversed)),
    )
    launch_chunk_kernel!(
        matrix_chunk_scale_kernel!,
        backend,
        wg,
        length(qd),
        (qd, kd, q, k, G, seg, chunks, slot, flags...),
    )
    launch_chunk_kernel!(
        matrix_chunk_state_kernel!,
        backend,
        wg,
        length(E),
        (E, kd, v, chunks, Val(reversed)),
    )
    launch_chunk_kernel!(
        matrix_chunk_carry_kernel!,
        backend,
        wg,
        length(hlast),
        (S0, hlast, E, D, h0, firsts, Val(decay), Val(false)),
    )
    launch_chunk_kernel!(
        matrix_chunk_intra_kernel!,
        backend,
        wg,
        length(Aw),
        (Aw, q, k, u, G, seg, chunks, slot, flags...),
    )
    return (; chunks, firsts, slot, G, seg, D, qd, kd, S0, Aw, E, A, Cw, nch)
end

"""
    matrix_chunked!(backend, wg, C, o, hlast, q, k, v, g, u, h0, cu_seqlens,
                    Val(decay), Val(bonus), Val(reversed)) -> nothing

The chunked matrix-state forward (`src/matrix/chunked.jl`) with chunks of `C`
steps: writes `o` and the final states `hlast` `(V, K, H, nseq)`;
`cu_seqlens` is a host vector or `nothing`.
"""
function matrix_chunked!(backend, wg, C, o, hlast, q, k, v, g, u, h0, cu_seqlens, flags...)
    st = matrix_chunk_states(backend, wg, C, hlast, q, k, v, g, u, h0, cu_seqlens, flags...)
    reversed = flags[3]
    launch_chunk_kernel!(
        matrix_chunk_output_kernel!,
        backend,
        wg,
        length(o),
        (o, st.qd, st.S0, st.Aw, v, st.chunks, st.slot, reversed),
    )
    return nothing
end

"""
    matrix_chunked_backward!(backend, wg, C, (; dq, dk, dv, dg, du, dh0), q, k, v, dout,
                             g, u, h0, dhlast, cu_seqlens, Val(decay), Val(bonus), Val(reversed))

The chunked matrix-state backward (`src/matrix/chunked_backward.jl`) with
chunks of `C` steps: writes `dq`, `dk`, `dv` and those of `dg`, `du`, `dh0`
that are not `nothing`.
"""
function matrix_chunked_backward!(
    backend,
    wg,
    C,
    grads::NamedTuple,
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
    decay_flag, _, reversed = flags
    nk, (nv, H, L, batch) = size(q, 1), size(v)
    S = eltype(grads.dv)
    A = chunk_accumulator(backend, S)
    nseq = cu_seqlens === nothing ? batch : length(cu_seqlens) - 1
    alloc(T, dims...) = KernelAbstractions.allocate(backend, T, dims)
    hl = alloc(A, nv, nk, H, nseq)
    st = matrix_chunk_states(backend, wg, C, hl, q, k, v, g, u, h0, cu_seqlens, flags...)
    Kd = decay_flag === Val(:key) ? nk : 1
    dS, dS0 = alloc(A, nv, nk, H, st.nch), alloc(A, nv, nk, H, nseq)
    Ed, dAw = st.E, alloc(A, st.Cw, H, L, batch)
    dqh, dkh, qa, kb = ntuple(_ -> alloc(A, nk, H, L, batch), 4)
    launch_chunk_kernel!(
        matrix_chunk_state_kernel!,
        backend,
        wg,
        length(Ed),
        (Ed, st.qd, dout, st.chunks, reversed),
    )
    launch_chunk_kernel!(
        matrix_chunk_carry_kernel!,
        backend,
        wg,
        length(dS0),
        (dS, dS0, Ed, st.D, dhlast, st.firsts, decay_flag, Val(true)),
    )
    launch_chunk_kernel!(
        matrix_chunk_dA_kernel!,
        backend,
        wg,
        length(dAw),
        (dAw, dout, v, st.chunks, st.slot, reversed),
    )
    common = (st.G, st.seg, st.chunks, st.slot, flags...)
    launch_chunk_kernel!(
        matrix_chunk_dq_kernel!,
        backend,
        wg,
        length(dqh),
        (dqh, qa, q, k, u, st.S0, dAw, dout, common...),
    )
    launch_chunk_kernel!(
        matrix_chunk_dk_kernel!,
        backend,
        wg,
        length(dkh),
        (dkh, kb, q, k, u, v, dS, dAw, common...),
    )
    launch_chunk_kernel!(
        matrix_chunk_dv_kernel!,
        backend,
        wg,
        length(grads.dv),
        (grads.dv, st.kd, dS, st.Aw, dout, st.chunks, st.slot, reversed),
    )
    launch_chunk_kernel!(
        matrix_chunk_group_kernel!,
        backend,
        wg,
        length(grads.dq),
        (grads.dq, grads.dk, dqh, dkh),
    )
    if grads.dg !== nothing && decay_flag !== Val(:none)
        args = (grads.dg, qa, kb, g, hl, dhlast, st.chunks, st.firsts, Val(S), flags...)
        launch_chunk_kernel!(matrix_chunk_dg_kernel!, backend, wg, Kd * H * nseq, args)
    end
    if grads.du !== nothing
        args = (grads.du, q, k, dAw, st.slot)
        launch_chunk_kernel!(matrix_chunk_du_kernel!, backend, wg, nk * H, args)
    end
    grads.dh0 === nothing || (grads.dh0 .= dS0)
    return nothing
end
