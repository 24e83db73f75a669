# ScanWeaver.jl on the CPU, in one process (run with 2 threads):
#
#     julia --project=<env with ScanWeaver> -t 2 bench/julia.jl [out.json]
#
# Float32, (L, lanes) = (4096, 4096) and one lane of 2^24: the default path
# (`schedule = :auto`), each schedule and a plain Julia loop (one lane at a
# time, one thread), every one checked against the plain loop first. The
# memory roofline (a broadcast with the scan's traffic: 4 reads, 1 write) is
# measured in the same rounds, right after each scan, on all threads and on
# one: a round's ratio `roofline time / scan time` compares two timings taken
# under the same load, and the row reports the median, min and max of those
# ratios over the rounds (15), next to each timing's own min/median/max. Then
# the matrix-state forward of ScanWeaver.jl at (batch, T, H, K, V) =
# (1, 1024, 8, 64, 64), how much more arithmetic all threads do than one
# (`thread_compute_scaling`, which bounds what threads can give a scan), the
# time to the first scan in a fresh process, and the default at (4096, 4096)
# in fresh processes under `-C generic` (no AVX) and `-C native`.
#
# Every row is printed when it is measured and the JSON file (if named) is
# rewritten after each row; a step that fails (a child process that crashes,
# a scan that disagrees with the loop) becomes a row that says so, and the
# run goes on. Targets: the default at least 0.8 of the same-run roofline,
# the first scan under 5 s. The juliacall overhead per call is
# `bench/julia_overhead.py`; the matrix-state forward against the C backend
# is `bench/julia_matrix.py`.
using ScanWeaver
using Statistics: median

function plain_loop!(y, a, b, x, c)
    L, lanes = size(a)
    @inbounds for l in 1:lanes
        h = zero(eltype(y))
        for t in 1:L
            h = a[t, l] * h + b[t, l] * x[t, l]
            y[t, l] = c[t, l] * h
        end
    end
    return y
end

# The scan's traffic as a broadcast, split over `parts` tasks by linear index
# (so one long lane's is too).
function roofline!(y, a, b, x, c, parts = Threads.nthreads())
    n = length(a)
    Threads.@threads for p in 1:parts
        @inbounds @simd for i in ((p - 1) * cld(n, parts) + 1):min(p * cld(n, parts), n)
            y[i] = a[i] * b[i] + x[i] * c[i]
        end
    end
    return y
end

roofline_one!(y, a, b, x, c) = roofline!(y, a, b, x, c, 1)

scan!(schedule) = (y, a, b, x, c) -> selective_scan!(y, a, b, x, c; schedule)

const SCANS = [
    "default" => scan!(:auto),
    "reduce_then_scan" => scan!(:reduce_then_scan),
    "hybrid" => scan!(:hybrid),
    "blelloch" => scan!(:blelloch),
    "plain_loop" => plain_loop!,
]

# --- output: each row printed and the JSON rewritten as it comes ---------------------------------

json(io, x::AbstractString) = print(io, '"', escape_string(x), '"')
json(io, x::Symbol) = json(io, String(x))
json(io, x::Bool) = print(io, x)
json(io, x::Integer) = print(io, x)
json(io, x::AbstractFloat) = isfinite(x) ? print(io, x) : print(io, "null")
json(io, ::Nothing) = print(io, "null")
function json(io, x::AbstractVector)
    print(io, '[')
    for (i, v) in enumerate(x)
        i > 1 && print(io, ", ")
        json(io, v)
    end
    return print(io, ']')
end
function json(io, x::Union{AbstractDict, NamedTuple})
    print(io, '{')
    for (i, (k, v)) in enumerate(pairs(x))
        i > 1 && print(io, ", ")
        json(io, string(k))
        print(io, ": ")
        json(io, v)
    end
    return print(io, '}')
end

"The run so far: its settings and every row measured."
struct Report
    out::Union{Nothing, String}
    meta::Dict{String, Any}
    rows::Vector{Any}
end

"Adds `row`, prints it, and rewrites the JSON file."
function emit!(report::Report, row)
    push!(report.rows, row)
    println(summary_line(row))
    flush(stdout)
    if report.out !== nothing
        open(report.out, "w") do io
            json(io, merge(report.meta, Dict("rows" => report.rows)))
            println(io)
        end
    end
    return nothing
end

spread(v) = (min = minimum(v), median = median(v), max = maximum(v))
fmt(x) = string(round(x; digits = 3))
fmt(s::NamedTuple) = "$(fmt(s.median)) ($(fmt(s.min))-$(fmt(s.max)))"

function summary_line(row)
    haskey(row, :error) && return "$(row.step): FAILED: $(row.error)"
    row.step == "scan" ||
        return "$(row.step): " *
            join(
                (
                    "$k = $(v isa NamedTuple ? fmt(v) : v)"
                    for (k, v) in pairs(row)
                    if k != :step
                ),
                ", ",
            )
    line = "($(row.L), $(row.lanes)) $(rpad(row.name, 17)) $(fmt(row.ns_per_element)) ns/element"
    row.status == "ok" || return line * "  [$(row.status)]"
    return line *
        ";  roofline / this: $(fmt(row.roofline_fraction)) (all threads), " *
        "$(fmt(row.roofline_1thread_fraction)) (one thread)"
end

# --- the vector scans, with the roofline in the same rounds ----------------------------------------

"""
    measure!(report, L, lanes; rounds = 15)

One row per scan of [`SCANS`](@ref): its time per element (min/median/max of
`rounds`), and the ratios of the all-thread and one-thread rooflines timed right
after it in each round. The default's row (the first) is emitted first, so a
slow schedule never delays the figure that matters.
"""
function measure!(report::Report, L, lanes; rounds = 15)
    a = 0.5f0 .+ 0.49f0 .* rand(Float32, L, lanes)
    b, x, c = (randn(Float32, L, lanes) for _ in 1:3)
    want = plain_loop!(similar(a), a, b, x, c)
    scale = maximum(abs, want)
    y, r = similar(a), similar(a)
    roofline!(r, a, b, x, c)
    roofline_one!(r, a, b, x, c)
    n = L * lanes
    for (name, f) in SCANS
        row = try
            f(y, a, b, x, c) # compiles
            err = maximum(abs, y .- want)
            if !(err <= 1.0f-3 * scale)
                (step = "scan", L, lanes, name, status = "disagrees with the loop by $err")
            else
                t, full, one = Float64[], Float64[], Float64[]
                for _ in 1:rounds
                    push!(t, @elapsed f(y, a, b, x, c))
                    push!(full, @elapsed roofline!(r, a, b, x, c))
                    push!(one, @elapsed roofline_one!(r, a, b, x, c))
                end
                (
                    step = "scan",
                    L,
                    lanes,
                    name,
                    status = "ok",
                    rounds,
                    ns_per_element = spread(1.0e9 .* t ./ n),
                    roofline_ns_per_element = spread(1.0e9 .* full ./ n),
                    roofline_1thread_ns_per_element = spread(1.0e9 .* one ./ n),
                    roofline_fraction = spread(full ./ t),
                    roofline_1thread_fraction = spread(one ./ t),
                )
            end
        catch err
            (step = "scan", L, lanes, name, error = sprint(showerror, err))
        end
        emit!(report, row)
    end
    return nothing
end

# --- the matrix-state forward ---------------------------------------------------------------------

function matrix_state!(
    report::Report;
    batch = 1,
    T = 1024,
    H = 8,
    K = 64,
    V = 64,
    rounds = 15,
)
    row = try
        q, k = randn(Float32, K, H, T, batch), randn(Float32, K, H, T, batch)
        v, g = randn(Float32, V, H, T, batch), -rand(Float32, H, T, batch)
        o, hlast = similar(v), similar(v, (V, K, H, batch))
        f() = matrix_state_scan!(o, q, k, v; g, hlast)
        f()
        t = [@elapsed(f()) for _ in 1:rounds]
        elements = batch * T * H * K * V
        (
            step = "matrix_state forward (batch, T, H, K, V) = ($batch, $T, $H, $K, $V)",
            ms = spread(1.0e3 .* t),
            ns_per_state_element = spread(1.0e9 .* t ./ elements),
        )
    catch err
        (step = "matrix_state forward", error = sprint(showerror, err))
    end
    return emit!(report, row)
end

# --- the bound on threads, start-up, code generation targets --------------------------------------

# Independent fused multiply-adds in registers, 16 chains.
function fma_work(n)
    v = ntuple(i -> 1.0f0 + i * 1.0f-7, 16)
    for _ in 1:n
        v = map(e -> muladd(e, 0.9999999f0, 1.0f-9), v)
    end
    return sum(v)
end

# How much more arithmetic all threads do than one: the same register-bound
# work on each thread at once, against one thread alone. About `nthreads()`
# where each thread has a core of its own, near 1 where the threads share one
# core's units: then a scan's compute cannot scale with the threads either,
# only its memory traffic can.
function thread_compute_scaling(n = 20_000_000)
    fma_work(10)
    k = Threads.nthreads()
    sums = zeros(Float32, k)
    one = median([@elapsed(sums[1] = fma_work(n)) for _ in 1:3])
    each = median([
        @elapsed(
            Threads.@threads(
                for i in 1:k
                    sums[i] = fma_work(n)
                end,
            ),
        )
        for _ in 1:3
    ])
    return k * one / each
end

"Runs `cmd` in a child process and returns its standard output; a failure throws with its standard error."
function child_output(cmd)
    out, err = IOBuffer(), IOBuffer()
    proc = run(pipeline(ignorestatus(cmd); stdout = out, stderr = err))
    if !success(proc)
        msg = String(take!(err))
        throw(ErrorException(
            "exit code $(proc.exitcode)" *
                (proc.termsignal != 0 ? ", signal $(proc.termsignal)" : "") *
                ": " *
                last(strip(msg), 600),
        ))
    end
    return String(take!(out))
end

function first_scan_seconds()
    project = Base.active_project()
    code = "t = time(); using ScanWeaver; selective_scan(rand(Float32, 64, 4), rand(Float32, 64, 4), " *
        "rand(Float32, 64, 4)); print(time() - t)"
    return parse(
        Float64,
        strip(child_output(`$(Base.julia_cmd()) --project=$project -t 2 -e $code`)),
    )
end

# The default at (4096, 4096) in a fresh process whose JIT code is compiled
# for `target` (`julia -C target`), in ns per element; with `generic` the code
# has no AVX.
function default_ns_with_target(target)
    project = Base.active_project()
    code = "include($(repr(@__FILE__))); print(target_probe())"
    cmd = `$(Base.julia_cmd()) -C $target --project=$project -t $(Threads.nthreads()) -e $code`
    return parse(Float64, strip(child_output(addenv(cmd, "SCANWEAVER_BENCH_PROBE" => "1"))))
end

function target_probe()
    L, lanes = 4096, 4096
    a = 0.5f0 .+ 0.49f0 .* rand(Float32, L, lanes)
    b, x, c = (randn(Float32, L, lanes) for _ in 1:3)
    y, f = similar(a), scan!(:auto)
    f(y, a, b, x, c)
    return 1.0e9 * median([@elapsed(f(y, a, b, x, c)) for _ in 1:7]) / (L * lanes)
end

"Emits `step => f()` as a row, or the failure of `f` as a row; never throws."
function attempt!(report::Report, step, f)
    row = try
        (; step, value = f())
    catch err
        (; step, error = sprint(showerror, err))
    end
    return emit!(report, row)
end

function main(out = nothing)
    meta = Dict{String, Any}(
        "threads" => Threads.nthreads(),
        "cpu" => Sys.CPU_NAME,
        "julia" => string(VERSION),
        "rounds" => 15,
    )
    report = Report(out, meta, Any[])
    println(
        "ScanWeaver.jl CPU benchmark: $(Threads.nthreads()) threads, $(Sys.CPU_NAME), Julia $VERSION",
    )
    measure!(report, 4096, 4096)
    measure!(report, 2^24, 1)
    matrix_state!(report)
    attempt!(report, "arithmetic of all threads against one (x)", thread_compute_scaling)
    attempt!(report, "first scan after `using ScanWeaver` (s)", first_scan_seconds)
    for target in ("generic", "native")
        attempt!(
            report,
            "default at (4096, 4096) under -C $target (ns/element)",
            () -> default_ns_with_target(target),
        )
    end
    return report
end

if get(ENV, "SCANWEAVER_BENCH_PROBE", "") != "1"
    main(isempty(ARGS) ? nothing : ARGS[1])
end
