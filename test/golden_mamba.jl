# Reading the Mamba-1 golden files written by `python -m scanweaver.tools.golden`
# (test/golden/mamba/*.toml, schema in python/scanweaver/tools/golden_mamba.py).

"""
A Mamba golden case in Julia layout: `u`, `delta`, `z` `(L, D, batch)`; `A`
`(N, D)`; `B`, `C` `(N, D)`, `(L, N, batch)` or `(L, N, G, batch)`; `D`,
`delta_bias` `(D,)`; `h0` and the expected `h_last` `(N, D, batch)`; `dout`
(u's size) and `dh_last` the cotangents, `grads` the expected gradients by
name (`du` ... `dh0`, those of absent inputs absent) in the inputs' layouts.
"""
struct MambaGolden
    name::String
    eltype::Type
    delta_softplus::Bool
    u::Array
    delta::Array
    A::Array
    B::Array
    C::Array
    D::Union{Nothing, Array}
    z::Union{Nothing, Array}
    delta_bias::Union{Nothing, Array}
    h0::Union{Nothing, Array}
    cu_seqlens::Union{Nothing, Vector{Int}}
    y::Array{Float64}
    h_last::Array{Float64}
    dout::Array
    dh_last::Array
    grads::Dict{Symbol, Array{Float64}}
end

const MAMBA_GOLDEN_DIR = joinpath(GOLDEN_DIR, "mamba")

"""
    load_mamba_golden(path) -> MambaGolden

Python writes flat arrays in C order of its shapes, which is column-major
order of the reversed shapes, so a `reshape` to the reversed shape is the whole
conversion: `(batch, D, L)` becomes `(L, D, batch)`, `(batch, G, N, L)` becomes
`(L, N, G, batch)`.
"""
function load_mamba_golden(path::AbstractString)
    data = TOML.parsefile(path)
    data["kind"] == "mamba" ||
        throw(ArgumentError("$path: kind = $(repr(data["kind"])), not \"mamba\""))
    batch, channels, L = data["shape"]
    N = data["state_size"]
    T = GOLDEN_ELTYPES[data["dtype"]]
    bc(groups) = groups == 0 ?
        (N, channels) :
        groups == 1 ? (L, N, batch) : (L, N, groups, batch)
    field(key, dims, E = T) = haskey(data, key) ? reshape(E.(data[key]), dims) : nothing
    seq = (L, channels, batch)
    shapes = Dict(
        :u => seq,
        :delta => seq,
        :A => (N, channels),
        :B => bc(data["groups_b"]),
        :C => bc(data["groups_c"]),
        :D => (channels,),
        :z => seq,
        :delta_bias => (channels,),
        :h0 => (N, channels, batch),
    )
    grads = Dict{Symbol, Array{Float64}}()
    for (input, dims) in shapes
        key = "grad_d$input"
        haskey(data, key) && (grads[Symbol(:d, input)] = field(key, dims, Float64))
    end
    return MambaGolden(
        data["name"],
        T,
        data["delta_softplus"],
        field("u", seq),
        field("delta", seq),
        field("A", (N, channels)),
        field("B", bc(data["groups_b"])),
        field("C", bc(data["groups_c"])),
        field("D", (channels,)),
        field("z", seq),
        field("delta_bias", (channels,)),
        field("h0", (N, channels, batch)),
        haskey(data, "cu_seqlens") ? Int.(data["cu_seqlens"]) : nothing,
        field("y", seq, Float64),
        field("h_last", (N, channels, batch), Float64),
        field("dout", seq),
        field("dh_last", (N, channels, batch)),
        grads,
    )
end

mamba_golden_cases() = [
    load_mamba_golden(p)
    for p in sort(readdir(MAMBA_GOLDEN_DIR; join = true))
    if endswith(p, ".toml")
]

"""
    check_mamba_golden_layout(g::MambaGolden)

Checks how the file was read, apart from any kernel: the double-precision loop
`mamba_reference` over `g`'s operands reproduces the expected outputs.
"""
function check_mamba_golden_layout(g::MambaGolden)
    L = size(g.u, 1)
    reset = g.cu_seqlens === nothing ? nothing : seqlens_reset(g.cu_seqlens, L)
    y, h_last = mamba_reference(
        g.u,
        g.delta,
        g.A,
        g.B,
        g.C;
        g.D,
        g.z,
        g.delta_bias,
        g.delta_softplus,
        g.h0,
        reset,
    )
    atol = 1.0e-10 * max(1.0, maximum(abs, g.y))
    @test all(isapprox.(y, g.y; rtol = 1.0e-10, atol))
    @test all(isapprox.(h_last, g.h_last; rtol = 1.0e-10, atol))
    args = (; g.u, g.delta, g.A, g.B, g.C, g.D, g.z, g.delta_bias, g.h0)
    f64(::Nothing) = nothing
    f64(A) = Float64.(A)
    function loss(a)
        y, h = mamba_reference(
            f64(a.u),
            f64(a.delta),
            f64(a.A),
            f64(a.B),
            f64(a.C);
            D = f64(a.D),
            z = f64(a.z),
            delta_bias = f64(a.delta_bias),
            g.delta_softplus,
            h0 = f64(a.h0),
            reset,
        )
        return sum(g.dout .* y) + sum(g.dh_last .* h)
    end
    @test Set(keys(g.grads)) ==
        Set(Symbol(:d, n) for n in keys(args) if getfield(args, n) !== nothing)
    rng = Xoshiro(11)
    for (name, grad) in g.grads
        input = Symbol(string(name)[2:end])
        A = Float64.(getfield(args, input))
        D = randn(rng, size(A))
        moved(s) = merge(args, NamedTuple{(input,)}((A .+ s .* D,)))
        fd = (loss(moved(1.0e-6)) - loss(moved(-1.0e-6))) / 2.0e-6
        @test isapprox(sum(grad .* D), fd; rtol = 1.0e-6, atol = 1.0e-6 * max(1.0, abs(fd)))
    end
    return nothing
end
