module ScanWeaver

using KernelAbstractions
using KernelAbstractions: Backend, CPU, get_backend
using StaticArrays: SArray, SVector, StaticArray, StaticMatrix, StaticVector

export AffinePair, compose, apply_pair, identity_pair, accumulator_type
export selective_scan, selective_scan!, SCHEDULES
export elapsed_ms, time_scan, tune_scan

include("pairs.jl")
include("elements.jl")
include("limits.jl")
include("kernels/sequential.jl")
include("kernels/blelloch.jl")
include("kernels/hybrid.jl")
include("kernels/reduce_then_scan.jl")
include("schedules.jl")
include("validate.jl")
include("api.jl")
include("timing.jl")
include("devices.jl")

end
