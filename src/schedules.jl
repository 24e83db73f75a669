# The schedules: their tunables (in the order their kernels take them as
# `Val`s, which is also the order of Kernel Tuner search spaces), defaults,
# and how each one launches its kernels.

"""
    SCHEDULES

The schedule names `selective_scan` accepts besides `:auto`, each with its
tunables in `Val` order:

- `:sequential`: `(:workgroup_size,)`
- `:blelloch`: `(:workgroup_size,)`
- `:hybrid`: `(:workgroup_size, :items_per_thread)`
- `:reduce_then_scan`: `(:workgroup_size, :chunk)`
"""
const SCHEDULES = (
    sequential = (:workgroup_size,),
    blelloch = (:workgroup_size,),
    hybrid = (:workgroup_size, :items_per_thread),
    reduce_then_scan = (:workgroup_size, :chunk),
)

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

"""
    default_schedule(backend, L, lanes, P, S) -> Symbol

The schedule `:auto` picks: `:sequential` on CPUs, for short sequences and for
very many lanes; `:reduce_then_scan` for long sequences, and for pairs so large
that `:hybrid`'s local memory would leave less than a warp per workgroup;
`:hybrid` otherwise.
"""
function default_schedule(backend::Backend, L::Integer, lanes::Integer, P, S)
    if backend isa CPU || L <= SHORT_SEQUENCE || lanes >= MANY_LANES
        return :sequential
    end
    L >= LONG_SEQUENCE && return :reduce_then_scan
    wg = default_workgroupsize(:hybrid, backend, P, S, DEFAULT_ITEMS_PER_THREAD)
    return wg < MIN_COOPERATIVE_WORKGROUP ? :reduce_then_scan : :hybrid
end

"""
    default_workgroupsize(schedule, backend, P, S, items_per_thread;
                          start = DEFAULT_WORKGROUP_SIZE) -> Int

`start` (a power of two), halved until the workgroup fits the backend's
[`max_workgroupsize`](@ref) and its [`local_memory_budget`](@ref) for pairs
`P` and states `S`: dense `3 x 3` `Float64` pairs get 128 work-items in
`:blelloch` and `:hybrid` by default, not 256.
"""
function default_workgroupsize(
    schedule::Symbol,
    backend,
    P,
    S,
    items_per_thread;
    start = DEFAULT_WORKGROUP_SIZE,
)
    wg = min(start, prevpow(2, max_workgroupsize(backend)))
    budget = local_memory_budget(backend)
    config(w) = (workgroup_size = w, items_per_thread, chunk = DEFAULT_CHUNK)
    while wg > 1 && local_memory(Val(schedule), config(wg), P, S) > budget
        wg ÷= 2
    end
    return wg
end

"""
    schedule_config(schedule, backend, P, S; workgroupsize, items_per_thread, chunk) -> NamedTuple

The tunables of `schedule`, in `Val` order, with defaults filled in: the
workgroup size defaults to [`default_workgroupsize`](@ref) for pairs `P` and
states `S` on `backend`.
"""
function schedule_config(
    schedule::Symbol,
    backend,
    P,
    S;
    workgroupsize = nothing,
    items_per_thread = nothing,
    chunk = nothing,
)
    ipt = something(items_per_thread, DEFAULT_ITEMS_PER_THREAD)
    wg = something(workgroupsize, default_workgroupsize(schedule, backend, P, S, ipt))
    given = (
        workgroup_size = wg,
        items_per_thread = ipt,
        chunk = something(chunk, DEFAULT_CHUNK),
    )
    names = SCHEDULES[schedule]
    return NamedTuple{names}(map(n -> as_int(getfield(given, n)), names))
end

"Integer tunables as `Int`, so `Val(32)` and `Val(Int32(32))` compile one kernel; others stay as given, for the checks."
as_int(v) = v isa Integer ? Int(v) : v

"""
    local_memory(Val(schedule), config, P, S) -> Int

Bytes of `@localmem` one workgroup of `schedule` allocates with tunables
`config` (from [`schedule_config`](@ref); absent tunables are not read) for
pairs of type `P` and states of type `S`, each allocation rounded up by
[`local_bytes`](@ref). Each kernel file defines the method for its
schedule next to the kernel; `test/test_julia_static.py` checks that it
counts every `@localmem` of that schedule's kernels.
"""
function local_memory end
local_memory(::Val{:sequential}, config, P, S) = 0
local_memory(::Val{:reduce_then_scan}, config, P, S) = 0

"""
    launch_schedule!(Val(schedule), backend, config, y, h_last, a, b, x, c, h0, reset, reversed;
                     workspace)

Launches the kernels of `schedule` with tunables `config` (from
[`schedule_config`](@ref)) on `(L, lanes)` operand matrices; `:reduce_then_scan`
keeps its per-chunk buffers in `workspace` (a [`ScanWorkspace`](@ref)).
"""
function launch_schedule! end

function launch_schedule!(
    ::Val{:sequential},
    backend,
    config,
    y,
    h_last,
    a,
    b,
    x,
    c,
    h0,
    reset,
    reversed;
    workspace = nothing,
)
    wg = config.workgroup_size
    kernel! = sequential_scan_kernel!(backend, wg)
    args = (y, h_last, a, b, x, c, h0, reset, reversed, Val(wg))
    launch_checked!(kernel!, wg, size(a, 2), args)
    return nothing
end

function launch_schedule!(
    ::Val{:blelloch},
    backend,
    config,
    y,
    h_last,
    a,
    b,
    x,
    c,
    h0,
    reset,
    reversed;
    workspace = nothing,
)
    wg = config.workgroup_size
    kernel! = blelloch_scan_kernel!(backend, wg)
    args = (y, h_last, a, b, x, c, h0, reset, reversed, Val(wg))
    launch_checked!(kernel!, wg, wg * size(a, 2), args)
    return nothing
end

function launch_schedule!(
    ::Val{:hybrid},
    backend,
    config,
    y,
    h_last,
    a,
    b,
    x,
    c,
    h0,
    reset,
    reversed;
    workspace = nothing,
)
    wg = config.workgroup_size
    kernel! = hybrid_scan_kernel!(backend, wg)
    args = (
        y,
        h_last,
        a,
        b,
        x,
        c,
        h0,
        reset,
        reversed,
        Val(wg),
        Val(config.items_per_thread),
    )
    launch_checked!(kernel!, wg, wg * size(a, 2), args)
    return nothing
end

function launch_schedule!(
    ::Val{:reduce_then_scan},
    backend,
    config,
    y,
    h_last,
    a,
    b,
    x,
    c,
    h0,
    reset,
    reversed;
    workspace = ScanWorkspace(),
)
    wg = config.workgroup_size
    launch! = ReduceThenScan(backend, wg, workspace)
    launch!(y, h_last, a, b, x, c, h0, reset, reversed, Val(wg), Val(config.chunk))
    return nothing
end
