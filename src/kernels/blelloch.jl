"""
    Blelloch(workgroupsize) <: ScanSchedule

Schedule `:blelloch`: one workgroup per lane scans blocks of
`2 * workgroupsize` elements in `@localmem` with Blelloch's work-efficient tree
(up-sweep, root, down-sweep over [`AffinePair`](@ref)s), then applies each
exclusive prefix to the running carry. Blocks follow each other along the
sequence; the carry stays in local memory. `workgroupsize` must be a power of
two. Blelloch (1990), "Prefix sums and their applications".
"""
struct Blelloch <: ScanSchedule
    workgroupsize::Int
end

function tunable_problem(s::Blelloch)
    ispow2(s.workgroupsize) && return nothing
    return "workgroupsize = $(s.workgroupsize) must be a power of two for schedule :blelloch"
end

"""
    blelloch_scan_kernel!(backend, workgroupsize)(
        y, h_last, ops, reversed, Val(workgroupsize);
        ndrange = workgroupsize * lanes,
    )

The kernel of [`Blelloch`](@ref), one workgroup per lane.

# Examples
```julia-repl
julia> a = rand(100, 3); b = rand(100, 3); x = rand(100, 3); y = similar(a);

julia> ops = ScanWeaver.ScanOperands(a, b, x, nothing, nothing, nothing);

julia> ScanWeaver.blelloch_scan_kernel!(CPU(), 32)(y, nothing, ops, false, Val(32); ndrange = 32 * 3);
```
"""
@kernel function blelloch_scan_kernel!(
    y,
    h_last,
    @Const(ops),
    reversed,
    ::Val{workgroupsize},
) where {workgroupsize}
    i = @index(Local, Linear)
    lane = @index(Group, Linear)
    @uniform P = pair_type(ops)
    @uniform S = fieldtype(P, :U)
    @uniform L = scan_length(ops)
    @uniform lanes = scan_lanes(ops)
    @uniform N = 2 * workgroupsize
    @uniform steps = trailing_zeros(N)
    tree = @localmem P (2 * workgroupsize,)
    total = @localmem P (1,)
    carry = @localmem S (1,)
    if i == 1
        carry[1] = lane <= lanes ? initial_state(S, ops.h0, lane) : zero(S)
    end
    @synchronize()
    for base in 0:N:(L - 1)
        for j in (2i - 1):(2i)
            k = base + j
            active = k <= L && lane <= lanes
            t = time_index(min(k, L), L, reversed)
            tree[j] = active ? load_pair(P, ops, t, lane) : identity_pair(P)
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
                inclusive = compose(load_pair(P, ops, t, lane), tree[j])
                store_output!(y, ops.c, apply_pair(inclusive, carry[1]), t, lane)
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

function local_memory(s::Blelloch, P, S)
    return local_bytes(P, 2 * s.workgroupsize) + local_bytes(P, 1) + local_bytes(S, 1)
end

function launch!(s::Blelloch, backend, y, h_last, ops, reversed; workspace = nothing)
    wg = s.workgroupsize
    kernel! = blelloch_scan_kernel!(backend, wg)
    launch_checked!(kernel!, wg, wg * scan_lanes(ops), (y, h_last, ops, reversed, Val(wg)))
    return nothing
end
