# The suite every backend runs. `AT` is the backend's array type (`Array`,
# `CuArray`, `ROCArray`, `oneArray`, `MtlArray`).

"Relative tolerance for results stored in `T` (expected values are float64)."
tolerance(::Type{Float64}) = 1.0e-10
tolerance(::Type{Float32}) = 2.0e-4
tolerance(::Type{Float16}) = 1.0e-2

"Small tunables: blocks, tiles and chunks shorter than the golden sequences, so carries cross them."
const SMALL_CONFIGS = (
    sequential = (workgroupsize = 4,),
    blelloch = (workgroupsize = 32,),
    hybrid = (workgroupsize = 16, items_per_thread = 3),
    reduce_then_scan = (workgroupsize = 32, chunk = 64),
)

"""
    golden_tolerance(g::GoldenCase, T) -> (rtol, atol)

The file's own tolerances when the backend computes in the file's element
type; else, and for files that state none, [`tolerance`](@ref)`(T)` with an
absolute floor scaled to the data.
"""
function golden_tolerance(g::GoldenCase, T)
    scale = max(1.0, maximum(abs, g.y))
    if T != g.eltype
        return tolerance(T), tolerance(T) * scale
    end
    rtol = something(g.rtol, tolerance(T))
    return rtol, something(g.atol, rtol * scale)
end

"The element type a backend computes `T` in: `Float64` becomes `Float32` on devices without it."
function device_eltype(backend, ::Type{T}) where {T}
    return T === Float64 && !ScanWeaver.supports_float64(backend) ? Float32 : T
end

with_eltype(::Type{T}, v::Number) where {T} = T(v)
with_eltype(::Type{T}, v::StaticArray) where {T} = T.(v)

"Results on the host as `Float64` numbers: a vector state adds a leading dimension of size `K`."
host64(A::AbstractArray{<:Number}) = Float64.(Array(A))
function host64(A::AbstractArray{<:StaticVector})
    return Float64.(reinterpret(reshape, eltype(eltype(A)), Array(A)))
end

"Elementwise `isapprox`, as the golden files state their tolerances."
function close_to(got, want; rtol, atol)
    return size(got) == size(want) && all(isapprox.(got, want; rtol, atol))
end

function check_golden(AT, backend, g::GoldenCase)
    T = device_eltype(backend, g.eltype)
    dev(::Nothing) = nothing
    dev(A::AbstractArray{Bool}) = AT(A)
    dev(A) = AT(with_eltype.(T, A))
    a, b, x, c, h0, reset = dev(g.a), dev(g.b), dev(g.x), dev(g.c), dev(g.h0), dev(g.reset)
    rtol, atol = golden_tolerance(g, T)
    runs = [
        (:auto, (;))
        [(s, (;)) for s in keys(SCHEDULES)]
        collect(pairs(SMALL_CONFIGS))
    ]
    for (schedule, tunables) in runs
        y, h_last = selective_scan(
            a,
            b,
            x,
            c;
            h0,
            reset,
            reverse = g.reverse,
            return_state = true,
            schedule,
            tunables...,
        )
        @test eltype(y) == T
        @test close_to(host64(y), g.y; rtol, atol)
        @test close_to(host64(h_last), g.h_last; rtol, atol)
    end
    return nothing
end

"Test-suite backend name => the device name the Python facade uses."
const DEVICE_NAMES = Dict(
    "CPU" => "cpu",
    "CUDA" => "cuda",
    "AMDGPU" => "amdgpu",
    "oneAPI" => "oneapi",
    "Metal" => "metal",
)

"The 2 x 2 identity, as a tuple for `SMatrix`."
const I2 = (1, 0, 0, 1)

function run_testsuite(name::AbstractString, AT)
    backend = get_backend(AT(zeros(Float32, 1)))
    rng = Xoshiro(7)
    @testset "$name" begin
        @testset "golden $(g.name)" for g in golden_cases()
            check_golden(AT, backend, g)
        end

        @testset "Float16 accumulates in Float32" begin
            L, lanes = 301, 3
            a = Float16.(0.5 .+ 0.45 .* rand(rng, L, lanes))
            b, x = Float16.(randn(rng, L, lanes)), Float16.(randn(rng, L, lanes))
            want, want_h = reference_scan(a, b, x, nothing)
            for schedule in keys(SCHEDULES)
                y, h = selective_scan(
                    AT(a),
                    AT(b),
                    AT(x);
                    schedule,
                    return_state = true,
                    workgroupsize = 32,
                )
                @test eltype(y) == Float16
                @test matches(y, want; rtol = tolerance(Float16))
                @test matches(h, want_h; rtol = tolerance(Float16))
            end
        end

        @testset "ComplexF32" begin
            L, lanes = 77, 4
            a = ComplexF32.(cis.(rand(rng, L, lanes)) .* 0.9f0)
            b, x, c = (ComplexF32.(randn(rng, ComplexF64, L, lanes)) for _ in 1:3)
            reset = rand(rng, L, lanes) .< 0.1
            want, _ = reference_scan(a, b, x, c; reset, reverse = true)
            for schedule in keys(SCHEDULES)
                y = selective_scan(
                    AT(a),
                    AT(b),
                    AT(x),
                    AT(c);
                    reset = AT(reset),
                    reverse = true,
                    schedule,
                )
                @test eltype(y) == ComplexF32
                @test matches(y, want; rtol = 1.0e-4)
            end
        end

        @testset "dense 2x2 transitions (StaticArrays)" begin
            L, lanes = 65, 3
            a = [SMatrix{2, 2, Float32}(0.6 .* rand(rng, 2, 2)) for _ in 1:L, _ in 1:lanes]
            b = [SVector{2, Float32}(randn(rng, 2)) for _ in 1:L, _ in 1:lanes]
            x = randn(rng, Float32, L, lanes)
            c = [SVector{2, Float32}(randn(rng, 2)) for _ in 1:L, _ in 1:lanes]
            h0 = [SVector{2, Float32}(randn(rng, 2)) for _ in 1:lanes]
            want, want_h = reference_scan(a, b, x, c; h0)
            for schedule in keys(SCHEDULES)
                y, h = selective_scan(
                    AT(a),
                    AT(b),
                    AT(x),
                    AT(c);
                    h0 = AT(h0),
                    schedule,
                    return_state = true,
                    workgroupsize = 16,
                )
                @test eltype(y) == Float32 && eltype(h) == SVector{2, Float32}
                @test matches(y, want; rtol = 1.0e-4)
                @test matches(h, want_h; rtol = 1.0e-4)
            end
        end

        @testset "x = nothing, in place, L = 0" begin
            a, b = AT(rand(rng, Float32, 40, 2)), AT(randn(rng, Float32, 40, 2))
            want, _ = reference_scan(Array(a), Array(b), nothing, nothing)
            y = similar(a)
            @test selective_scan!(y, a, b, nothing; schedule = :hybrid) === y
            @test matches(y, want; rtol = 1.0e-4)
            h0 = AT(Float32[1, 2])
            y0, h = selective_scan(
                AT(zeros(Float32, 0, 2)),
                AT(zeros(Float32, 0, 2)),
                nothing;
                h0,
                return_state = true,
            )
            @test size(y0) == (0, 2) && Array(h) == Float32[1, 2]
        end

        @testset "kernels launched the way Kernel Tuner does" begin
            L, lanes = 130, 5
            a, b, x, c = (rand(rng, Float32, L, lanes) for _ in 1:4)
            want, want_h = reference_scan(a, b, x, c)
            launches = (
                (ScanWeaver.sequential_scan!, (Val(4),), 8),
                (ScanWeaver.blelloch_scan!, (Val(16),), 16 * lanes),
                (ScanWeaver.hybrid_scan!, (Val(8), Val(5)), 8 * lanes),
                (ScanWeaver.reduce_then_scan!, (Val(8), Val(32)), lanes),
            )
            for (kernel, vals, ndrange) in launches
                y, h = AT(zeros(Float32, L, lanes)), AT(zeros(Float32, lanes))
                wg = typeof(first(vals)).parameters[1]
                kernel(backend, (wg,))(
                    y,
                    h,
                    AT(a),
                    AT(b),
                    AT(x),
                    AT(c),
                    nothing,
                    nothing,
                    false,
                    vals...;
                    ndrange = (ndrange,),
                )
                KernelAbstractions.synchronize(backend)
                @test matches(y, want; rtol = 1.0e-4)
                @test matches(h, want_h; rtol = 1.0e-4)
            end
            # Kernel Tuner launches every configuration of its search space: the
            # launchers refuse the ones the schedule cannot run (a :blelloch tree
            # of 48 work-items would scan wrongly, silently) instead of launching.
            y, h = AT(zeros(Float32, L, lanes)), AT(zeros(Float32, lanes))
            operands = (y, h, AT(a), AT(b), AT(x), AT(c), nothing, nothing, false)
            err = try
                ScanWeaver.blelloch_scan!(backend, (48,))(
                    operands...,
                    Val(48);
                    ndrange = (48 * lanes,),
                )
            catch e
                e
            end
            @test err isa ArgumentError &&
                occursin("Blelloch launcher", err.msg) &&
                occursin("power of two", err.msg)
            @test_throws ArgumentError ScanWeaver.hybrid_scan!(backend, 8)(
                operands...,
                Val(8),
                Val(0),
            )
            big = ScanWeaver.max_workgroupsize(backend) + 1
            @test_throws ArgumentError ScanWeaver.sequential_scan!(backend, big)(
                operands...,
                Val(big),
            )
            u, A = AT(rand(rng, Float32, 10, 3, 1)), AT(-rand(rng, Float32, 4, 3))
            BC = AT(rand(rng, Float32, 10, 4, 1))
            mamba_args = (similar(u), nothing, u, u, A, BC, BC)
            unset = (nothing, nothing, nothing, nothing, nothing, false)
            err = try
                ScanWeaver.mamba_scan!(backend, 8)(mamba_args..., unset..., Val(8), Val(0))
            catch e
                e
            end
            @test err isa ArgumentError &&
                occursin("mamba_scan!", err.msg) &&
                occursin("chunk = 0", err.msg)
        end

        @testset "bad input names the argument and its size" begin
            a = AT(rand(Float32, 10, 3))
            err = try
                selective_scan(a, AT(rand(Float32, 9, 3)), a)
            catch e
                e
            end
            @test err isa DimensionMismatch &&
                occursin("b has size (9, 3)", err.msg) &&
                occursin("(10, 3)", err.msg)
            @test_throws DimensionMismatch selective_scan(
                a,
                a,
                a;
                h0 = AT(zeros(Float32, 4)),
            )
            @test_throws ArgumentError selective_scan(a, a, a; schedule = :fastest)
            @test_throws ArgumentError selective_scan(
                a,
                a,
                a;
                schedule = :blelloch,
                workgroupsize = 48,
            )
            @test_throws ArgumentError selective_scan(
                a,
                a,
                a;
                schedule = :hybrid,
                items_per_thread = 0,
            )
            @test_throws ArgumentError selective_scan(
                AT(ones(Int32, 4)),
                AT(ones(Int32, 4)),
                AT(ones(Int32, 4)),
            )
        end

        @testset "timing and tuning" begin
            a = AT(rand(rng, Float32, 512, 8))
            @test ScanWeaver.elapsed_ms(() -> selective_scan(a, a, a), backend) > 0
            times = time_scan(
                a,
                a,
                a;
                iterations = 3,
                schedule = :hybrid,
                workgroupsize = 32,
            )
            @test length(times) == 3 && all(>(0), times)
            space = ScanWeaver.search_space(;
                workgroupsize = (32,),
                items_per_thread = (2,),
                chunk = (128,),
            )
            results = tune_scan(a, a, a; space, iterations = 2)
            @test length(results) == length(SCHEDULES) &&
                issorted(results; by = r -> r.time_ms)
            err = try
                time_scan(a, a, a; iterations = 0)
            catch e
                e
            end
            @test err isa ArgumentError && occursin("time_scan: iterations = 0", err.msg)
            @test_throws ArgumentError tune_scan(a, a, a; space, iterations = 0)
        end

        @testset "local memory within the device's budget" begin
            T = device_eltype(backend, Float64)
            P3 = AffinePair{SMatrix{3, 3, T, 9}, SVector{3, T}}
            S3 = SVector{3, T}
            budget = ScanWeaver.local_memory_budget(backend)
            for Sched in SCHEDULES
                s = ScanWeaver.make_schedule(Sched, backend, P3, S3)
                @test ScanWeaver.local_memory(s, P3, S3) <= budget
                @test ScanWeaver.config_problem(s, backend, P3, S3) === nothing
            end
            @test ScanWeaver.make_schedule(Blelloch, backend, P3, S3).workgroupsize <
                ScanWeaver.DEFAULT_WORKGROUP_SIZE ||
                T === Float32
            L, lanes = 70, 2
            a = [SMatrix{3, 3, T}(0.3 .* rand(rng, 3, 3)) for _ in 1:L, _ in 1:lanes]
            b = [SVector{3, T}(randn(rng, 3)) for _ in 1:L, _ in 1:lanes]
            x = randn(rng, T, L, lanes)
            want, _ = reference_scan(a, b, x, nothing)
            for schedule in keys(SCHEDULES)
                y = selective_scan(AT(a), AT(b), AT(x); schedule)
                @test matches(y, want; rtol = tolerance(T))
            end
            big = 2 * ScanWeaver.default_workgroupsize(Blelloch(256), backend, P3, S3)
            if big <= ScanWeaver.max_workgroupsize(backend)
                err = try
                    selective_scan(
                        AT(a),
                        AT(b),
                        AT(x);
                        schedule = :blelloch,
                        workgroupsize = big,
                    )
                catch e
                    e
                end
                @test err isa ArgumentError &&
                    occursin("bytes of local memory", err.msg) &&
                    occursin("workgroupsize <= $(big ÷ 2)", err.msg)
            end
            space = ScanWeaver.search_space(; workgroupsize = (64, 1024), chunk = (64,))
            results = tune_scan(AT(a), AT(b), AT(x); space, iterations = 1)
            @test all(
                r -> ScanWeaver.config_problem(r.schedule, backend, P3, S3) === nothing,
                results,
            )
            @test Blelloch(64) in [r.schedule for r in results]
            @test Blelloch(1024) in space &&
                !(Blelloch(1024) in [r.schedule for r in results])
        end

        @testset "workgroup limit, operand kinds, device dtypes" begin
            a = AT(rand(rng, Float32, 50, 2))
            too_big = ScanWeaver.max_workgroupsize(backend) + 1
            err = try
                selective_scan(a, a, a; schedule = :hybrid, workgroupsize = too_big)
            catch e
                e
            end
            @test err isa ArgumentError && occursin("exceeds", err.msg)
            dense_b = AT([SVector{2, Float32}(1, 2) for _ in 1:50, _ in 1:2])
            err = try
                selective_scan(a, dense_b, a)
            catch e
                e
            end
            @test err isa ArgumentError &&
                occursin("b has element type", err.msg) &&
                occursin("scalar", err.msg)
            dense_a = AT([SMatrix{2, 2, Float32}(I2) for _ in 1:50, _ in 1:2])
            for (b, x, c, culprit) in (
                    (a, a, nothing, "b"),
                    (dense_b, a, a, "c"),
                    (
                        AT([SVector{3, Float32}(1, 2, 3) for _ in 1:50, _ in 1:2]),
                        a,
                        nothing,
                        "b",
                    ),
                    (dense_b, dense_b, nothing, "x"),
                )
                err = try
                    selective_scan(dense_a, b, x, c)
                catch e
                    e
                end
                @test err isa ArgumentError &&
                    occursin("$culprit has element type", err.msg)
            end
            dtypes = ScanWeaver.device_dtypes(DEVICE_NAMES[name])
            @test ("float64" in dtypes) == ScanWeaver.supports_float64(backend)
            @test "float32" in dtypes && "complex64" in dtypes
        end

        @testset "schedules as types" begin
            L, lanes = 90, 3
            a, b, x, c = (rand(rng, Float32, L, lanes) for _ in 1:4)
            want, _ = reference_scan(a, b, x, c)
            for (name, Sched) in pairs(SCHEDULES)
                @test first(fieldnames(Sched)) === :workgroupsize
                s = Sched(16, ntuple(_ -> 7, fieldcount(Sched) - 1)...)
                @test ScanWeaver.schedule_name(s) === name
                y = selective_scan(AT(a), AT(b), AT(x), AT(c); schedule = s)
                @test matches(y, want; rtol = 1.0e-4)
            end
            @test_throws ArgumentError selective_scan(
                AT(a),
                AT(b),
                AT(x);
                schedule = Hybrid(16, 2),
                workgroupsize = 32,
            )
            @test_throws ArgumentError selective_scan(
                AT(a),
                AT(b),
                AT(x);
                schedule = Blelloch(48),
            )
            ops = ScanWeaver.ScanOperands(AT(a), AT(b), nothing, AT(c), nothing, nothing)
            host = Adapt.adapt(Array, ops)
            @test host isa ScanWeaver.ScanOperands && host.a isa Array && host.x === nothing
            @test Array(host.c) == c
            launch! = ScanWeaver.hybrid_scan!(backend, 16)
            y = AT(zeros(Float32, L, lanes))
            @test_throws ArgumentError launch!(
                y,
                nothing,
                AT(a),
                AT(b),
                AT(x),
                AT(c),
                nothing,
                nothing,
                false,
                Val(32),
                Val(2),
            )
        end

        @testset "gradients match the CPU's" begin
            T = device_eltype(backend, Float64)
            L, lanes = 40, 3
            a = T.(0.5 .+ 0.4 .* rand(rng, L, lanes))
            b, x, c, W = (randn(rng, T, L, lanes) for _ in 1:4)
            h0, V = randn(rng, T, lanes), randn(rng, T, lanes)
            reset = rand(rng, L, lanes) .< 0.1
            want = ScanWeaver.selective_scan_pullback(W, V, a, b, x, c; h0, reset)
            for schedule in keys(SCHEDULES)
                got = ScanWeaver.selective_scan_pullback(
                    AT(W),
                    AT(V),
                    AT(a),
                    AT(b),
                    AT(x),
                    AT(c);
                    h0 = AT(h0),
                    reset = AT(reset),
                    schedule,
                    workgroupsize = 16,
                )
                for name in keys(want)
                    @test matches(got[name], widen64.(want[name]); rtol = tolerance(T))
                end
            end
        end

        @testset "fused Mamba, golden $(g.name)" for g in mamba_golden_cases()
            T = device_eltype(backend, g.eltype)
            dev(::Nothing) = nothing
            dev(A) = AT(T.(A))
            scale = max(1.0, maximum(abs, g.y))
            rtol = T == g.eltype ? tolerance(T) : 2 * tolerance(T)
            for tunables in (
                    (;),
                    (workgroupsize = 4, chunk = 8),
                    (workgroupsize = 32, chunk = 1),
                )
                y, h = mamba_selective_scan(
                    dev(g.u),
                    dev(g.delta),
                    dev(g.A),
                    dev(g.B),
                    dev(g.C);
                    D = dev(g.D),
                    z = dev(g.z),
                    delta_bias = dev(g.delta_bias),
                    delta_softplus = g.delta_softplus,
                    h0 = dev(g.h0),
                    g.cu_seqlens,
                    return_state = true,
                    tunables...,
                )
                @test eltype(y) == T && size(h) == size(g.h_last)
                @test close_to(host64(y), g.y; rtol, atol = rtol * scale)
                @test close_to(host64(h), g.h_last; rtol, atol = rtol * scale)
                d = mamba_selective_backward(
                    dev(g.dout),
                    dev(g.u),
                    dev(g.delta),
                    dev(g.A),
                    dev(g.B),
                    dev(g.C);
                    D = dev(g.D),
                    z = dev(g.z),
                    delta_bias = dev(g.delta_bias),
                    delta_softplus = g.delta_softplus,
                    h0 = dev(g.h0),
                    dh_last = dev(g.dh_last),
                    g.cu_seqlens,
                    tunables...,
                )
                for (name, want) in g.grads
                    gscale = max(1.0, maximum(abs, want))
                    @test close_to(
                        host64(getfield(d, name)),
                        want;
                        rtol = 4 * rtol,
                        atol = 4 * rtol * gscale,
                    )
                end
            end
        end

        @testset "fused Mamba: N, B/C layouts, chunks against a loop" begin
            T = device_eltype(backend, Float64)
            L, channels, batch = 37, 4, 2
            for N in (1, 4, 16, 64), layout in (:fixed, :per_step, :grouped)
                shape = layout === :fixed ?
                    (N, channels) :
                    layout === :per_step ? (L, N, batch) : (L, N, 2, batch)
                u, z = randn(rng, T, L, channels, batch), randn(rng, T, L, channels, batch)
                delta = T.(0.05 .+ 0.5 .* rand(rng, L, channels, batch))
                A = T.(-0.2 .- 2 .* rand(rng, N, channels))
                B, C = randn(rng, T, shape), randn(rng, T, shape)
                D, h0 = randn(rng, T, channels), randn(rng, T, N, channels, batch)
                want, want_h = mamba_reference(u, delta, A, B, C; D, z, h0)
                for chunk in (5, 37)
                    y, h = mamba_selective_scan(
                        AT(u),
                        AT(delta),
                        AT(A),
                        AT(B),
                        AT(C);
                        D = AT(D),
                        z = AT(z),
                        h0 = AT(h0),
                        return_state = true,
                        chunk,
                        workgroupsize = 8,
                    )
                    @test matches(y, want; rtol = tolerance(T))
                    @test matches(h, want_h; rtol = tolerance(T))
                end
            end
        end

        @testset "fused Mamba: bad input names the argument" begin
            u = AT(rand(Float32, 10, 3, 1))
            A, B = AT(-rand(Float32, 4, 3)), AT(rand(Float32, 10, 4, 1))
            err = try
                mamba_selective_scan(u, u, A, AT(rand(Float32, 9, 4, 1)), B)
            catch e
                e
            end
            @test err isa DimensionMismatch && occursin("B has size (9, 4, 1)", err.msg)
            @test_throws DimensionMismatch mamba_selective_scan(
                u,
                u,
                AT(rand(Float32, 4, 2)),
                B,
                B,
            )
            @test_throws DimensionMismatch mamba_selective_scan(
                u,
                u,
                A,
                B,
                AT(rand(Float32, 10, 4, 2, 1)),
            )
            @test_throws ArgumentError mamba_selective_scan(
                u,
                u,
                A,
                B,
                B;
                cu_seqlens = [0, 4, 9],
            )
            @test_throws ArgumentError mamba_selective_scan(u, u, A, B, B; chunk = 0)
        end

        @testset "matrix-state scan: decays, readouts, groups, packing against a loop" begin
            T = device_eltype(backend, Float64)
            nk, nv, H, Hq, L = 5, 7, 4, 2, 11
            dev(::Nothing) = nothing
            dev(A) = AT(A)
            for decay in (:none, :scalar, :key), bonus in (false, true), reverse in (
                    false,
                    true,
                )
                packed = decay !== :scalar
                batch = packed ? 1 : 2
                cu_seqlens = packed ? [0, 3, 3, 8, L] : nothing
                nseq = packed ? 4 : batch
                q, k = randn(rng, T, nk, Hq, L, batch), randn(rng, T, nk, Hq, L, batch)
                v = randn(rng, T, nv, H, L, batch)
                g = decay === :none ?
                    nothing :
                    T.(-2 .* rand(rng, (decay === :key ? (nk,) : ())..., H, L, batch))
                u = bonus ? randn(rng, T, nk, H) : nothing
                h0 = randn(rng, T, nv, nk, H, nseq)
                want, want_h = matrix_reference(q, k, v; g, u, h0, cu_seqlens, reverse)
                for workgroupsize in (nothing, 3)
                    o, h = matrix_state_scan(
                        AT(q),
                        AT(k),
                        AT(v);
                        g = dev(g),
                        u = dev(u),
                        h0 = AT(h0),
                        cu_seqlens,
                        reverse,
                        workgroupsize,
                        return_state = true,
                    )
                    @test matches(o, want; rtol = tolerance(T))
                    @test matches(h, want_h; rtol = tolerance(T))
                end
            end
            q = AT(rand(Float32, 4, 3, 6, 1))
            v = AT(rand(Float32, 5, 4, 6, 1))
            err = try
                matrix_state_scan(q, q, v)
            catch e
                e
            end
            @test err isa DimensionMismatch && occursin("q has 3 heads", err.msg)
            q2 = AT(rand(Float32, 4, 2, 6, 1))
            @test_throws DimensionMismatch matrix_state_scan(
                q2,
                q2,
                v;
                g = AT(rand(Float32, 4, 5, 1)),
            )
            @test_throws ArgumentError matrix_state_scan(q2, q2, v; cu_seqlens = [0, 2, 9])
            @test_throws ArgumentError matrix_state_scan(q2, q2, v; workgroupsize = 0)
        end

        @testset "delta rule: gates, forms, l2norm, groups, packing against a loop" begin
            T = device_eltype(backend, Float64)
            nk, nv, H, Hq, L = 5, 7, 4, 2, 13
            dev(::Nothing) = nothing
            dev(A) = AT(A)
            for gate in (:none, :scalar, :key), form in (:delta, :dplr), l2norm in (
                    false,
                    true,
                )
                packed = gate !== :scalar
                batch = packed ? 1 : 2
                cu_seqlens = packed ? [0, 1, 1, 9, L] : nothing
                nseq = packed ? 4 : batch
                q, k = randn(rng, T, nk, Hq, L, batch), randn(rng, T, nk, Hq, L, batch)
                l2norm || (k ./= sqrt(T(nk)))
                v = randn(rng, T, nv, H, L, batch)
                g = gate === :none ?
                    nothing :
                    T.(-2 .* rand(rng, (gate === :key ? (nk,) : ())..., H, L, batch))
                beta = form === :delta ? rand(rng, T, H, L, batch) : nothing
                a = form === :dplr ? T(0.3) .* randn(rng, T, nk, H, L, batch) : nothing
                b = form === :dplr ? T(0.3) .* randn(rng, T, nk, H, L, batch) : nothing
                h0 = randn(rng, T, nv, nk, H, nseq)
                want, want_h = delta_reference(
                    q,
                    k,
                    v;
                    beta,
                    a,
                    b,
                    g,
                    l2norm,
                    h0,
                    cu_seqlens,
                )
                for workgroupsize in (nothing, 3)
                    o, h = delta_rule_scan(
                        AT(q),
                        AT(k),
                        AT(v);
                        beta = dev(beta),
                        a = dev(a),
                        b = dev(b),
                        g = dev(g),
                        l2norm,
                        h0 = AT(h0),
                        cu_seqlens,
                        workgroupsize,
                        return_state = true,
                    )
                    @test matches(o, want; rtol = tolerance(T))
                    @test matches(h, want_h; rtol = tolerance(T))
                end
            end
            q = AT(rand(Float32, 4, 2, 6, 1))
            v = AT(rand(Float32, 5, 4, 6, 1))
            beta = AT(rand(Float32, 4, 6, 1))
            err = try
                delta_rule_scan(q, q, v)
            catch e
                e
            end
            @test err isa ArgumentError && occursin("give beta", err.msg)
            @test_throws ArgumentError delta_rule_scan(
                q,
                q,
                v;
                beta,
                a = AT(rand(Float32, 4, 4, 6, 1)),
            )
            @test_throws DimensionMismatch delta_rule_scan(
                q,
                q,
                v;
                beta = AT(rand(Float32, 4, 5, 1)),
            )
            @test_throws DimensionMismatch delta_rule_scan(
                q,
                q,
                v;
                a = AT(rand(Float32, 3, 4, 6, 1)),
                b = AT(rand(Float32, 3, 4, 6, 1)),
            )
            @test_throws ArgumentError delta_rule_scan(
                q,
                q,
                v;
                beta,
                cu_seqlens = [0, 2, 9],
            )
        end

        @testset "matrix-state backward against central differences of the loop" begin
            T = device_eltype(backend, Float64)
            nk, nv, H, Hq, L = 3, 4, 4, 2, 9
            dev(::Nothing) = nothing
            dev(A) = AT(T.(A))
            for decay in (:none, :scalar, :key), bonus in (false, true), reverse in (
                    false,
                    true,
                )
                packed = decay === :key
                batch = packed ? 1 : 2
                cu_seqlens = packed ? [0, 4, 4, L] : nothing
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
                W, Vh = randn(rng, nv, H, L, batch), randn(rng, nv, nk, H, nseq)
                loss(a) = begin
                    o, h = matrix_reference(
                        a.q,
                        a.k,
                        a.v;
                        a.g,
                        a.u,
                        a.h0,
                        cu_seqlens,
                        reverse,
                    )
                    sum(W .* o) + sum(Vh .* h)
                end
                d = matrix_state_backward(
                    dev(args.q),
                    dev(args.k),
                    dev(args.v),
                    dev(W);
                    g = dev(args.g),
                    u = dev(args.u),
                    h0 = dev(args.h0),
                    dhlast = dev(Vh),
                    cu_seqlens,
                    reverse,
                    workgroupsize = 2,
                )
                for name in keys(args)
                    A = args[name]
                    grad = getfield(d, Symbol(:d, name))
                    A === nothing && (@test grad === nothing; continue)
                    D = randn(rng, size(A))
                    moved(s) = merge(args, NamedTuple{(name,)}((A .+ s .* D,)))
                    fd = (loss(moved(1.0e-6)) - loss(moved(-1.0e-6))) / 2.0e-6
                    @test isapprox(
                        sum(Float64.(Array(grad)) .* D),
                        fd;
                        rtol = 100 * tolerance(T),
                        atol = 1.0e-6,
                    )
                end
            end
        end

        @testset "matrix-state golden $(g.name), forward and backward" for g in matrix_golden_cases()
            T = device_eltype(backend, g.eltype)
            dev(::Nothing) = nothing
            dev(A) = AT(T.(A))
            rtol = T == g.eltype ? tolerance(T) : 2 * tolerance(T)
            for workgroupsize in (nothing, 2)
                o, h = matrix_state_scan(
                    dev(g.q),
                    dev(g.k),
                    dev(g.v);
                    g = dev(g.g),
                    decay = g.decay,
                    u = dev(g.u),
                    h0 = dev(g.h0),
                    g.cu_seqlens,
                    g.reverse,
                    return_state = true,
                    workgroupsize,
                )
                scale = max(1.0, maximum(abs, g.o))
                @test close_to(host64(o), g.o; rtol, atol = rtol * scale)
                @test close_to(host64(h), g.h_last; rtol, atol = rtol * scale)
                d = matrix_state_backward(
                    dev(g.q),
                    dev(g.k),
                    dev(g.v),
                    dev(g.dout);
                    g = dev(g.g),
                    decay = g.decay,
                    u = dev(g.u),
                    h0 = dev(g.h0),
                    dhlast = dev(g.dh_last),
                    g.cu_seqlens,
                    g.reverse,
                    workgroupsize,
                )
                for name in (:dq, :dk, :dv, :dg, :du, :dh0)
                    got = getfield(d, name)
                    haskey(g.grads, name) || (@test got === nothing; continue)
                    want = g.grads[name]
                    gscale = max(1.0, maximum(abs, want))
                    @test close_to(
                        host64(got),
                        want;
                        rtol = 4 * rtol,
                        atol = 4 * rtol * gscale,
                    )
                end
            end
        end

        @testset "fused Mamba backward against central differences of the loop" begin
            T = device_eltype(backend, Float64)
            L, channels, batch = 23, 4, 2
            for (layout, N, options) in (
                    (
                        :fixed,
                        3,
                        (
                            D = true,
                            z = true,
                            bias = true,
                            softplus = true,
                            h0 = true,
                            packed = false,
                        ),
                    ),
                    (
                        :per_step,
                        1,
                        (
                            D = false,
                            z = false,
                            bias = false,
                            softplus = false,
                            h0 = false,
                            packed = false,
                        ),
                    ),
                    (
                        :grouped,
                        4,
                        (
                            D = true,
                            z = true,
                            bias = false,
                            softplus = true,
                            h0 = true,
                            packed = true,
                        ),
                    ),
                    (
                        :per_step,
                        16,
                        (
                            D = true,
                            z = false,
                            bias = true,
                            softplus = false,
                            h0 = true,
                            packed = true,
                        ),
                    ),
                )
                nb = options.packed ? 1 : batch
                cu_seqlens = options.packed ? [0, 7, 8, L] : nothing
                shape = layout === :fixed ?
                    (N, channels) :
                    layout === :per_step ? (L, N, nb) : (L, N, 2, nb)
                args = (
                    u = randn(rng, L, channels, nb),
                    delta = options.softplus ?
                        randn(rng, L, channels, nb) :
                        0.05 .+ 0.5 .* rand(rng, L, channels, nb),
                    A = -0.2 .- 2 .* rand(rng, N, channels),
                    B = randn(rng, shape),
                    C = randn(rng, shape),
                    D = options.D ? randn(rng, channels) : nothing,
                    z = options.z ? randn(rng, L, channels, nb) : nothing,
                    delta_bias = options.bias ? 0.3 .* randn(rng, channels) : nothing,
                    h0 = options.h0 ? randn(rng, N, channels, nb) : nothing,
                )
                reset = cu_seqlens === nothing ? nothing : seqlens_reset(cu_seqlens, L)
                W, Vh = randn(rng, L, channels, nb), randn(rng, N, channels, nb)
                loss(a) = begin
                    y, h = mamba_reference(
                        a.u,
                        a.delta,
                        a.A,
                        a.B,
                        a.C;
                        a.D,
                        a.z,
                        a.delta_bias,
                        delta_softplus = options.softplus,
                        a.h0,
                        reset,
                    )
                    sum(W .* y) + sum(Vh .* h)
                end
                dev(::Nothing) = nothing
                dev(A) = AT(T.(A))
                for chunk in (nothing, 4, L)
                    d = mamba_selective_backward(
                        dev(W),
                        dev(args.u),
                        dev(args.delta),
                        dev(args.A),
                        dev(args.B),
                        dev(args.C);
                        D = dev(args.D),
                        z = dev(args.z),
                        delta_bias = dev(args.delta_bias),
                        delta_softplus = options.softplus,
                        h0 = dev(args.h0),
                        dh_last = dev(Vh),
                        cu_seqlens,
                        chunk,
                        workgroupsize = 8,
                    )
                    for name in keys(args)
                        A = args[name]
                        grad = getfield(d, Symbol(:d, name))
                        A === nothing && (@test grad === nothing; continue)
                        D = randn(rng, size(A))
                        moved(s) = merge(args, NamedTuple{(name,)}((A .+ s .* D,)))
                        fd = (loss(moved(1.0e-6)) - loss(moved(-1.0e-6))) / 2.0e-6
                        @test isapprox(
                            sum(Float64.(Array(grad)) .* D),
                            fd;
                            rtol = 100 * tolerance(T),
                            atol = 1.0e-6 * max(1.0, abs(fd)),
                        )
                    end
                end
            end
            u = AT(rand(Float32, 10, 3, 1))
            A, B = AT(-rand(Float32, 4, 3)), AT(rand(Float32, 10, 4, 1))
            err = try
                mamba_selective_backward(AT(rand(Float32, 9, 3, 1)), u, u, A, B, B)
            catch e
                e
            end
            @test err isa DimensionMismatch && occursin("dout has size (9, 3, 1)", err.msg)
            @test_throws ArgumentError mamba_selective_backward(u, u, u, A, B, B; chunk = 0)
        end

        @testset "reduce_then_scan reuses its chunk buffers" begin
            a, b, x = (AT(rand(rng, Float32, 300, 3)) for _ in 1:3)
            y = similar(a)
            ws = ScanWeaver.ScanWorkspace()
            selective_scan!(
                y,
                a,
                b,
                x;
                schedule = :reduce_then_scan,
                chunk = 64,
                workspace = ws,
            )
            agg, carry = ws.agg, ws.carry
            @test size(agg) == (5, 3)
            selective_scan!(
                y,
                a,
                b,
                x;
                schedule = :reduce_then_scan,
                chunk = 64,
                workspace = ws,
            )
            @test ws.agg === agg && ws.carry === carry
            want, _ = reference_scan(Array(a), Array(b), Array(x), nothing)
            @test matches(y, want; rtol = 1.0e-4)
            launch! = ScanWeaver.reduce_then_scan!(backend, 8)
            args = (y, nothing, a, b, x, nothing, nothing, nothing, false, Val(8), Val(64))
            launch!(args...)
            first_agg = launch!.workspace.agg
            launch!(args...)
            @test launch!.workspace.agg === first_agg
        end

        @testset "device status" begin
            ok, reason = ScanWeaver.device_status("cpu")
            @test ok && occursin("CPU", reason)
        end
    end
    return nothing
end
