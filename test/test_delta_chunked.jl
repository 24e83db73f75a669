# The delta rule's chunked (WY) forward (`src/matrix/delta_chunked.jl`) on every
# backend of the suite: DeltaNet, Gated DeltaNet (a log decay per head), KDA
# (one per key row) and the dplr form (RWKV-7, with a decay per key, per head or
# none) against the Float64 loop of the recurrence
# (`delta_reference` in test/reference.jl) and against the recurrent kernels,
# over chunks shorter and longer than the sequences, resets, tiny, huge and
# growing decays, L2 normalisation, groups, packing and initial states.

@testset "delta rule chunked form: $name" for (name, AT) in BACKENDS
    backend = get_backend(AT(zeros(Float32, 1)))
    rng = Xoshiro(23)
    dev(::Nothing) = nothing
    dev(A) = AT(A)
    nk, nv, H, Hq, L = 5, 6, 4, 2, 37
    eltypes = unique((Float32, device_eltype(backend, Float64)))
    kinds = (:reset, :tiny, :huge, :positive, :mixed)
    @testset "$T $gate l2norm=$l2norm" for T in eltypes, gate in (
            :none,
            :scalar,
            :key,
        ), l2norm in (false, true)

        for (case, kind) in enumerate(gate === :none ? (:none, :none) : kinds)
            packed = isodd(case)
            batch = packed ? 1 : 2
            cu_seqlens = packed ? [0, 1, 1, 17, 30, L] : nothing
            nseq = packed ? 5 : batch
            q, k = T.(randn(rng, nk, Hq, L, batch)), T.(randn(rng, nk, Hq, L, batch))
            l2norm || (k ./= sqrt(T(nk)))
            v = T.(randn(rng, nv, H, L, batch))
            g = gate === :none ?
                nothing :
                T.(chunked_log_decays(
                    rng,
                    kind,
                    ((gate === :key ? (nk,) : ())..., H, L, batch),
                ))
            beta = T.(rand(rng, H, L, batch))
            h0 = iseven(case) ? nothing : T.(randn(rng, nv, nk, H, nseq))
            want, want_h = delta_reference(q, k, v; beta, g, l2norm, h0, cu_seqlens)
            args = (; beta = dev(beta), g = dev(g), l2norm, h0 = dev(h0), cu_seqlens)
            check_chunked_forward(
                delta_rule_scan,
                AT,
                q,
                k,
                v,
                want,
                want_h,
                args,
                (1, 4, 16, 32, 64),
                (; T, gate, l2norm, kind),
            )
        end
    end

    @testset "default chunk, in place, longer than one chunk" begin
        q, k = randn(rng, Float32, 4, 1, 70, 1), randn(rng, Float32, 4, 1, 70, 1)
        v, g = randn(rng, Float32, 3, 1, 70, 1), -rand(rng, Float32, 1, 70, 1)
        beta = rand(rng, Float32, 1, 70, 1)
        want, want_h = delta_reference(q, k, v; beta, g, l2norm = true)
        o, hlast = AT(zeros(Float32, 3, 1, 70, 1)), AT(zeros(Float32, 3, 4, 1, 1))
        delta_rule_scan!(
            o,
            AT(q),
            AT(k),
            AT(v);
            beta = AT(beta),
            g = AT(g),
            l2norm = true,
            hlast,
            algorithm = :chunked,
        )
        @test matches(o, want; rtol = tolerance(Float32))
        @test matches(hlast, want_h; rtol = tolerance(Float32))
    end

    @testset "dplr $T $gate" for T in eltypes, gate in (:none, :scalar, :key)
        for (case, kind) in enumerate(gate === :none ? (:none, :none) : kinds)
            packed = isodd(case)
            batch = packed ? 1 : 2
            cu_seqlens = packed ? [0, 1, 1, 17, 30, L] : nothing
            nseq = packed ? 5 : batch
            l2norm = case in (2, 3)
            q, k = T.(randn(rng, nk, Hq, L, batch)), T.(randn(rng, nk, Hq, L, batch))
            l2norm || (k ./= sqrt(T(nk)))
            v = T.(randn(rng, nv, H, L, batch))
            # RWKV-7's a = -kk and b = kk * (a gate in (0, 1)), kk of unit norm
            kk = randn(rng, nk, H, L, batch)
            kk ./= sqrt.(sum(abs2, kk; dims = 1))
            a, b = T.(-kk), T.(kk .* rand(rng, 1, H, L, batch))
            g = gate === :none ?
                nothing :
                T.(chunked_log_decays(
                    rng,
                    kind,
                    ((gate === :key ? (nk,) : ())..., H, L, batch),
                ))
            h0 = iseven(case) ? nothing : T.(randn(rng, nv, nk, H, nseq))
            want, want_h = delta_reference(q, k, v; a, b, g, l2norm, h0, cu_seqlens)
            args = (; a = dev(a), b = dev(b), g = dev(g), l2norm, h0 = dev(h0), cu_seqlens)
            check_chunked_forward(
                delta_rule_scan,
                AT,
                q,
                k,
                v,
                want,
                want_h,
                args,
                (1, 4, 16, 32, 64),
                (; T, form = :dplr, gate, l2norm, kind),
            )
        end
    end

    @testset "bad algorithm and chunk" begin
        q, v = AT(rand(Float32, 4, 1, 6, 1)), AT(rand(Float32, 5, 1, 6, 1))
        beta = AT(rand(Float32, 1, 6, 1))
        err = try
            delta_rule_scan(q, q, v; beta, algorithm = :blocked)
        catch e
            e
        end
        @test err isa ArgumentError && occursin("algorithm = :blocked", err.msg)
        for chunk in (0, 1025, 2.5)
            err = try
                delta_rule_scan(q, q, v; beta, algorithm = :chunked, chunk)
            catch e
                e
            end
            @test err isa ArgumentError && occursin("chunk = $(repr(chunk))", err.msg)
        end
    end
end

@testset "no chunked delta-rule kernel keeps a variable in a Core.Box (CPU typed code)" begin
    nk, nv, H, Hq, L, batch, wg = 3, 4, 2, 1, 11, 2, 8
    q, k = rand(Float32, nk, Hq, L, batch), rand(Float32, nk, Hq, L, batch)
    v, beta = rand(Float32, nv, H, L, batch), rand(Float32, H, L, batch)
    a, b = rand(Float32, nk, H, L, batch), rand(Float32, nk, H, L, batch)
    chunks, firsts, slot = ScanWeaver.matrix_chunk_tables(nothing, batch, L, 4, false)
    nch = size(chunks, 2)
    A4(n) = zeros(Float64, n, H, L, batch)
    S0, S = zeros(Float64, nv, nk, H, nch), zeros(Float32, nv, nk, H, batch)
    grow = zeros(Int32, H, nch)
    for (gate, g) in (
            (:key, -rand(Float32, nk, H, L, batch)),
            (:scalar, -rand(Float32, H, L, batch)),
        ), form in (:delta, :dplr)
        Kd = gate === :key ? nk : 1
        D = ones(Float64, Kd, H, nch)
        dplr = form === :dplr
        fb, fa, fbb, fbd, fM = dplr ?
            (nothing, a, b, A4(nk), A4(4)) :
            (beta, nothing, nothing, nothing, nothing)
        kernels = [
            (
                ScanWeaver.delta_chunk_norm_kernel!,
                (A4(nk)[:, 1:Hq, :, :], A4(nk)[:, 1:Hq, :, :], q, k),
                Hq * L * batch,
            ),
            (ScanWeaver.delta_chunk_grow_kernel!, (grow, g, chunks, Val(gate)), H * nch),
            (
                ScanWeaver.delta_chunk_solve_kernel!,
                (A4(nk), A4(nv), A4(4), A4(nk), v, fb, grow, chunks, fM, Val(form)),
                (nk + nv) * H * nch,
            ),
            (
                ScanWeaver.delta_chunk_carry_kernel!,
                (
                    S0,
                    A4(nv),
                    similar(v),
                    S,
                    A4(nk),
                    A4(nv),
                    A4(nk),
                    D,
                    grow,
                    S,
                    q,
                    k,
                    v,
                    g,
                    fb,
                    fa,
                    fbb,
                    fbd,
                    chunks,
                    firsts,
                    Val(nk),
                    Val(gate),
                    Val(form),
                    Val(true),
                ),
                nv * H * batch,
            ),
            (
                ScanWeaver.delta_chunk_output_kernel!,
                (
                    similar(v),
                    A4(nk),
                    S0,
                    A4(4),
                    A4(nv),
                    grow,
                    chunks,
                    slot,
                    fM,
                    v,
                    Val(form),
                ),
                length(v),
            ),
            (
                ScanWeaver.delta_chunk_adjoint_kernel!,
                (
                    S0,
                    similar(v),
                    S,
                    A4(nk),
                    A4(nk),
                    A4(nk),
                    fbd,
                    D,
                    grow,
                    q,
                    k,
                    g,
                    fb,
                    fa,
                    fbb,
                    chunks,
                    firsts,
                    Val(nk),
                    Val(gate),
                    Val(form),
                    Val(true),
                ),
                nv * H * batch,
            ),
            (
                ScanWeaver.delta_chunk_readout_kernel!,
                (A4(nk), A4(nk), A4(nk), A4(4), fM, grow, chunks, slot, Val(form)),
                nk * H * L * batch,
            ),
        ]
        for (kernel, args, n) in kernels
            @test !boxes_a_variable(kernel(CPU(), wg), args, n)
        end
    end
end

@testset "delta rule chunked backward against the recurrent backward (CPU)" begin
    # The recurrent backward is held to central differences of the Float64 loop
    # (test_cpu_only.jl); the chunked one must give its gradients on every decay
    # the forward tests take, both forms, packed sequences (an empty one among
    # them), groups, chunks shorter and longer than the sequences.
    rng = Xoshiro(29)
    nk, nv, H, Hq, L = 5, 6, 4, 2, 37
    kinds = (:reset, :tiny, :huge, :positive, :mixed)
    grads(X) = X === nothing ? nothing : fill(NaN, size(X))
    @testset "$form $gate" for form in (:delta, :dplr), gate in (:none, :scalar, :key)
        for (case, kind) in enumerate(gate === :none ? (:none, :none) : kinds)
            packed = isodd(case)
            batch = packed ? 1 : 2
            cu_seqlens = packed ? [0, 1, 1, 17, 30, L] : nothing
            nseq = packed ? 5 : batch
            l2norm = case in (2, 3)
            T = case == 4 ? Float32 : Float64
            q, k = T.(randn(rng, nk, Hq, L, batch)), T.(randn(rng, nk, Hq, L, batch))
            l2norm || (k ./= sqrt(T(nk)))
            v = T.(randn(rng, nv, H, L, batch))
            g = gate === :none ?
                nothing :
                T.(chunked_log_decays(
                    rng,
                    kind,
                    ((gate === :key ? (nk,) : ())..., H, L, batch),
                ))
            beta = form === :delta ? T.(rand(rng, H, L, batch)) : nothing
            kk = randn(rng, nk, H, L, batch)
            kk ./= sqrt.(sum(abs2, kk; dims = 1))
            a = form === :dplr ? T.(-kk) : nothing
            b = form === :dplr ? T.(kk .* rand(rng, 1, H, L, batch)) : nothing
            h0 = iseven(case) ? nothing : T.(randn(rng, nv, nk, H, nseq))
            dhlast = case == 2 ? nothing : T.(randn(rng, nv, nk, H, nseq))
            dout = T.(randn(rng, size(v)))
            function run(algorithm, chunk)
                out = (
                    dq = grads(q),
                    dk = grads(k),
                    dv = grads(v),
                    dg = grads(g),
                    dbeta = grads(beta),
                    da = grads(a),
                    db = grads(b),
                    dh0 = grads(something(h0, dhlast, Some(nothing))),
                )
                delta_rule_backward!(
                    out.dq,
                    out.dk,
                    out.dv,
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
                    cu_seqlens,
                    out.dg,
                    out.dbeta,
                    out.da,
                    out.db,
                    out.dh0,
                    algorithm,
                    chunk,
                )
                return out
            end
            want = run(:recurrent, nothing)
            rtol = T === Float32 ? 2.0e-4 : 1.0e-9
            for chunk in (1, 4, 16, 64)
                got = run(:chunked, chunk)
                for name in keys(want)
                    want[name] === nothing && continue
                    ok = matches(got[name], Float64.(want[name]); rtol)
                    ok || @info "chunked backward differs" form gate kind chunk name
                    @test ok
                end
            end
        end
    end
    q, v = rand(Float32, 4, 1, 6, 1), rand(Float32, 5, 1, 6, 1)
    beta = rand(Float32, 1, 6, 1)
    for (algorithm, chunk) in ((:blocked, nothing), (:chunked, 0))
        err = try
            delta_rule_backward!(
                similar(q),
                similar(q),
                similar(v),
                q,
                q,
                v,
                v;
                beta,
                algorithm,
                chunk,
            )
        catch e
            e
        end
        @test err isa ArgumentError && occursin("delta_rule_backward!", err.msg)
    end
end
