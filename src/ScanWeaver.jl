module ScanWeaver

using Adapt: Adapt
using KernelAbstractions
using KernelAbstractions: Backend, CPU, get_backend
using StaticArrays: SArray, SVector, StaticArray, StaticMatrix, StaticVector

export AffinePair, compose, apply_pair, identity_pair, accumulator_type
export selective_scan, selective_scan!, SCHEDULES
export ScanSchedule, Sequential, Blelloch, Hybrid, ReduceThenScan
export elapsed_ms, time_scan, tune_scan
export mamba_selective_scan, mamba_selective_scan!
export mamba_selective_backward, mamba_selective_backward!
export matrix_state_scan, matrix_state_scan!, matrix_state_backward, matrix_state_backward!
export delta_rule_scan, delta_rule_scan!, delta_rule_backward!

include("pairs.jl")
include("operands.jl")
include("elements.jl")
include("limits.jl")
include("schedules.jl")
include("kernels/sequential.jl")
include("kernels/blelloch.jl")
include("kernels/hybrid.jl")
include("kernels/reduce_then_scan.jl")
include("cpu.jl")
include("cpu_simd.jl")
include("items.jl")
include("registry.jl")
include("validate.jl")
include("api.jl")
include("gradients.jl")
include("timing.jl")
include("devices.jl")
include("host_entry.jl")
include("mamba/elements.jl")
include("mamba/kernels.jl")
include("mamba/api.jl")
include("mamba/backward.jl")
include("mamba/pullback.jl")
include("mamba/host.jl")
include("matrix/state.jl")
include("matrix/cpu.jl")
include("matrix/chunked.jl")
include("matrix/chunked_backward.jl")
include("matrix/chunked_launch.jl")
include("matrix/backward.jl")
include("matrix/cpu_backward.jl")
include("matrix/delta.jl")
include("matrix/delta_chunked.jl")
include("matrix/delta_backward.jl")
include("matrix/delta_chunked_backward.jl")
include("matrix/host.jl")

end
