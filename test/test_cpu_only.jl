# What only the CPU runs here: BFloat16 needs BFloat16s.jl for its arithmetic
# (and GPU BFloat16 support differs per vendor), BitArray flags are host arrays,
# and the package-level checks need no device.

using BFloat16s: BFloat16
using Pkg: Pkg

@testset "BFloat16 accumulates in Float32 (CPU)" begin
    rng = Xoshiro(11)
    L, lanes = 200, 2
    a = BFloat16.(0.5 .+ 0.45 .* rand(rng, L, lanes))
    b, x = BFloat16.(randn(rng, L, lanes)), BFloat16.(randn(rng, L, lanes))
    want, _ = reference_scan(a, b, x, nothing)
    for schedule in keys(SCHEDULES)
        y = selective_scan(a, b, x; schedule, workgroupsize = 16)
        @test eltype(y) == BFloat16
        @test matches(y, want; rtol = 5.0e-2)
    end
end

@testset "BitMatrix reset flags (CPU)" begin
    rng = Xoshiro(12)
    L, lanes = 150, 3
    a, b, x, c = (rand(rng, Float64, L, lanes) for _ in 1:4)
    reset = rand(rng, L, lanes) .< 0.1
    @test reset isa BitMatrix
    want, want_h = reference_scan(a, b, x, c; reset)
    for (schedule, tunables) in pairs(SMALL_CONFIGS)
        y, h = selective_scan(a, b, x, c; reset, schedule, return_state = true, tunables...)
        @test matches(y, want; rtol = 1.0e-10) && matches(h, want_h; rtol = 1.0e-10)
    end
end

@testset "mutable StaticArrays are refused by name (CPU)" begin
    # `MMatrix`/`MVector` pass for StaticArrays but `accumulator_type` (and
    # device arrays, `@localmem`) need the immutable `SArray`: without the
    # check this was a MethodError from inside the scan.
    L, lanes = 8, 2
    dense_a = [SMatrix{2, 2}(0.5, 0.0, 0.0, 0.5) for _ in 1:L, _ in 1:lanes]
    dense_b = [SVector(1.0, 2.0) for _ in 1:L, _ in 1:lanes]
    x = ones(L, lanes)
    for (a, b, culprit) in (
            (MMatrix.(dense_a), dense_b, "a"),
            (dense_a, MVector.(dense_b), "b"),
        )
        err = try
            selective_scan(a, b, x)
        catch e
            e
        end
        @test err isa ArgumentError &&
            occursin("$culprit has element type", err.msg) &&
            occursin("SArray", err.msg)
    end
    @test selective_scan(dense_a, dense_b, x) isa Matrix{SVector{2, Float64}}
end

@testset "no method ambiguities, no unbound type parameters" begin
    @test isempty(Test.detect_ambiguities(ScanWeaver; recursive = true))
    @test isempty(Test.detect_unbound_args(ScanWeaver; recursive = true))
end

@testset "[compat] admits today's GPU packages" begin
    project = TOML.parsefile(joinpath(dirname(@__DIR__), "Project.toml"))
    admits(pkg, v) = v in Pkg.Versions.semver_spec(project["compat"][pkg])
    @test admits("CUDA", v"5.11.3") && admits("CUDA", v"6.3.0")
    @test admits("AMDGPU", v"1.3.6") && admits("AMDGPU", v"2.8.0")
    @test admits("Metal", v"1.10.3") && admits("oneAPI", v"2.9.1")
    @test admits("KernelAbstractions", v"0.9.41")
    @test !admits("KernelAbstractions", v"0.9.0")
    @test pkgversion(KernelAbstractions) >= v"0.9.1"
end
