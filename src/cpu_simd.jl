# SIMD for the CPU's own scan (`src/cpu.jl`): a lane advanced `W` steps at a
# time, the `W` pairs of one vector composed in registers by a Hillis-Steele
# scan (three shift-and-compose steps for 8 lanes), then applied to the carry.
# The carry's chain is one scalar fused multiply-add per vector, where the
# scalar loop has one per step, and the vector loads and stores follow the
# arrays in order. Julia's tuples are not vectorised across steps by LLVM (the
# same scan on `NTuple`s measured no faster than the scalar loop), so the
# vector operations are LLVM instructions through `Base.llvmcall`.
#
# Taken where every operand is a dense `Matrix` of one real `Float32` or
# `Float64` element type and there is no reset (`simd_width`); every other
# scan runs the scalar loops, which the kernels share.

"`W` values of type `T` in one SIMD register (`<W x T>` to LLVM)."
const Vec{W, T} = NTuple{W, VecElement{T}}

llvm_type(::Type{Float32}) = "float"
llvm_type(::Type{Float64}) = "double"

# The LLVM type of `V`, a `Vec`, and its element type. (The methods below
# take `V <: Vec` rather than `Vec{W, T}`: an empty tuple would leave `T` unbound.)
vec_eltype(::Type{V}) where {V} = fieldtype(fieldtype(V, 1), 1)
llvm_vec(::Type{V}) where {V} = "<$(fieldcount(V)) x $(llvm_type(vec_eltype(V)))>"

# `W` elements from the address `p` (aligned to one element only).
@generated function vload(::Type{V}, p::Ptr{T}) where {V <: Vec, T}
    t = llvm_vec(V)
    ir = "%ptr = inttoptr i64 %0 to $t*\n%v = load $t, $t* %ptr, align $(sizeof(T))\nret $t %v"
    return :(Base.llvmcall($ir, V, Tuple{Ptr{T}}, p))
end

@generated function vstore!(p::Ptr{T}, v::V) where {T, V <: Vec}
    t = llvm_vec(V)
    ir = "%ptr = inttoptr i64 %0 to $t*\nstore $t %1, $t* %ptr, align $(sizeof(T))\nret void"
    return :(Base.llvmcall($ir, Cvoid, Tuple{Ptr{T}, V}, p, v))
end

@generated function vmul(a::V, b::V) where {V <: Vec}
    t = llvm_vec(V)
    ir = "%3 = fmul $t %0, %1\nret $t %3"
    return :(Base.llvmcall($ir, V, Tuple{V, V}, a, b))
end

@generated function vadd(a::V, b::V) where {V <: Vec}
    t = llvm_vec(V)
    ir = "%3 = fadd $t %0, %1\nret $t %3"
    return :(Base.llvmcall($ir, V, Tuple{V, V}, a, b))
end

@generated function vsub(a::V, b::V) where {V <: Vec}
    t = llvm_vec(V)
    ir = "%3 = fsub $t %0, %1\nret $t %3"
    return :(Base.llvmcall($ir, V, Tuple{V, V}, a, b))
end

# `a * b + c`, fused where the target has the instruction (as `muladd`).
@generated function vmuladd(a::V, b::V, c::V) where {V <: Vec}
    t = llvm_vec(V)
    ir = "%4 = fmul contract $t %0, %1\n%5 = fadd contract $t %4, %2\nret $t %5"
    return :(Base.llvmcall($ir, V, Tuple{V, V, V}, a, b, c))
end

# `a`'s elements moved `d` places up, the first `d` taken from `fill`.
@generated function vshift(a::V, fill::V, ::Val{d}) where {V <: Vec, d}
    t, W = llvm_vec(V), fieldcount(V)
    mask = join(["i32 $(i < d ? i : W + i - d)" for i in 0:(W - 1)], ", ")
    ir = "%3 = shufflevector $t %1, $t %0, <$W x i32> <$mask>\nret $t %3"
    return :(Base.llvmcall($ir, V, Tuple{V, V}, a, fill))
end

# The elementwise larger of `m` and `|v|`; `NaN` stays `NaN` in the result
# once either side has it (`fcmp uno`), so a check of the result sees it.
@generated function vmaxabs(m::V, v::V) where {V <: Vec}
    t, W, bits = llvm_vec(V), fieldcount(V), 8 * sizeof(vec_eltype(V))
    it = "<$W x i$bits>"
    mask = join(("i$bits $(typemax(Int64) >> (64 - bits))" for _ in 1:W), ", ")
    ir = """
    %i = bitcast $t %1 to $it
    %j = and $it %i, <$mask>
    %f = bitcast $it %j to $t
    %g = fcmp ugt $t %f, %0
    %r = select <$W x i1> %g, $t %f, $t %0
    %n = fcmp uno $t %0, %0
    %s = select <$W x i1> %n, $t %0, $t %r
    ret $t %s
    """
    return :(Base.llvmcall($ir, V, Tuple{V, V}, m, v))
end

@generated function vreverse(a::V) where {V <: Vec}
    t, W = llvm_vec(V), fieldcount(V)
    mask = join(["i32 $(W - 1 - i)" for i in 0:(W - 1)], ", ")
    ir = "%2 = shufflevector $t %0, $t %0, <$W x i32> <$mask>\nret $t %2"
    return :(Base.llvmcall($ir, V, Tuple{V}, a))
end

@generated function vbroadcast(::Type{V}, x) where {V <: Vec}
    T = vec_eltype(V)
    return Expr(:tuple, (:(VecElement(convert($T, x))) for _ in 1:fieldcount(V))...)
end

# One Hillis-Steele step: element `w` composed after element `w - d`.
@inline function vscan_step(A::V, U::V, ::Val{d}) where {V <: Vec, d}
    T = vec_eltype(V)
    As = vshift(A, vbroadcast(V, one(T)), Val(d))
    Us = vshift(U, vbroadcast(V, zero(T)), Val(d))
    return vmul(A, As), vmuladd(A, Us, U)
end

# The inclusive scan of `W` pairs: element `w` becomes steps `1:w` composed
# (steps `d = 1, 2, 4, ...` while `d < W`, unrolled).
@generated function vscan(A::V, U::V) where {V <: Vec}
    steps = Expr[]
    d = 1
    while d < fieldcount(V)
        push!(steps, :((A, U) = vscan_step(A, U, Val($d))))
        d *= 2
    end
    return Expr(:block, steps..., :(return (A, U)))
end

"The operands [`simd_width`](@ref) takes: dense matrices of one element type, no reset."
const SIMDOperands{T} = ScanOperands{
    Matrix{T},
    Matrix{T},
    <:Union{Nothing, Matrix{T}},
    <:Union{Nothing, Matrix{T}},
    <:Any,
    Nothing,
}

"""
    simd_width(s::CPUScan)

Steps per vector of the SIMD loops for `s` (one 32-byte register: 8 `Float32`,
4 `Float64`), or 0 where they do not apply and the scalar loops run.
"""
simd_width(::CPUScan) = 0
function simd_width(
    ::CPUScan{AffinePair{T, T}, R, Matrix{T}, <:SIMDOperands{T}},
) where {T <: Union{Float32, Float64}, R}
    return 32 ÷ sizeof(T)
end

# Byte offset of the lowest time among scan positions `k:k+W-1` of lane `l`.
@inline function simd_offset(s::CPUScan{P, R}, l, k, ::Val{W}) where {P, R, W}
    t = R ? s.L + 2 - k - W : k
    return ((l - 1) * s.L + t - 1) * sizeof(cpu_state_type(s))
end

@inline simd_offsets(b::Matrix{T}, ::Nothing, o, ::Val{W}) where {T, W} = vload(
    Vec{W, T},
    pointer(b) + o,
)
@inline function simd_offsets(b::Matrix{T}, x::Matrix{T}, o, ::Val{W}) where {T, W}
    return vmul(vload(Vec{W, T}, pointer(b) + o), vload(Vec{W, T}, pointer(x) + o))
end

# The pairs at scan positions `k:k+W-1` of lane `l`, in scan order.
@inline function simd_pairs(s::CPUScan{P, R}, l, k, ::Val{W}) where {P, R, W}
    o = simd_offset(s, l, k, Val(W))
    A = vload(Vec{W, cpu_state_type(s)}, pointer(s.ops.a) + o)
    U = simd_offsets(s.ops.b, s.ops.x, o, Val(W))
    return R ? (vreverse(A), vreverse(U)) : (A, U)
end

@inline simd_project(::Nothing, hs, o) = hs
@inline simd_project(c::Matrix, hs::V, o) where {V <: Vec} = vmul(
    vload(V, pointer(c) + o),
    hs,
)

# The states `hs` of scan positions `k:k+W-1` of lane `l` written as outputs.
@inline function simd_store!(s::CPUScan{P, R}, l, k, hs, ::Val{W}) where {P, R, W}
    o = simd_offset(s, l, k, Val(W))
    vstore!(pointer(s.y) + o, simd_project(s.ops.c, R ? vreverse(hs) : hs, o))
    return nothing
end

# Positions `first:last` of lane `l` from state `h`, `W` at a time, then the
# rest as the scalar loop; returns the last state.
function simd_scan_range!(s::CPUScan, l, first, last, h, ::Val{W}) where {W}
    k = first
    GC.@preserve s while k + W - 1 <= last
        A, U = vscan(simd_pairs(s, l, k, Val(W))...)
        simd_store!(s, l, k, vmuladd(A, vbroadcast(typeof(A), h), U), Val(W))
        h = muladd(A[W].value, h, U[W].value)
        k += W
    end
    return scan_range!(s, l, k, last, h)
end

# A block of a long lane in two passes (`simd_scan_block!` in `src/cpu.jl`),
# with no reduction: pass 1 scans positions `first:last` of lane `l` from the
# state zero, storing, in scan order, the local states in `hl` and the
# products of the transitions since `first` in `P`, and returns the block's
# aggregate pair; pass 2 (`simd_fixup!`), once the carry-in `h` is known,
# writes the outputs `hl + P * h`, an elementwise vector multiply-add. As a
# scalar pair's transitions commute, `P` is all the carry needs; and pass 2
# has no shuffles and no chain, where a reduction costs most of a scan.
# Pass 1 also says whether every `|P|` stayed at most 1: where the
# transitions grow, `hl` and `P * h` can be large and cancel (and overflow),
# and the block is scanned again from its carry-in instead.
function simd_local_scan!(
    hl::Vector{T},
    P::Vector{T},
    s::CPUScan,
    l,
    first,
    last,
    ::Val{W},
) where {T, W}
    h, pc = zero(T), one(T)
    k, j = first, 1
    peak = vbroadcast(Vec{W, T}, zero(T))
    GC.@preserve s hl P while k + W - 1 <= last
        A, U = vscan(simd_pairs(s, l, k, Val(W))...)
        products = vmul(A, vbroadcast(typeof(A), pc))
        vstore!(pointer(hl, j), vmuladd(A, vbroadcast(typeof(A), h), U))
        vstore!(pointer(P, j), products)
        peak = vmaxabs(peak, products)
        h, pc = muladd(A[W].value, h, U[W].value), A[W].value * pc
        k, j = k + W, j + W
    end
    bounded = all(e -> e.value <= 1, peak)
    for k in k:last
        p = load_pair(AffinePair{T, T}, s.ops, cpu_time(s, k), l)
        h, pc = muladd(p.A, h, p.U), p.A * pc
        @inbounds hl[j], P[j] = h, pc
        bounded &= abs(pc) <= 1
        j += 1
    end
    return AffinePair(pc, h), bounded
end

# Pass 2: the outputs of positions `first:last` of lane `l` for carry-in `h`.
function simd_fixup!(
    s::CPUScan,
    l,
    first,
    last,
    hl::Vector{T},
    P::Vector{T},
    h,
    ::Val{W},
) where {T, W}
    k, j = first, 1
    V = Vec{W, T}
    if iszero(h)
        GC.@preserve s hl while k + W - 1 <= last
            simd_store!(s, l, k, vload(V, pointer(hl, j)), Val(W))
            k, j = k + W, j + W
        end
    else
        hv = vbroadcast(V, h)
        GC.@preserve s hl P while k + W - 1 <= last
            hs = vmuladd(vload(V, pointer(P, j)), hv, vload(V, pointer(hl, j)))
            simd_store!(s, l, k, hs, Val(W))
            k, j = k + W, j + W
        end
    end
    for k in k:last
        state = carry_state(AffinePair(@inbounds(P[j]), @inbounds(hl[j])), h)
        store_output!(s.y, s.ops.c, state, cpu_time(s, k), l)
        j += 1
    end
    return nothing
end
