# The matrix-state scan from outside Julia: the Python facade's entry points
# (by buffer address) for the forward and backward parts of
# `scanweaver.fused.matrix_state`.

"""
    MatrixHost

The sizes and flags of one matrix-state call from Python: `batch`, `T`, `H`,
`Hq`, `nseq` (the ABI's `int` parameters), `K`, `V`, `decay` (`:none`,
`:scalar`, `:key`) and the element type.
"""
struct MatrixHost
    T::Type
    batch::Int
    L::Int
    H::Int
    Hq::Int
    nseq::Int
    K::Int
    V::Int
    decay::Symbol
end

"""
    matrix_host(dtype, batch, T, H, Hq, nseq, K, V, decay) -> MatrixHost

The checked [`MatrixHost`](@ref) of a call: `dtype` `float32` or `float64`, `decay` a name.
"""
function matrix_host(dtype, batch, L, H, Hq, nseq, K, V, decay)
    key = Symbol(dtype)
    key in (:float32, :float64) ||
        throw(ArgumentError(
            "host_matrix_state!: dtype must be float32 or float64, got $dtype",
        ))
    Symbol(decay) in MATRIX_DECAYS ||
        throw(ArgumentError(
            "host_matrix_state!: decay = $(repr(decay)) must be one of $(join(MATRIX_DECAYS, ", "))",
        ))
    return MatrixHost(
        HOST_ELTYPES[key],
        map(Int, (batch, L, H, Hq, nseq, K, V))...,
        Symbol(decay),
    )
end

"""
    matrix_host_arrays(m::MatrixHost, addresses::NamedTuple) -> NamedTuple

The buffers at `addresses` (`0`: absent) wrapped as Julia arrays without
copying, in the Julia layouts (the Python ones reversed): `q`, `k`, `dq`, `dk`
`(K, Hq, T, batch)`; `v`, `o`, `dout`, `dv` `(V, H, T, batch)`; `g`, `dg`
`(H, T, batch)` or `(K, H, T, batch)`; `u`, `du` `(K, H)`; (the delta rule)
`beta`, `dbeta` `(H, T, batch)`, `a`, `b`, `da`, `db` `(K, H, T, batch)`;
states `(V, K, H, nseq)`; `cu_seqlens` `Int` `(nseq + 1,)`.
"""
function matrix_host_arrays(m::MatrixHost, addresses::NamedTuple)
    qk, vo = (m.K, m.Hq, m.L, m.batch), (m.V, m.H, m.L, m.batch)
    gs = m.decay === :key ? (m.K, m.H, m.L, m.batch) : (m.H, m.L, m.batch)
    state = (m.V, m.K, m.H, m.nseq)
    shapes = (
        q = qk,
        k = qk,
        dq = qk,
        dk = qk,
        v = vo,
        o = vo,
        dout = vo,
        dv = vo,
        g = gs,
        dg = gs,
        u = (m.K, m.H),
        du = (m.K, m.H),
        beta = (m.H, m.L, m.batch),
        dbeta = (m.H, m.L, m.batch),
        a = (m.K, m.H, m.L, m.batch),
        da = (m.K, m.H, m.L, m.batch),
        b = (m.K, m.H, m.L, m.batch),
        db = (m.K, m.H, m.L, m.batch),
        h0 = state,
        hlast = state,
        dhlast = state,
        dh0 = state,
    )
    names = keys(addresses)
    wrapped = map(names, values(addresses)) do name, address
        name === :cu_seqlens && return wrap_host(Int, address, (m.nseq + 1,))
        return wrap_host(m.T, address, getfield(shapes, name))
    end
    return NamedTuple{names}(wrapped)
end

"`A` on the device of array type `D` (`A` itself for `Array`)."
device_copy(::Type{D}, A) where {D} = to_device(D, A)

"Copies each device array of `dev` back into its host buffer in `host` (nothing for `Array`)."
function copy_back!(::Type{D}, host::NamedTuple, dev::NamedTuple, names) where {D}
    D === Array && return nothing
    for name in names
        X = getfield(host, name)
        X === nothing || copyto!(X, getfield(dev, name))
    end
    return nothing
end

"""
    host_matrix_state!(device, dtype, batch, T, H, Hq, nseq, K, V, decay,
                       q, k, v, g, u, h0, cu_seqlens, o, hlast;
                       reverse = false, workgroupsize = nothing,
                       algorithm = "recurrent", chunk = nothing) -> nothing

The Python facade's entry point for [`matrix_state_scan!`](@ref): the arrays
are addresses of C-contiguous host buffers in `dtype` (`cu_seqlens`: int64),
`0` for absent ones, in the layouts of `scanweaver.fused.matrix_state`, read
as the Julia layouts without copying (see [`matrix_host_arrays`](@ref)). A
`u` selects the bonus readout. On a GPU device the inputs are copied over and
`o`, `hlast` copied back. `algorithm` (`recurrent` or `chunked`) and `chunk`
are those of [`matrix_state_scan!`](@ref).
"""
function host_matrix_state!(
    device::AbstractString,
    dtype::AbstractString,
    batch::Integer,
    T::Integer,
    H::Integer,
    Hq::Integer,
    nseq::Integer,
    K::Integer,
    V::Integer,
    decay::AbstractString,
    q::Integer,
    k::Integer,
    v::Integer,
    g::Integer,
    u::Integer,
    h0::Integer,
    cu_seqlens::Integer,
    o::Integer,
    hlast::Integer;
    reverse::Bool = false,
    workgroupsize = nothing,
    algorithm::AbstractString = "recurrent",
    chunk = nothing,
)
    m = matrix_host(dtype, batch, T, H, Hq, nseq, K, V, decay)
    host = matrix_host_arrays(m, (; q, k, v, g, u, h0, cu_seqlens, o, hlast))
    D = device_array_type(Val(Symbol(device)))
    dev = map(X -> device_copy(D, X), host)
    matrix_state_scan!(
        dev.o,
        dev.q,
        dev.k,
        dev.v;
        g = dev.g,
        decay = m.decay,
        u = dev.u,
        h0 = dev.h0,
        hlast = dev.hlast,
        cu_seqlens = host.cu_seqlens,
        reverse,
        workgroupsize,
        algorithm = Symbol(algorithm),
        chunk,
    )
    KernelAbstractions.synchronize(array_backend(dev.v))
    copy_back!(D, host, dev, (:o, :hlast))
    return nothing
end

"""
    host_matrix_backward!(device, dtype, batch, T, H, Hq, nseq, K, V, decay,
                          q, k, v, g, u, h0, cu_seqlens, dout, dhlast,
                          dq, dk, dv, dg, du, dh0;
                          reverse = false, workgroupsize = nothing,
                          algorithm = "recurrent", chunk = nothing) -> nothing

The Python facade's entry point for [`matrix_state_backward!`](@ref), by
address as [`host_matrix_state!`](@ref): writes `dq`, `dk`, `dv` and, when
their addresses are not `0`, `dg`, `du`, `dh0`. `algorithm` and `chunk` are
those of [`matrix_state_backward!`](@ref).
"""
function host_matrix_backward!(
    device::AbstractString,
    dtype::AbstractString,
    batch::Integer,
    T::Integer,
    H::Integer,
    Hq::Integer,
    nseq::Integer,
    K::Integer,
    V::Integer,
    decay::AbstractString,
    q::Integer,
    k::Integer,
    v::Integer,
    g::Integer,
    u::Integer,
    h0::Integer,
    cu_seqlens::Integer,
    dout::Integer,
    dhlast::Integer,
    dq::Integer,
    dk::Integer,
    dv::Integer,
    dg::Integer,
    du::Integer,
    dh0::Integer;
    reverse::Bool = false,
    workgroupsize = nothing,
    algorithm::AbstractString = "recurrent",
    chunk = nothing,
)
    m = matrix_host(dtype, batch, T, H, Hq, nseq, K, V, decay)
    addresses = (; q, k, v, g, u, h0, cu_seqlens, dout, dhlast, dq, dk, dv, dg, du, dh0)
    host = matrix_host_arrays(m, addresses)
    D = device_array_type(Val(Symbol(device)))
    dev = map(X -> device_copy(D, X), host)
    matrix_state_backward!(
        dev.dq,
        dev.dk,
        dev.dv,
        dev.q,
        dev.k,
        dev.v,
        dev.dout;
        dg = dev.dg,
        du = dev.du,
        dh0 = dev.dh0,
        g = dev.g,
        decay = m.decay,
        u = dev.u,
        h0 = dev.h0,
        dhlast = dev.dhlast,
        cu_seqlens = host.cu_seqlens,
        reverse,
        workgroupsize,
        algorithm = Symbol(algorithm),
        chunk,
    )
    KernelAbstractions.synchronize(array_backend(dev.v))
    copy_back!(D, host, dev, (:dq, :dk, :dv, :dg, :du, :dh0))
    return nothing
end

"""
    host_delta_rule!(device, dtype, batch, T, H, Hq, nseq, K, V, gate,
                     q, k, v, g, beta, a, b, h0, cu_seqlens, o, hlast;
                     l2norm = false, workgroupsize = nothing,
                     algorithm = "recurrent", chunk = nothing) -> nothing

The Python facade's entry point for [`delta_rule_scan!`](@ref), by address as
[`host_matrix_state!`](@ref) (the layouts of `scanweaver.fused.delta_rule`):
`beta` given selects the delta rule, `a` and `b` the diagonal-plus-low-rank
form; `gate` is `none`, `scalar` or `key`. `algorithm` and `chunk` are those
of [`delta_rule_scan!`](@ref). On a GPU device the inputs are copied over and
`o`, `hlast` copied back.
"""
function host_delta_rule!(
    device::AbstractString,
    dtype::AbstractString,
    batch::Integer,
    T::Integer,
    H::Integer,
    Hq::Integer,
    nseq::Integer,
    K::Integer,
    V::Integer,
    gate::AbstractString,
    q::Integer,
    k::Integer,
    v::Integer,
    g::Integer,
    beta::Integer,
    a::Integer,
    b::Integer,
    h0::Integer,
    cu_seqlens::Integer,
    o::Integer,
    hlast::Integer;
    l2norm::Bool = false,
    workgroupsize = nothing,
    algorithm::AbstractString = "recurrent",
    chunk = nothing,
)
    m = matrix_host(dtype, batch, T, H, Hq, nseq, K, V, gate)
    host = matrix_host_arrays(m, (; q, k, v, g, beta, a, b, h0, cu_seqlens, o, hlast))
    D = device_array_type(Val(Symbol(device)))
    dev = map(X -> device_copy(D, X), host)
    delta_rule_scan!(
        dev.o,
        dev.q,
        dev.k,
        dev.v;
        beta = dev.beta,
        a = dev.a,
        b = dev.b,
        g = dev.g,
        gate = m.decay,
        l2norm,
        h0 = dev.h0,
        hlast = dev.hlast,
        cu_seqlens = host.cu_seqlens,
        workgroupsize,
        algorithm = Symbol(algorithm),
        chunk,
    )
    KernelAbstractions.synchronize(array_backend(dev.v))
    copy_back!(D, host, dev, (:o, :hlast))
    return nothing
end

"""
    host_delta_backward!(device, dtype, batch, T, H, Hq, nseq, K, V, gate,
                         q, k, v, g, beta, a, b, h0, cu_seqlens, dout, dhlast,
                         dq, dk, dv, dg, dbeta, da, db, dh0;
                         l2norm = false, workgroupsize = nothing,
                         algorithm = "recurrent", chunk = nothing) -> nothing

The Python facade's entry point for [`delta_rule_backward!`](@ref), by address
as [`host_delta_rule!`](@ref): writes `dq`, `dk`, `dv` and, when their
addresses are not `0`, `dg`, `dbeta`, `da`, `db`, `dh0`. It runs on the CPU
(`device` must be `cpu`); `workgroupsize` is accepted for the ABI and unused;
`algorithm` (`recurrent` or `chunked`) and `chunk` are those of
[`delta_rule_backward!`](@ref).
"""
function host_delta_backward!(
    device::AbstractString,
    dtype::AbstractString,
    batch::Integer,
    T::Integer,
    H::Integer,
    Hq::Integer,
    nseq::Integer,
    K::Integer,
    V::Integer,
    gate::AbstractString,
    q::Integer,
    k::Integer,
    v::Integer,
    g::Integer,
    beta::Integer,
    a::Integer,
    b::Integer,
    h0::Integer,
    cu_seqlens::Integer,
    dout::Integer,
    dhlast::Integer,
    dq::Integer,
    dk::Integer,
    dv::Integer,
    dg::Integer,
    dbeta::Integer,
    da::Integer,
    db::Integer,
    dh0::Integer;
    l2norm::Bool = false,
    workgroupsize = nothing,
    algorithm::AbstractString = "recurrent",
    chunk = nothing,
)
    device == "cpu" ||
        throw(ArgumentError(
            "host_delta_backward!: the delta rule's backward runs on device cpu, got $device",
        ))
    m = matrix_host(dtype, batch, T, H, Hq, nseq, K, V, gate)
    addresses = (; q, k, v, g, beta, a, b, h0, cu_seqlens, dout, dhlast, dq, dk, dv, dg, dbeta, da, db, dh0)
    host = matrix_host_arrays(m, addresses)
    delta_rule_backward!(
        host.dq,
        host.dk,
        host.dv,
        host.q,
        host.k,
        host.v,
        host.dout;
        beta = host.beta,
        a = host.a,
        b = host.b,
        g = host.g,
        gate = m.decay,
        l2norm,
        h0 = host.h0,
        dhlast = host.dhlast,
        cu_seqlens = host.cu_seqlens,
        dg = host.dg,
        dbeta = host.dbeta,
        da = host.da,
        db = host.db,
        dh0 = host.dh0,
        algorithm = Symbol(algorithm),
        chunk,
    )
    return nothing
end
