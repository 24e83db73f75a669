# Element types only the CPU runs here: BFloat16 needs BFloat16s.jl for its
# arithmetic, and GPU BFloat16 support differs per vendor.

using BFloat16s: BFloat16

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
