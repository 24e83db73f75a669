"""
    Hybrid(workgroupsize, items_per_thread) <: ScanSchedule

Schedule `:hybrid`: one workgroup per lane walks the sequence in tiles of
`workgroupsize * items_per_thread` elements. Each work-item composes its
`items_per_thread` consecutive elements in registers (`@private`), the
workgroup scans those partial aggregates in `@localmem` (Hillis-Steele,
double-buffered), and each work-item replays its elements from its exclusive
prefix applied to the running carry. More work per item and fewer barriers
than `:blelloch`; `workgroupsize` may be any positive integer.
"""
struct Hybrid <: ScanSchedule
    workgroupsize::Int
    items_per_thread::Int
end

"""
    hybrid_scan_kernel!(backend, workgroupsize)(
        y, h_last, ops, reversed, Val(workgroupsize), Val(items_per_thread);
        ndrange = workgroupsize * lanes,
    )

The kernel of [`Hybrid`](@ref), one workgroup per lane.

# Examples
```julia-repl
julia> a = rand(100, 3); b = rand(100, 3); x = rand(100, 3); y = similar(a);

julia> ops = ScanWeaver.ScanOperands(a, b, x, nothing, nothing, nothing);

julia> ScanWeaver.hybrid_scan_kernel!(CPU(), 16)(y, nothing, ops, false, Val(16), Val(4); ndrange = 16 * 3);
```
"""
@kernel function hybrid_scan_kernel!(
    y,
    h_last,
    @Const(ops),
    reversed,
    ::Val{workgroupsize},
    ::Val{items_per_thread},
) where {workgroupsize, items_per_thread}
    i = @index(Local, Linear)
    lane = @index(Group, Linear)
    @uniform P = pair_type(ops)
    @uniform S = fieldtype(P, :U)
    @uniform L = scan_length(ops)
    @uniform lanes = scan_lanes(ops)
    @uniform tile = workgroupsize * items_per_thread
    @uniform steps = workgroupsize > 1 ?
        8 * sizeof(Int) - leading_zeros(workgroupsize - 1) :
        0
    @uniform final_col = isodd(steps) ? 2 : 1
    elems = @private P (items_per_thread,)
    partial = @localmem P (workgroupsize, 2)
    carry = @localmem S (1,)
    if i == 1
        carry[1] = lane <= lanes ? initial_state(S, ops.h0, lane) : zero(S)
    end
    @synchronize()
    for base in 0:tile:(L - 1)
        agg = identity_pair(P)
        for j in 1:items_per_thread
            k = base + (i - 1) * items_per_thread + j
            t = time_index(min(k, L), L, reversed)
            e = k <= L && lane <= lanes ? load_pair(P, ops, t, lane) : identity_pair(P)
            elems[j] = e
            agg = compose(e, agg)
        end
        partial[i, 1] = agg
        @synchronize()
        for s in 0:(steps - 1)
            src = (s & 1) + 1
            d = 1 << s
            mine = partial[i, src]
            partial[i, 3 - src] = i > d ? compose(mine, partial[i - d, src]) : mine
            @synchronize()
        end
        h = i == 1 ? carry[1] : apply_pair(partial[i - 1, final_col], carry[1])
        for j in 1:items_per_thread
            k = base + (i - 1) * items_per_thread + j
            if k <= L && lane <= lanes
                h = apply_pair(elems[j], h)
                store_output!(y, ops.c, h, time_index(k, L, reversed), lane)
            end
        end
        @synchronize()
        if i == 1
            carry[1] = apply_pair(partial[workgroupsize, final_col], carry[1])
        end
        @synchronize()
    end
    if i == 1 && lane <= lanes
        store_state!(h_last, carry[1], lane)
    end
end

function local_memory(s::Hybrid, P, S)
    return local_bytes(P, s.workgroupsize * 2) + local_bytes(S, 1)
end

function launch!(s::Hybrid, backend, y, h_last, ops, reversed; workspace = nothing)
    wg = s.workgroupsize
    kernel! = hybrid_scan_kernel!(backend, wg)
    args = (y, h_last, ops, reversed, Val(wg), Val(s.items_per_thread))
    launch_checked!(kernel!, wg, wg * scan_lanes(ops), args)
    return nothing
end
