# The schedule interface. A schedule is a type whose fields are its tunables;
# each kernels/*.jl file defines one schedule: its struct, its kernels, and its
# methods of the functions below.

"""
    ScanSchedule

A way to run a scan: one concrete subtype per schedule, whose fields are its
tunables, in the order its kernels take them as `Val`s (the order of Kernel
Tuner search spaces too). The first field is always `workgroupsize`. A schedule
implements

- [`launch!`](@ref)`(s, backend, y, h_last, ops, reversed; workspace)`: run its
  kernels;
- [`local_memory`](@ref)`(s, P, S)`: the `@localmem` bytes one workgroup needs
  (zero unless it allocates any);
- [`tunable_problem`](@ref)`(s)`: a rule its tunables must follow beyond being
  positive (none unless it has one),

and is listed in [`SCHEDULES`](@ref) under the name `selective_scan` accepts.

# Examples
```julia
julia> s = Hybrid(128, 4);

julia> ScanWeaver.tunables(s)
(workgroupsize = 128, items_per_thread = 4)
```
"""
abstract type ScanSchedule end

"""
    launch!(s::ScanSchedule, backend, y, h_last, ops::ScanOperands, reversed; workspace)

Launches the kernels of schedule `s` on `backend` for the `(L, lanes)` operands
`ops`, writing `y` and, unless it is `nothing`, `h_last`; `workspace` (a
[`ScanWorkspace`](@ref)) holds buffers a schedule reuses between calls.
"""
function launch! end

"""
    local_memory(s::ScanSchedule, P, S) -> Int

Bytes of `@localmem` one workgroup of `s` allocates for pairs of type `P` and
states of type `S`, each allocation rounded up by [`local_bytes`](@ref). Each
kernel file defines the method for its schedule next to the kernel;
`test/test_julia_static.py` checks that it counts every `@localmem` of that
schedule's kernels.
"""
local_memory(::ScanSchedule, P, S) = 0

"""
    tunable_problem(s::ScanSchedule) -> Union{Nothing, String}

What is wrong with `s`'s tunables beyond their being positive (`nothing` when
nothing is): `:blelloch` needs a power-of-two workgroup.
"""
tunable_problem(::ScanSchedule) = nothing

"""
    tunables(s::ScanSchedule) -> NamedTuple

The tunables of `s` by name, in `Val` order.
"""
tunables(s::T) where {T <: ScanSchedule} = NamedTuple{fieldnames(T)}(ntuple(
    i -> getfield(s, i),
    fieldcount(T),
))

"""
    with_workgroupsize(s::ScanSchedule, workgroupsize) -> typeof(s)

`s` with another workgroup size, its other tunables kept.
"""
function with_workgroupsize(s::T, workgroupsize::Integer) where {T <: ScanSchedule}
    return T(workgroupsize, ntuple(i -> getfield(s, i + 1), fieldcount(T) - 1)...)
end

"Work-items per workgroup unless given: a multiple of every warp and wavefront width."
const DEFAULT_WORKGROUP_SIZE = 256

"Elements each work-item of `:hybrid` composes in registers unless given."
const DEFAULT_ITEMS_PER_THREAD = 4

"Elements per chunk of `:reduce_then_scan` unless given (the Python `chunked` default)."
const DEFAULT_CHUNK = 2048

"Below this length a loop per lane beats every parallel scan."
const SHORT_SEQUENCE = 64

"With this many lanes one work-item per lane already fills a GPU."
const MANY_LANES = 2^14

"Past this length one workgroup per lane serialises too much; split L over workgroups."
const LONG_SEQUENCE = 2^16

"A cooperative schedule whose default workgroup would shrink below this (one warp) is not picked by `:auto`."
const MIN_COOPERATIVE_WORKGROUP = 32

"The largest value of any tunable (the Python side's bound): products of tunables stay far from overflow."
const MAX_TUNABLE = 2^24

"""
    default_workgroupsize(s::ScanSchedule, backend, P, S; start = DEFAULT_WORKGROUP_SIZE) -> Int

`start` (a power of two), halved until `s` with that workgroup fits the
backend's [`max_workgroupsize`](@ref) and its [`local_memory_budget`](@ref) for
pairs `P` and states `S`: dense `3 x 3` `Float64` pairs get 128 work-items in
`:blelloch` and `:hybrid` by default, not 256. Returns 1 when nothing fits.
"""
function default_workgroupsize(
    s::ScanSchedule,
    backend,
    P,
    S;
    start = DEFAULT_WORKGROUP_SIZE,
)
    wg = min(prevpow(2, start), prevpow(2, max_workgroupsize(backend)))
    budget = local_memory_budget(backend)
    while wg > 1 && local_memory(with_workgroupsize(s, wg), P, S) > budget
        wg ÷= 2
    end
    return wg
end

"""
    config_problem(s::ScanSchedule, backend, P, S) -> Union{Nothing, String}

What is wrong with running schedule `s` for pairs `P` and states `S` on
`backend` (`nothing` when nothing is): a tunable below 1 or above `MAX_TUNABLE`, a workgroup beyond
[`max_workgroupsize`](@ref), a rule of the schedule ([`tunable_problem`](@ref)),
or [`local_memory`](@ref) beyond the backend's [`local_memory_budget`](@ref).
"""
function config_problem(s::ScanSchedule, backend, P, S)
    for (name, value) in pairs(tunables(s))
        value < 1 && return "$name = $value must be a positive integer"
        value > MAX_TUNABLE &&
            return "$name = $value exceeds $MAX_TUNABLE, the largest tunable"
    end
    wg = s.workgroupsize
    limit = max_workgroupsize(backend)
    wg > limit &&
        return "workgroupsize = $wg exceeds $limit, the largest workgroup on $backend"
    problem = tunable_problem(s)
    problem === nothing || return problem
    bytes = local_memory(s, P, S)
    budget = local_memory_budget(backend)
    bytes <= budget && return nothing
    fits = default_workgroupsize(s, backend, P, S; start = wg)
    advice = local_memory(with_workgroupsize(s, fits), P, S) <= budget ?
        "use workgroupsize <= $fits, or" :
        "these pairs are too large for it; use"
    return "$s needs $bytes bytes of local memory for $P ($(sizeof(P)) bytes per pair) " *
        "but $backend allows $budget per workgroup; $advice schedule :reduce_then_scan " *
        "or :sequential (no local memory)"
end
