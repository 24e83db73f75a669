module ScanWeaverCUDAExt

using CUDA: CUDA, CUDABackend, CuArray, CuEvent
import ScanWeaver

ScanWeaver.device_array_type(::Val{:cuda}) = CuArray
ScanWeaver.device_backend(::Val{:cuda}) = CUDABackend()

function ScanWeaver.device_status(::Val{:cuda})
    CUDA.functional() ||
        return (false, "CUDA.jl is loaded but not functional: no NVIDIA GPU or driver")
    return (true, "CUDA.jl on $(CUDA.name(CUDA.device()))")
end

# The local memory budget stays ScanWeaver's 48 KiB: `@localmem` is static
# shared memory on CUDA, and 48 KiB is its limit without a dynamic opt-in.
function ScanWeaver.max_workgroupsize(::CUDABackend)
    return Int(CUDA.attribute(CUDA.device(), CUDA.DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK))
end

"""
    ScanWeaver.elapsed_ms(f, ::CUDABackend) -> Float64

Times `f()` between two CUDA events recorded on the task's stream.
"""
function ScanWeaver.elapsed_ms(f, ::CUDABackend)
    start = CuEvent()
    stop = CuEvent()
    CUDA.record(start)
    f()
    CUDA.record(stop)
    CUDA.synchronize(stop)
    return Float64(CUDA.elapsed(start, stop)) * 1000
end

end
