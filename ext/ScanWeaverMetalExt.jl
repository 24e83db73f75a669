module ScanWeaverMetalExt

using Metal: Metal, MetalBackend, MtlArray
import ScanWeaver

ScanWeaver.device_array_type(::Val{:metal}) = MtlArray

function ScanWeaver.device_status(::Val{:metal})
    Metal.functional() ||
        return (false, "Metal.jl is loaded but not functional: needs an Apple-silicon Mac")
    return (true, "Metal.jl on $(Metal.device().name) (Float32 only)")
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
