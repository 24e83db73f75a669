# A plain sequential loop in double precision: the reference for element types
# and random cases beyond the golden files (BFloat16, complex, arbitrary dense transitions).

widen64(v::Real) = Float64(v)
widen64(v::Complex) = ComplexF64(v)
widen64(v::StaticArray) = map(widen64, v)

project64(::Nothing, h) = h
project64(c::Number, h) = widen64(c) * h
project64(c::StaticVector, h) = sum(widen64(c) .* h)

"""
    reference_scan(a, b, x, c; h0, reset, reverse) -> (y, h_last)

`(L, lanes)` operands; returns `Matrix{Any}` outputs and `Vector{Any}` states.
"""
function reference_scan(a, b, x, c; h0 = nothing, reset = nothing, reverse = false)
    L, lanes = size(a)
    y = Matrix{Any}(undef, L, lanes)
    h_last = Vector{Any}(undef, lanes)
    for l in 1:lanes
        h = h0 === nothing ? zero(widen64(b[1, l])) : widen64(h0[l])
        for k in 1:L
            t = reverse ? L + 1 - k : k
            A = reset !== nothing && reset[t, l] ? zero(widen64(a[t, l])) : widen64(a[t, l])
            u = x === nothing ? widen64(b[t, l]) : widen64(b[t, l]) * widen64(x[t, l])
            h = A * h + u
            y[t, l] = project64(c === nothing ? nothing : c[t, l], h)
        end
        h_last[l] = h
    end
    return y, h_last
end

"Elementwise `isapprox` of results against the reference, with an absolute floor scaled to the data."
function matches(got, want; rtol)
    scale = maximum(v -> maximum(abs, v), want; init = 1.0)
    return all(isapprox.(widen64.(Array(got)), want; rtol, atol = rtol * scale))
end

"`B_t[n]` of channel `d` in Julia layout: fixed `(N, D)`, per step `(L, N, batch)`, grouped `(L, N, G, batch)`."
mamba_bc(M::AbstractArray{<:Any, 2}, n, t, d, b, channels) = M[n, d]
mamba_bc(M::AbstractArray{<:Any, 3}, n, t, d, b, channels) = M[t, n, b]
function mamba_bc(M::AbstractArray{<:Any, 4}, n, t, d, b, channels)
    return M[t, n, (d - 1) ÷ (channels ÷ size(M, 3)) + 1, b]
end

"""
    mamba_reference(u, delta, A, B, C; D, z, delta_bias, delta_softplus, h0, reset) -> (y, h_last)

The Mamba-1 selective scan as a plain double-precision loop over (b, d, n, t),
in Julia layout, written from `mamba_ssm`'s `selective_scan_ref`.
"""
function mamba_reference(
    u,
    delta,
    A,
    B,
    C;
    D = nothing,
    z = nothing,
    delta_bias = nothing,
    delta_softplus = false,
    h0 = nothing,
    reset = nothing,
)
    L, channels, batch = size(u)
    N = size(A, 1)
    y = zeros(L, channels, batch)
    h_last = zeros(N, channels, batch)
    for b in 1:batch, d in 1:channels
        h = h0 === nothing ? zeros(N) : Float64.(h0[:, d, b])
        for t in 1:L
            dt = Float64(delta[t, d, b]) +
                (delta_bias === nothing ? 0.0 : Float64(delta_bias[d]))
            dt = delta_softplus ? log1p(exp(dt)) : dt
            fresh = reset !== nothing && reset[t]
            for n in 1:N
                gate = fresh ? 0.0 : exp(dt * Float64(A[n, d]))
                h[n] = gate * h[n] +
                    dt * Float64(mamba_bc(B, n, t, d, b, channels)) * Float64(u[t, d, b])
            end
            out = sum(Float64(mamba_bc(C, n, t, d, b, channels)) * h[n] for n in 1:N)
            out += (D === nothing ? 0.0 : Float64(D[d])) * Float64(u[t, d, b])
            if z !== nothing
                zt = Float64(z[t, d, b])
                out *= zt / (1 + exp(-zt))
            end
            y[t, d, b] = out
        end
        h_last[:, d, b] = h
    end
    return y, h_last
end

"""
    matrix_reference(q, k, v; g, u, h0, cu_seqlens, reverse) -> (o, hlast)

The matrix-state scan as a plain double-precision loop over (sequence, head,
t, i, j), in Julia layout (`src/matrix/state.jl`), written from the
definition `S_t = exp(g_t) * S_{t-1} + k_t v_t'`, `o_t = S_t' q_t` (with `u`:
`o_t = S_{t-1}' q_t + (q_t . (u .* k_t)) v_t`).
"""
function matrix_reference(
    q,
    k,
    v;
    g = nothing,
    u = nothing,
    h0 = nothing,
    cu_seqlens = nothing,
    reverse = false,
)
    nv, H, T, batch = size(v)
    nk, Hq = size(q, 1), size(q, 2)
    segs = cu_seqlens === nothing ?
        [(b, b, 1, T) for b in 1:batch] :
        [
            (n, 1, cu_seqlens[n] + 1, cu_seqlens[n + 1] - cu_seqlens[n])
            for n in 1:(length(cu_seqlens) - 1)
        ]
    o = zeros(Float64, size(v))
    hlast = zeros(Float64, nv, nk, H, length(segs))
    for (n, b, start, len) in segs, h in 1:H
        hq = (h - 1) ÷ (H ÷ Hq) + 1
        S = h0 === nothing ? zeros(nk, nv) : Float64.(permutedims(h0[:, :, h, n]))
        steps = reverse ? ((start + len - 1):-1:start) : (start:(start + len - 1))
        for t in steps
            d = g === nothing ?
                ones(nk) :
                ndims(g) == 4 ?
                    exp.(Float64.(g[:, h, t, b])) :
                    fill(exp(Float64(g[h, t, b])), nk)
            qt, kt, vt = Float64.(q[:, hq, t, b]),
                Float64.(k[:, hq, t, b]),
                Float64.(v[:, h, t, b])
            prev = S
            S = d .* S .+ kt * vt'
            o[:, h, t, b] = u === nothing ?
                S' * qt :
                prev' * qt .+ sum(qt .* Float64.(u[:, h]) .* kt) .* vt
        end
        hlast[:, :, h, n] = permutedims(S)
    end
    return o, hlast
end

"""
    delta_reference(q, k, v; beta, a, b, g, l2norm, h0, cu_seqlens) -> (o, hlast)

The delta-rule family's recurrence (`src/matrix/delta.jl`) in `Float64`, one
K x V matrix per head and sequence: with `beta` the delta rule
`S = D S; S += k (beta (v - S' k))'`, with `a`, `b` the diagonal plus low rank
`S = D S + b (a' S_prev) + k v'`; `o_t = S' q_t`.
"""
function delta_reference(
    q,
    k,
    v;
    beta = nothing,
    a = nothing,
    b = nothing,
    g = nothing,
    l2norm = false,
    h0 = nothing,
    cu_seqlens = nothing,
)
    nv, H, T, batch = size(v)
    nk, Hq = size(q, 1), size(q, 2)
    segs = cu_seqlens === nothing ?
        [(n, n, 1, T) for n in 1:batch] :
        [
            (n, 1, cu_seqlens[n] + 1, cu_seqlens[n + 1] - cu_seqlens[n])
            for n in 1:(length(cu_seqlens) - 1)
        ]
    norm64(x) = l2norm ? x ./ sqrt(sum(abs2, x) + 1.0e-6) : x
    o = zeros(Float64, size(v))
    hlast = zeros(Float64, nv, nk, H, length(segs))
    for (n, bi, start, len) in segs, h in 1:H
        hq = (h - 1) ÷ (H ÷ Hq) + 1
        S = h0 === nothing ? zeros(nk, nv) : Float64.(permutedims(h0[:, :, h, n]))
        for t in start:(start + len - 1)
            d = g === nothing ?
                ones(nk) :
                ndims(g) == 4 ?
                    exp.(Float64.(g[:, h, t, bi])) :
                    fill(exp(Float64(g[h, t, bi])), nk)
            qt, kt = norm64(Float64.(q[:, hq, t, bi])), norm64(Float64.(k[:, hq, t, bi]))
            vt = Float64.(v[:, h, t, bi])
            if beta === nothing
                at, bt = Float64.(a[:, h, t, bi]), Float64.(b[:, h, t, bi])
                S = d .* S .+ bt * (at' * S) .+ kt * vt'
            else
                S = d .* S
                S = S .+ kt * (Float64(beta[h, t, bi]) .* (vt .- S' * kt))'
            end
            o[:, h, t, bi] = S' * qt
        end
        hlast[:, :, h, n] = permutedims(S)
    end
    return o, hlast
end
