# The affine-pair algebra, independent of any backend.

@testset "affine pairs" begin
    rng = Xoshiro(3)
    pairs3 = [AffinePair(rand(rng) + 0.2, randn(rng)) for _ in 1:3]
    p1, p2, p3 = pairs3
    @test compose(p3, compose(p2, p1)) ≈ compose(compose(p3, p2), p1)
    @test p3 ∘ p2 ∘ p1 ≈ compose(p3, compose(p2, p1))
    @test compose(p2, p1) != compose(p1, p2)
    h = randn(rng)
    @test apply_pair(compose(p2, p1), h) ≈ apply_pair(p2, apply_pair(p1, h))
    e = identity_pair(AffinePair{Float64, Float64})
    @test compose(e, p1) == p1 && compose(p1, e) == p1
    M = [AffinePair(SMatrix{2, 2}(rand(rng, 2, 2)), SVector{2}(randn(rng, 2))) for _ in 1:3]
    @test compose(M[3], compose(M[2], M[1])) ≈ compose(compose(M[3], M[2]), M[1])
    @test compose(identity_pair(typeof(M[1])), M[1]) == M[1]
    @test accumulator_type(Float16) === Float32
    @test accumulator_type(Float64) === Float64
    @test accumulator_type(ComplexF16) === ComplexF32
    @test accumulator_type(SVector{3, Float16}) === SVector{3, Float32}
end

@testset "affine pairs: isequal and hash agree" begin
    p, q = AffinePair(1.0, 2.0), AffinePair(1, 2)
    @test p == q && isequal(p, q) && hash(p) == hash(q)
    @test length(Set([p, q, AffinePair(1.0f0, 2.0f0)])) == 1
    @test Dict(p => :found)[q] === :found
    z, nz = AffinePair(0.0, 1.0), AffinePair(-0.0, 1.0)
    @test z == nz && !isequal(z, nz)
    @test hash(AffinePair(0.5, 1.0)) != hash(AffinePair(1.0, 0.5))
    M = AffinePair(SMatrix{2, 2}(1.0, 2.0, 3.0, 4.0), SVector(1.0, 2.0))
    N = AffinePair(SMatrix{2, 2}(1, 2, 3, 4), SVector(1, 2))
    @test isequal(M, N) && hash(M) == hash(N)
end
