# Reading the golden files written by `python -m scanweaver.golden`.

"A golden case in Julia layout: operands `(L, D, B)`, states `(D, B)`."
struct GoldenCase
    name::String
    eltype::Type
    reverse::Bool
    a::Array
    b::Array
    x::Array
    c::Union{Nothing, Array}
    h0::Union{Nothing, Array}
    reset::Union{Nothing, Array{Bool}}
    y::Array{Float64}
    h_last::Array{Float64}
end

const GOLDEN_DIR = joinpath(@__DIR__, "golden")

"""
    load_golden(path) -> GoldenCase

Python writes flat arrays in C order of `shape = [B, D, L]`, which is
column-major `(L, D, B)` here, so a `reshape` is the whole conversion.
"""
function load_golden(path::AbstractString)
    data = TOML.parsefile(path)
    B, D, L = data["shape"]
    T = Dict("float32" => Float32, "float64" => Float64)[data["dtype"]]
    field(key, dims, E) = haskey(data, key) ? reshape(E.(data[key]), dims) : nothing
    return GoldenCase(
        data["name"],
        T,
        data["reverse"],
        field("a", (L, D, B), T),
        field("b", (L, D, B), T),
        field("x", (L, D, B), T),
        field("c", (L, D, B), T),
        field("h0", (D, B), T),
        field("reset", (L, D, B), Bool),
        field("y", (L, D, B), Float64),
        field("h_last", (D, B), Float64),
    )
end

golden_cases() = [
    load_golden(p)
    for p in sort(readdir(GOLDEN_DIR; join = true))
    if endswith(p, ".toml")
]
