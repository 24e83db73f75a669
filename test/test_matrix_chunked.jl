# The chunked (matmul) form of the matrix-state scan (`src/matrix/chunked.jl`,
# `chunked_backward.jl`) on every backend of the suite: the forward against the
# Float64 loop of the recurrence (`matrix_reference` in test/reference.jl) and
# against the recurrent kernels, the backward against central differences of
# that loop.

"""
    check_chunked_forward(scan, AT, q, k, v, want, want_h, args, chunks, case)

Runs `scan(AT(q), AT(k), AT(v); args...)` in the recurrent form and in the
chunked form at each of `chunks`, and tests the chunked outputs and final
states against the Float64 loop's `want`, `want_h` and against the recurrent
ones; `case` (a named tuple) is logged where the loop differs.
"""
function check_chunked_forward(scan, AT, q, k, v, want, want_h, args, chunks, case)
    T = eltype(q)
    rec, rec_h = scan(AT(q), AT(k), AT(v); args..., return_state = true)
    for chunk in chunks
        o, h = scan(
            AT(q),
            AT(k),
            AT(v);
            args...,
            return_state = true,
            algorithm = :chunked,
            chunk,
        )
        ok = matches(o, want; rtol = tolerance(T)) &&
            matches(h, want_h; rtol = tolerance(T))
        ok || @info "chunked form differs from the loop" scan case chunk
        @test ok
        @test matches(o, widen64.(Array(rec)); rtol = tolerance(T))
        @test matches(h, widen64.(Array(rec_h)); rtol = tolerance(T))
    end
    return nothing
end

"""
    chunked_log_decays(rng, kind, dims) -> Array{Float64}

Log decays of one `kind`: `:positive` (growth), `:mixed` (both signs),
`:reset` (decays with `-inf` among them), `:tiny` (-1e-4), `:huge` (-1e4).
"""
function chunked_log_decays(rng, kind, dims)
    kind === :positive && return 0.15 .* rand(rng, dims...)
    kind === :mixed && return 0.5 .- 2.0 .* rand(rng, dims...)
    kind === :tiny && return fill(-1.0e-4, dims)
    kind === :huge && return -1.0e4 .* (1 .+ rand(rng, dims...))
    g = -2.0 .* rand(rng, dims...)
    g[rand(rng, 1:length(g), max(1, length(g) ÷ 9))] .= -Inf
    return g
end

@testset "matrix-state chunked form: $name" for (name, AT) in BACKENDS
    backend = get_backend(AT(zeros(Float32, 1)))
    rng = Xoshiro(11)
    dev(::Nothing) = nothing
    dev(A) = AT(A)
    nk, nv, H, Hq, L = 5, 6, 4, 2, 37
    eltypes = unique((Float32, device_eltype(backend, Float64)))
    kinds = (:positive, :mixed, :reset, :tiny, :huge)
    @testset "$T $decay bonus=$bonus reverse=$reverse" for T in eltypes, decay in (
            :none,
            :scalar,
            :key,
        ), bonus in (false, true), reverse in (false, true)

        for (case, kind) in enumerate(decay === :none ? (:none,) : kinds)
            packed = isodd(case)
            batch = packed ? 1 : 2
            cu_seqlens = packed ? [0, 1, 1, 17, 30, L] : nothing
            nseq = packed ? 5 : batch
            q, k = T.(randn(rng, nk, Hq, L, batch)), T.(randn(rng, nk, Hq, L, batch))
            v = T.(randn(rng, nv, H, L, batch))
            g = decay === :none ?
                nothing :
                T.(chunked_log_decays(
                    rng,
                    kind,
                    ((decay === :key ? (nk,) : ())..., H, L, batch),
                ))
            u = bonus ? T.(randn(rng, nk, H)) : nothing
            h0 = iseven(case) ? nothing : T.(randn(rng, nv, nk, H, nseq))
            want, want_h = matrix_reference(q, k, v; g, u, h0, cu_seqlens, reverse)
            args = (; g = dev(g), u = dev(u), h0 = dev(h0), cu_seqlens, reverse)
            check_chunked_forward(
                matrix_state_scan,
                AT,
                q,
                k,
                v,
                want,
                want_h,
                args,
                (1, 4, 16, 64),
                (; T, decay, bonus, reverse, kind),
            )
        end
    end

    @testset "backward $T $decay bonus=$bonus reverse=$reverse" for T in eltypes, decay in (
            :none,
            :scalar,
            :key,
        ), bonus in (false, true), reverse in (false, true)

        nk, nv, H, Hq, L = 3, 4, 4, 2, 13
        for (case, kind) in enumerate(decay === :none ? (:none,) : kinds)
            packed = isodd(case)
            batch = packed ? 1 : 2
            cu_seqlens = packed ? [0, 4, 4, L] : nothing
            nseq = packed ? 3 : batch
            rounded(A) = Float64.(T.(A))
            args = (
                q = rounded(randn(rng, nk, Hq, L, batch)),
                k = rounded(randn(rng, nk, Hq, L, batch)),
                v = rounded(randn(rng, nv, H, L, batch)),
                g = decay === :none ?
                    nothing :
                    rounded(chunked_log_decays(
                        rng,
                        kind,
                        ((decay === :key ? (nk,) : ())..., H, L, batch),
                    )),
                u = bonus ? rounded(randn(rng, nk, H)) : nothing,
                h0 = rounded(randn(rng, nv, nk, H, nseq)),
            )
            W, Vh = rounded(randn(rng, nv, H, L, batch)),
                rounded(randn(rng, nv, nk, H, nseq))
            loss(a) = begin
                o, h = matrix_reference(a.q, a.k, a.v; a.g, a.u, a.h0, cu_seqlens, reverse)
                sum(W .* o) + sum(Vh .* h)
            end
            on(A) = A === nothing ? nothing : AT(T.(A))
            for chunk in (1, 4, 16)
                d = matrix_state_backward(
                    on(args.q),
                    on(args.k),
                    on(args.v),
                    on(W);
                    g = on(args.g),
                    u = on(args.u),
                    h0 = on(args.h0),
                    dhlast = on(Vh),
                    cu_seqlens,
                    reverse,
                    algorithm = :chunked,
                    chunk,
                )
                for arg in keys(args)
                    A = args[arg]
                    grad = getfield(d, Symbol(:d, arg))
                    A === nothing && (@test grad === nothing; continue)
                    D = randn(rng, size(A))
                    moved(s) = merge(args, NamedTuple{(arg,)}((A .+ s .* D,)))
                    fd = (loss(moved(1.0e-6)) - loss(moved(-1.0e-6))) / 2.0e-6
                    got = sum(Float64.(Array(grad)) .* D)
                    ok = isapprox(
                        got,
                        fd;
                        rtol = 100 * tolerance(T),
                        atol = 1.0e-6 * max(1, abs(fd)),
                    )
                    ok ||
                        @info "chunked backward differs from the loop" T decay bonus reverse kind chunk arg got fd
                    @test ok
                end
            end
        end
    end

    @testset "one step, default chunk, in place" begin
        q, k = randn(rng, Float32, 3, 1, 1, 2), randn(rng, Float32, 3, 1, 1, 2)
        v, g = randn(rng, Float32, 4, 1, 1, 2), -rand(rng, Float32, 3, 1, 1, 2)
        want, want_h = matrix_reference(q, k, v; g)
        o, hlast = AT(zeros(Float32, 4, 1, 1, 2)), AT(zeros(Float32, 4, 3, 1, 2))
        matrix_state_scan!(o, AT(q), AT(k), AT(v); g = AT(g), hlast, algorithm = :chunked)
        @test matches(o, want; rtol = tolerance(Float32))
        @test matches(hlast, want_h; rtol = tolerance(Float32))
    end

    @testset "bad algorithm and chunk" begin
        q, v = AT(rand(Float32, 4, 1, 6, 1)), AT(rand(Float32, 5, 1, 6, 1))
        err = try
            matrix_state_scan(q, q, v; algorithm = :blocked)
        catch e
            e
        end
        @test err isa ArgumentError && occursin("algorithm = :blocked", err.msg)
        for chunk in (0, 1025, 2.5)
            err = try
                matrix_state_scan(q, q, v; algorithm = :chunked, chunk)
            catch e
                e
            end
            @test err isa ArgumentError && occursin("chunk = $(repr(chunk))", err.msg)
        end
    end
end
