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

"The largest workgroup any supported GPU launches."
const MAX_WORKGROUP_SIZE = 1024

"Below this length a loop per lane beats every parallel scan."
const SHORT_SEQUENCE = 64

"With this many lanes one work-item per lane already fills a GPU."
const MANY_LANES = 2^14

"Past this length one workgroup per lane serialises too much; split L over workgroups."
const LONG_SEQUENCE = 2^16

"""
    default_schedule(backend, L, lanes) -> Symbol

The schedule `:auto` picks: `:sequential` on CPUs, for short sequences and for
very many lanes; `:reduce_then_scan` for long sequences; `:hybrid` otherwise.
"""
function default_schedule(backend::Backend, L::Integer, lanes::Integer)
    if backend isa CPU || L <= SHORT_SEQUENCE || lanes >= MANY_LANES
        return :sequential
    end
    return L >= LONG_SEQUENCE ? :reduce_then_scan : :hybrid
end

"""
    schedule_config(schedule; workgroupsize, items_per_thread, chunk) -> NamedTuple

The tunables of `schedule`, in `Val` order, with defaults filled in.
"""
function schedule_config(
    schedule::Symbol;
    workgroupsize = nothing,
    items_per_thread = nothing,
    chunk = nothing,
)
    given = (
        workgroup_size = something(workgroupsize, DEFAULT_WORKGROUP_SIZE),
        items_per_thread = something(items_per_thread, DEFAULT_ITEMS_PER_THREAD),
        chunk = something(chunk, DEFAULT_CHUNK),
    )
    names = SCHEDULES[schedule]
    return NamedTuple{names}(map(n -> getfield(given, n), names))
end

"""
    launch_schedule!(Val(schedule), backend, config, y, h_last, a, b, x, c, h0, reset, reversed)

Launches the kernels of `schedule` with tunables `config` (from
[`schedule_config`](@ref)) on `(L, lanes)` operand matrices.
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
    reversed,
)
    wg = config.workgroup_size
    kernel! = sequential_scan_kernel!(backend, wg)
    kernel!(y, h_last, a, b, x, c, h0, reset, reversed, Val(wg); ndrange = size(a, 2))
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
    reversed,
)
    wg = config.workgroup_size
    kernel! = blelloch_scan_kernel!(backend, wg)
    kernel!(y, h_last, a, b, x, c, h0, reset, reversed, Val(wg); ndrange = wg * size(a, 2))
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
    reversed,
)
    wg = config.workgroup_size
    kernel! = hybrid_scan_kernel!(backend, wg)
    vals = (Val(wg), Val(config.items_per_thread))
    kernel!(y, h_last, a, b, x, c, h0, reset, reversed, vals...; ndrange = wg * size(a, 2))
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
    reversed,
)
    wg = config.workgroup_size
    launch! = reduce_then_scan!(backend, wg)
    launch!(y, h_last, a, b, x, c, h0, reset, reversed, Val(wg), Val(config.chunk))
    return nothing
end
