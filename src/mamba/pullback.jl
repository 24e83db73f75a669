# The fused Mamba-1 backward for Julia users, ChainRules and the Python facade.

"""
    check_mamba_grads(api, grads::MambaGrads, u, A, B, C, dout, dh_last)

Every gradient array has the size of its input (`du`, `ddelta`, `dz` and
`dout` u's; `dA` A's; `dB`, `dC` B's and C's; `dD`, `ddelta_bias` `(D,)`;
`dh0`, `dh_last` `(N, D, batch)`), real floats on u's device.
"""
function check_mamba_grads(api::Symbol, grads::MambaGrads, u, A, B, C, dout, dh_last)
    N, channels = size(A)
    seq, state = size(u), (N, channels, size(u, 3))
    named = (; grads.du, grads.ddelta, grads.dA, grads.dB, grads.dC, grads.dD, grads.dz, grads.ddelta_bias, grads.dh0, dout, dh_last)
    for (name, X) in pairs(named)
        X === nothing && continue
        if !(X isa AbstractArray) || !(eltype(X) <: AbstractFloat)
            throw(ArgumentError(
                "$api: $name must be an array of real floats, got $(typeof(X))",
            ))
        end
    end
    for (name, X) in pairs((; grads.du, grads.ddelta, grads.dz, dout))
        check_mamba_size(api, name, X, seq, "u's size (L, D, batch)")
    end
    check_mamba_size(api, :dA, grads.dA, size(A), "A's size (N, D)")
    check_mamba_size(api, :dB, grads.dB, size(B), "B's size")
    check_mamba_size(api, :dC, grads.dC, size(C), "C's size")
    for (name, X) in pairs((; grads.dD, grads.ddelta_bias))
        check_mamba_size(api, name, X, (channels,), "(D,)")
    end
    for (name, X) in pairs((; grads.dh0, dh_last))
        check_mamba_size(api, name, X, state, "(N, D, batch)")
    end
    check_backends(api, array_backend(u), named)
    return nothing
end

"""
    mamba_selective_backward!(grads::MambaGrads, dout, u, delta, A, B, C; D = nothing,
                              z = nothing, delta_bias = nothing, delta_softplus = false,
                              h0 = nothing, dh_last = nothing, cu_seqlens = nothing,
                              reset = nothing, workgroupsize = nothing, chunk = nothing) -> grads

In-place [`mamba_selective_backward`](@ref): overwrites every array of
`grads` (see [`MambaGrads`](@ref); give `dD`, `dz`, `ddelta_bias`, `dh0` for
the inputs that have them). `chunk` is the number of steps between the
backward's checkpoints.
"""
function mamba_selective_backward!(
    grads::MambaGrads,
    dout,
    u,
    delta,
    A,
    B,
    C;
    D = nothing,
    z = nothing,
    delta_bias = nothing,
    delta_softplus::Bool = false,
    h0 = nothing,
    dh_last = nothing,
    cu_seqlens = nothing,
    reset = nothing,
    workgroupsize = nothing,
    chunk = nothing,
)
    api = :mamba_selective_backward!
    if cu_seqlens !== nothing
        reset === nothing ||
            throw(ArgumentError("$api: give cu_seqlens or reset, not both"))
        host = seqlens_reset(api, cu_seqlens, size(u, 1))
        reset = copyto!(
            KernelAbstractions.allocate(array_backend(u), Bool, size(host)),
            host,
        )
    end
    check_mamba(api, nothing, nothing, u, delta, A, B, C, D, z, delta_bias, h0, reset)
    check_mamba_grads(api, grads, u, A, B, C, dout, dh_last)
    backend = array_backend(u)
    L, channels, batch = size(u)
    for X in (grads.dA, grads.dB, grads.dC, grads.dD, grads.ddelta_bias, grads.dz)
        X === nothing || fill!(X, zero(eltype(X)))
    end
    if L == 0 || channels * batch == 0
        foreach(X -> X === nothing || fill!(X, zero(eltype(X))), (grads.du, grads.ddelta))
        grads.dh0 === nothing ||
            (
                dh_last === nothing ?
                    fill!(grads.dh0, zero(eltype(grads.dh0))) :
                    copyto!(grads.dh0, dh_last)
            )
        return grads
    end
    wg = something(
        workgroupsize,
        min(DEFAULT_MAMBA_WORKGROUP_SIZE, max_workgroupsize(backend)),
    )
    s = MambaChunks(wg, something(chunk, min(DEFAULT_MAMBA_BACKWARD_CHUNK, L)))
    check_mamba_chunks(api, s, backend)
    ops = MambaOperands(u, delta, A, B, C, D, z, delta_bias, h0, reset, delta_softplus)
    T, N = mamba_type(ops), size(A, 1)
    ckpt = KernelAbstractions.allocate(backend, T, (N, cld(L, s.chunk), channels, batch))
    hs = KernelAbstractions.allocate(backend, T, (N, s.chunk, channels, batch))
    args = (grads, ckpt, hs, ops, dout, dh_last, Val(N), Val(s.workgroupsize), Val(s.chunk))
    items = channels * batch
    launch_items!(
        mamba_backward_item!,
        mamba_backward_kernel!,
        backend,
        wg,
        items,
        args;
        work = 2 * L * N,
    )
    return grads
end

"""
    mamba_selective_backward(dout, u, delta, A, B, C; D = nothing, z = nothing,
                             delta_bias = nothing, delta_softplus = false, h0 = nothing,
                             dh_last = nothing, cu_seqlens = nothing,
                             workgroupsize = nothing, chunk = nothing)
        -> (; du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0)

Every gradient of [`mamba_selective_scan`](@ref)'s `y` (and final state) given
`dout` (u's size) and `dh_last` (`(N, D, batch)`), in the layouts of the
inputs (`dD`, `dz`, `ddelta_bias`, `dh0` are `nothing` without `D`, `z`,
`delta_bias`, `h0`). One work-item per channel recomputes its states from
checkpoints every `chunk` steps (see `src/mamba/backward.jl`).

# Examples
```julia-repl
julia> L, D, N = 8, 3, 4; u = randn(L, D, 1); delta = rand(L, D, 1);

julia> A = -rand(N, D); B = randn(L, N, 1); C = randn(L, N, 1);

julia> g = mamba_selective_backward(ones(L, D, 1), u, delta, A, B, C; D = ones(D));

julia> size(g.dA), size(g.dB), size(g.dD)
((4, 3), (8, 4, 1), (3,))
```
"""
function mamba_selective_backward(
    dout,
    u,
    delta,
    A,
    B,
    C;
    D = nothing,
    z = nothing,
    delta_bias = nothing,
    h0 = nothing,
    kwargs...,
)
    like(X) = X isa AbstractArray ? similar(X) : nothing
    for (name, X) in pairs((; u, delta, A, B, C))
        X isa AbstractArray ||
            throw(ArgumentError(
                "mamba_selective_backward: $name must be an array, got $(typeof(X))",
            ))
    end
    grads = MambaGrads(
        like(u),
        like(delta),
        like(A),
        like(B),
        like(C),
        like(D),
        like(z),
        like(delta_bias),
        like(h0),
    )
    mamba_selective_backward!(
        grads,
        dout,
        u,
        delta,
        A,
        B,
        C;
        D,
        z,
        delta_bias,
        h0,
        kwargs...,
    )
    return (; grads.du, grads.ddelta, grads.dA, grads.dB, grads.dC, grads.dD, grads.dz, grads.ddelta_bias, grads.dh0)
end
