# Kernels whose work-items never talk to each other (no `@localmem`, no
# `@synchronize`): the fused Mamba-1, matrix-state and delta-rule carry kernels.
# Each is written once, as an item function `item!(w, args...)` for work-item
# `w`; its `@kernel` is a two-line wrapper (`w = @index(Global, Linear)`, then
# `item!(w, args...)`: KernelAbstractions' CPU backend passes the index only to
# such a statement) that GPUs launch, while on `CPU()` the items run as plain
# loops on Julia tasks. So the CPU path does not depend on KernelAbstractions'
# CPU backend (which emulates workgroups, and becomes POCL in
# KernelAbstractions 0.10).

"Fewest items (times their work, see [`cpu_items!`](@ref)) before the CPU path uses more than one task."
const CPU_ITEMS_PARALLEL_MIN = 2^15

"""
    cpu_items!(item!, n, args; work = 1, tasks = Threads.nthreads())

Runs `item!(w, args...)` for `w in 1:n` on the host: `tasks` Julia tasks, each
a contiguous range of items, or the calling task alone when `n * work` (the
elements the items touch together) is under [`CPU_ITEMS_PARALLEL_MIN`](@ref).

# Examples
```julia-repl
julia> out = zeros(Int, 5); ScanWeaver.cpu_items!((w, o) -> (o[w] = w^2), 5, (out,));

julia> out
5-element Vector{Int64}:
  1
  4
  9
 16
 25
```
"""
function cpu_items!(
    item!::F,
    n::Integer,
    args::Tuple;
    work::Integer = 1,
    tasks::Integer = Threads.nthreads(),
) where {F}
    ntasks = n * work < CPU_ITEMS_PARALLEL_MIN ? 1 : clamp(Int(tasks), 1, max(Int(n), 1))
    per = cld(n, ntasks)
    run_tasks(cld(n, max(per, 1))) do task
        for w in ((task - 1) * per + 1):min(task * per, n)
            item!(w, args...)
        end
    end
    return nothing
end

"""
    launch_items!(item!, kernel!, backend, workgroupsize, n, args; work = 1)

Runs the `n` work-items of an item kernel: on `CPU()` through
[`cpu_items!`](@ref), elsewhere by launching `kernel!(backend, workgroupsize)`
(whose body calls `item!`) through [`launch_checked!`](@ref).
"""
function launch_items!(
    item!::F,
    kernel!,
    ::CPU,
    workgroupsize,
    n,
    args::Tuple;
    work = 1,
) where {F}
    cpu_items!(item!, n, args; work)
    return nothing
end

function launch_items!(
    item!::F,
    kernel!,
    backend,
    workgroupsize,
    n,
    args::Tuple;
    work = 1,
) where {F}
    launch_checked!(kernel!(backend, workgroupsize), workgroupsize, n, args)
    return nothing
end
