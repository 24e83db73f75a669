# Schedule `:reduce_then_scan`: the sequence is split into chunks that many
# workgroups process independently, in three launches:
#   1. chunk_reduce_kernel!: each (chunk, lane) composes its elements into one
#      aggregate pair;
#   2. carry_scan_kernel!: each lane scans its chunk aggregates from h0, giving
#      every chunk its carry-in state (and h_last);
#   3. chunk_propagate_kernel!: each (chunk, lane) replays h = A*h + U from its
#      carry-in and writes y.
# Work-item g covers chunk `(g - 1) % nchunks + 1` of lane `(g - 1) ÷ nchunks + 1`.

"""
    ReduceThenScan(workgroupsize, chunk) <: ScanSchedule

Schedule `:reduce_then_scan`, for few long lanes: chunks of `chunk` elements
are reduced to aggregate pairs in parallel, each lane scans its aggregates,
and every chunk is replayed from its carry-in. Three launches, no local
memory; the per-chunk buffers live in a [`ScanWorkspace`](@ref).
"""
struct ReduceThenScan <: ScanSchedule
    workgroupsize::Int
    chunk::Int
end

@inline chunk_of(g, nchunks) = (g - 1) % nchunks + 1
@inline lane_of(g, nchunks) = (g - 1) ÷ nchunks + 1
@inline chunk_range(j, chunk, L) = ((j - 1) * chunk + 1):min(j * chunk, L)

"""
    chunk_reduce_kernel!(backend, workgroupsize)(
        agg, ops, reversed, Val(workgroupsize), Val(chunk);
        ndrange = nchunks * lanes,
    )

Stage 1 of [`ReduceThenScan`](@ref): `agg[j, l]` is the composition of the
elements of chunk `j` (in scan order) of lane `l`.
"""
@kernel function chunk_reduce_kernel!(
    agg,
    @Const(ops),
    reversed,
    ::Val{workgroupsize},
    ::Val{chunk},
) where {workgroupsize, chunk}
    g = @index(Global, Linear)
    nchunks = size(agg, 1)
    if g <= nchunks * size(agg, 2)
        j = chunk_of(g, nchunks)
        l = lane_of(g, nchunks)
        P = eltype(agg)
        L = scan_length(ops)
        acc = identity_pair(P)
        for k in chunk_range(j, chunk, L)
            acc = compose(load_pair(P, ops, time_index(k, L, reversed), l), acc)
        end
        @inbounds agg[j, l] = acc
    end
end

"""
    carry_scan_kernel!(backend, workgroupsize)(
        carry, h_last, agg, ops, Val(workgroupsize), Val(chunk);
        ndrange = lanes,
    )

Stage 2 of [`ReduceThenScan`](@ref): `carry[j, l]` is lane `l`'s state before
chunk `j` (from `ops.h0`); `h_last[l]` the state after the last chunk.
"""
@kernel function carry_scan_kernel!(
    carry,
    h_last,
    @Const(agg),
    @Const(ops),
    ::Val{workgroupsize},
    ::Val{chunk},
) where {workgroupsize, chunk}
    l = @index(Global, Linear)
    if l <= size(agg, 2)
        h = initial_state(eltype(carry), ops.h0, l)
        for j in axes(agg, 1)
            @inbounds carry[j, l] = h
            h = apply_pair(@inbounds(agg[j, l]), h)
        end
        store_state!(h_last, h, l)
    end
end

"""
    chunk_propagate_kernel!(backend, workgroupsize)(
        y, ops, carry, reversed, Val(workgroupsize), Val(chunk);
        ndrange = nchunks * lanes,
    )

Stage 3 of [`ReduceThenScan`](@ref): replays each chunk from its carry-in
state and writes the outputs.
"""
@kernel function chunk_propagate_kernel!(
    y,
    @Const(ops),
    @Const(carry),
    reversed,
    ::Val{workgroupsize},
    ::Val{chunk},
) where {workgroupsize, chunk}
    g = @index(Global, Linear)
    nchunks = size(carry, 1)
    if g <= nchunks * size(carry, 2)
        j = chunk_of(g, nchunks)
        l = lane_of(g, nchunks)
        P = pair_type(ops)
        L = scan_length(ops)
        h = @inbounds carry[j, l]
        for k in chunk_range(j, chunk, L)
            t = time_index(k, L, reversed)
            h = apply_pair(load_pair(P, ops, t, l), h)
            store_output!(y, ops.c, h, t, l)
        end
    end
end

"""
    ScanWorkspace()

Device buffers a scan reuses from call to call: the per-chunk aggregates and
carries of [`ReduceThenScan`](@ref). Pass one to [`selective_scan!`](@ref)
(the `workspace` keyword) when calling it repeatedly on problems of one size,
as [`time_scan`](@ref) does, so no call allocates; buffers are replaced only
when the element type, size or backend changes. Not safe to share between
tasks that scan at the same time.

# Examples
```julia-repl
julia> ws = ScanWeaver.ScanWorkspace(); a = rand(5000, 2); y = similar(a);

julia> selective_scan!(y, a, a, a; schedule = :reduce_then_scan, workspace = ws);
```
"""
mutable struct ScanWorkspace
    agg::Any
    carry::Any
end
ScanWorkspace() = ScanWorkspace(nothing, nothing)

function reuse_or_allocate(A, backend, ::Type{T}, dims::Dims) where {T}
    if A isa AbstractArray{T} && size(A) == dims && array_backend(A) == backend
        return A
    end
    return KernelAbstractions.allocate(backend, T, dims)
end

"""
    chunk_buffers!(ws::ScanWorkspace, backend, P, S, nchunks, lanes) -> (agg, carry)

`ws`'s aggregate (`P`) and carry (`S`) matrices of size `(nchunks, lanes)` on
`backend`, allocated only when `ws` holds none of that type and size.
"""
function chunk_buffers!(ws::ScanWorkspace, backend, P, S, nchunks, lanes)
    dims = (Int(nchunks), Int(lanes))
    ws.agg = reuse_or_allocate(ws.agg, backend, P, dims)
    ws.carry = reuse_or_allocate(ws.carry, backend, S, dims)
    return ws.agg, ws.carry
end

function launch!(
    s::ReduceThenScan,
    backend,
    y,
    h_last,
    ops,
    reversed;
    workspace = ScanWorkspace(),
)
    wg, chunk = s.workgroupsize, s.chunk
    lanes = scan_lanes(ops)
    nchunks = cld(scan_length(ops), chunk)
    P = pair_type(ops)
    agg, carry = chunk_buffers!(workspace, backend, P, fieldtype(P, :U), nchunks, lanes)
    vals = (Val(wg), Val(chunk))
    launch_checked!(
        chunk_reduce_kernel!(backend, wg),
        wg,
        nchunks * lanes,
        (agg, ops, reversed, vals...),
    )
    launch_checked!(
        carry_scan_kernel!(backend, wg),
        wg,
        lanes,
        (carry, h_last, agg, ops, vals...),
    )
    launch_checked!(
        chunk_propagate_kernel!(backend, wg),
        wg,
        nchunks * lanes,
        (y, ops, carry, reversed, vals...),
    )
    return nothing
end
