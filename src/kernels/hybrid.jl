"""
    hybrid_scan_kernel!(backend, workgroup_size)(
        y, h_last, a, b, x, c, h0, reset, reversed,
        Val(workgroup_size), Val(items_per_thread);
        ndrange = workgroup_size * lanes,
    )

Schedule `:hybrid`: one workgroup per lane walks the sequence in tiles of
`workgroup_size * items_per_thread` elements. Each work-item composes its
`items_per_thread` consecutive elements in registers (`@private`), the
workgroup scans those partial aggregates in `@localmem` (Hillis-Steele,
double-buffered), and each work-item replays its elements from its exclusive
prefix applied to the running carry. More work per item and fewer barriers
than `:blelloch`; `workgroup_size` may be any positive integer.

# Examples
```julia-repl
julia> a = rand(100, 3); b = rand(100, 3); x = rand(100, 3); y = similar(a);

julia> k! = ScanWeaver.hybrid_scan_kernel!(CPU(), 16);

julia> k!(y, nothing, a, b, x, nothing, nothing, nothing, false, Val(16), Val(4); ndrange = 16 * 3);
```
"""
@kernel function hybrid_scan_kernel!(
    y,
    h_last,
    @Const(a),
    @Const(b),
    @Const(x),
    @Const(c),
    @Const(h0),
    @Const(reset),
    reversed,
    ::Val{workgroup_size},
    ::Val{items_per_thread},
) where {workgroup_size, items_per_thread}
    i = @index(Local, Linear)
    lane = @index(Group, Linear)
    @uniform P = pair_type(a, b, x)
    @uniform S = fieldtype(P, :U)
    @uniform L = size(a, 1)
    @uniform lanes = size(a, 2)
    @uniform tile = workgroup_size * items_per_thread
    @uniform steps = workgroup_size > 1 ?
        8 * sizeof(Int) - leading_zeros(workgroup_size - 1) :
        0
    @uniform final_col = isodd(steps) ? 2 : 1
    elems = @private P (items_per_thread,)
    partial = @localmem P (workgroup_size, 2)
    carry = @localmem S (1,)
    if i == 1
        carry[1] = lane <= lanes ? initial_state(S, h0, lane) : zero(S)
    end
    @synchronize()
    for base in 0:tile:(L - 1)
        agg = identity_pair(P)
        for j in 1:items_per_thread
            k = base + (i - 1) * items_per_thread + j
            t = time_index(min(k, L), L, reversed)
            e = k <= L && lane <= lanes ?
                load_pair(P, a, b, x, reset, t, lane) :
                identity_pair(P)
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
                store_output!(y, c, h, time_index(k, L, reversed), lane)
            end
        end
        @synchronize()
        if i == 1
            carry[1] = apply_pair(partial[workgroup_size, final_col], carry[1])
        end
        @synchronize()
    end
    if i == 1 && lane <= lanes
        store_state!(h_last, carry[1], lane)
    end
end

function local_memory(::Val{:hybrid}, config, P, S)
    return local_bytes(P, config.workgroup_size * 2) + local_bytes(S, 1)
end
