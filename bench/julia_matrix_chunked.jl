# The chunked matrix-state forward of ScanWeaver.jl (`algorithm = :chunked`,
# KernelAbstractions kernels) against its recurrent forward on the CPU, in one
# process (run with 2 threads):
#
#     julia --project=<env with ScanWeaver> -t 2 bench/julia_matrix_chunked.jl [B,T,H,K,V] [rounds]
#
# Float32 at (batch, T, H, K, V) = (1, 2048, 4, 64, 64) unless given, a log
# decay per head (Mamba-2, simple GLA) and per key (GLA), chunks of 64. The two
# forms are checked against each other first, then timed alternately in the
# same rounds (so both see the same load); a row reports each one's
# min/median/max in ms and the median, min and max of the per-round ratio
# chunked / recurrent.
using ScanWeaver
using Statistics: median

function timed(f)
    t = time_ns()
    f()
    return (time_ns() - t) / 1.0e6
end

function row(decay, B, T, H, K, V, rounds)
    q, k = randn(Float32, K, H, T, B), randn(Float32, K, H, T, B)
    v = randn(Float32, V, H, T, B)
    g = decay === :key ? -rand(Float32, K, H, T, B) ./ 4 : -rand(Float32, H, T, B) ./ 4
    o, h = similar(v), similar(v, V, K, H, B)
    oc, hc = similar(v), similar(v, V, K, H, B)
    recurrent() = matrix_state_scan!(o, q, k, v; g, hlast = h)
    chunked() = matrix_state_scan!(
        oc,
        q,
        k,
        v;
        g,
        hlast = hc,
        algorithm = :chunked,
        chunk = 64,
    )
    recurrent()
    chunked()
    scale = max(1.0f0, maximum(abs, o))
    err = max(maximum(abs, o - oc), maximum(abs, h - hc)) / scale
    err < 1.0f-3 || error("chunked and recurrent differ by $err (relative) at decay $decay")
    times = (rec = Float64[], chk = Float64[])
    for _ in 1:rounds
        push!(times.rec, timed(recurrent))
        push!(times.chk, timed(chunked))
    end
    ratio = times.chk ./ times.rec
    spread(x) = round.((minimum(x), median(x), maximum(x)); sigdigits = 3)
    println(
        "decay $decay: recurrent $(spread(times.rec)) ms, chunked $(spread(times.chk)) ms, ",
        "chunked/recurrent median $(round(median(ratio); sigdigits = 3)) ",
        "(min $(round(minimum(ratio); sigdigits = 3)), max $(round(maximum(ratio); sigdigits = 3))), ",
        "max relative difference $err",
    )
    return nothing
end

function main(args)
    B, T, H, K, V = parse.(Int, split(get(args, 1, "1,2048,4,64,64"), ","))
    rounds = parse(Int, get(args, 2, "7"))
    println(
        "ScanWeaver.jl matrix-state forward, Float32, (B, T, H, K, V) = $((B, T, H, K, V)), ",
        "$(Threads.nthreads()) threads, $rounds rounds",
    )
    for decay in (:scalar, :key)
        row(decay, B, T, H, K, V, rounds)
    end
    return nothing
end

main(ARGS)
