# The fused Mamba-1 kernels. One work-item runs one chunk of time steps of one
# (batch, channel) pair with the channel's N states in registers (an NTuple);
# the gates, inputs, C contraction, D skip and silu(z) are computed on the fly,
# so only the inputs are read and only y (and the final states) written. Long
# sequences with few channels are split into chunks: a reduce pass composes
# each chunk's steps into one affine pair per state, a carry pass scans those
# over the chunks, and the replay pass starts each chunk from its carry. With
# one chunk the replay pass alone runs, from h0.
#
# Work-item g covers chunk `(g - 1) % nchunks + 1` of channel
# `((g - 1) ÷ nchunks) % D + 1` of batch element `(g - 1) ÷ (nchunks * D) + 1`.
# On CPUs each work-item streams contiguous memory; on GPUs neighbouring
# work-items read addresses L apart (time is the contiguous dimension), so the
# loads are not coalesced.

"""
    MambaChunks(workgroupsize, chunk)

The launch of the fused Mamba kernels: `workgroupsize` work-items per
workgroup (each one chunk of one channel), `chunk` time steps per work-item.
Both reach the kernels as `Val`s (compile-time constants), as the state count
`N` does.
"""
struct MambaChunks
    workgroupsize::Int
    chunk::Int
end

@inline function mamba_item(g, nchunks, channels)
    j = (g - 1) % nchunks + 1
    rest = (g - 1) ÷ nchunks
    return j, rest % channels + 1, rest ÷ channels + 1
end

"Work-item `g` of [`mamba_replay_kernel!`](@ref)."
@inline function mamba_replay_item!(
    g,
    y,
    h_last,
    ops,
    carry,
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    L = mamba_length(ops)
    channels = mamba_channels(ops)
    nchunks = cld(L, chunk)
    if g <= nchunks * channels * mamba_batch(ops)
        j, d, b = mamba_item(g, nchunks, channels)
        T = mamba_type(ops)
        ch = MambaChannel(ops, T, Val(nstate), d)
        h = if carry === nothing
            initial_states(ops, T, Val(nstate), d, b)
        else
            ntuple(n -> convert(T, @inbounds carry[n, j, d, b]), Val(nstate))
        end
        for t in chunk_range(j, chunk, L)
            p = mamba_pairs(ops, ch, t, d, b)
            h = map(apply_pair, p, h)
            @inbounds y[t, d, b] = convert(eltype(y), mamba_output(ops, ch, h, t, d, b))
        end
        store_tuple!(h_last, h, d, b)
    end
    return nothing
end

"""
    mamba_replay_kernel!(backend, workgroupsize)(
        y, h_last, ops, carry, Val(N), Val(workgroupsize), Val(chunk);
        ndrange = nchunks * D * batch,
    )

Replays each chunk of each channel from its carry-in states (`carry[:, j, d, b]`,
or `h0` when `carry` is `nothing`) and writes `y`; with `h_last` (one chunk
only) also the final states.
"""
@kernel function mamba_replay_kernel!(
    y,
    h_last,
    @Const(ops),
    @Const(carry),
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    g = @index(Global, Linear)
    vals = (Val(nstate), Val(workgroupsize), Val(chunk))
    mamba_replay_item!(g, y, h_last, ops, carry, vals...)
end

"Work-item `g` of [`mamba_reduce_kernel!`](@ref)."
@inline function mamba_reduce_item!(
    g,
    agg,
    ops,
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    L = mamba_length(ops)
    channels = mamba_channels(ops)
    nchunks = cld(L, chunk)
    if g <= nchunks * channels * mamba_batch(ops)
        j, d, b = mamba_item(g, nchunks, channels)
        T = mamba_type(ops)
        ch = MambaChannel(ops, T, Val(nstate), d)
        acc = ntuple(_ -> identity_pair(AffinePair{T, T}), Val(nstate))
        for t in chunk_range(j, chunk, L)
            p = mamba_pairs(ops, ch, t, d, b)
            acc = map(compose, p, acc)
        end
        store_tuple!(agg, acc, j, d, b)
    end
    return nothing
end

"""
    mamba_reduce_kernel!(backend, workgroupsize)(
        agg, ops, Val(N), Val(workgroupsize), Val(chunk);
        ndrange = nchunks * D * batch,
    )

`agg[n, j, d, b]` is the composition of state `n`'s pairs over chunk `j` of
channel `d` of batch element `b`.
"""
@kernel function mamba_reduce_kernel!(
    agg,
    @Const(ops),
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    g = @index(Global, Linear)
    vals = (Val(nstate), Val(workgroupsize), Val(chunk))
    mamba_reduce_item!(g, agg, ops, vals...)
end

"Work-item `g` of [`mamba_carry_kernel!`](@ref)."
@inline function mamba_carry_item!(
    g,
    carry,
    h_last,
    agg,
    ops,
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    channels = mamba_channels(ops)
    if g <= nstate * channels * mamba_batch(ops)
        n = (g - 1) % nstate + 1
        rest = (g - 1) ÷ nstate
        d, b = rest % channels + 1, rest ÷ channels + 1
        T = eltype(carry)
        h = convert(T, optional_at(ops.h0, zero(T), n, d, b))
        for j in axes(agg, 2)
            @inbounds carry[n, j, d, b] = h
            h = apply_pair(@inbounds(agg[n, j, d, b]), h)
        end
        if h_last !== nothing
            @inbounds h_last[n, d, b] = convert(eltype(h_last), h)
        end
    end
    return nothing
end

"""
    mamba_carry_kernel!(backend, workgroupsize)(
        carry, h_last, agg, ops, Val(N), Val(workgroupsize), Val(chunk);
        ndrange = N * D * batch,
    )

One work-item per state: `carry[n, j, d, b]` is the state before chunk `j`
(from `h0`, or zero), `h_last[n, d, b]` the state after the last chunk.
"""
@kernel function mamba_carry_kernel!(
    carry,
    h_last,
    @Const(agg),
    @Const(ops),
    ::Val{nstate},
    ::Val{workgroupsize},
    ::Val{chunk},
) where {nstate, workgroupsize, chunk}
    g = @index(Global, Linear)
    vals = (Val(nstate), Val(workgroupsize), Val(chunk))
    mamba_carry_item!(g, carry, h_last, agg, ops, vals...)
end

"""
    launch_mamba!(s::MambaChunks, backend, y, h_last, ops, Val(N); workspace)

Runs the fused Mamba kernels for `N` states: the replay pass alone when one
chunk covers the sequence, else reduce, carry and replay, with the per-chunk
pairs and carries kept in `workspace` (a [`ScanWorkspace`](@ref)).
"""
function launch_mamba!(
    s::MambaChunks,
    backend,
    y,
    h_last,
    ops::MambaOperands,
    ::Val{N};
    workspace = ScanWorkspace(),
) where {N}
    wg, chunk = s.workgroupsize, s.chunk
    L, channels, batch = size(ops.u)
    nchunks = cld(L, chunk)
    vals = (Val(N), Val(wg), Val(chunk))
    items = nchunks * channels * batch
    work = chunk * N
    if nchunks == 1
        args = (y, h_last, ops, nothing, vals...)
        launch_items!(
            mamba_replay_item!,
            mamba_replay_kernel!,
            backend,
            wg,
            items,
            args;
            work,
        )
        return nothing
    end
    T = mamba_type(ops)
    dims = (N, nchunks, channels, batch)
    workspace.agg = agg = reuse_or_allocate(workspace.agg, backend, AffinePair{T, T}, dims)
    workspace.carry = carry = reuse_or_allocate(workspace.carry, backend, T, dims)
    reduce = (agg, ops, vals...)
    launch_items!(
        mamba_reduce_item!,
        mamba_reduce_kernel!,
        backend,
        wg,
        items,
        reduce;
        work,
    )
    carries = (carry, h_last, agg, ops, vals...)
    nstates = N * channels * batch
    launch_items!(
        mamba_carry_item!,
        mamba_carry_kernel!,
        backend,
        wg,
        nstates,
        carries;
        work = nchunks,
    )
    replay = (y, nothing, ops, carry, vals...)
    launch_items!(
        mamba_replay_item!,
        mamba_replay_kernel!,
        backend,
        wg,
        items,
        replay;
        work,
    )
    return nothing
end
