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
    check_tunables(:time_scan, (; iterations))
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
    search_space(; schedules = keys(SCHEDULES), workgroupsize = (64, 128, 256, 512),
                 items_per_thread = (2, 4, 8), chunk = (512, 2048, 8192)) -> Vector{ScanSchedule}

Every schedule to try: for each name in `schedules`, its type built from every
combination of the candidate values of its tunables (`:blelloch` keeps
powers of two only).

# Examples
```julia-repl
julia> ScanWeaver.search_space(; schedules = (:hybrid,), workgroupsize = (64,), items_per_thread = (2, 4))
2-element Vector{ScanSchedule}:
 Hybrid(64, 2)
 Hybrid(64, 4)
```
"""
function search_space(;
    schedules = keys(SCHEDULES),
    workgroupsize = (64, 128, 256, 512),
    items_per_thread = (2, 4, 8),
    chunk = (512, 2048, 8192),
)
    candidates = (; workgroupsize, items_per_thread, chunk)
    space = ScanSchedule[]
    for name in schedules
        T = SCHEDULES[name]
        for values in Iterators.product(map(n -> getfield(candidates, n), fieldnames(T))...)
            s = T(values...)
            tunable_problem(s) === nothing && push!(space, s)
        end
    end
    return space
end

"""
    tune_scan(a, b, x, c = nothing; space = search_space(), iterations = 7,
              kwargs...) -> Vector{NamedTuple}

Times every schedule of `space` on these operands with [`time_scan`](@ref) and
returns `(schedule, time_ms)` results, fastest (by median time) first.
Schedules that cannot run for these operands on this device (see
`ScanWeaver.config_problem`: local memory over the budget, a workgroup over the
device's limit) are left out. `kwargs` (`h0`, `reset`, `reverse`) go to every
run.

# Examples
```julia-repl
julia> a = rand(Float32, 2048, 16);

julia> best = first(tune_scan(a, a, a; iterations = 3));

julia> selective_scan(a, a, a; schedule = best.schedule);
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
    check_tunables(:tune_scan, (; iterations))
    backend = array_backend(a)
    P = pair_type(a, b, x)
    S = fieldtype(P, :U)
    runnable = [s for s in space if config_problem(s, backend, P, S) === nothing]
    results = map(runnable) do schedule
        times = time_scan(a, b, x, c; iterations, schedule, kwargs...)
        (; schedule, time_ms = median_of(times))
    end
    return sort!(results; by = r -> r.time_ms)
end
