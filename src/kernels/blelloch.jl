"""
    blelloch_scan_kernel!(backend, workgroup_size)(
        y, h_last, a, b, x, c, h0, reset, reversed, Val(workgroup_size);
        ndrange = workgroup_size * lanes,
    )

Schedule `:blelloch`: one workgroup per lane scans blocks of
`2 * workgroup_size` elements in `@localmem` with Blelloch's work-efficient
tree (up-sweep, root, down-sweep over [`AffinePair`](@ref)s), then applies
each exclusive prefix to the running carry. Blocks follow each other along
the sequence; the carry stays in local memory. `workgroup_size` must be a
power of two. Blelloch (1990), "Prefix sums and their applications".

# Examples
```julia-repl
julia> a = rand(100, 3); b = rand(100, 3); x = rand(100, 3); y = similar(a);

julia> k! = ScanWeaver.blelloch_scan_kernel!(CPU(), 32);

julia> k!(y, nothing, a, b, x, nothing, nothing, nothing, false, Val(32); ndrange = 32 * 3);
```
"""
@kernel function blelloch_scan_kernel!(
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
) where {workgroup_size}
    i = @index(Local, Linear)
    lane = @index(Group, Linear)
    @uniform P = pair_type(a, b, x)
    @uniform S = fieldtype(P, :U)
    @uniform L = size(a, 1)
    @uniform lanes = size(a, 2)
    @uniform N = 2 * workgroup_size
    @uniform steps = trailing_zeros(N)
    tree = @localmem P (2 * workgroup_size,)
    total = @localmem P (1,)
    carry = @localmem S (1,)
    if i == 1
        carry[1] = lane <= lanes ? initial_state(S, h0, lane) : zero(S)
    end
    @synchronize()
    for base in 0:N:(L - 1)
        for j in (2i - 1):(2i)
            k = base + j
            active = k <= L && lane <= lanes
            t = time_index(min(k, L), L, reversed)
            tree[j] = active ? load_pair(P, a, b, x, reset, t, lane) : identity_pair(P)
        end
        @synchronize()
        for s in 0:(steps - 1)
            if i <= N >> (s + 1)
                d = 1 << s
                r = 2d * i
                tree[r] = compose(tree[r], tree[r - d])
            end
            @synchronize()
        end
        if i == 1
            total[1] = tree[N]
            tree[N] = identity_pair(P)
        end
        @synchronize()
        for s in (steps - 1):-1:0
            if i <= N >> (s + 1)
                d = 1 << s
                r = 2d * i
                left_sum = tree[r - d]
                tree[r - d] = tree[r]
                tree[r] = compose(left_sum, tree[r])
            end
            @synchronize()
        end
        for j in (2i - 1):(2i)
            k = base + j
            if k <= L && lane <= lanes
                t = time_index(k, L, reversed)
                inclusive = compose(load_pair(P, a, b, x, reset, t, lane), tree[j])
                store_output!(y, c, apply_pair(inclusive, carry[1]), t, lane)
            end
        end
        @synchronize()
        if i == 1
            carry[1] = apply_pair(total[1], carry[1])
        end
        @synchronize()
    end
    if i == 1 && lane <= lanes
        store_state!(h_last, carry[1], lane)
    end
end

function local_memory(::Val{:blelloch}, config, P, S)
    wg = config.workgroup_size
    return local_bytes(P, 2 * wg) + local_bytes(P, 1) + local_bytes(S, 1)
end
