# What one workgroup may use on a backend: how many work-items and how much
# local (shared) memory. The defaults below hold on every supported GPU; the
# package extensions replace them with what the device reports.

"""
    MAX_WORKGROUP_SIZE

Work-items per workgroup unless the backend reports its own limit (see
[`max_workgroupsize`](@ref)): 1024, the limit of CUDA and AMD GPUs.
"""
const MAX_WORKGROUP_SIZE = 1024

"""
    LOCAL_MEMORY_BUDGET

Bytes of `@localmem` one workgroup may allocate unless the backend reports its
own limit (see [`local_memory_budget`](@ref)): 48 KiB, CUDA's limit for
*static* shared memory per block. KernelAbstractions turns `@localmem` into
`CuStaticSharedArray` on CUDA, and more than 48 KiB needs a dynamic opt-in it
does not make, so `ptxas` rejects such a kernel. The same budget applies on the
CPU, so a configuration that runs there also fits a GPU.
"""
const LOCAL_MEMORY_BUDGET = 48 * 1024

"""
    LOCAL_MEMORY_ALIGNMENT

[`local_bytes`](@ref) rounds every `@localmem` allocation up to this many bytes,
the padding a backend may insert between two shared arrays.
"""
const LOCAL_MEMORY_ALIGNMENT = 16

"""
    local_bytes(T, n) -> Int

Bytes of a `@localmem` array of `n` elements of type `T`, rounded up to
[`LOCAL_MEMORY_ALIGNMENT`](@ref).

# Examples
```julia
julia> ScanWeaver.local_bytes(Float32, 3)
16
```
"""
local_bytes(::Type{T}, n::Integer) where {T} = cld(n * sizeof(T), LOCAL_MEMORY_ALIGNMENT) *
    LOCAL_MEMORY_ALIGNMENT

"""
    max_workgroupsize(backend) -> Int

The most work-items one workgroup may have on `backend`'s current device:
[`MAX_WORKGROUP_SIZE`](@ref) unless a package extension asks the device (CUDA's
`MAX_THREADS_PER_BLOCK`, HIP's `MaxThreadsPerBlock`, Level Zero's
`maxTotalGroupSize`, Metal's `maxThreadsPerThreadgroup`).
"""
max_workgroupsize(::Backend) = MAX_WORKGROUP_SIZE

"""
    local_memory_budget(backend) -> Int

Bytes of `@localmem` one workgroup may allocate on `backend`'s current device:
[`LOCAL_MEMORY_BUDGET`](@ref) unless a package extension asks the device
(Metal reports 32 KiB, Level Zero `maxSharedLocalMemory`); CUDA keeps the
static 48 KiB whatever the device could give with an opt-in.
"""
local_memory_budget(::Backend) = LOCAL_MEMORY_BUDGET

"""
    pipeline_max_workgroupsize(kernel, ndrange, args) -> Int

The most work-items `kernel` (a KernelAbstractions kernel about to be launched
with `args` over `ndrange`) may have per workgroup once compiled for the
device. Unlimited here: CUDA.jl compiles a kernel with a static workgroup size
under launch bounds of that size, so `ptxas` fits the registers to it, and AMD
compiles for workgroups of up to 1024. The Metal extension compiles the
pipeline and reads its `maxTotalThreadsPerThreadgroup`, which register
pressure can lower below the device's limit.
"""
pipeline_max_workgroupsize(kernel, ndrange, args) = typemax(Int)

"""
    launch_checked!(kernel!, workgroupsize, ndrange, args)

Launches `kernel!(args...; ndrange)` after checking `workgroupsize` against the
compiled pipeline's limit ([`pipeline_max_workgroupsize`](@ref)); throws an
`ArgumentError` that names the limit instead of a backend's launch failure.
"""
function launch_checked!(kernel!, workgroupsize::Integer, ndrange, args::Tuple)
    limit = pipeline_max_workgroupsize(kernel!, ndrange, args)
    if workgroupsize > limit
        throw(ArgumentError(
            "selective_scan!: workgroupsize = $workgroupsize exceeds $limit, the largest " *
                "workgroup this kernel's compiled pipeline allows on this device; " *
                "use workgroupsize <= $limit",
        ))
    end
    kernel!(args...; ndrange)
    return nothing
end
