# Reading the golden files written by `python -m scanweaver.tools.golden`.

"""
A golden case in Julia layout: operands `(L, D, B)`, states `(D, B)`.

Dense cases (`state_size = K > 1`) hold `a` as `SMatrix{K, K}` elements and
`b`, `c`, `h0` as `SVector{K}` elements; their expected `h_last` has size
`(K, D, B)`. `rtol` and `atol` are the file's own tolerances (`nothing` when
it states none); `cu_seqlens` are the zero-based offsets of a varlen case,
whose `reset` holds the same segments.
"""
struct GoldenCase
    name::String
    eltype::Type
    state_size::Int
    reverse::Bool
    a::Array
    b::Array
    x::Array
    c::Union{Nothing, Array}
    h0::Union{Nothing, Array}
    reset::Union{Nothing, Array{Bool}}
    cu_seqlens::Union{Nothing, Vector{Int}}
    rtol::Union{Nothing, Float64}
    atol::Union{Nothing, Float64}
    y::Array{Float64}
    h_last::Array{Float64}
end

const GOLDEN_DIR = joinpath(@__DIR__, "golden")

const GOLDEN_ELTYPES = Dict(
    "float16" => Float16,
    "float32" => Float32,
    "float64" => Float64,
)

"""
    row_major_matrices(v, K, dims) -> Array{SMatrix{K, K}}

An array of size `dims` of `K × K` matrices from `v`, in which every run of
`K * K` consecutive values is one matrix in row-major order: Python writes
`a[b, d, t, r, j]` (row `r`, column `j`) in C order. Read column-major, a run
is the transpose, hence the `transpose`.

# Examples
```julia-repl
julia> row_major_matrices([1.0, 2.0, 3.0, 4.0], 2, (1,))[1]
2×2 SMatrix{2, 2, Float64, 4} with indices SOneTo(2)×SOneTo(2):
 1.0  2.0
 3.0  4.0
```
"""
function row_major_matrices(v, K, dims)
    runs = reshape(v, K * K, dims...)
    return [
        transpose(SMatrix{K, K}(Tuple(view(runs, :, I))))
        for I in CartesianIndices(dims)
    ]
end

"""
    static_vectors(v, K, dims) -> Array{SVector{K}}

An array of size `dims` of `SVector{K}` from `v`, whose runs of `K`
consecutive values are one vector each (Python's trailing axis of size `K`).

# Examples
```julia-repl
julia> static_vectors([1.0, 2.0, 3.0, 4.0], 2, (2,))
2-element Vector{SVector{2, Float64}}:
 [1.0, 2.0]
 [3.0, 4.0]
```
"""
function static_vectors(v, K, dims)
    runs = reshape(v, K, dims...)
    return [SVector{K}(Tuple(view(runs, :, I))) for I in CartesianIndices(dims)]
end

"""
    seqlens_reset(cu_seqlens, L; reverse = false) -> BitVector

The reset mask of sequences packed along `L`, given by zero-based offsets
`cu_seqlens = [0, ..., L]`: a forward scan resets at the first element of
every sequence after the first, a reverse scan at the last element of every
sequence but the final one (as `scanweaver.arrays.seqlens_reset` in Python).

# Examples
```julia-repl
julia> findall(seqlens_reset([0, 2, 5], 5))
1-element Vector{Int64}:
 3

julia> findall(seqlens_reset([0, 2, 5], 5; reverse = true))
1-element Vector{Int64}:
 2
```
"""
function seqlens_reset(cu_seqlens, L; reverse::Bool = false)
    mask = falses(L)
    first_of_next = cu_seqlens[2:(end - 1)] .+ 1
    mask[reverse ? first_of_next .- 1 : first_of_next] .= true
    return mask
end

"""
    load_golden(path) -> GoldenCase

Python writes flat arrays in C order of `shape = [B, D, L]`, which is
column-major `(L, D, B)` here, so a `reshape` is the whole conversion for
diagonal cases (files without `kind`, or `kind = "diagonal"`). Dense cases
(`kind = "dense"`) have a trailing `[K]` or `[K, K]` in Python, a leading one
here, read by [`static_vectors`](@ref) and [`row_major_matrices`](@ref).
"""
function load_golden(path::AbstractString)
    data = TOML.parsefile(path)
    B, D, L = data["shape"]
    T = GOLDEN_ELTYPES[data["dtype"]]
    kind = get(data, "kind", "diagonal")
    K = get(data, "state_size", 1)
    if kind ∉ ("diagonal", "dense") || (kind == "dense") != (K > 1)
        throw(ArgumentError("$path: kind = $(repr(kind)) with state_size = $K"))
    end
    numbers(key, E) = haskey(data, key) ? E.(data[key]) : nothing
    field(key, dims, E = T) = haskey(data, key) ? reshape(numbers(key, E), dims) : nothing
    function vectors(key, dims)
        if K == 1 || !haskey(data, key)
            return field(key, dims)
        end
        return static_vectors(numbers(key, T), K, dims)
    end
    operands, lanes = (L, D, B), (D, B)
    return GoldenCase(
        data["name"],
        T,
        K,
        data["reverse"],
        K == 1 ? field("a", operands) : row_major_matrices(numbers("a", T), K, operands),
        vectors("b", operands),
        field("x", operands),
        vectors("c", operands),
        vectors("h0", lanes),
        field("reset", operands, Bool),
        numbers("cu_seqlens", Int),
        numbers("rtol", Float64),
        numbers("atol", Float64),
        field("y", operands, Float64),
        field("h_last", K == 1 ? lanes : (K, lanes...), Float64),
    )
end

golden_cases() = [
    load_golden(p)
    for p in sort(readdir(GOLDEN_DIR; join = true))
    if endswith(p, ".toml")
]

"""
    check_golden_layout(g::GoldenCase)

Checks how the file was read, apart from any kernel: the plain
double-precision loop `reference_scan` over `g`'s operands reproduces the
expected outputs (so a transposed dense matrix fails here), a companion-form
case has rows `[a1 a2; 1 0]`, and a varlen case's `reset` is its
`cu_seqlens` segments.
"""
function check_golden_layout(g::GoldenCase)
    L = size(g.x, 1)
    lanes = length(g.x) ÷ L
    columns(A) = A === nothing ? nothing : reshape(A, L, lanes)
    y, h_last = reference_scan(
        columns(g.a),
        columns(g.b),
        columns(g.x),
        columns(g.c);
        h0 = g.h0 === nothing ? nothing : vec(g.h0),
        reset = columns(g.reset),
        reverse = g.reverse,
    )
    atol = 1.0e-10 * max(1.0, maximum(abs, g.y))
    want_h = collect(Float64, Iterators.flatten(h_last))
    @test all(isapprox.(vec(g.y), vec(Float64.(y)); rtol = 1.0e-10, atol))
    @test all(isapprox.(vec(g.h_last), want_h; rtol = 1.0e-10, atol))
    if g.state_size > 1
        K = g.state_size
        @test eltype(g.a) <: SMatrix{K, K, g.eltype} && eltype(g.b) <: SVector{K, g.eltype}
    end
    if occursin("companion", g.name)
        @test all(A -> A[2, 1] == 1 && A[2, 2] == 0 && A[1, 2] < 0, g.a)
    end
    if g.cu_seqlens !== nothing
        @test all(g.reset .== seqlens_reset(g.cu_seqlens, L; reverse = g.reverse))
    end
    return nothing
end
