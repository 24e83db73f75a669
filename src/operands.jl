# The inputs of one scan, bundled so that every kernel takes one argument for
# them and KernelAbstractions converts them to device arrays field by field.

"""
    ScanOperands(a, b, x, c, h0, reset)

The inputs of one scan: `(L, lanes)` matrices `a`, `b`, `x`, `c`, `reset` and
the vector `h0` of initial states; all but `a` and `b` may be `nothing` (then
`U = b`, `y = h`, `h0 = 0`, no resets). Every kernel takes this one struct
instead of six arrays. `Adapt.@adapt_structure` lets KernelAbstractions convert
it field by field when it launches a kernel: `cudaconvert`, `rocconvert`,
`mtlconvert` and oneAPI's `kernel_convert` turn the arrays into device arrays,
and `@Const` on the CPU wraps them in `Base.Experimental.Const`.

# Examples
```julia
julia> ops = ScanWeaver.ScanOperands(ones(3, 2), ones(3, 2), nothing, nothing, nothing, nothing);

julia> ScanWeaver.pair_type(ops)
AffinePair{Float64, Float64}
```
"""
struct ScanOperands{A, B, X, C, H, R}
    a::A
    b::B
    x::X
    c::C
    h0::H
    reset::R
end

Adapt.@adapt_structure ScanOperands

"The scan length `L` of `ops`."
scan_length(ops::ScanOperands) = size(ops.a, 1)

"The number of lanes of `ops`."
scan_lanes(ops::ScanOperands) = size(ops.a, 2)
