# The CPU's own scan. KernelAbstractions' CPU backend runs a kernel by
# emulating GPU workgroups on Julia tasks; a scan runs on a CPU as plain
# threaded loops instead.
#
# Dense `Float32`/`Float64` matrices without a reset take SIMD loops
# (`src/cpu_simd.jl`): a lane advanced a vector of steps at a time. Every
# other scan takes the scalar loops:
#
# - Lanes go to the tasks, each lane whole on one task: with SIMD, one lane
#   after another; else two at a time in one loop (`scan_lane_pair!`), the
#   second `CPU_SKEW` steps behind the first. Each scalar step is one fused
#   multiply-add (`cpu_muladd`), and one lane's chain of them is bound by that
#   instruction's latency; two chains in one loop overlap, which made scans
#   that fit the cache 1.8x faster at (L, lanes) = (1024, 16) and kept the
#   speed from memory. The skew matters: lanes lie `L` elements apart, often a
#   multiple of 4 KiB, so in step their lines fall in one cache set and evict
#   each other (8 lanes in step were measured 1.6-4x slower; 3 or 4 skewed
#   lanes were slower than 2).
# - A few long lanes are split among the tasks by blocks of `CPU_BLOCK` steps,
#   round-robin, as a chained scan: a block is reduced to its aggregate pair,
#   waits for its carry-in (an atomic counter), publishes its carry-out and
#   then gets its outputs from its carry-in out of the L2 cache. With SIMD
#   that is two passes (`simd_scan_block!`): the block scanned from the state
#   zero into a scratch of local states and products of transitions (its
#   aggregate is the last of them), then each output fixed up by one
#   elementwise multiply-add with the carry-in. That measured 1.2x the
#   earlier reduce-then-rescan on one lane of 2^24, whose reduce cost most of
#   a scan. A block whose products grow past 1 (where the fix-up could cancel)
#   is scanned again from its carry-in instead, and its carry-out taken from
#   that scan. Without SIMD, four passes (`scan_block!`):
#   1. pack: read the block's pairs once, in order, into a scratch block of
#      `cpu_width` sub-chunks side by side (`A[w, j]` is step `j` of
#      sub-chunk `w`, so step `j` of all of them is one SIMD vector);
#   2. reduce the sub-chunks, one column at a time, to their aggregate pairs;
#   3. wait for the block's carry-in, give each sub-chunk its start and
#      publish the block's carry-out at once;
#   4. replay the columns from those starts out of the cache, then write the
#      outputs in order.
#   So every element is read from memory once, and the tasks wait on each
#   other only for the carries.
#
# `Sequential`, the schedule `:auto` picks on the CPU, takes this path on
# `CPU()`; the other schedules, and every schedule on a GPU, run the
# KernelAbstractions kernels. The loops use the kernels' own element helpers
# (`load_pair`, `store_output!`, ...), so both paths compute the same thing.

"Steps per block of a lane split among tasks in [`cpu_scan!`](@ref): a block's scratch fits the L2 cache."
const CPU_BLOCK = 2^14

"Fewest elements a scan needs before [`cpu_scan!`](@ref) uses more than one task."
const CPU_PARALLEL_MIN = 2^15

"Fewest steps per sub-chunk worth the four passes; shorter blocks run as one loop."
const CPU_SUB_MIN = 16

"Steps the second lane of a pair runs behind the first in [`cpu_scan!`](@ref) (64 bytes of `Float32`)."
const CPU_SKEW = 16

"""
    cpu_width(P)

How many sub-chunks of a block [`cpu_scan!`](@ref) advances together for
pairs of type `P`: 8 for real scalar pairs (one AVX2 register of `Float32`,
and enough independent chains to hide the multiply-add latency), 4 for wider
states (complex, vectors, dense transitions), whose registers fill sooner.
"""
cpu_width(::Type{AffinePair{TA, TU}}) where {TA <: Real, TU <: Real} = 8
cpu_width(::Type{<:AffinePair}) = 4

"""
    CPUScan{P}(y, ops, reversed)

One scan on the host: the output, the operands and the direction, with the
pair type `P` and the direction as type parameters (so `time_index` folds to
one order and the passes vectorise). The loops take it as their one argument
and dispatch on it, so every type is inferred from it.
"""
struct CPUScan{P, R, Y, O}
    y::Y
    ops::O
    L::Int
end
function CPUScan{P}(y, ops, reversed::Bool) where {P}
    return CPUScan{P, reversed, typeof(y), typeof(ops)}(y, ops, scan_length(ops))
end

cpu_pair_type(::CPUScan{P}) where {P} = P
cpu_state_type(::CPUScan{AffinePair{TA, TU}}) where {TA, TU} = TU
initial_state(s::CPUScan, l) = initial_state(cpu_state_type(s), s.ops.h0, l)
@inline cpu_time(s::CPUScan{P, R}, k) where {P, R} = time_index(k, s.L, R)

# The state after the element at time `t` of lane `l`, no output.
@inline function advance_at(s::CPUScan{P}, l, t, h) where {P}
    p = load_pair(P, s.ops, t, l)
    return cpu_muladd(p.A, h, p.U)
end
@inline advance(s::CPUScan, l, k, h) = advance_at(s, l, cpu_time(s, k), h)

# One step at scan position `k` of lane `l`, writing its output.
@inline function scan_step!(s::CPUScan, l, k, h)
    t = cpu_time(s, k)
    h = advance_at(s, l, t, h)
    store_output!(s.y, s.ops.c, h, t, l)
    return h
end

"""
    CPUBlock(s::CPUScan, Val(W))

A task's scratch for one block of `W` sub-chunks: their transitions `A`,
offsets `U` and states `h`, `W x sub` each, sub-chunk `w` in row `w`, so that
step `j` of every sub-chunk is one column, one SIMD vector.
"""
struct CPUBlock{TA, TS}
    A::Matrix{TA}
    U::Matrix{TS}
    h::Matrix{TS}
end
function CPUBlock(s::CPUScan{AffinePair{TA, TS}}, ::Val{W}) where {TA, TS, W}
    rows = cld(CPU_BLOCK, W)
    return CPUBlock{TA, TS}(
        Matrix{TA}(undef, W, rows),
        Matrix{TS}(undef, W, rows),
        Matrix{TS}(undef, W, rows),
    )
end

# `a * h + u`, fused where the types allow (one rounding; the chain's latency
# is one instruction).
@inline cpu_muladd(a::Number, h::Number, u::Number) = muladd(a, h, u)
@inline cpu_muladd(a, h, u) = a * h + u

# Pass 1: sub-chunk `w` of the block at `first` is positions
# `first + (w - 1) * sub .+ (0:sub-1)`, read in order.
function pack_block!(blk::CPUBlock, s::CPUScan{P}, l, first, sub, ::Val{W}) where {P, W}
    for w in 1:W
        k0 = first + (w - 1) * sub - 1
        for j in 1:sub
            p = load_pair(P, s.ops, cpu_time(s, k0 + j), l)
            @inbounds blk.A[w, j] = p.A
            @inbounds blk.U[w, j] = p.U
        end
    end
    return nothing
end

# Column `j` of the block composed after the aggregates `(As, Us)`, and
# applied to the states `hs`. The tuples are arguments, never reassigned here,
# so the closures box nothing.
@inline function compose_row(blk::CPUBlock, j, As::NTuple{W}, Us::NTuple{W}) where {W}
    A = ntuple(w -> @inbounds(blk.A[w, j]) * As[w], Val(W))
    U = ntuple(
        w -> cpu_muladd(@inbounds(blk.A[w, j]), Us[w], @inbounds(blk.U[w, j])),
        Val(W),
    )
    return A, U
end
@inline function apply_row!(blk::CPUBlock, j, hs::NTuple{W}) where {W}
    next = ntuple(
        w -> cpu_muladd(@inbounds(blk.A[w, j]), hs[w], @inbounds(blk.U[w, j])),
        Val(W),
    )
    for w in 1:W
        @inbounds blk.h[w, j] = next[w]
    end
    return next
end

# Pass 2: the sub-chunks' aggregate pairs.
function reduce_block(blk::CPUBlock, ::Type{P}, sub, ::Val{W}) where {P, W}
    id = identity_pair(P)
    As, Us = ntuple(_ -> id.A, Val(W)), ntuple(_ -> id.U, Val(W))
    for j in 1:sub
        As, Us = compose_row(blk, j, As, Us)
    end
    return map(P, As, Us)
end

# Pass 4: the columns replayed from the sub-chunks' starts, then the outputs.
function replay_block!(blk::CPUBlock, s::CPUScan, l, first, sub, hs::NTuple{W}) where {W}
    for j in 1:sub
        hs = apply_row!(blk, j, hs)
    end
    for w in 1:W
        k0 = first + (w - 1) * sub - 1
        for j in 1:sub
            store_output!(s.y, s.ops.c, @inbounds(blk.h[w, j]), cpu_time(s, k0 + j), l)
        end
    end
    return hs
end

# `p` applied to the carry `h`. A zero carry (the usual initial state) gives
# `p`'s offset even where `p`'s transition has overflowed: `Inf * 0` would be
# `NaN`, and spread to every later output.
@inline carry_state(p::AffinePair, h) = iszero(h) ? p.U : apply_pair(p, h)

# The sub-chunks' starts for carry-in `h` and aggregates `aggs`, and the state
# after the last sub-chunk.
@inline sub_chunk_starts(::Tuple{}, h) = ((), h)
@inline function sub_chunk_starts(aggs::Tuple, h)
    rest, last = sub_chunk_starts(Base.tail(aggs), carry_state(aggs[1], h))
    return (h, rest...), last
end

# Positions `first:last` of lane `l` as one loop from state `h`.
function scan_range!(s::CPUScan, l, first, last, h)
    for k in first:last
        h = scan_step!(s, l, k, h)
    end
    return h
end

"Spins of [`wait_for_carry`](@ref) before it also yields its CPU to the OS."
const CARRY_SPINS = 4096

# Raised in a task of a chained scan whose carry-in will never come (a task
# before it failed); `run_tasks` reports the failure itself instead.
struct CarryAbandoned <: Exception end

# Spins until `ready[] >= b`, pausing the core and yielding now and then, so
# that tasks sharing one thread still make progress; after a few thousand
# spins it also gives its CPU back to the OS (`sched_yield`): on a machine with
# more runnable threads than cores the task that owes the carry may be waiting
# for a CPU, and spinning through a whole time slice stalled every block of a
# long lane (up to 500 ns/element at 2^24 with other processes running).
# `ready[]` only grows (`atomic_max!`); a failed task sets it to `typemax(Int)`.
function wait_for_carry(ready::Threads.Atomic{Int}, b)
    spins = 0
    while ready[] < b
        ccall(:jl_cpu_pause, Cvoid, ())
        spins += 1
        if spins % 256 == 0
            yield()
            spins >= CARRY_SPINS && ccall(:sched_yield, Cint, ())
        end
    end
    ready[] == typemax(Int) && throw(CarryAbandoned())
    return nothing
end

publish_carry!(ready::Threads.Atomic{Int}, b) = (Threads.atomic_max!(ready, b + 1); nothing)

"""
    scan_block!(s, blk, l, b, carries, ready, Val(W))

Block `b` of lane `l` in a chained scan, in the four passes: packs and
reduces it; once `ready[] >= b` (the carry-in `carries[b]` is there), stores
the carry-out in `carries[b + 1]` and raises `ready[]` to `b + 1`; then replays it
out of the cache and writes its outputs. A block too short for `W` sub-chunks
of [`CPU_SUB_MIN`](@ref) steps runs as one loop after its carry-in.
"""
function scan_block!(s::CPUScan{P}, blk, l, b, carries, ready, ::Val{W}) where {P, W}
    first, last = (b - 1) * CPU_BLOCK + 1, min(b * CPU_BLOCK, s.L)
    sub = fld(last - first + 1, W)
    if sub < CPU_SUB_MIN
        wait_for_carry(ready, b)
        @inbounds carries[b + 1] = scan_range!(s, l, first, last, carries[b])
        publish_carry!(ready, b)
        return nothing
    end
    pack_block!(blk, s, l, first, sub, Val(W))
    aggs = reduce_block(blk, P, sub, Val(W))
    wait_for_carry(ready, b)
    starts, h = sub_chunk_starts(aggs, @inbounds(carries[b]))
    tail = first + W * sub # the steps past the last sub-chunk, fewer than W
    for k in tail:last
        h = advance(s, l, k, h)
    end
    @inbounds carries[b + 1] = h
    publish_carry!(ready, b)
    hs = replay_block!(blk, s, l, first, sub, starts)
    scan_range!(s, l, tail, last, hs[W])
    return nothing
end

# Runs `f(task)` for `task in 1:n`, on the calling task when `n == 1`, and
# rethrows the first failure as itself (not wrapped in a `TaskFailedException`),
# passing over the tasks that only gave up waiting for it.
function run_tasks(f, n)
    n == 1 && return f(1)
    try
        @sync for task in 1:n
            Threads.@spawn f(task)
        end
    catch e
        e isa CompositeException || rethrow()
        inner = [x isa TaskFailedException ? x.task.exception : x for x in e.exceptions]
        throw(inner[something(findfirst(x -> !(x isa CarryAbandoned), inner), 1)])
    end
    return nothing
end

# Lanes `l` and `l + 1` in one loop, lane `l + 1` `CPU_SKEW` steps behind
# (see the top of the file): lane `l` runs its first `CPU_SKEW` steps alone,
# then both advance together, then lane `l + 1` runs its last ones alone.
function scan_lane_pair!(s::CPUScan, h_last, l)
    L, d = s.L, CPU_SKEW
    h1 = scan_range!(s, l, 1, d, initial_state(s, l))
    h2 = initial_state(s, l + 1)
    for k in 1:(L - d)
        h1 = scan_step!(s, l, k + d, h1)
        h2 = scan_step!(s, l + 1, k, h2)
    end
    store_state!(h_last, h1, l)
    store_state!(h_last, scan_range!(s, l + 1, L - d + 1, L, h2), l + 1)
    return nothing
end

# Lanes `first:last` one after another, each `W` steps at a time
# (`src/cpu_simd.jl`).
function scan_lanes_simd!(s::CPUScan, h_last, first, last, ::Val{W}) where {W}
    for l in first:last
        store_state!(h_last, simd_scan_range!(s, l, 1, s.L, initial_state(s, l), Val(W)), l)
    end
    return nothing
end

# Lanes shared among `tasks` tasks, each lane whole on one task: with SIMD
# where it applies, else in pairs where the lanes are long enough for the skew
# to matter little.
function scan_many_lanes!(s::CPUScan, h_last, tasks)
    lanes = scan_lanes(s.ops)
    per = cld(lanes, tasks)
    W = simd_width(s)
    run_tasks(cld(lanes, per)) do task
        l, last = (task - 1) * per + 1, min(task * per, lanes)
        W > 0 && return scan_lanes_simd!(s, h_last, l, last, Val(W))
        if s.L >= 4 * CPU_SKEW
            while l < last
                scan_lane_pair!(s, h_last, l)
                l += 2
            end
        end
        for m in l:last
            store_state!(h_last, scan_range!(s, m, 1, s.L, initial_state(s, m)), m)
        end
    end
    return nothing
end

"""
    simd_scan_block!(s, hl, P, l, b, carries, ready, Val(W))

Block `b` of lane `l` in a chained scan with SIMD (`src/cpu_simd.jl`), in two
passes: scans the block from the state zero into the scratch `hl` and `P`
(`simd_local_scan!`), reading it from memory; once `ready[] >= b`, stores the
carry-out in `carries[b + 1]` and raises `ready[]` to `b + 1`; then writes the
outputs from the carry-in out of the cache (`simd_fixup!`). Where a product
of the block's transitions grew past 1 in magnitude (and the carry-in is not
zero), it scans the block again from the carry-in instead, before the
carry-out.
"""
function simd_scan_block!(s::CPUScan, hl, P, l, b, carries, ready, ::Val{W}) where {W}
    first, last = (b - 1) * CPU_BLOCK + 1, min(b * CPU_BLOCK, s.L)
    agg, bounded = simd_local_scan!(hl, P, s, l, first, last, Val(W))
    wait_for_carry(ready, b)
    h = @inbounds carries[b]
    if bounded || iszero(h)
        @inbounds carries[b + 1] = carry_state(agg, h)
        publish_carry!(ready, b)
        simd_fixup!(s, l, first, last, hl, P, h, Val(W))
    else
        # growing transitions: the block again from its carry-in, and its
        # carry-out from that scan, as a loop would (the next block waits)
        @inbounds carries[b + 1] = simd_scan_range!(s, l, first, last, h, Val(W))
        publish_carry!(ready, b)
    end
    return nothing
end

# The blocks `task:ntasks:nblocks` of lane `l` (see `scan_long_lane!`).
function scan_task_blocks!(s::CPUScan, l, task, ntasks, nblocks, carries, ready)
    W = simd_width(s)
    if W > 0
        T = cpu_state_type(s)
        hl, P = Vector{T}(undef, CPU_BLOCK), Vector{T}(undef, CPU_BLOCK)
        for b in task:ntasks:nblocks
            simd_scan_block!(s, hl, P, l, b, carries, ready, Val(W))
        end
        return nothing
    end
    V = cpu_width(cpu_pair_type(s))
    blk = CPUBlock(s, Val(V))
    for b in task:ntasks:nblocks
        scan_block!(s, blk, l, b, carries, ready, Val(V))
    end
    return nothing
end

# One lane split among `tasks` tasks by blocks, as a chained scan.
function scan_long_lane!(s::CPUScan, h_last, l, tasks)
    nblocks = cld(s.L, CPU_BLOCK)
    carries = Vector{cpu_state_type(s)}(undef, nblocks + 1)
    carries[1] = initial_state(s, l)
    ready = Threads.Atomic{Int}(1)
    ntasks = min(tasks, nblocks)
    run_tasks(ntasks) do task
        try
            scan_task_blocks!(s, l, task, ntasks, nblocks, carries, ready)
        catch
            Threads.atomic_max!(ready, typemax(Int)) # release the tasks waiting for a carry
            rethrow()
        end
    end
    store_state!(h_last, carries[nblocks + 1], l)
    return nothing
end

"""
    cpu_scan!(y, h_last, ops::ScanOperands, reversed::Bool; tasks = Threads.nthreads())

The scan of `ops` on the host in Julia threads (see the top of `src/cpu.jl`):
whole lanes per task while there are at least as many lanes as tasks, else
each lane split among the tasks as a chained scan over its blocks of
[`CPU_BLOCK`](@ref) steps. Scans of fewer than [`CPU_PARALLEL_MIN`](@ref)
elements run on the calling task.

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
function cpu_scan!(
    y,
    h_last,
    ops::ScanOperands,
    reversed::Bool;
    tasks::Integer = Threads.nthreads(),
)
    tasks >= 1 || throw(ArgumentError("cpu_scan!: tasks must be at least 1, got $tasks"))
    lanes, L = scan_lanes(ops), scan_length(ops)
    tasks = lanes * L < CPU_PARALLEL_MIN ? 1 : Int(tasks)
    s = CPUScan{pair_type(ops)}(y, ops, reversed)
    if lanes >= tasks || L < 2 * CPU_BLOCK
        scan_many_lanes!(s, h_last, min(tasks, lanes))
    else
        for l in 1:lanes
            scan_long_lane!(s, h_last, l, tasks)
        end
    end
    return nothing
end

function launch!(s::Sequential, backend::CPU, y, h_last, ops, reversed; workspace = nothing)
    cpu_scan!(y, h_last, ops, reversed)
    return nothing
end
