# Gradients of the selective scan (CPU, Float64): ScanWeaver.selective_scan_pullback
# and the ChainRulesCore rrule against central differences along random
# directions, for scalar, complex and dense transitions, both directions,
# resets, h0, and absent x or c.

using ChainRulesCore: ChainRulesCore, NoTangent, Tangent, ZeroTangent

"`Re⟨p, q⟩` summed over an array: the pairing of a cotangent with a tangent."
pairing(P, Q) = real(sum(ScanWeaver.inner.(P, Q)))

"A random array like `A` (same size and element type; `nothing` for `nothing`)."
random_like(rng, ::Nothing) = nothing
random_like(rng, A::AbstractArray{T}) where {T <: Number} = randn(rng, T, size(A))
random_like(rng, A::AbstractArray{T}) where {T <: StaticArray} = [randn(rng, T) for _ in A]

"""
    check_pullback(rng; a, b, x, c, h0, reset, reverse, schedule)

Compares every cotangent `selective_scan_pullback` returns with the central
difference of `L = Re⟨W, y⟩ + Re⟨V, h_last⟩` along a random direction.
"""
function check_pullback(
    rng;
    a,
    b,
    x,
    c = nothing,
    h0 = nothing,
    reset = nothing,
    reverse = false,
    schedule = :auto,
)
    kw = (; reset, reverse, schedule)
    y, h_last = selective_scan(a, b, x, c; h0, return_state = true, kw...)
    W, V = random_like(rng, y), random_like(rng, h_last)
    loss(a, b, x, c, h0) = begin
        out, state = selective_scan(a, b, x, c; h0, return_state = true, kw...)
        pairing(W, out) + pairing(V, state)
    end
    d = ScanWeaver.selective_scan_pullback(W, V, a, b, x, c; h0, kw...)
    args = (; a, b, x, c, h0)
    for name in keys(args)
        A = args[name]
        A === nothing && (@test d[name] === nothing; continue)
        D = random_like(rng, A)
        step = 1.0e-6
        moved(s) = map(n -> n === name ? A .+ s .* D : args[n], keys(args))
        fd = (loss(moved(step)...) - loss(moved(-step)...)) / (2step)
        @test isapprox(pairing(d[name], D), fd; rtol = 1.0e-5, atol = 1.0e-8)
    end
    return nothing
end

@testset "gradients against central differences" begin
    rng = Xoshiro(21)
    L, lanes = 23, 3
    gate() = 0.5 .+ 0.45 .* rand(rng, L, lanes)
    for schedule in (:sequential, :blelloch, :hybrid, :reduce_then_scan), reverse in (
            false,
            true,
        )
        reset = rand(rng, L, lanes) .< 0.15
        check_pullback(
            rng;
            a = gate(),
            b = randn(rng, L, lanes),
            x = randn(rng, L, lanes),
            c = randn(rng, L, lanes),
            h0 = randn(rng, lanes),
            reset,
            reverse,
            schedule,
        )
    end
    check_pullback(
        rng;
        a = gate(),
        b = randn(rng, L, lanes),
        x = nothing,
        h0 = randn(rng, lanes),
    )
    check_pullback(
        rng;
        a = gate(),
        b = randn(rng, L, lanes),
        x = randn(rng, L, lanes),
        reverse = true,
    )
    check_pullback(
        rng;
        a = ComplexF64.(cis.(rand(rng, L, lanes)) .* 0.9),
        b = randn(rng, ComplexF64, L, lanes),
        x = randn(rng, ComplexF64, L, lanes),
        c = randn(rng, ComplexF64, L, lanes),
        h0 = randn(rng, ComplexF64, lanes),
        reset = rand(rng, L, lanes) .< 0.1,
    )
    dense_a = [SMatrix{2, 2}(0.45 .* rand(rng, 2, 2)) for _ in 1:L, _ in 1:lanes]
    dense_b = [SVector{2}(randn(rng, 2)) for _ in 1:L, _ in 1:lanes]
    for reverse in (false, true)
        check_pullback(
            rng;
            a = dense_a,
            b = dense_b,
            x = randn(rng, L, lanes),
            c = [SVector{2}(randn(rng, 2)) for _ in 1:L, _ in 1:lanes],
            h0 = [SVector{2}(randn(rng, 2)) for _ in 1:lanes],
            reset = rand(rng, L, lanes) .< 0.1,
            reverse,
        )
    end
    check_pullback(rng; a = dense_a, b = dense_b, x = randn(rng, L, lanes))
end

@testset "gradients of an empty scan (L = 0)" begin
    # The final state of an empty scan is h0, so dh0 = dh_last; `neighbours`
    # used to index the first step of a length-0 array (a BoundsError).
    a, b, x = zeros(0, 3), zeros(0, 3), zeros(0, 3)
    h0, V = [1.0, 2.0, 3.0], [0.5, -1.0, 2.0]
    d = ScanWeaver.selective_scan_pullback(zeros(0, 3), V, a, b, x; h0)
    @test d.h0 == V && size(d.a) == (0, 3) && size(d.x) == (0, 3) && d.c === nothing
    @test ScanWeaver.selective_scan_pullback(nothing, nothing, a, b, x; h0).h0 == zeros(3)
end

@testset "ChainRulesCore.rrule for selective_scan" begin
    rng = Xoshiro(22)
    L, lanes = 17, 2
    a = 0.5 .+ 0.4 .* rand(rng, L, lanes)
    b, x, c = (randn(rng, L, lanes) for _ in 1:3)
    h0 = randn(rng, lanes)
    reset = rand(rng, L, lanes) .< 0.2
    W, V = randn(rng, L, lanes), randn(rng, lanes)
    want = ScanWeaver.selective_scan_pullback(W, V, a, b, x, c; h0, reset)
    (y, h), pullback = ChainRulesCore.rrule(
        selective_scan,
        a,
        b,
        x,
        c,
        h0;
        reset,
        return_state = true,
    )
    @test (y, h) == selective_scan(a, b, x, c; h0, reset, return_state = true)
    tangents = pullback(Tangent{Tuple{typeof(y), typeof(h)}}(W, V))
    @test length(tangents) == 6 && tangents[1] === NoTangent()
    @test all(collect(tangents[2:6]) .≈ [want.a, want.b, want.x, want.c, want.h0])
    only_y = ScanWeaver.selective_scan_pullback(W, nothing, a, b, x, c; h0, reset)
    @test pullback((W, ZeroTangent()))[2] ≈ only_y.a
    y3, pullback3 = ChainRulesCore.rrule(selective_scan, a, b, nothing)
    @test y3 == selective_scan(a, b, nothing)
    tangents3 = pullback3(view(hcat(W, W), :, 1:lanes))
    @test length(tangents3) == 4 && tangents3[4] === NoTangent()
    @test tangents3[3] ≈ ScanWeaver.selective_scan_pullback(W, nothing, a, b, nothing).b
    a32 = Float32.(a)
    _, pullback32 = ChainRulesCore.rrule(selective_scan, a32, a32, a32)
    @test eltype(pullback32(ones(Float32, L, lanes))[2]) === Float32
    @test_throws ArgumentError selective_scan(a, b, x, c, h0; h0)
end

"""
    check_rrule(rng, f, args, loss; kwargs...)

Calls `ChainRulesCore.rrule(f, args...; return_state = true, kwargs...)`,
pulls back random cotangents `(W, V)` of the output and final state, and
compares each positional argument's tangent with the central difference of
`loss(args, W, V)` (a plain loop) along a random direction; `nothing`
arguments must get `NoTangent()`.
"""
function check_rrule(rng, f, args::NamedTuple, loss; kwargs...)
    (y, h), pullback = ChainRulesCore.rrule(
        f,
        values(args)...;
        return_state = true,
        kwargs...,
    )
    W, V = randn(rng, size(y)), randn(rng, size(h))
    tangents = pullback(Tangent{Tuple{typeof(y), typeof(h)}}(W, V))
    @test length(tangents) == length(args) + 1 && tangents[1] === NoTangent()
    for (i, name) in enumerate(keys(args))
        A = args[name]
        A === nothing && (@test tangents[i + 1] === NoTangent(); continue)
        D = randn(rng, size(A))
        moved(s) = merge(args, NamedTuple{(name,)}((A .+ s .* D,)))
        fd = (loss(moved(1.0e-6), W, V) - loss(moved(-1.0e-6), W, V)) / 2.0e-6
        @test isapprox(
            sum(tangents[i + 1] .* D),
            fd;
            rtol = 1.0e-6,
            atol = 1.0e-7 * max(1.0, abs(fd)),
        )
    end
    return y, h
end

@testset "ChainRulesCore.rrule for matrix_state_scan" begin
    rng = Xoshiro(23)
    nk, nv, H, Hq, L = 3, 4, 4, 2, 10
    for decay in (:none, :scalar, :key), bonus in (false, true)
        packed = decay === :scalar
        batch, cu_seqlens = packed ? (1, [0, 3, 3, L]) : (2, nothing)
        nseq = packed ? 3 : batch
        args = (
            q = randn(rng, nk, Hq, L, batch),
            k = randn(rng, nk, Hq, L, batch),
            v = randn(rng, nv, H, L, batch),
            g = decay === :none ?
                nothing :
                -rand(rng, (decay === :key ? (nk,) : ())..., H, L, batch),
            u = bonus ? randn(rng, nk, H) : nothing,
            h0 = randn(rng, nv, nk, H, nseq),
        )
        for reverse in (false, true)
            loss(a, W, V) = begin
                o, h = matrix_reference(a.q, a.k, a.v; a.g, a.u, a.h0, cu_seqlens, reverse)
                sum(W .* o) + sum(V .* h)
            end
            y, h = check_rrule(rng, matrix_state_scan, args, loss; cu_seqlens, reverse)
            @test (y, h) ==
                matrix_state_scan(values(args)...; cu_seqlens, reverse, return_state = true)
        end
    end
    q = randn(rng, nk, Hq, L, 1)
    v = randn(rng, nv, H, L, 1)
    o, pullback3 = ChainRulesCore.rrule(matrix_state_scan, q, q, v)
    tangents = pullback3(ones(size(o)))
    @test length(tangents) == 4 && size(tangents[4]) == size(v)
    want = matrix_state_backward(q, q, v, ones(size(o)))
    @test tangents[2] ≈ want.dq && tangents[4] ≈ want.dv
    q32, v32 = Float32.(q), Float32.(v)
    _, pullback32 = ChainRulesCore.rrule(matrix_state_scan, q32, q32, v32)
    @test eltype(pullback32(ones(Float32, size(v32)))[2]) === Float32
end

@testset "ChainRulesCore.rrule for mamba_selective_scan" begin
    rng = Xoshiro(24)
    L, channels, N = 19, 3, 4
    for (layout, packed) in ((:fixed, false), (:per_step, true), (:grouped, false))
        batch = packed ? 1 : 2
        cu_seqlens = packed ? [0, 6, L] : nothing
        shape = layout === :fixed ?
            (N, channels) :
            layout === :per_step ? (L, N, batch) : (L, N, 3, batch)
        args = (
            u = randn(rng, L, channels, batch),
            delta = randn(rng, L, channels, batch),
            A = -0.2 .- 2 .* rand(rng, N, channels),
            B = randn(rng, shape),
            C = randn(rng, shape),
            D = randn(rng, channels),
            z = randn(rng, L, channels, batch),
            delta_bias = 0.3 .* randn(rng, channels),
            h0 = randn(rng, N, channels, batch),
        )
        reset = packed ? seqlens_reset(cu_seqlens, L) : nothing
        loss(a, W, V) = begin
            y, h = mamba_reference(
                a.u,
                a.delta,
                a.A,
                a.B,
                a.C;
                a.D,
                a.z,
                a.delta_bias,
                delta_softplus = true,
                a.h0,
                reset,
            )
            sum(W .* y) + sum(V .* h)
        end
        check_rrule(
            rng,
            mamba_selective_scan,
            args,
            loss;
            delta_softplus = true,
            cu_seqlens,
            chunk = 5,
        )
    end
    u = randn(rng, L, channels, 1)
    A, B = -rand(rng, N, channels), randn(rng, L, N, 1)
    y, pullback5 = ChainRulesCore.rrule(mamba_selective_scan, u, abs.(u), A, B, B)
    tangents = pullback5(ones(size(y)))
    @test length(tangents) == 6 && size(tangents[4]) == size(A)
    want = mamba_selective_backward(ones(size(y)), u, abs.(u), A, B, B)
    @test tangents[4] ≈ want.dA && tangents[6] ≈ want.dC
end
