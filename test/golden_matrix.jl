# Reading the matrix-state golden files written by `python -m scanweaver.tools.golden`
# (test/golden/matrix/*.toml, schema in python/scanweaver/tools/golden_matrix.py).

"""
A matrix-state golden case in Julia layout (`src/matrix/state.jl`): `q`, `k`
`(K, Hq, T, batch)`; `v`, `dout` and the expected `o` `(V, H, T, batch)`; `g`
`(H, T, batch)` or `(K, H, T, batch)`; `u` `(K, H)`; states `(V, K, H, nseq)`;
`grads` the expected gradients by name (`dq` ... `dh0`, those of absent
inputs absent).
"""
struct MatrixGolden
    name::String
    eltype::Type
    decay::Symbol
    reverse::Bool
    q::Array
    k::Array
    v::Array
    g::Union{Nothing, Array}
    u::Union{Nothing, Array}
    h0::Union{Nothing, Array}
    cu_seqlens::Union{Nothing, Vector{Int}}
    dout::Array
    dh_last::Array
    o::Array{Float64}
    h_last::Array{Float64}
    grads::Dict{Symbol, Array{Float64}}
end

const MATRIX_GOLDEN_DIR = joinpath(GOLDEN_DIR, "matrix")

"""
    load_matrix_golden(path) -> MatrixGolden

Python writes flat arrays in C order of its shapes, which is column-major
order of the reversed shapes, so a `reshape` to the reversed shape is the
whole conversion: `(batch, T, Hq, K)` becomes `(K, Hq, T, batch)`.
"""
function load_matrix_golden(path::AbstractString)
    data = TOML.parsefile(path)
    data["kind"] == "matrix" ||
        throw(ArgumentError("$path: kind = $(repr(data["kind"])), not \"matrix\""))
    batch, L, H, Hq, K, V = data["shape"]
    cu = haskey(data, "cu_seqlens") ? Int.(data["cu_seqlens"]) : nothing
    nseq = cu === nothing ? batch : length(cu) - 1
    T = GOLDEN_ELTYPES[data["dtype"]]
    decay = Symbol(data["decay"])
    qk, vo, state = (K, Hq, L, batch), (V, H, L, batch), (V, K, H, nseq)
    gs = decay === :key ? (K, H, L, batch) : (H, L, batch)
    shapes = Dict(
        :q => qk,
        :k => qk,
        :v => vo,
        :g => gs,
        :u => (K, H),
        :h0 => state,
        :dout => vo,
        :dh_last => state,
    )
    field(key, dims, E = T) = haskey(data, key) ? reshape(E.(data[key]), dims) : nothing
    grads = Dict{Symbol, Array{Float64}}()
    for (name, input) in (
            (:dq, :q),
            (:dk, :k),
            (:dv, :v),
            (:dg, :g),
            (:du, :u),
            (:dh0, :h0),
        )
        key = "grad_$name"
        haskey(data, key) && (grads[name] = field(key, shapes[input], Float64))
    end
    return MatrixGolden(
        data["name"],
        T,
        decay,
        data["reverse"],
        field("q", qk),
        field("k", qk),
        field("v", vo),
        field("g", gs),
        field("u", (K, H)),
        field("h0", state),
        cu,
        field("dout", vo),
        field("dh_last", state),
        field("y", vo, Float64),
        field("h_last", state, Float64),
        grads,
    )
end

matrix_golden_cases() = [
    load_matrix_golden(p)
    for p in sort(readdir(MATRIX_GOLDEN_DIR; join = true))
    if endswith(p, ".toml")
]

"""
    check_matrix_golden_layout(g::MatrixGolden)

Checks how the file was read, apart from any kernel: the double-precision loop
`matrix_reference` over `g`'s operands reproduces the expected outputs, and
central differences of it the expected gradients along a random direction.
"""
function check_matrix_golden_layout(g::MatrixGolden)
    args = (; g.q, g.k, g.v, g.g, g.u, g.h0)
    f64(::Nothing) = nothing
    f64(A) = Float64.(A)
    scan_of(a) = matrix_reference(
        f64(a.q),
        f64(a.k),
        f64(a.v);
        g = f64(a.g),
        u = f64(a.u),
        h0 = f64(a.h0),
        g.cu_seqlens,
        g.reverse,
    )
    o, h = scan_of(args)
    atol = 1.0e-10 * max(1.0, maximum(abs, g.o))
    @test all(isapprox.(o, g.o; rtol = 1.0e-10, atol))
    @test all(isapprox.(h, g.h_last; rtol = 1.0e-10, atol))
    loss(a) = (r = scan_of(a); sum(g.dout .* r[1]) + sum(g.dh_last .* r[2]))
    rng = Xoshiro(7)
    for (name, grad) in g.grads
        input = Symbol(string(name)[2:end])
        A = Float64.(getfield(args, input))
        D = randn(rng, size(A))
        moved(s) = merge(args, NamedTuple{(input,)}((A .+ s .* D,)))
        fd = (loss(moved(1.0e-6)) - loss(moved(-1.0e-6))) / 2.0e-6
        @test isapprox(sum(grad .* D), fd; rtol = 1.0e-6, atol = 1.0e-6)
    end
    return nothing
end
