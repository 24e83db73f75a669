# Schedule `:reduce_then_scan`: the sequence is split into chunks that many
# workgroups process independently, in three launches:
#   1. chunk_reduce_kernel!: each (chunk, lane) composes its elements into one
#      aggregate pair;
#   2. carry_scan_kernel!: each lane scans its chunk aggregates from h0, giving
#      every chunk its carry-in state (and h_last);
#   3. chunk_propagate_kernel!: each (chunk, lane) replays h = A*h + U from its
#      carry-in and writes y.
# Work-item g covers chunk `(g - 1) % nchunks + 1` of lane `(g - 1) ÷ nchunks + 1`.

@inline chunk_of(g, nchunks) = (g - 1) % nchunks + 1
@inline lane_of(g, nchunks) = (g - 1) ÷ nchunks + 1
@inline chunk_range(j, chunk, L) = ((j - 1) * chunk + 1):min(j * chunk, L)

"""
    chunk_reduce_kernel!(backend, workgroup_size)(
        agg, a, b, x, reset, reversed, Val(workgroup_size), Val(chunk);
        ndrange = nchunks * lanes,
    )

Stage 1 of `:reduce_then_scan`: `agg[j, l]` is the composition of the
elements of chunk `j` (in scan order) of lane `l`.
"""
@kernel function chunk_reduce_kernel!(
    agg,
    @Const(a),
    @Const(b),
    @Const(x),
    @Const(reset),
    reversed,
    ::Val{workgroup_size},
    ::Val{chunk},
) where {workgroup_size, chunk}
    g = @index(Global, Linear)
    nchunks = size(agg, 1)
    if g <= nchunks * size(agg, 2)
        j = chunk_of(g, nchunks)
        l = lane_of(g, nchunks)
        P = eltype(agg)
        L = size(a, 1)
        acc = identity_pair(P)
        for k in chunk_range(j, chunk, L)
            acc = compose(load_pair(P, a, b, x, reset, time_index(k, L, reversed), l), acc)
        end
        @inbounds agg[j, l] = acc
    end
end

"""
    carry_scan_kernel!(backend, workgroup_size)(
        carry, h_last, agg, h0, Val(workgroup_size), Val(chunk);
        ndrange = lanes,
    )

Stage 2 of `:reduce_then_scan`: `carry[j, l]` is lane `l`'s state before
chunk `j`; `h_last[l]` the state after the last chunk.
"""
@kernel function carry_scan_kernel!(
    carry,
    h_last,
    @Const(agg),
    @Const(h0),
    ::Val{workgroup_size},
    ::Val{chunk},
) where {workgroup_size, chunk}
    l = @index(Global, Linear)
    if l <= size(agg, 2)
        h = initial_state(eltype(carry), h0, l)
        for j in axes(agg, 1)
            @inbounds carry[j, l] = h
            h = apply_pair(@inbounds(agg[j, l]), h)
        end
        store_state!(h_last, h, l)
    end
end

"""
    chunk_propagate_kernel!(backend, workgroup_size)(
        y, a, b, x, c, reset, carry, reversed, Val(workgroup_size), Val(chunk);
        ndrange = nchunks * lanes,
    )

Stage 3 of `:reduce_then_scan`: replays each chunk from its carry-in state
and writes the outputs.
"""
@kernel function chunk_propagate_kernel!(
    y,
    @Const(a),
    @Const(b),
    @Const(x),
    @Const(c),
    @Const(reset),
    @Const(carry),
    reversed,
    ::Val{workgroup_size},
    ::Val{chunk},
) where {workgroup_size, chunk}
    g = @index(Global, Linear)
    nchunks = size(carry, 1)
    if g <= nchunks * size(carry, 2)
        j = chunk_of(g, nchunks)
        l = lane_of(g, nchunks)
        P = pair_type(a, b, x)
        L = size(a, 1)
        h = @inbounds carry[j, l]
        for k in chunk_range(j, chunk, L)
            t = time_index(k, L, reversed)
            h = apply_pair(load_pair(P, a, b, x, reset, t, l), h)
            store_output!(y, c, h, t, l)
        end
    end
end

"""
    ScanWorkspace()

Device buffers a scan reuses from call to call: the per-chunk aggregates and
carries of `:reduce_then_scan`. Pass one to [`selective_scan!`](@ref) (the
`workspace` keyword) when calling it repeatedly on problems of one size, as
[`time_scan`](@ref) does, so no call allocates; buffers are replaced only when
the element type, size or backend changes. Not safe to share between tasks
that scan at the same time.

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

"""
    ReduceThenScan(backend, workgroupsize, workspace = ScanWorkspace())

The launcher of schedule `:reduce_then_scan`, shaped like a KernelAbstractions
kernel so Kernel Tuner's Julia backend can launch it like one: build it with
[`reduce_then_scan!`](@ref), then call it with the kernel arguments followed
by `Val(workgroup_size), Val(chunk)`. It runs the three stage kernels in order
on per-chunk buffers kept in its [`ScanWorkspace`](@ref), so repeated calls
(Kernel Tuner's timing loop) allocate nothing; the `ndrange` keyword is
accepted and ignored (the stages size their own).
"""
struct ReduceThenScan{B <: Backend}
    backend::B
    workgroupsize::Int
    workspace::ScanWorkspace
end
ReduceThenScan(backend::Backend, workgroupsize) = ReduceThenScan(
    backend,
    workgroupsize,
    ScanWorkspace(),
)

"""
    reduce_then_scan!(backend, workgroupsize) -> ReduceThenScan

# Examples
```julia-repl
julia> a = rand(5000, 2); b = rand(5000, 2); x = rand(5000, 2); y = similar(a);

julia> launch! = ScanWeaver.reduce_then_scan!(CPU(), 64);

julia> launch!(y, nothing, a, b, x, nothing, nothing, nothing, false, Val(64), Val(1024));
```
"""
reduce_then_scan!(backend::Backend, workgroupsize) = ReduceThenScan(
    backend,
    Int(prod(workgroupsize)),
)

function (launch::ReduceThenScan)(
    y,
    h_last,
    a,
    b,
    x,
    c,
    h0,
    reset,
    reversed,
    wg::Val{workgroup_size},
    ch::Val{chunk};
    ndrange = nothing,
) where {workgroup_size, chunk}
    backend = launch.backend
    L, lanes = size(a)
    nchunks = cld(L, chunk)
    P = pair_type(a, b, x)
    agg, carry = chunk_buffers!(
        launch.workspace,
        backend,
        P,
        fieldtype(P, :U),
        nchunks,
        lanes,
    )
    wgs = launch.workgroupsize
    reduce! = chunk_reduce_kernel!(backend, wgs)
    launch_checked!(reduce!, wgs, nchunks * lanes, (agg, a, b, x, reset, reversed, wg, ch))
    carry! = carry_scan_kernel!(backend, wgs)
    launch_checked!(carry!, wgs, lanes, (carry, h_last, agg, h0, wg, ch))
    propagate! = chunk_propagate_kernel!(backend, wgs)
    args = (y, a, b, x, c, reset, carry, reversed, wg, ch)
    launch_checked!(propagate!, wgs, nchunks * lanes, args)
    return nothing
end
