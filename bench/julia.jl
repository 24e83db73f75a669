# ScanWeaver.jl on the CPU, in one process (run with 2 threads):
#
#     julia --project=<env with ScanWeaver> -t 2 bench/julia.jl [out.json]
#
# Float32, (L, lanes) = (4096, 4096) and one lane of 2^24: the default path
# (`schedule = :auto`), each schedule, a plain Julia loop (one lane at a time,
# one thread) and a broadcast with the scan's traffic (4 reads, 1 write, split
# over all threads, so one long lane's is too) as the roofline, timed round-robin (15 rounds) after a warm-up call; every scan is checked
# against the plain loop first. Then the time to the first scan in a fresh
# process after `using ScanWeaver`, and the default at (4096, 4096) in fresh
# processes under `-C generic` (no AVX) and `-C native`. Targets: the default at least 0.7 of the
# roofline, at least 3x the plain loop on the long lane, the first scan under
# 5 s. It also reports how much more arithmetic all threads do than one
# (`thread_compute_scaling`), which bounds what threads can give a long lane.
# The juliacall overhead per call is `bench/julia_overhead.py`.
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

# Split over the threads by linear index, so one long lane is shared too.
function roofline!(y, a, b, x, c)
    n, parts = length(a), Threads.nthreads()
    Threads.@threads for p in 1:parts
        @inbounds @simd for i in ((p - 1) * cld(n, parts) + 1):min(p * cld(n, parts), n)
            y[i] = a[i] * b[i] + x[i] * c[i]
        end
    end
    return y
end

scan!(schedule) = (y, a, b, x, c) -> selective_scan!(y, a, b, x, c; schedule)

function entries()
    return [
        "default" => scan!(:auto),
        "sequential" => scan!(:sequential),
        "blelloch" => scan!(:blelloch),
        "hybrid" => scan!(:hybrid),
        "reduce_then_scan" => scan!(:reduce_then_scan),
        "plain_loop" => plain_loop!,
        "roofline" => roofline!,
    ]
end

function measure(L, lanes; rounds = 15)
    a = 0.5f0 .+ 0.49f0 .* rand(Float32, L, lanes)
    b, x, c = (randn(Float32, L, lanes) for _ in 1:3)
    want = plain_loop!(similar(a), a, b, x, c)
    scale = maximum(abs, want)
    times = Dict{String, Vector{Float64}}()
    status = Dict{String, String}()
    y = similar(a)
    for (name, f) in entries()
        f(y, a, b, x, c) # compiles
        ok = name == "roofline" || maximum(abs, y .- want) <= 1.0f-3 * scale
        status[name] = ok ? "ok" : "failed"
        times[name] = Float64[]
    end
    for _ in 1:rounds, (name, f) in entries()
        status[name] == "ok" || continue
        push!(times[name], @elapsed f(y, a, b, x, c))
    end
    ns = Dict(n => 1.0e9 * median(t) / (L * lanes) for (n, t) in times if !isempty(t))
    return (
        L = L,
        lanes = lanes,
        ns_per_element = ns,
        status = status,
        roofline_fraction = ns["roofline"] / ns["default"],
        speedup_vs_plain_loop = ns["plain_loop"] / ns["default"],
    )
end

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
# core's units (two hardware threads of one core): then a scan's compute
# cannot scale with the threads either, only its memory traffic can.
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

function first_scan_seconds()
    project = Base.active_project()
    code = "t = time(); using ScanWeaver; selective_scan(rand(Float32, 64, 4), rand(Float32, 64, 4), " *
        "rand(Float32, 64, 4)); print(time() - t)"
    out = read(`$(Base.julia_cmd()) --project=$project -t 2 -e $code`, String)
    return parse(Float64, strip(out))
end

# The default at (4096, 4096) in a fresh process whose JIT code is compiled
# for `target` (`julia -C target`), in ns per element; with `generic` the code
# has no AVX.
function default_ns_with_target(target)
    project = Base.active_project()
    code = "include($(repr(@__FILE__))); print(target_probe())"
    cmd = `$(Base.julia_cmd()) -C $target --project=$project -t $(Threads.nthreads()) -e $code`
    return parse(Float64, strip(read(addenv(cmd, "SCANWEAVER_BENCH_PROBE" => "1"), String)))
end

function target_probe()
    L, lanes = 4096, 4096
    a = 0.5f0 .+ 0.49f0 .* rand(Float32, L, lanes)
    b, x, c = (randn(Float32, L, lanes) for _ in 1:3)
    y, f = similar(a), scan!(:auto)
    f(y, a, b, x, c)
    return 1.0e9 * median([@elapsed(f(y, a, b, x, c)) for _ in 1:7]) / (L * lanes)
end

function main(out = nothing)
    results = [measure(4096, 4096), measure(2^24, 1)]
    scaling = thread_compute_scaling()
    first = first_scan_seconds()
    targets = Dict(t => default_ns_with_target(t) for t in ("generic", "native"))
    for r in results
        println("(L, lanes) = ($(r.L), $(r.lanes)):")
        for (name, v) in sort(collect(r.ns_per_element); by = last)
            println(rpad("  $name", 22), round(v; digits = 3), " ns/element")
        end
        println(
            "  default / roofline: ",
            round(r.roofline_fraction; digits = 2),
            " (target >= 0.7)",
        )
        println(
            "  default vs plain loop: ",
            round(r.speedup_vs_plain_loop; digits = 2),
            "x",
        )
    end
    println(
        "arithmetic of $(Threads.nthreads()) threads against one: ",
        round(scaling; digits = 2),
        "x (register-bound multiply-adds, the same work on each)",
    )
    println(
        "first scan after `using ScanWeaver`: ",
        round(first; digits = 2),
        " s (target < 5)",
    )
    println(
        "default at (4096, 4096) under `-C generic`: ",
        round(targets["generic"]; digits = 3),
        " ns/element, `-C native` ($(Sys.CPU_NAME)): ",
        round(targets["native"]; digits = 3),
        " (",
        round(targets["generic"] / targets["native"]; digits = 2),
        "x)",
    )
    if out !== nothing
        open(out, "w") do io
            print(
                io,
                "{\"threads\": $(Threads.nthreads()), \"cpu\": \"$(Sys.CPU_NAME)\", " *
                    "\"first_scan_s\": $first, \"thread_compute_scaling\": $scaling, \"default_ns_generic_target\": $(targets["generic"]), " *
                    "\"default_ns_native_target\": $(targets["native"]), \"shapes\": [",
            )
            for (i, r) in enumerate(results)
                i > 1 && print(io, ", ")
                ns = join(("\"$k\": $v" for (k, v) in r.ns_per_element), ", ")
                print(
                    io,
                    "{\"L\": $(r.L), \"lanes\": $(r.lanes), \"ns_per_element\": {$ns}, ",
                )
                print(io, "\"roofline_fraction\": $(r.roofline_fraction), ")
                print(io, "\"speedup_vs_plain_loop\": $(r.speedup_vs_plain_loop)}")
            end
            println(io, "]}")
        end
    end
    return nothing
end

if get(ENV, "SCANWEAVER_BENCH_PROBE", "") != "1"
    main(isempty(ARGS) ? nothing : ARGS[1])
end
