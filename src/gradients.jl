# Gradients of the selective scan. The backward pass of a linear recurrence is
# another linear recurrence run in the opposite direction, so it runs on the
# same kernels: with g_t = dL/dh_t,
#   g_t = conj(c_t) dy_t + A_{t+1}' g_{t+1}      (g_L also receives dL/dh_last)
#   da_t = g_t h_{t-1}',  db_t = g_t conj(x_t),  dx_t = b_t' g_t,
#   dc_t = conj(h_t) dy_t,  dh0 = A_1' g_1,
# where ' is the adjoint (the conjugate of a scalar, the conjugate transpose of
# a dense transition) and A_t = 0 at a reset, so no gradient crosses it. A
# reverse scan swaps "previous" and "next".

"""
    neighbours(A, reverse::Bool, edge) -> similar(A)

`A` shifted by one step along the scan: entry `t` holds `A`'s entry at the
step before `t` in scan order (`t - 1`, or `t + 1` for a reverse scan), and
the first step in scan order holds `edge` (an array of the lane shape, or a
`Ref` to one value for every lane).
"""
function neighbours(A, reverse::Bool, edge)
    L = size(A, 1)
    B = similar(A)
    src, dst, first = reverse ? (2:L, 1:(L - 1), L) : (1:(L - 1), 2:L, 1)
    selectdim(B, 1, dst) .= selectdim(A, 1, src)
    selectdim(B, 1, first) .= edge
    return B
end

"`g * h'`: `g * conj(h)` for scalars, the outer product for vector states."
@inline outer(g, h) = g * h'

"`b' * g`: `conj(b) * g` for scalars, the dot product `sum(conj.(b) .* g)` for static arrays."
@inline inner(b::Number, g::Number) = conj(b) * g
@inline inner(b::StaticArray, g::StaticArray) = sum(conj(b) .* g)

"`a` with zeros where `reset` is set (`a` itself without resets)."
masked(a, ::Nothing) = a
masked(a, reset) = ifelse.(iszero.(reset), a, Ref(zero(eltype(a))))

"`d` where `reset` is not set, zero where it is."
masked_gradient(d, ::Nothing) = d
masked_gradient(d, reset) = ifelse.(iszero.(reset), d, Ref(zero(eltype(d))))

"""
    dense_like(a, d) -> AbstractArray

`d` as an array of `a`'s kind: as it is when it is a dense array (`Array`,
`CuArray` ...), else copied into `similar(a)` by broadcasting (a `Fill` from
Zygote's `sum`, a reshaped view), so the kernels can read it.
"""
dense_like(a, d::DenseArray) = d
function dense_like(a, d)
    D = similar(a, eltype(d), size(d))
    D .= d
    return D
end
dense_like(a, ::Nothing) = nothing

zeros_like(::Nothing) = nothing
zeros_like(A) = fill!(similar(A), zero(eltype(A)))

"""
    empty_scan_pullback(dh_last, a, b, x, c, h0) -> (; a, b, x, c, h0)

The cotangents of a scan of length `L = 0`, whose final state is `h0`: zeros
for the (empty) operands, `dh_last` (or zeros) for `h0`.
"""
function empty_scan_pullback(dh_last, a, b, x, c, h0)
    dh0 = if h0 === nothing
        nothing
    elseif dh_last === nothing
        zeros_like(h0)
    else
        copyto!(similar(h0), dh_last)
    end
    da, db, dx, dc = zeros_like(a), zeros_like(b), zeros_like(x), zeros_like(c)
    return (; a = da, b = db, x = dx, c = dc, h0 = dh0)
end

"""
    selective_scan_pullback(dy, dh_last, a, b, x, c = nothing; h0 = nothing,
                            reset = nothing, reverse = false, kwargs...)
        -> (; a, b, x, c, h0)

The cotangents of `selective_scan(a, b, x, c; h0, reset, reverse, kwargs...)`
given the cotangent `dy` of its output and `dh_last` of its final states
(either may be `nothing`, meaning zero); `x`, `c` and `h0` get `nothing` when
they are `nothing`. Two scans on the same kernels (and `kwargs`: schedule and
tunables): the states `h` are recomputed forward, then `g = dL/dh` is scanned
in the opposite direction; the rest is elementwise. Works for scalar and dense
(`StaticArrays`) transitions, real and complex numbers (cotangents in
ChainRules' convention, conjugated), on any KernelAbstractions backend. The
`ChainRulesCore.rrule` for [`selective_scan`](@ref) (a package extension)
calls this.

# Examples
```julia-repl
julia> a = fill(0.5, 3); b = ones(3); x = ones(3);

julia> ScanWeaver.selective_scan_pullback(ones(3), nothing, a, b, x).x
3-element Vector{Float64}:
 1.75
 1.5
 1.0
```
"""
function selective_scan_pullback(
    dy,
    dh_last,
    a,
    b,
    x,
    c = nothing;
    h0 = nothing,
    reset = nothing,
    reverse::Bool = false,
    kwargs...,
)
    dy, dh_last = dense_like(a, dy), dense_like(a, dh_last)
    check_arguments(:selective_scan_pullback, dy, dh_last, a, b, x, c, h0, reset)
    size(a, 1) == 0 && return empty_scan_pullback(dh_last, a, b, x, c, h0)
    Ty, Th = output_types(a, b, x, c)
    lanes = Base.tail(size(a))
    if dy === nothing
        dy = fill!(similar(a, Ty), zero(Ty))
    end
    h = selective_scan(a, b, x; h0, reset, reverse, kwargs...)
    effective = masked(a, reset)
    following = neighbours(effective, !reverse, Ref(one(eltype(a))))
    transposed = adjoint.(following)
    g = if c === nothing
        selective_scan(transposed, dy, nothing; h0 = dh_last, reverse = !reverse, kwargs...)
    else
        selective_scan(
            transposed,
            conj.(c),
            dy;
            h0 = dh_last,
            reverse = !reverse,
            kwargs...,
        )
    end
    start = h0 === nothing ? Ref(zero(Th)) : reshape(h0, lanes)
    previous = neighbours(h, reverse, start)
    da = masked_gradient(outer.(g, previous), reset)
    db = x === nothing ? g : g .* conj.(x)
    dx = x === nothing ? nothing : inner.(b, g)
    dc = c === nothing ? nothing : conj.(h) .* dy
    dh0 = if h0 === nothing
        nothing
    else
        first = reverse ? size(a, 1) : 1
        reshape(
            adjoint.(selectdim(effective, 1, first)) .* selectdim(g, 1, first),
            size(h0),
        )
    end
    return (; a = da, b = db, x = dx, c = dc, h0 = dh0)
end
