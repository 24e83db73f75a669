# The chunked (WY) delta-rule forward of ScanWeaver.jl (`delta_rule_scan(...;
# algorithm = :chunked)`, KernelAbstractions kernels) and its chunked backward
# (`delta_rule_backward!(...; algorithm = :chunked)`) against the recurrent
# ones on the CPU, in one process (run with 2 threads):
#
#     julia --project=<env with ScanWeaver> -t 2 bench/julia_delta_chunked.jl [B,T,H,K,V] [rounds] [chunk]
#
# Float32 at (batch, T, H, K, V) = (1, 1024, 4, 64, 64) unless given, L2-normalised
# q and k, Gated DeltaNet (a log decay per head), KDA (one per key) and RWKV-7
# (the dplr form: a = -kk, b = kk times a gate in (0, 1), a log decay per key),
# chunks of 32. The two forms are checked against each other first, then timed alternately
# in the same rounds (so both see the same load); a row reports each one's
# min/median/max in ms and the median, min and max of the per-round ratio
# chunked / recurrent.
using ScanWeaver
using Statistics: median

function timed(f)
    t = time_ns()
    f()
    return (time_ns() - t) / 1.0e6
end

"The largest difference of the arrays in `a` and `b`, relative to the largest of `a`."
function relative(a, b)
    scale = max(1.0f0, maximum(x -> maximum(abs, x), a))
    return maximum(((x, y),) -> maximum(abs, x - y), zip(a, b)) / scale
end

function row(family, B, T, H, K, V, rounds, chunk)
    gate = family === :gated ? :scalar : :key
    q, k = randn(Float32, K, H, T, B), randn(Float32, K, H, T, B)
    v, beta = randn(Float32, V, H, T, B), rand(Float32, H, T, B)
    g = gate === :key ? -rand(Float32, K, H, T, B) ./ 4 : -rand(Float32, H, T, B) ./ 4
    kk = randn(Float32, K, H, T, B)
    kk ./= sqrt.(sum(abs2, kk; dims = 1))
    form = family === :rwkv7 ? (; a = -kk, b = kk .* rand(Float32, 1, H, T, B)) : (; beta)
    o, h = similar(v), similar(v, V, K, H, B)
    function run(algorithm)
        delta_rule_scan!(o, q, k, v; form..., g, l2norm = true, hlast = h, algorithm, chunk)
        return (copy(o), copy(h))
    end
    recurrent() = run(:recurrent)
    chunked() = run(:chunked)
    err = relative(recurrent(), chunked())
    err < 1.0f-3 || error("chunked and recurrent differ by $err (relative): $family")
    times = (rec = Float64[], chk = Float64[])
    for _ in 1:rounds
        push!(times.rec, timed(recurrent))
        push!(times.chk, timed(chunked))
    end
    report("forward", family, times, err)
    dout, dh = randn(Float32, size(o)), randn(Float32, size(h))
    grads = (
        similar(q),
        similar(k),
        similar(v),
        similar(g),
        family === :rwkv7 ? similar(kk) : similar(beta),
    )
    function back(algorithm)
        dq, dk, dv, dg, dx = grads
        extra = family === :rwkv7 ? (; da = dx) : (; dbeta = dx)
        delta_rule_backward!(
            dq,
            dk,
            dv,
            q,
            k,
            v,
            dout;
            form...,
            g,
            l2norm = true,
            dhlast = dh,
            dg,
            extra...,
            algorithm,
            chunk,
        )
        return copy.(grads)
    end
    err = relative(back(:recurrent), back(:chunked))
    err < 1.0f-3 ||
        error("chunked and recurrent backward differ by $err (relative): $family")
    times = (rec = Float64[], chk = Float64[])
    for _ in 1:rounds
        push!(times.rec, timed(() -> back(:recurrent)))
        push!(times.chk, timed(() -> back(:chunked)))
    end
    report("backward", family, times, err)
    return nothing
end

function report(part, family, times, err)
    ratio = times.chk ./ times.rec
    spread(x) = round.((minimum(x), median(x), maximum(x)); sigdigits = 3)
    println(
        "$part, $family: recurrent $(spread(times.rec)) ms, chunked $(spread(times.chk)) ms, ",
        "chunked/recurrent median $(round(median(ratio); sigdigits = 3)) ",
        "(min $(round(minimum(ratio); sigdigits = 3)), max $(round(maximum(ratio); sigdigits = 3))), ",
        "max relative difference $err",
    )
    return nothing
end

function main(args)
    B, T, H, K, V = parse.(Int, split(get(args, 1, "1,1024,4,64,64"), ","))
    rounds = parse(Int, get(args, 2, "7"))
    chunk = parse(Int, get(args, 3, "32"))
    println(
        "ScanWeaver.jl delta rule, Float32, (B, T, H, K, V) = $((B, T, H, K, V)), chunk $chunk, ",
        "$(Threads.nthreads()) threads, $rounds rounds",
    )
    for family in (:gated, :kda, :rwkv7)
        row(family, B, T, H, K, V, rounds, chunk)
    end
    return nothing
end

main(ARGS)
