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
