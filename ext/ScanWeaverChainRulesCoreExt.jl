module ScanWeaverChainRulesCoreExt

using ChainRulesCore: ChainRulesCore, AbstractZero, NoTangent, ProjectTo, unthunk
using ScanWeaver: ScanWeaver, mamba_selective_scan, matrix_state_scan, selective_scan

"""
    ChainRulesCore.rrule(::typeof(selective_scan), a, b, x[, c[, h0]]; kwargs...)

Reverse-mode rule for [`selective_scan`](@ref), so that Zygote, Flux, Lux and
other ChainRules users can train through it. The pullback is
`ScanWeaver.selective_scan_pullback`: the states are recomputed, and the
gradient `g = dL/dh` is scanned in the opposite direction on the same
KernelAbstractions kernels (and the same schedule and tunables). Cotangents
flow to the positional arguments; pass `h0` positionally (the five-argument
`selective_scan`) to get its cotangent, as keyword arguments are not
differentiated. `reset` gets none (flags).
"""
function ChainRulesCore.rrule(::typeof(selective_scan), a, b, x; kwargs...)
    return scan_rrule(3, a, b, x, nothing; kwargs...)
end
function ChainRulesCore.rrule(::typeof(selective_scan), a, b, x, c; kwargs...)
    return scan_rrule(4, a, b, x, c; kwargs...)
end
function ChainRulesCore.rrule(::typeof(selective_scan), a, b, x, c, h0; kwargs...)
    return scan_rrule(5, a, b, x, c; h0, kwargs...)
end

"A cotangent as an array, or `nothing` for a zero cotangent."
dense_cotangent(d) = unthunk(d)
dense_cotangent(::AbstractZero) = nothing

"`(dy, dh_last)` from the output's cotangent `Δ`: a tuple's when the scan returned its state."
function output_cotangents(Δ, return_state::Bool)
    Δ = unthunk(Δ)
    return_state || return (dense_cotangent(Δ), nothing)
    Δ isa AbstractZero && return (nothing, nothing)
    return (dense_cotangent(Δ[1]), dense_cotangent(Δ[2]))
end

"`d` in `A`'s element type and shape; `NoTangent()` for an absent operand."
project_cotangent(::Nothing, d) = NoTangent()
project_cotangent(A::AbstractArray{<:Number}, d) = ProjectTo(A)(d)
project_cotangent(A::AbstractArray, d) = convert.(eltype(A), d)

function scan_rrule(nargs::Int, a, b, x, c; return_state::Bool = false, kwargs...)
    out = selective_scan(a, b, x, c; return_state, kwargs...)
    function selective_scan_pullback(Δ)
        dy, dh_last = output_cotangents(Δ, return_state)
        d = ScanWeaver.selective_scan_pullback(dy, dh_last, a, b, x, c; kwargs...)
        h0 = get(kwargs, :h0, nothing)
        tangents = (
            NoTangent(),
            project_cotangent(a, d.a),
            project_cotangent(b, d.b),
            project_cotangent(x, d.x),
            project_cotangent(c, d.c),
            project_cotangent(h0, d.h0),
        )
        return tangents[1:(nargs + 1)]
    end
    return out, selective_scan_pullback
end

"""
    ChainRulesCore.rrule(::typeof(matrix_state_scan), q, k, v[, g[, u[, h0]]]; kwargs...)

Reverse-mode rule for [`matrix_state_scan`](@ref): the pullback is
`ScanWeaver.matrix_state_backward` (the states recomputed, never stored).
Cotangents flow to the positional arguments; pass `g`, `u` and `h0`
positionally (`nothing` where absent) to get theirs, as keyword arguments are
not differentiated.
"""
function ChainRulesCore.rrule(::typeof(matrix_state_scan), q, k, v; kwargs...)
    return matrix_rrule(3, q, k, v, nothing, nothing, nothing; kwargs...)
end
function ChainRulesCore.rrule(::typeof(matrix_state_scan), q, k, v, g; kwargs...)
    return matrix_rrule(4, q, k, v, g, nothing, nothing; kwargs...)
end
function ChainRulesCore.rrule(::typeof(matrix_state_scan), q, k, v, g, u; kwargs...)
    return matrix_rrule(5, q, k, v, g, u, nothing; kwargs...)
end
function ChainRulesCore.rrule(::typeof(matrix_state_scan), q, k, v, g, u, h0; kwargs...)
    return matrix_rrule(6, q, k, v, g, u, h0; kwargs...)
end

"The output's cotangent as an array the kernels read (zeros for a zero cotangent)."
dense_output(like, ::Nothing) = fill!(similar(like), zero(eltype(like)))
dense_output(like, d) = ScanWeaver.dense_like(like, d)

"A state cotangent the kernels read, or `nothing`."
dense_state(like, ::Nothing) = nothing
dense_state(like, d) = ScanWeaver.dense_like(like, d)

function matrix_rrule(nargs::Int, q, k, v, g, u, h0; return_state::Bool = false, kwargs...)
    out = matrix_state_scan(q, k, v; g, u, h0, return_state, kwargs...)
    function matrix_state_scan_pullback(Δ)
        dout, dhlast = output_cotangents(Δ, return_state)
        hl = return_state ? out[2] : nothing
        d = ScanWeaver.matrix_state_backward(
            q,
            k,
            v,
            dense_output(v, dout);
            g,
            u,
            h0,
            dhlast = dense_state(hl, dhlast),
            kwargs...,
        )
        tangents = (
            NoTangent(),
            project_cotangent(q, d.dq),
            project_cotangent(k, d.dk),
            project_cotangent(v, d.dv),
            project_cotangent(g, d.dg),
            project_cotangent(u, d.du),
            project_cotangent(h0, d.dh0),
        )
        return tangents[1:(nargs + 1)]
    end
    return out, matrix_state_scan_pullback
end

"""
    ChainRulesCore.rrule(::typeof(mamba_selective_scan), u, delta, A, B, C[, D[, z[, delta_bias[, h0]]]]; kwargs...)

Reverse-mode rule for [`mamba_selective_scan`](@ref): the pullback is
`ScanWeaver.mamba_selective_backward` (the fused backward, states recomputed
from checkpoints). Cotangents flow to the positional arguments; pass `D`, `z`,
`delta_bias` and `h0` positionally (`nothing` where absent) to get theirs.
"""
function ChainRulesCore.rrule(::typeof(mamba_selective_scan), u, delta, A, B, C; kwargs...)
    return mamba_rrule(5, u, delta, A, B, C, nothing, nothing, nothing, nothing; kwargs...)
end
function ChainRulesCore.rrule(
    ::typeof(mamba_selective_scan),
    u,
    delta,
    A,
    B,
    C,
    D;
    kwargs...,
)
    return mamba_rrule(6, u, delta, A, B, C, D, nothing, nothing, nothing; kwargs...)
end
function ChainRulesCore.rrule(
    ::typeof(mamba_selective_scan),
    u,
    delta,
    A,
    B,
    C,
    D,
    z;
    kwargs...,
)
    return mamba_rrule(7, u, delta, A, B, C, D, z, nothing, nothing; kwargs...)
end
function ChainRulesCore.rrule(
    ::typeof(mamba_selective_scan),
    u,
    delta,
    A,
    B,
    C,
    D,
    z,
    delta_bias;
    kwargs...,
)
    return mamba_rrule(8, u, delta, A, B, C, D, z, delta_bias, nothing; kwargs...)
end
function ChainRulesCore.rrule(
    ::typeof(mamba_selective_scan),
    u,
    delta,
    A,
    B,
    C,
    D,
    z,
    delta_bias,
    h0;
    kwargs...,
)
    return mamba_rrule(9, u, delta, A, B, C, D, z, delta_bias, h0; kwargs...)
end

function mamba_rrule(
    nargs::Int,
    u,
    delta,
    A,
    B,
    C,
    D,
    z,
    delta_bias,
    h0;
    return_state::Bool = false,
    chunk = nothing,
    kwargs...,
)
    out = mamba_selective_scan(
        u,
        delta,
        A,
        B,
        C;
        D,
        z,
        delta_bias,
        h0,
        return_state,
        chunk,
        kwargs...,
    )
    function mamba_selective_scan_pullback(Δ)
        dout, dh_last = output_cotangents(Δ, return_state)
        hl = return_state ? out[2] : nothing
        d = ScanWeaver.mamba_selective_backward(
            dense_output(u, dout),
            u,
            delta,
            A,
            B,
            C;
            D,
            z,
            delta_bias,
            h0,
            dh_last = dense_state(hl, dh_last),
            kwargs...,
        )
        tangents = (
            NoTangent(),
            project_cotangent(u, d.du),
            project_cotangent(delta, d.ddelta),
            project_cotangent(A, d.dA),
            project_cotangent(B, d.dB),
            project_cotangent(C, d.dC),
            project_cotangent(D, d.dD),
            project_cotangent(z, d.dz),
            project_cotangent(delta_bias, d.ddelta_bias),
            project_cotangent(h0, d.dh0),
        )
        return tangents[1:(nargs + 1)]
    end
    return out, mamba_selective_scan_pullback
end

end
