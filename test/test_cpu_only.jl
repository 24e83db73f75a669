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

"Whether the typed code of `kernel` (the CPU backend's) for `args` holds a `Core.Box`."
function boxes_a_variable(kernel, args, ndrange)
    types = Tuple{map(typeof, args)...}
    typed = KernelAbstractions.ka_code_typed(kernel, types; ndrange)
    return occursin("Core.Box", sprint(show, typed))
end

# The fused Mamba reduce loop as it was: the closure captures `acc`, which the
# loop reassigns, so Julia keeps `acc` in a `Core.Box`.
@kernel function boxed_reduce_kernel!(out, @Const(a), ::Val{n}) where {n}
    g = @index(Global, Linear)
    acc = ntuple(_ -> zero(eltype(out)), Val(n))
    for t in axes(a, 1)
        acc = ntuple(k -> acc[k] + a[t, k], Val(n))
    end
    @inbounds out[g] = sum(acc)
end

@testset "no kernel body keeps a variable in a Core.Box (CPU typed code)" begin
    @test boxes_a_variable(
        boxed_reduce_kernel!(CPU(), 4),
        (zeros(4), ones(5, 2), Val(2)),
        4,
    )
    L, lanes, wg, chunk = 300, 3, 32, 150
    a, b, x, c = (rand(Float32, L, lanes) for _ in 1:4)
    y, h = similar(a), zeros(Float32, lanes)
    ops = ScanWeaver.ScanOperands(a, b, x, c, nothing, nothing)
    P = ScanWeaver.pair_type(ops)
    agg, carry = Matrix{P}(undef, 2, lanes), zeros(Float32, 2, lanes)
    scans = [
        (ScanWeaver.sequential_scan_kernel!, (y, h, ops, false, Val(wg)), lanes),
        (ScanWeaver.blelloch_scan_kernel!, (y, h, ops, false, Val(wg)), lanes * wg),
        (ScanWeaver.hybrid_scan_kernel!, (y, h, ops, false, Val(wg), Val(4)), lanes * wg),
        (
            ScanWeaver.chunk_reduce_kernel!,
            (agg, ops, false, Val(wg), Val(chunk)),
            2 * lanes,
        ),
        (ScanWeaver.carry_scan_kernel!, (carry, h, agg, ops, Val(wg), Val(chunk)), lanes),
        (
            ScanWeaver.chunk_propagate_kernel!,
            (y, ops, carry, false, Val(wg), Val(chunk)),
            2 * lanes,
        ),
    ]
    N, D, batch = 4, 3, 2
    u, delta, z = (rand(Float32, L, D, batch) for _ in 1:3)
    A = -rand(Float32, N, D)
    B, C = rand(Float32, L, N, batch), rand(Float32, L, N, batch)
    mops = ScanWeaver.MambaOperands(
        u,
        delta,
        A,
        B,
        C,
        ones(Float32, D),
        z,
        zeros(Float32, D),
        nothing,
        nothing,
        true,
    )
    my, mh = similar(u), zeros(Float32, N, D, batch)
    magg = Array{AffinePair{Float32, Float32}}(undef, N, 2, D, batch)
    mcarry = zeros(Float32, N, 2, D, batch)
    vals = (Val(N), Val(wg), Val(chunk))
    mamba = [
        (ScanWeaver.mamba_replay_kernel!, (my, mh, mops, nothing, vals...), 2 * D * batch),
        (
            ScanWeaver.mamba_replay_kernel!,
            (my, nothing, mops, mcarry, vals...),
            2 * D * batch,
        ),
        (ScanWeaver.mamba_reduce_kernel!, (magg, mops, vals...), 2 * D * batch),
        (ScanWeaver.mamba_carry_kernel!, (mcarry, mh, magg, mops, vals...), N * D * batch),
    ]
    ckpt, hs = zeros(Float32, N, 2, D, batch), zeros(Float32, N, chunk, D, batch)
    grads = ScanWeaver.MambaGrads(
        similar(u),
        similar(u),
        zeros(Float32, N, D),
        zeros(Float32, size(B)),
        zeros(Float32, size(C)),
        zeros(Float32, D),
        similar(u),
        zeros(Float32, D),
        nothing,
    )
    mamba_back = (grads, ckpt, hs, mops, similar(u), nothing, vals...)
    mamba = Any[mamba; (ScanWeaver.mamba_backward_kernel!, mamba_back, D * batch)]
    nk, nv, H = 3, 4, 2
    q, k = rand(Float32, nk, H, L, batch), rand(Float32, nk, H, L, batch)
    v, g, u_ = rand(Float32, nv, H, L, batch),
        -rand(Float32, nk, H, L, batch),
        rand(Float32, nk, H)
    S = zeros(Float32, nv, nk, H, batch)
    flags = (Val(:key), Val(true), Val(false), Val(wg))
    matrix = [
        (
            ScanWeaver.matrix_state_kernel!,
            (similar(v), S, q, k, v, g, u_, S, nothing, Val(nk), flags...),
            nv * H * batch,
        ),
        (
            ScanWeaver.matrix_values_kernel!,
            (similar(v), S, q, k, g, u_, v, S, nothing, batch, Val(nk), flags...),
            nv * H * batch,
        ),
        (
            ScanWeaver.matrix_keys_kernel!,
            (
                similar(q),
                similar(k),
                similar(g),
                zeros(Float32, nk, H, batch),
                q,
                k,
                v,
                g,
                u_,
                S,
                v,
                S,
                nothing,
                batch,
                Val(nv),
                flags...,
            ),
            nk * H * batch,
        ),
    ]
    st = ScanWeaver.matrix_chunk_states(
        CPU(),
        wg,
        4,
        similar(S),
        q,
        k,
        v,
        g,
        u_,
        S,
        nothing,
        flags[1:3]...,
    )
    A4 = zeros(Float64, nk, H, L, batch)
    dS = similar(st.S0)
    common = (st.G, st.seg, st.chunks, st.slot, flags[1:3]...)
    chunked = [
        (
            ScanWeaver.matrix_chunk_prefix_kernel!,
            (st.G, st.seg, st.D, g, st.chunks, Val(Float32), Val(:key), Val(false)),
            length(st.D),
        ),
        (
            ScanWeaver.matrix_chunk_scale_kernel!,
            (st.qd, st.kd, q, k, st.G, st.seg, st.chunks, st.slot, flags[1:3]...),
            length(st.qd),
        ),
        (
            ScanWeaver.matrix_chunk_state_kernel!,
            (st.E, st.kd, v, st.chunks, Val(false)),
            length(st.E),
        ),
        (
            ScanWeaver.matrix_chunk_carry_kernel!,
            (st.S0, S, st.E, st.D, S, st.firsts, Val(:key), Val(true)),
            length(S),
        ),
        (
            ScanWeaver.matrix_chunk_intra_kernel!,
            (st.Aw, q, k, u_, common...),
            length(st.Aw),
        ),
        (
            ScanWeaver.matrix_chunk_output_kernel!,
            (similar(v), st.qd, st.S0, st.Aw, v, st.chunks, st.slot, Val(false)),
            length(v),
        ),
        (
            ScanWeaver.matrix_chunk_dA_kernel!,
            (st.Aw, v, v, st.chunks, st.slot, Val(false)),
            length(st.Aw),
        ),
        (
            ScanWeaver.matrix_chunk_dq_kernel!,
            (A4, similar(A4), q, k, u_, st.S0, st.Aw, v, common...),
            length(A4),
        ),
        (
            ScanWeaver.matrix_chunk_dk_kernel!,
            (A4, similar(A4), q, k, u_, v, dS, st.Aw, common...),
            length(A4),
        ),
        (
            ScanWeaver.matrix_chunk_dv_kernel!,
            (similar(v), st.kd, dS, st.Aw, v, st.chunks, st.slot, Val(false)),
            length(v),
        ),
        (
            ScanWeaver.matrix_chunk_dg_kernel!,
            (
                similar(g),
                A4,
                A4,
                g,
                zeros(Float64, size(S)),
                S,
                st.chunks,
                st.firsts,
                Val(Float32),
                flags[1:3]...,
            ),
            nk * H * batch,
        ),
        (ScanWeaver.matrix_chunk_du_kernel!, (similar(u_), q, k, st.Aw, st.slot), nk * H),
        (
            ScanWeaver.matrix_chunk_group_kernel!,
            (similar(q), similar(k), A4, A4),
            length(q),
        ),
    ]
    for (kernel, args, n) in [scans; mamba; matrix; chunked]
        @test !boxes_a_variable(kernel(CPU(), wg), args, n)
    end
end

@testset "the CPU runs item kernels without KernelAbstractions, as the kernels would" begin
    rng = Xoshiro(31)
    nk, nv, H, Hq, L, batch = 5, 37, 4, 2, 29, 2
    for decay in (:none, :scalar, :key), bonus in (false, true), reverse in (false, true)
        q, k = randn(rng, Float32, nk, Hq, L, batch), randn(rng, Float32, nk, Hq, L, batch)
        v = randn(rng, Float32, nv, H, L, batch)
        g = decay === :none ?
            nothing :
            -rand(rng, Float32, (decay === :key ? (nk,) : ())..., H, L, batch)
        u = bonus ? randn(rng, Float32, nk, H) : nothing
        h0 = randn(rng, Float32, nv, nk, H, batch)
        args(o, S) = (
            o,
            S,
            q,
            k,
            v,
            g,
            u,
            h0,
            nothing,
            Val(nk),
            Val(decay),
            Val(bonus),
            Val(reverse),
            Val(8),
        )
        o_ka, S_ka = similar(v), similar(h0)
        ScanWeaver.matrix_state_kernel!(CPU(), 8)(
            args(o_ka, S_ka)...;
            ndrange = nv * H * batch,
        )
        o_cpu, S_cpu = similar(v), similar(h0)
        ScanWeaver.launch_matrix_state!(CPU(), 8, args(o_cpu, S_cpu)) # the SIMD blocks
        @test o_cpu ≈ o_ka && S_cpu ≈ S_ka
        o_item, S_item = similar(v, Float64), similar(h0)
        ScanWeaver.launch_matrix_state!(
            CPU(),
            8,
            args(o_item, S_item),
        ) # per-column items (types differ)
        @test o_item ≈ o_ka && S_item ≈ S_ka
        want = matrix_reference(q, k, v; g, u, h0, reverse)
        @test matches(o_cpu, want[1]; rtol = 1.0f-4) &&
            matches(S_cpu, want[2]; rtol = 1.0f-4)
    end
    # the SIMD vector paths (V a multiple of 4 vectors, K of one) against the same scans through
    # views, which take the per-column and per-row items
    for T in (Float32, Float64), decay in (:none, :scalar, :key), bonus in (
            false,
            true,
        ), packed in (false, true)
        nk, nv, H, Hq, L = 16, 64, 4, 2, 23
        batch, cu = packed ? (1, [0, 5, 5, L]) : (2, nothing)
        nseq = packed ? 3 : 2
        q, k = randn(rng, T, nk, Hq, L, batch), randn(rng, T, nk, Hq, L, batch)
        v, dout = randn(rng, T, nv, H, L, batch), randn(rng, T, nv, H, L, batch)
        g = decay === :none ?
            nothing :
            -rand(rng, T, (decay === :key ? (nk,) : ())..., H, L, batch)
        u = bonus ? randn(rng, T, nk, H) : nothing
        h0, dh = randn(rng, T, nv, nk, H, nseq), randn(rng, T, nv, nk, H, nseq)
        kw = (; g, u, h0, cu_seqlens = cu, reverse = packed)
        whole(A) = view(A, :, :, :, :)
        o, hl = matrix_state_scan(q, k, v; kw..., return_state = true)
        o_items, hl_items = matrix_state_scan(q, k, whole(v); kw..., return_state = true)
        @test o ≈ o_items && hl ≈ hl_items
        got = matrix_state_backward(q, k, v, dout; dhlast = dh, kw...)
        want = matrix_state_backward(q, k, whole(v), whole(dout); dhlast = dh, kw...)
        @test all(
            n -> getfield(got, n) === getfield(want, n) === nothing ||
                getfield(got, n) ≈ getfield(want, n),
            keys(got),
        )
    end
    out = zeros(Int, 100)
    for tasks in (1, 3, 100)
        fill!(out, 0)
        ScanWeaver.cpu_items!((w, o) -> (o[w] += w), 100, (out,); work = 10^6, tasks)
        @test out == 1:100
    end
    @test_throws ErrorException ScanWeaver.cpu_items!(
        (w, o) -> w == 50 && error("item 50"),
        100,
        (out,);
        work = 10^6,
    )
end

@testset "Kernel Tuner launchers take its 0-dimensional flags and check sizes (CPU)" begin
    rng = Xoshiro(13)
    L, lanes = 120, 2
    a = 0.5f0 .+ 0.4f0 .* rand(rng, Float32, L, lanes)
    b, x, c = (randn(rng, Float32, L, lanes) for _ in 1:3)
    h0, reset = zeros(Float32, lanes), zeros(UInt8, L, lanes)
    want = selective_scan(a, b, x, c; reverse = true)
    y, h = similar(a), similar(h0)
    launch = ScanWeaver.sequential_scan!(CPU(), 64)
    launch(
        y,
        h,
        a,
        b,
        x,
        c,
        h0,
        reset,
        fill(true),
        Val(64),
    ) # as Kernel Tuner passes `reversed`
    @test matches(y, want; rtol = 1.0e-5)
    err = try
        launch(zeros(Float32, L - 1, lanes), h, a, b, x, c, h0, reset, true, Val(64))
    catch e
        e
    end
    @test err isa DimensionMismatch && occursin("y", err.msg)
    @test_throws ArgumentError launch(y, h, a, b, x, c, h0, reset, 1.5, Val(64))
end

@testset "the CPU's threaded scan matches the KernelAbstractions kernel (CPU)" begin
    rng = Xoshiro(14)
    block = ScanWeaver.CPU_BLOCK
    # long lanes split among tasks (with short final blocks and tails), many
    # lanes in skewed pairs and alone (odd counts; L just long enough for
    # pairs, and one shorter), and a scan too small for more than one task
    shapes = ((3 * block + 5, 1), (2 * block + 77, 2), (700, 5), (64, 4), (63, 3), (40, 3))
    for (L, lanes) in shapes, reverse in (false, true), tasks in (1, 2, 3), T in (
            Float64,
            ComplexF64,
        )
        a = T.(0.5 .+ 0.49 .* rand(rng, L, lanes))
        b, x, c = (T.(randn(rng, L, lanes)) for _ in 1:3)
        h0, reset = T.(randn(rng, lanes)), rand(rng, L, lanes) .< 0.01
        ops = ScanWeaver.ScanOperands(a, b, x, c, h0, reset)
        y, h = similar(a), similar(h0)
        ScanWeaver.cpu_scan!(y, h, ops, reverse; tasks)
        y_ka, h_ka = similar(a), similar(h0)
        kernel! = ScanWeaver.sequential_scan_kernel!(CPU(), 64)
        kernel!(y_ka, h_ka, ops, reverse, Val(64); ndrange = lanes)
        KernelAbstractions.synchronize(CPU())
        @test matches(y, y_ka; rtol = 1.0e-9) && matches(h, h_ka; rtol = 1.0e-9)
    end
    # dense 2x2 transitions take the same paths
    L, K = 2 * block + 9, 2
    a = [SMatrix{K, K}(0.45 .* rand(rng, K, K)) for _ in 1:L, _ in 1:1]
    b = [SVector{K}(randn(rng, K)) for _ in 1:L, _ in 1:1]
    c = [SVector{K}(randn(rng, K)) for _ in 1:L, _ in 1:1]
    ops = ScanWeaver.ScanOperands(a, b, nothing, c, nothing, nothing)
    y, y_ka = zeros(L, 1), zeros(L, 1)
    ScanWeaver.cpu_scan!(y, nothing, ops, false; tasks = 2)
    ScanWeaver.sequential_scan_kernel!(CPU(), 64)(
        y_ka,
        nothing,
        ops,
        false,
        Val(64);
        ndrange = 1,
    )
    KernelAbstractions.synchronize(CPU())
    @test matches(y, y_ka; rtol = 1.0e-9)
    @test_throws ArgumentError ScanWeaver.cpu_scan!(y, nothing, ops, false; tasks = 0)
end

@testset "the CPU's SIMD loops match the KernelAbstractions kernel (CPU)" begin
    # dense matrices of one real type and no reset take the SIMD loops; their
    # in-register scans round differently from the kernel, within a few ulps
    rng = Xoshiro(15)
    block = ScanWeaver.CPU_BLOCK
    shapes = ((2 * block + 13, 1), (3 * block, 1), (301, 3), (8, 2), (7, 1))
    for (L, lanes) in shapes, reverse in (false, true), tasks in (1, 2, 3), T in (
            Float32,
            Float64,
        ), (with_x, with_c) in ((true, true), (false, true), (true, false))
        a = T.(0.5 .+ 0.49 .* rand(rng, L, lanes))
        b, x, c = (T.(randn(rng, L, lanes)) for _ in 1:3)
        h0 = T.(randn(rng, lanes))
        ops = ScanWeaver.ScanOperands(
            a,
            b,
            with_x ? x : nothing,
            with_c ? c : nothing,
            h0,
            nothing,
        )
        y, h = similar(a), similar(h0)
        s = ScanWeaver.CPUScan{ScanWeaver.pair_type(ops)}(y, ops, reverse)
        @test ScanWeaver.simd_width(s) == 32 ÷ sizeof(T)
        ScanWeaver.cpu_scan!(y, h, ops, reverse; tasks)
        y_ka, h_ka = similar(a), similar(h0)
        kernel! = ScanWeaver.sequential_scan_kernel!(CPU(), 64)
        kernel!(y_ka, h_ka, ops, reverse, Val(64); ndrange = lanes)
        KernelAbstractions.synchronize(CPU())
        rtol = T == Float32 ? 1.0f-4 : 1.0e-11
        @test matches(y, y_ka; rtol) && matches(h, h_ka; rtol)
    end
    # a growing transition from a zero state: a block's product of
    # transitions overflows, and a zero carry-in must still add nothing
    # (`Inf * 0` would make every later output `NaN`); views take the scalar
    # chained scan, dense matrices the SIMD one
    L = 3 * block
    a, b = fill(2.0f0, L, 1), zeros(Float32, L, 1)
    b[(end - 49):end] .= 1
    want = zeros(Float32, L, 1)
    want[(end - 49):end] .= Float32.(exp2.(1:50) .- 1)
    for tasks in (1, 2), reverse in (false, true), wrap in (identity, A -> view(A, :, :))
        ops = ScanWeaver.ScanOperands(
            wrap(a),
            wrap(reverse ? b[end:-1:1, :] : b),
            nothing,
            nothing,
            nothing,
            nothing,
        )
        y = similar(a)
        ScanWeaver.cpu_scan!(y, nothing, ops, reverse; tasks)
        @test (reverse ? y[end:-1:1, :] : y) == want
    end
    # growing transitions from a nonzero state: a fixed point (`hl + P * h`
    # would cancel to 0, then `Inf - Inf`), and a tiny carry grown 2^200
    # then shrunk 2^-200 in one block; the SIMD chained scan rescans such
    # blocks and matches the loop
    for tasks in (1, 2), reverse in (false, true)
        a, b = fill(2.0f0, L, 1), ones(Float32, L, 1)
        ops = ScanWeaver.ScanOperands(a, b, nothing, nothing, [-1.0f0], nothing)
        y = similar(a)
        ScanWeaver.cpu_scan!(y, nothing, ops, reverse; tasks)
        @test all(==(-1.0f0), y)
        a = fill(1.0f0, L, 1)
        a[(block + 1):(block + 200), 1] .= 2
        a[(block + 201):(block + 400), 1] .= 0.5f0
        a = reverse ? a[end:-1:1, :] : a
        ops = ScanWeaver.ScanOperands(
            a,
            zeros(Float32, L, 1),
            nothing,
            nothing,
            [1.0f-30],
            nothing,
        )
        ScanWeaver.cpu_scan!(y, nothing, ops, reverse; tasks)
        @test all(isfinite, y) && (reverse ? y[end:-1:1, :] : y)[end] ≈ 1.0f-30
    end
    # a reset, a view or a mixed element type runs the scalar loops
    a = rand(rng, Float32, 64, 2)
    for ops in (
            ScanWeaver.ScanOperands(a, a, nothing, nothing, nothing, falses(64, 2)),
            ScanWeaver.ScanOperands(view(a, :, :), a, nothing, nothing, nothing, nothing),
            ScanWeaver.ScanOperands(a, Float64.(a), nothing, nothing, nothing, nothing),
        )
        s = ScanWeaver.CPUScan{ScanWeaver.pair_type(ops)}(similar(a), ops, false)
        @test ScanWeaver.simd_width(s) == 0
    end
end

@testset "the CPU's scan allocates per call, not per element (CPU)" begin
    # A boxed variable or a dynamic call in a loop allocates on every step:
    # gigabytes for this scan. Both paths, after a warm-up call.
    for (L, lanes, tasks) in (
            (2^12, 64, 2),
            (6 * ScanWeaver.CPU_BLOCK, 1, 2),
            (2^12, 64, 1),
        )
        a = 0.5f0 .+ 0.49f0 .* rand(Float32, L, lanes)
        b, x, c = (randn(Float32, L, lanes) for _ in 1:3)
        ops = ScanWeaver.ScanOperands(a, b, x, c, nothing, nothing)
        y = similar(a)
        ScanWeaver.cpu_scan!(y, nothing, ops, false; tasks)
        bytes = @allocated ScanWeaver.cpu_scan!(y, nothing, ops, false; tasks)
        @test bytes < 2^20
    end
end

@testset "a small scan's checks and dispatch allocate almost nothing (CPU)" begin
    # The argument checks loop over NamedTuples of arrays of different types:
    # written as `for` loops they dispatched dynamically, 1.4 KB and about
    # 6 us a call. The facade's `host_scanner` resolves its schedule once.
    a = 0.5f0 .+ 0.49f0 .* rand(Float32, 8, 2)
    b, x, c = (randn(Float32, 8, 2) for _ in 1:3)
    y, h = similar(a), zeros(Float32, 2)
    check() = ScanWeaver.check_arguments(
        :selective_scan!,
        y,
        h,
        a,
        b,
        x,
        c,
        nothing,
        nothing,
    )
    check()
    @test @allocated(check()) == 0
    scan = ScanWeaver.host_scanner("cpu", "float32", 8, 2)
    @test scan.schedule isa ScanWeaver.ScanSchedule
    p(v) = UInt(pointer(v))
    call() = GC.@preserve y h a b x c scan(p(y), p(h), p(a), p(b), p(x), p(c), 0, 0)
    call()
    @test y ≈ selective_scan(a, b, x, c)
    @test @allocated(call()) < 2048
end

@testset "a failing task of the CPU's chained scan releases the others (CPU)" begin
    # every task raises converting its outputs; none waits forever for a carry
    L = 4 * ScanWeaver.CPU_BLOCK
    a = fill(0.5, L, 1)
    ops = ScanWeaver.ScanOperands(a, a, nothing, nothing, nothing, nothing)
    done = Threads.@spawn try
        ScanWeaver.cpu_scan!(zeros(Int, L, 1), nothing, ops, false; tasks = 2)
    catch e
        e
    end
    @test timedwait(() -> istaskdone(done), 60.0) === :ok
    @test fetch(done) isa InexactError
end

@testset "delta-rule backward, recurrent and chunked, against central differences of the loop (CPU)" begin
    rng = MersenneTwister(41)
    for gate in (:none, :scalar, :key), form in (:delta, :dplr)
        l2norm = form === :delta
        nk, nv, H, Hq, L = 3, 4, 4, 2, 7
        cu = gate === :key ? [0, 2, 2, L] : nothing
        batch, nseq = cu === nothing ? (2, 2) : (1, 3)
        q, k = randn(rng, nk, Hq, L, batch), randn(rng, nk, Hq, L, batch) ./ 2
        v = randn(rng, nv, H, L, batch)
        g = gate === :none ?
            nothing :
            -2 .* rand(rng, (gate === :key ? (nk,) : ())..., H, L, batch)
        beta = form === :delta ? rand(rng, H, L, batch) : nothing
        a = form === :dplr ? 0.3 .* randn(rng, nk, H, L, batch) : nothing
        b = form === :dplr ? 0.3 .* randn(rng, nk, H, L, batch) : nothing
        h0 = randn(rng, nv, nk, H, nseq)
        dout, dhlast = randn(rng, size(v)), randn(rng, size(h0))
        function loss()
            o, h = delta_reference(q, k, v; beta, a, b, g, l2norm, h0, cu_seqlens = cu)
            return sum(o .* dout) + sum(h .* dhlast)
        end
        like(X) = X === nothing ? nothing : fill(NaN, size(X))
        dq, dk, dv, dh0 = like(q), like(k), like(v), like(h0)
        dg, dbeta, da, db = like(g), like(beta), like(a), like(b)
        # the recurrent backward, and the chunked one (`src/matrix/delta_chunked_backward.jl`)
        for (checkpoint, algorithm, chunk) in (
                (nothing, :recurrent, nothing),
                (2, :recurrent, nothing),
                (nothing, :chunked, 3),
                (2, :chunked, 1),
            )
            delta_rule_backward!(
                dq,
                dk,
                dv,
                q,
                k,
                v,
                dout;
                beta,
                a,
                b,
                g,
                l2norm,
                h0,
                dhlast,
                cu_seqlens = cu,
                dg,
                dbeta,
                da,
                db,
                dh0,
                checkpoint,
                algorithm,
                chunk,
            )
            pairs = (
                (q, dq),
                (k, dk),
                (v, dv),
                (g, dg),
                (beta, dbeta),
                (a, da),
                (b, db),
                (h0, dh0),
            )
            for (X, dX) in pairs
                X === nothing && continue
                fd = similar(X)
                for i in eachindex(X)
                    x0 = X[i]
                    X[i] = x0 + 1.0e-6
                    hi = loss()
                    X[i] = x0 - 1.0e-6
                    lo = loss()
                    X[i] = x0
                    fd[i] = (hi - lo) / 2.0e-6
                end
                @test maximum(abs, fd .- dX) <= 1.0e-6 * max(1, maximum(abs, fd))
            end
        end
    end
    v = rand(Float32, 2, 1, 3, 1)
    q = rand(Float32, 2, 1, 3, 1)
    err = try
        delta_rule_backward!(similar(q), similar(q), similar(v), q, q, v, v)
    catch e
        e
    end
    @test err isa ArgumentError && occursin("give beta", err.msg)
end
