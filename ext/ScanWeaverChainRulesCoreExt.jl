module ScanWeaverChainRulesCoreExt

using ChainRulesCore: ChainRulesCore, AbstractZero, NoTangent, ProjectTo, unthunk
using ScanWeaver: ScanWeaver, selective_scan

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

end
