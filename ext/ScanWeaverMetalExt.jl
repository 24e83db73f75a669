module ScanWeaverMetalExt

import KernelAbstractions as KA
using Metal: Metal, MetalBackend, MtlArray
import ScanWeaver

ScanWeaver.device_array_type(::Val{:metal}) = MtlArray
ScanWeaver.device_backend(::Val{:metal}) = MetalBackend()

function ScanWeaver.device_status(::Val{:metal})
    Metal.functional() ||
        return (false, "Metal.jl is loaded but not functional: needs an Apple-silicon Mac")
    return (true, "Metal.jl on $(Metal.device().name) (Float32 only)")
end

ScanWeaver.max_workgroupsize(::MetalBackend) = Int(
    Metal.device().maxThreadsPerThreadgroup.width,
)
ScanWeaver.local_memory_budget(::MetalBackend) = Int(
    Metal.device().maxThreadgroupMemoryLength,
)

"""
    ScanWeaver.pipeline_max_workgroupsize(kernel::KA.Kernel{MetalBackend}, ndrange, args)

The compiled pipeline's `maxTotalThreadsPerThreadgroup`, which register use can
lower below the device's limit. Compiles `kernel` for `args` the way Metal.jl's
own KernelAbstractions launch does (`@metal launch = false` on the kernel
function and its context), so the launch that follows finds it compiled.
"""
function ScanWeaver.pipeline_max_workgroupsize(
    kernel::KA.Kernel{MetalBackend},
    ndrange,
    args,
)
    ndrange, _, iterspace, _ = KA.launch_config(kernel, ndrange, nothing)
    ctx = KA.mkcontext(kernel, ndrange, iterspace)
    compiled = Metal.@metal launch = false kernel.f(ctx, args...)
    return Int(compiled.pipeline.maxTotalThreadsPerThreadgroup)
end

function committed_buffer(queue)
    buffer = Metal.MTLCommandBuffer(queue)
    Metal.commit!(buffer)
    Metal.wait_completed(buffer)
    return buffer
end

"""
    ScanWeaver.elapsed_ms(f, ::MetalBackend) -> Float64

Times `f()` on the GPU clock: from the end of an empty command buffer committed
before it to the start of one committed after it, on the queue the kernels use.
"""
function ScanWeaver.elapsed_ms(f, ::MetalBackend)
    queue = Metal.global_queue(Metal.device())
    before = committed_buffer(queue)
    f()
    after = committed_buffer(queue)
    return (Float64(after.GPUStartTime) - Float64(before.GPUEndTime)) * 1000
end

end
