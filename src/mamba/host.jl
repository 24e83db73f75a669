# The fused Mamba scan from outside Julia: the Python facade's entry point (by
# buffer address) and the launcher Kernel Tuner's Julia backend calls.

"""
    host_mamba_scan!(device, dtype, L, dim, batch, N, groups_b, groups_c,
                     y, h_last, u, delta, A, B, C, D, z, delta_bias, h0, reset;
                     delta_softplus = false, tunables...) -> nothing

The Python facade's entry point for [`mamba_selective_scan!`](@ref). The array
arguments are addresses of C-contiguous host buffers in `dtype` (`reset`:
`UInt8`), `0` for absent ones, in the layout of `scanweaver.fused.mamba1`:
`u`, `delta`, `z`, `y` `(batch, dim, L)`; `A` `(dim, N)`; `B` `(dim, N)` when
`groups_b == 0`, else `(batch, groups_b, N, L)` (likewise `C`); `D`,
`delta_bias` `(dim,)`; `h0`, `h_last` `(batch, dim, N)`; `reset` `(L,)`. Read
column-major with the dimensions reversed, they are the Julia layouts, so they
are wrapped without copying; on a GPU device the inputs are copied over and
`y`, `h_last` copied back.
"""
function host_mamba_scan!(
    device::AbstractString,
    dtype::AbstractString,
    L::Integer,
    dim::Integer,
    batch::Integer,
    N::Integer,
    groups_b::Integer,
    groups_c::Integer,
    y::Integer,
    h_last::Integer,
    u::Integer,
    delta::Integer,
    A::Integer,
    B::Integer,
    C::Integer,
    D::Integer,
    z::Integer,
    delta_bias::Integer,
    h0::Integer,
    reset::Integer;
    delta_softplus::Bool = false,
    tunables...,
)
    T = HOST_ELTYPES[Symbol(dtype)]
    seq, state = (Int(L), Int(dim), Int(batch)), (Int(N), Int(dim), Int(batch))
    bc(groups) = groups == 0 ?
        (Int(N), Int(dim)) :
        (Int(L), Int(N), Int(groups), Int(batch))
    host = (
        y = wrap_host(T, y, seq),
        h_last = wrap_host(T, h_last, state),
        u = wrap_host(T, u, seq),
        delta = wrap_host(T, delta, seq),
        A = wrap_host(T, A, (Int(N), Int(dim))),
        B = wrap_host(T, B, bc(groups_b)),
        C = wrap_host(T, C, bc(groups_c)),
        D = wrap_host(T, D, (Int(dim),)),
        z = wrap_host(T, z, seq),
        delta_bias = wrap_host(T, delta_bias, (Int(dim),)),
        h0 = wrap_host(T, h0, state),
        reset = wrap_host(UInt8, reset, (Int(L),)),
    )
    Dev = device_array_type(Val(Symbol(device)))
    dev = map(X -> to_device(Dev, X), host)
    mamba_selective_scan!(
        dev.y,
        dev.u,
        dev.delta,
        dev.A,
        dev.B,
        dev.C;
        D = dev.D,
        z = dev.z,
        delta_bias = dev.delta_bias,
        delta_softplus,
        h0 = dev.h0,
        h_last = dev.h_last,
        reset = dev.reset,
        tunables...,
    )
    KernelAbstractions.synchronize(array_backend(dev.u))
    if Dev !== Array
        copyto!(host.y, dev.y)
        host.h_last === nothing || copyto!(host.h_last, dev.h_last)
    end
    return nothing
end

"""
    host_mamba_backward!(device, dtype, L, dim, batch, N, groups_b, groups_c,
                         u, delta, A, B, C, D, z, delta_bias, h0, reset, dout, dh_last,
                         du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0;
                         delta_softplus = false, tunables...) -> nothing

The Python facade's entry point for [`mamba_selective_backward!`](@ref), by
address in the layouts of [`host_mamba_scan!`](@ref) (`dout`, `du`,
`ddelta`, `dz` like `u`; `dA` like `A`; `dB`, `dC` like `B`, `C`; `dD`,
`ddelta_bias` `(dim,)`; `dh_last`, `dh0` `(batch, dim, N)`). `chunk` is the
number of steps between the backward's checkpoints. On a GPU device the
inputs are copied over and the gradients copied back.
"""
function host_mamba_backward!(
    device::AbstractString,
    dtype::AbstractString,
    L::Integer,
    dim::Integer,
    batch::Integer,
    N::Integer,
    groups_b::Integer,
    groups_c::Integer,
    u::Integer,
    delta::Integer,
    A::Integer,
    B::Integer,
    C::Integer,
    D::Integer,
    z::Integer,
    delta_bias::Integer,
    h0::Integer,
    reset::Integer,
    dout::Integer,
    dh_last::Integer,
    du::Integer,
    ddelta::Integer,
    dA::Integer,
    dB::Integer,
    dC::Integer,
    dD::Integer,
    dz::Integer,
    ddelta_bias::Integer,
    dh0::Integer;
    delta_softplus::Bool = false,
    tunables...,
)
    T = HOST_ELTYPES[Symbol(dtype)]
    seq, state = (Int(L), Int(dim), Int(batch)), (Int(N), Int(dim), Int(batch))
    bc(groups) = groups == 0 ?
        (Int(N), Int(dim)) :
        (Int(L), Int(N), Int(groups), Int(batch))
    chan = (Int(dim),)
    host = (
        u = wrap_host(T, u, seq),
        delta = wrap_host(T, delta, seq),
        A = wrap_host(T, A, (Int(N), Int(dim))),
        B = wrap_host(T, B, bc(groups_b)),
        C = wrap_host(T, C, bc(groups_c)),
        D = wrap_host(T, D, chan),
        z = wrap_host(T, z, seq),
        delta_bias = wrap_host(T, delta_bias, chan),
        h0 = wrap_host(T, h0, state),
        reset = wrap_host(UInt8, reset, (Int(L),)),
        dout = wrap_host(T, dout, seq),
        dh_last = wrap_host(T, dh_last, state),
        du = wrap_host(T, du, seq),
        ddelta = wrap_host(T, ddelta, seq),
        dA = wrap_host(T, dA, (Int(N), Int(dim))),
        dB = wrap_host(T, dB, bc(groups_b)),
        dC = wrap_host(T, dC, bc(groups_c)),
        dD = wrap_host(T, dD, chan),
        dz = wrap_host(T, dz, seq),
        ddelta_bias = wrap_host(T, ddelta_bias, chan),
        dh0 = wrap_host(T, dh0, state),
    )
    Dev = device_array_type(Val(Symbol(device)))
    dev = map(X -> to_device(Dev, X), host)
    grads = MambaGrads(
        dev.du,
        dev.ddelta,
        dev.dA,
        dev.dB,
        dev.dC,
        dev.dD,
        dev.dz,
        dev.ddelta_bias,
        dev.dh0,
    )
    mamba_selective_backward!(
        grads,
        dev.dout,
        dev.u,
        dev.delta,
        dev.A,
        dev.B,
        dev.C;
        D = dev.D,
        z = dev.z,
        delta_bias = dev.delta_bias,
        delta_softplus,
        h0 = dev.h0,
        dh_last = dev.dh_last,
        reset = dev.reset,
        tunables...,
    )
    KernelAbstractions.synchronize(array_backend(dev.u))
    if Dev !== Array
        for name in (:du, :ddelta, :dA, :dB, :dC, :dD, :dz, :ddelta_bias, :dh0)
            X = getfield(host, name)
            X === nothing || copyto!(X, getfield(dev, name))
        end
    end
    return nothing
end

"""
    MambaLauncher(backend, workgroupsize)

The fused Mamba scan as Kernel Tuner's Julia backend launches a kernel: built
by [`mamba_scan!`](@ref)`(backend, workgroupsize)`, then called with
`(y, h_last, u, delta, A, B, C, D, z, delta_bias, h0, reset, delta_softplus)`
in Julia layout and `Val(workgroupsize), Val(chunk)`. Tunables that are not
positive, or a workgroup past the device's limit, are refused with an
`ArgumentError` (see [`check_mamba_chunks`](@ref)). Its buffers persist in a
[`ScanWorkspace`](@ref); `ndrange` is accepted and ignored.
"""
struct MambaLauncher{B <: Backend}
    backend::B
    workgroupsize::Int
    workspace::ScanWorkspace
end

"""
    mamba_scan!(backend, workgroupsize) -> MambaLauncher

Kernel Tuner's entry point for the fused Mamba kernels (see [`MambaLauncher`](@ref)).
"""
mamba_scan!(backend::Backend, workgroupsize) = MambaLauncher(
    backend,
    Int(prod(workgroupsize)),
    ScanWorkspace(),
)

function (launch::MambaLauncher)(
    y,
    h_last,
    u,
    delta,
    A,
    B,
    C,
    D,
    z,
    delta_bias,
    h0,
    reset,
    delta_softplus,
    ::Val{workgroupsize},
    ::Val{chunk};
    ndrange = nothing,
) where {workgroupsize, chunk}
    if workgroupsize != launch.workgroupsize
        throw(ArgumentError(
            "mamba_scan!: built for workgroupsize = $(launch.workgroupsize) but called with " *
                "Val($workgroupsize); pass the same value to both",
        ))
    end
    softplus = launch_flag(:mamba_scan!, :delta_softplus, delta_softplus)
    # As in `mamba_selective_scan!`: the kernels index with @inbounds.
    check_mamba(:mamba_scan!, y, h_last, u, delta, A, B, C, D, z, delta_bias, h0, reset)
    ops = MambaOperands(u, delta, A, B, C, D, z, delta_bias, h0, reset, softplus)
    s = MambaChunks(workgroupsize, chunk)
    check_mamba_chunks(:mamba_scan!, s, launch.backend)
    launch_mamba!(
        s,
        launch.backend,
        y,
        h_last,
        ops,
        Val(size(A, 1));
        workspace = launch.workspace,
    )
    return nothing
end
