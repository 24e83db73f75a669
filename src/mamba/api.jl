# The fused Mamba-1 selective scan for Julia users and for the Python facade.

"Work-items per workgroup of the fused Mamba kernels unless given."
const DEFAULT_MAMBA_WORKGROUP_SIZE = 64

"""
    MAMBA_WORK_ITEMS

How many work-items the fused Mamba kernels aim for before splitting time into
chunks (a heuristic, not a measurement): 4 per thread on the CPU, `2^15` on a
GPU. Chunks are never shorter than [`MIN_MAMBA_CHUNK`](@ref) steps.
"""
const MAMBA_WORK_ITEMS = (cpu_per_thread = 4, gpu = 2^15)

"Fewest time steps per chunk when the fused Mamba kernels split time."
const MIN_MAMBA_CHUNK = 64

"""
    default_mamba_chunk(backend, L, channels) -> Int

Time steps per work-item: all of `L` when `channels` (batch times D)
work-items already reach [`MAMBA_WORK_ITEMS`](@ref), else chunks of at least
[`MIN_MAMBA_CHUNK`](@ref) steps until they do.
"""
function default_mamba_chunk(backend, L::Integer, channels::Integer)
    target = backend isa CPU ?
        MAMBA_WORK_ITEMS.cpu_per_thread * Threads.nthreads() :
        MAMBA_WORK_ITEMS.gpu
    nchunks = clamp(cld(target, max(channels, 1)), 1, max(cld(L, MIN_MAMBA_CHUNK), 1))
    return max(cld(L, nchunks), 1)
end

"""
    seqlens_reset(api, cu_seqlens, L) -> Vector{Bool}

The start flags of sequences packed along `L` from zero-based offsets
`cu_seqlens = [0, ..., L]`: set at the first step of every sequence after the
first.
"""
function seqlens_reset(api::Symbol, cu_seqlens, L::Integer)
    offsets = collect(Int, cu_seqlens)
    if length(offsets) < 2 ||
            first(offsets) != 0 ||
            last(offsets) != L ||
            !issorted(offsets)
        throw(ArgumentError(
            "$api: cu_seqlens = $(repr(cu_seqlens)) must rise from 0 to L = $L " *
                "(zero-based offsets of the packed sequences)",
        ))
    end
    reset = zeros(Bool, L)
    for start in offsets[2:(end - 1)]
        start < L && (reset[start + 1] = true)
    end
    return reset
end

function check_mamba_size(api, name, A, want, layout)
    A === nothing && return nothing
    if size(A) != want
        throw(DimensionMismatch(
            "$api: $name has size $(size(A)); it needs $layout = $want",
        ))
    end
    return nothing
end

function check_bc(api, name, M, L, N, channels, batch)
    layouts = "(N, D) = $((N, channels)) fixed, (L, N, batch) = $((L, N, batch)) per step, " *
        "or (L, N, G, batch) with G dividing D = $channels"
    ok = if ndims(M) == 2
        size(M) == (N, channels)
    elseif ndims(M) == 3
        size(M) == (L, N, batch)
    elseif ndims(M) == 4
        size(M, 1) == L &&
            size(M, 2) == N &&
            size(M, 4) == batch &&
            size(M, 3) >= 1 &&
            channels % size(M, 3) == 0
    else
        false
    end
    ok || throw(DimensionMismatch("$api: $name has size $(size(M)); it needs $layouts"))
    return nothing
end

"""
    check_mamba_chunks(api, s::MambaChunks, backend)

Both tunables of `s` are positive integers and `s.workgroupsize` is within the
backend's [`max_workgroupsize`](@ref); throws an `ArgumentError` naming the
tunable otherwise. [`mamba_selective_scan!`](@ref) and the Kernel Tuner
launcher [`mamba_scan!`](@ref) both check their launch with it.

# Examples
```julia-repl
julia> ScanWeaver.check_mamba_chunks(:demo, ScanWeaver.MambaChunks(64, 0), CPU())
ERROR: ArgumentError: demo: chunk = 0 must be a positive integer
```
"""
function check_mamba_chunks(api::Symbol, s::MambaChunks, backend)
    check_tunables(api, (; workgroupsize = s.workgroupsize, chunk = s.chunk))
    limit = max_workgroupsize(backend)
    if s.workgroupsize > limit
        throw(ArgumentError(
            "$api: workgroupsize = $(s.workgroupsize) exceeds $limit, the largest workgroup on $backend",
        ))
    end
    return nothing
end

"""
    check_mamba(api, y, h_last, u, delta, A, B, C, D, z, delta_bias, h0, reset)

Shapes (Julia layout), real floating-point element types and one device for
the fused Mamba scan; throws `DimensionMismatch` or `ArgumentError` naming the
argument, what it got and what it needs.
"""
function check_mamba(api::Symbol, y, h_last, u, delta, A, B, C, D, z, delta_bias, h0, reset)
    if !(u isa AbstractArray) || ndims(u) != 3
        throw(ArgumentError("$api: u must be an (L, D, batch) array, got $(typeof(u))"))
    end
    L, channels, batch = size(u)
    if !(A isa AbstractMatrix) || size(A, 2) != channels
        throw(DimensionMismatch(
            "$api: A has size $(size(A)); it needs (N, D) with D = $channels",
        ))
    end
    N = size(A, 1)
    named = (; y, h_last, u, delta, A, B, C, D, z, delta_bias, h0)
    for (name, X) in pairs(named)
        X === nothing && continue
        if !(X isa AbstractArray) || !(eltype(X) <: AbstractFloat)
            throw(ArgumentError(
                "$api: $name must be an array of real floats (Float16, BFloat16, Float32, Float64), " *
                    "got $(typeof(X))",
            ))
        end
    end
    for (name, X) in pairs((; y, delta, z))
        check_mamba_size(api, name, X, size(u), "u's size (L, D, batch)")
    end
    for (name, X) in pairs((; D, delta_bias))
        check_mamba_size(api, name, X, (channels,), "(D,)")
    end
    for (name, X) in pairs((; h0, h_last))
        check_mamba_size(api, name, X, (N, channels, batch), "(N, D, batch)")
    end
    check_mamba_size(api, :reset, reset, (L,), "(L,)")
    check_bc(api, :B, B, L, N, channels, batch)
    check_bc(api, :C, C, L, N, channels, batch)
    check_backends(api, array_backend(u), (; named..., reset))
    return nothing
end

"""
    mamba_selective_scan!(y, u, delta, A, B, C; D = nothing, z = nothing,
                          delta_bias = nothing, delta_softplus = false, h0 = nothing,
                          h_last = nothing, cu_seqlens = nothing, reset = nothing,
                          workgroupsize = nothing, chunk = nothing, workspace = nothing) -> y

In-place [`mamba_selective_scan`](@ref): writes `y` (the size of `u`) and,
when given, the final states `h_last` `(N, D, batch)`. `reset` (a vector of
`L` flags on `u`'s device) is what `cu_seqlens` becomes; give one or neither.
"""
function mamba_selective_scan!(
    y,
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
    h_last = nothing,
    cu_seqlens = nothing,
    reset = nothing,
    workgroupsize = nothing,
    chunk = nothing,
    workspace = nothing,
)
    api = :mamba_selective_scan!
    if cu_seqlens !== nothing
        reset === nothing ||
            throw(ArgumentError("$api: give cu_seqlens or reset, not both"))
        host = seqlens_reset(api, cu_seqlens, size(u, 1))
        reset = copyto!(
            KernelAbstractions.allocate(array_backend(u), Bool, size(host)),
            host,
        )
    end
    check_mamba(api, y, h_last, u, delta, A, B, C, D, z, delta_bias, h0, reset)
    check_tunables(api, (; workgroupsize, chunk))
    backend = array_backend(u)
    L, channels, batch = size(u)
    if L == 0 || channels * batch == 0
        h_last === nothing ||
            (h0 === nothing ? fill!(h_last, zero(eltype(h_last))) : copyto!(h_last, h0))
        return y
    end
    wg = something(
        workgroupsize,
        min(DEFAULT_MAMBA_WORKGROUP_SIZE, max_workgroupsize(backend)),
    )
    s = MambaChunks(wg, something(chunk, default_mamba_chunk(backend, L, channels * batch)))
    check_mamba_chunks(api, s, backend)
    ops = MambaOperands(u, delta, A, B, C, D, z, delta_bias, h0, reset, delta_softplus)
    launch_mamba!(
        s,
        backend,
        y,
        h_last,
        ops,
        Val(size(A, 1));
        workspace = something(workspace, ScanWorkspace()),
    )
    return y
end

"""
    mamba_selective_scan(u, delta, A, B, C; D = nothing, z = nothing,
                         delta_bias = nothing, delta_softplus = false, h0 = nothing,
                         return_state = false, cu_seqlens = nothing,
                         workgroupsize = nothing, chunk = nothing)

The Mamba-1 selective scan (S6) with the semantics of `mamba_ssm`'s
`selective_scan_ref`, fused into one kernel pass: per batch element `b`,
channel `d` and state `n`,

    dt_t   = softplus(delta_t[d] + delta_bias[d])          (bias, softplus optional)
    h_t[n] = exp(dt_t * A[d, n]) * h_{t-1}[n] + dt_t * B_t[n] * u_t[d]
    y_t[d] = (sum_n C_t[n] * h_t[n] + D[d] * u_t[d]) * silu(z_t[d])

with the `N` states of a channel in registers; nothing of size
`(batch, D, N, L)` is ever stored. Layouts are the Python ones with the
dimensions reversed (time first, contiguous): `u`, `delta`, `z` are
`(L, D, batch)`; `A` is `(N, D)`; `B` and `C` are `(N, D)` (fixed),
`(L, N, batch)` (per step) or `(L, N, G, batch)` (`G` groups of `D ÷ G`
channels); `D`, `delta_bias` are `(D,)`; `h0` and the returned state
`(N, D, batch)`. `cu_seqlens` packs sequences along `L` (each starts from a
zero state). `y` has `u`'s element type; the state is returned in the compute
type (`Float32` for 16-bit inputs). `workgroupsize` and `chunk` (time steps
per work-item) are the kernels' tunables, passed as `Val`s.

# Examples
```julia-repl
julia> L, D, N = 8, 3, 4; u = randn(Float32, L, D, 1); delta = rand(Float32, L, D, 1);

julia> A = -rand(Float32, N, D); B = randn(Float32, L, N, 1); C = randn(Float32, L, N, 1);

julia> y, h = mamba_selective_scan(u, delta, A, B, C; D = ones(Float32, D), return_state = true);

julia> size(y), size(h)
((8, 3, 1), (4, 3, 1))
```
"""
function mamba_selective_scan(u, delta, A, B, C; return_state::Bool = false, kwargs...)
    if !(u isa AbstractArray) || ndims(u) != 3
        throw(ArgumentError(
            "mamba_selective_scan: u must be an (L, D, batch) array, got $(typeof(u))",
        ))
    end
    y = similar(u)
    if !return_state
        mamba_selective_scan!(y, u, delta, A, B, C; kwargs...)
        return y
    end
    T = accumulator_type(promote_type(
        eltype(u),
        eltype(delta),
        eltype(A),
        eltype(B),
        eltype(C),
    ))
    h_last = similar(u, T, (size(A, 1), size(u, 2), size(u, 3)))
    mamba_selective_scan!(y, u, delta, A, B, C; h_last, kwargs...)
    return y, h_last
end

"""
    mamba_selective_scan(u, delta, A, B, C, D, z = nothing, delta_bias = nothing,
                         h0 = nothing; kwargs...)

[`mamba_selective_scan`](@ref) with `D`, `z`, `delta_bias` and `h0`
positional (`nothing` where absent), the form whose ChainRules rule
differentiates them too.
"""
function mamba_selective_scan(
    u,
    delta,
    A,
    B,
    C,
    D,
    z = nothing,
    delta_bias = nothing,
    h0 = nothing;
    kwargs...,
)
    return mamba_selective_scan(u, delta, A, B, C; D, z, delta_bias, h0, kwargs...)
end
