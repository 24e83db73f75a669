# The chunked matrix-state forward and backward of ScanWeaver.jl
# (`algorithm = :chunked`, KernelAbstractions kernels) against the recurrent
# ones on the CPU, in one process (run with 2 threads):
#
#     julia --project=<env with ScanWeaver> -t 2 bench/julia_matrix_chunked.jl [B,T,H,K,V] [rounds]
#
# Float32 at (batch, T, H, K, V) = (1, 2048, 4, 64, 64) unless given, a log
# decay per head (Mamba-2, simple GLA) and per key (GLA), chunks of 64. The two
# forms are checked against each other first, then timed alternately in the
# same rounds (so both see the same load); a row reports each one's
# min/median/max in ms and the median, min and max of the per-round ratio
# chunked / recurrent. The backward (dq, dk, dv, dg) is checked and timed the
# same way.
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

function row(part, decay, B, T, H, K, V, rounds)
    q, k = randn(Float32, K, H, T, B), randn(Float32, K, H, T, B)
    v, dout = randn(Float32, V, H, T, B), randn(Float32, V, H, T, B)
    g = decay === :key ? -rand(Float32, K, H, T, B) ./ 4 : -rand(Float32, H, T, B) ./ 4
    o, h = similar(v), similar(v, V, K, H, B)
    function run(algorithm)
        if part === :forward
            matrix_state_scan!(o, q, k, v; g, hlast = h, algorithm, chunk = 64)
            return (copy(o), copy(h))
        end
        d = matrix_state_backward(q, k, v, dout; g, algorithm, chunk = 64)
        return (d.dq, d.dk, d.dv, d.dg)
    end
    recurrent() = run(:recurrent)
    chunked() = run(:chunked)
    err = relative(recurrent(), chunked())
    err < 1.0f-3 ||
        error("chunked and recurrent differ by $err (relative): $part, decay $decay")
    times = (rec = Float64[], chk = Float64[])
    for _ in 1:rounds
        push!(times.rec, timed(recurrent))
        push!(times.chk, timed(chunked))
    end
    ratio = times.chk ./ times.rec
    spread(x) = round.((minimum(x), median(x), maximum(x)); sigdigits = 3)
    println(
        "$part, decay $decay: recurrent $(spread(times.rec)) ms, chunked $(spread(times.chk)) ms, ",
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
        "ScanWeaver.jl matrix-state scan, Float32, (B, T, H, K, V) = $((B, T, H, K, V)), ",
        "$(Threads.nthreads()) threads, $rounds rounds",
    )
    for part in (:forward, :backward), decay in (:scalar, :key)
        row(part, decay, B, T, H, K, V, rounds)
    end
    return nothing
end

main(ARGS)
