"""
    sequential_scan_kernel!(backend, workgroupsize)(
        y, h_last, a, b, x, c, h0, reset, reversed, Val(workgroup_size);
        ndrange = lanes,
    )

Schedule `:sequential`: one work-item per lane runs `h = A_t * h + U_t` over
the whole sequence in scan order. Lanes run in parallel; there is no
cooperation inside a workgroup, so `workgroup_size` only sets the launch
shape. The naive baseline, and the fastest choice on CPUs and for very many
short lanes.

Arguments are `(L, lanes)` matrices (`h0`, `h_last`: vectors of `lanes`);
`x`, `c`, `h0`, `reset` and `h_last` may be `nothing`.

# Examples
```julia-repl
julia> a = fill(0.5, 4, 1); b = ones(4, 1); x = ones(4, 1); y = similar(a);

julia> k! = ScanWeaver.sequential_scan_kernel!(CPU(), 64);

julia> k!(y, nothing, a, b, x, nothing, nothing, nothing, false, Val(64); ndrange = 1);

julia> vec(y)
4-element Vector{Float64}:
 1.0
 1.5
 1.75
 1.875
```
"""
@kernel function sequential_scan_kernel!(
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
    lane = @index(Global, Linear)
    P = pair_type(a, b, x)
    L = size(a, 1)
    if lane <= size(a, 2)
        h = initial_state(fieldtype(P, :U), h0, lane)
        for k in 1:L
            t = time_index(k, L, reversed)
            h = apply_pair(load_pair(P, a, b, x, reset, t, lane), h)
            store_output!(y, c, h, t, lane)
        end
        store_state!(h_last, h, lane)
    end
end
