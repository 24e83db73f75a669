# Timing and tuning from Julia, without Python. Device-specific clocks are
# `elapsed_ms` methods in the package extensions (CUDA and HIP events, Metal
# command-buffer timestamps); CPUs and oneAPI use the host clock below.

"""
    elapsed_ms(f, backend) -> Float64

Runs `f()` once and returns the time it took on `backend`, in milliseconds.
This method brackets `f` with `KernelAbstractions.synchronize` and reads the
host clock (CPU and oneAPI); the CUDA, AMDGPU and Metal extensions time with
device events instead.

# Examples
```julia-repl
julia> a = rand(Float32, 4096, 64); y = similar(a);

julia> elapsed_ms(() -> selective_scan!(y, a, a, a), CPU()) > 0
true
```
"""
function elapsed_ms(f, backend::Backend)
    KernelAbstractions.synchronize(backend)
    start = time_ns()
    f()
    KernelAbstractions.synchronize(backend)
    return (time_ns() - start) / 1.0e6
end

median_of(times) = sort(times)[cld(length(times), 2)]

"""
    time_scan(a, b, x, c = nothing; iterations = 7, h0 = nothing,
              reset = nothing, reverse = false, kwargs...) -> Vector{Float64}

Times `selective_scan!` on these operands: one untimed run (it compiles the
kernels), then `iterations` runs timed with [`elapsed_ms`](@ref), all into the
same outputs and one [`ScanWorkspace`](@ref), so the timed runs allocate
nothing. `kwargs` are the schedule and its tunables.

# Examples
```julia-repl
julia> a = rand(Float32, 1000, 32);

julia> times = time_scan(a, a, a; schedule = :hybrid, workgroupsize = 64, iterations = 3);
```
"""
function time_scan(
    a,
    b,
    x,
    c = nothing;
    iterations::Integer = 7,
    h0 = nothing,
    reset = nothing,
    reverse::Bool = false,
    kwargs...,
)
    Ty, Th = output_types(a, b, x, c)
    y = similar(a, Ty)
    h_last = similar(a, Th, Base.tail(size(a)))
    workspace = ScanWorkspace()
    scan_once() = selective_scan!(
        y,
        a,
        b,
        x,
        c;
        h0,
        reset,
        reverse,
        h_last,
        workspace,
        kwargs...,
    )
    scan_once()
    backend = array_backend(a)
    return [elapsed_ms(scan_once, backend) for _ in 1:iterations]
end

"""
    search_space(; schedules = keys(SCHEDULES), workgroup_size = (64, 128, 256, 512),
                 items_per_thread = (2, 4, 8), chunk = (512, 2048, 8192))

Every `(schedule, config)` to try: the product of the candidate values of each
schedule's tunables (`:blelloch` keeps powers of two only).
"""
function search_space(;
    schedules = keys(SCHEDULES),
    workgroup_size = (64, 128, 256, 512),
    items_per_thread = (2, 4, 8),
    chunk = (512, 2048, 8192),
)
    candidates = (; workgroup_size, items_per_thread, chunk)
    space = Tuple{Symbol, NamedTuple}[]
    for schedule in schedules
        names = SCHEDULES[schedule]
        for values in Iterators.product(map(n -> getfield(candidates, n), names)...)
            config = NamedTuple{names}(values)
            schedule === :blelloch && !ispow2(config.workgroup_size) && continue
            push!(space, (schedule, config))
        end
    end
    return space
end

"""
    keywords(config::NamedTuple) -> NamedTuple

`config`'s tunables as `selective_scan` keywords (`workgroup_size` is spelled
`workgroupsize`, as in KernelAbstractions).
"""
function keywords(config::NamedTuple)
    names = map(n -> n === :workgroup_size ? :workgroupsize : n, keys(config))
    return NamedTuple{names}(values(config))
end

"""
    tune_scan(a, b, x, c = nothing; space = search_space(), iterations = 7,
              kwargs...) -> Vector{NamedTuple}

Times every `(schedule, config)` of `space` on these operands with
[`time_scan`](@ref) and returns `(schedule, config, time_ms)` results, fastest
(by median time) first. Configurations that cannot run for these operands on
this device (see `ScanWeaver.config_problem`: local memory over the budget, a
workgroup over the device's limit) are left out. `kwargs` (`h0`, `reset`,
`reverse`) go to every run.

# Examples
```julia-repl
julia> a = rand(Float32, 2048, 16);

julia> best = first(tune_scan(a, a, a; iterations = 3));

julia> selective_scan(a, a, a; schedule = best.schedule, ScanWeaver.keywords(best.config)...);
```
"""
function tune_scan(
    a,
    b,
    x,
    c = nothing;
    space = search_space(),
    iterations::Integer = 7,
    kwargs...,
)
    backend = array_backend(a)
    P = pair_type(a, b, x)
    S = fieldtype(P, :U)
    runnable = [
        (schedule, config)
        for (schedule, config) in space
        if config_problem(schedule, config, backend, P, S) === nothing
    ]
    results = map(runnable) do (schedule, config)
        times = time_scan(a, b, x, c; iterations, schedule, keywords(config)..., kwargs...)
        (; schedule, config, time_ms = median_of(times))
    end
    return sort!(results; by = r -> r.time_ms)
end
