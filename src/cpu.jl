# The CPU's own scan. KernelAbstractions' CPU backend runs a kernel by
# emulating GPU workgroups on Julia tasks; a scan runs on a CPU as plain
# threaded loops instead: lanes split over Julia's threads, each lane one loop
# in scan order; a few long lanes are split in time too (each chunk's aggregate
# pair, a carry pass per lane, then every chunk replayed from its carry-in).
# `Sequential`, the schedule `:auto` picks on the CPU, takes this path on
# `CPU()`; the other schedules, and every schedule on a GPU, run the
# KernelAbstractions kernels. The loops use the kernels' own element helpers
# (`load_pair`, `store_output!`, ...), so both paths compute the same thing.

"Fewest time steps per chunk when [`cpu_scan!`](@ref) splits lanes in time."
const CPU_CHUNK_MIN = 2^14

@inline function replay_range!(y, ops, ::Type{P}, L, reversed, lane, ks, h) where {P}
    for k in ks
        t = time_index(k, L, reversed)
        h = apply_pair(load_pair(P, ops, t, lane), h)
        store_output!(y, ops.c, h, t, lane)
    end
    return h
end

@inline function reduce_range(ops, ::Type{P}, L, reversed, lane, ks) where {P}
    acc = identity_pair(P)
    for k in ks
        acc = compose(load_pair(P, ops, time_index(k, L, reversed), lane), acc)
    end
    return acc
end

"""
    cpu_scan!(y, h_last, ops::ScanOperands, reversed::Bool)

The scan of `ops` on the host in Julia threads (see the top of `src/cpu.jl`):
one loop per lane while there are at least as many lanes as threads or the
lanes are short, else each lane split into up to `Threads.nthreads()` chunks of
at least [`CPU_CHUNK_MIN`](@ref) steps.

# Examples
```julia-repl
julia> a = fill(0.5, 4, 1); b = ones(4, 1); y = similar(a);

julia> ScanWeaver.cpu_scan!(y, nothing, ScanWeaver.ScanOperands(a, b, nothing, nothing, nothing, nothing), false);

julia> vec(y)
4-element Vector{Float64}:
 1.0
 1.5
 1.75
 1.875
```
"""
function cpu_scan!(y, h_last, ops::ScanOperands, reversed::Bool)
    lanes, L = scan_lanes(ops), scan_length(ops)
    P = pair_type(ops)
    S = fieldtype(P, :U)
    threads = Threads.nthreads()
    nchunks = lanes >= threads ? 1 : clamp(fld(L, CPU_CHUNK_MIN), 1, cld(threads, lanes))
    if nchunks == 1
        Threads.@threads for lane in 1:lanes
            h = replay_range!(
                y,
                ops,
                P,
                L,
                reversed,
                lane,
                1:L,
                initial_state(S, ops.h0, lane),
            )
            store_state!(h_last, h, lane)
        end
        return nothing
    end
    chunk = cld(L, nchunks)
    agg = Matrix{P}(undef, nchunks, lanes)
    Threads.@threads for g in 1:(nchunks * lanes)
        j, lane = chunk_of(g, nchunks), lane_of(g, nchunks)
        @inbounds agg[j, lane] = reduce_range(
            ops,
            P,
            L,
            reversed,
            lane,
            chunk_range(j, chunk, L),
        )
    end
    carry = Matrix{S}(undef, nchunks, lanes)
    for lane in 1:lanes
        h = initial_state(S, ops.h0, lane)
        for j in 1:nchunks
            @inbounds carry[j, lane] = h
            h = apply_pair(@inbounds(agg[j, lane]), h)
        end
        store_state!(h_last, h, lane)
    end
    Threads.@threads for g in 1:(nchunks * lanes)
        j, lane = chunk_of(g, nchunks), lane_of(g, nchunks)
        h = @inbounds carry[j, lane]
        replay_range!(y, ops, P, L, reversed, lane, chunk_range(j, chunk, L), h)
    end
    return nothing
end

function launch!(s::Sequential, backend::CPU, y, h_last, ops, reversed; workspace = nothing)
    cpu_scan!(y, h_last, ops, reversed)
    return nothing
end
