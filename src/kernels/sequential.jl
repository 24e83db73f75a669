"""
    Sequential(workgroupsize) <: ScanSchedule

Schedule `:sequential`: one work-item per lane runs `h = A_t * h + U_t` over
the whole sequence in scan order. Lanes run in parallel; there is no
cooperation inside a workgroup, so `workgroupsize` only sets the launch shape.
The naive baseline, and the fastest choice on CPUs and for very many short
lanes.
"""
struct Sequential <: ScanSchedule
    workgroupsize::Int
end

"""
    sequential_scan_kernel!(backend, workgroupsize)(
        y, h_last, ops, reversed, Val(workgroupsize); ndrange = lanes,
    )

The kernel of [`Sequential`](@ref): `ops` is a [`ScanOperands`](@ref) of
`(L, lanes)` matrices, `y` the `(L, lanes)` output and `h_last` (or `nothing`)
the final states.

# Examples
```julia-repl
julia> a = fill(0.5, 4, 1); b = ones(4, 1); y = similar(a);

julia> ops = ScanWeaver.ScanOperands(a, b, nothing, nothing, nothing, nothing);

julia> ScanWeaver.sequential_scan_kernel!(CPU(), 64)(y, nothing, ops, false, Val(64); ndrange = 1);

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
    @Const(ops),
    reversed,
    ::Val{workgroupsize},
) where {workgroupsize}
    lane = @index(Global, Linear)
    P = pair_type(ops)
    L = scan_length(ops)
    if lane <= scan_lanes(ops)
        h = initial_state(fieldtype(P, :U), ops.h0, lane)
        for k in 1:L
            t = time_index(k, L, reversed)
            h = apply_pair(load_pair(P, ops, t, lane), h)
            store_output!(y, ops.c, h, t, lane)
        end
        store_state!(h_last, h, lane)
    end
end

function launch!(s::Sequential, backend, y, h_last, ops, reversed; workspace = nothing)
    wg = s.workgroupsize
    kernel! = sequential_scan_kernel!(backend, wg)
    launch_checked!(kernel!, wg, scan_lanes(ops), (y, h_last, ops, reversed, Val(wg)))
    return nothing
end
