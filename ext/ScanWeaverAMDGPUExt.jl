module ScanWeaverAMDGPUExt

using AMDGPU: AMDGPU, ROCArray, ROCBackend
import ScanWeaver

ScanWeaver.device_array_type(::Val{:amdgpu}) = ROCArray
ScanWeaver.device_backend(::Val{:amdgpu}) = ROCBackend()

function ScanWeaver.device_status(::Val{:amdgpu})
    AMDGPU.functional() ||
        return (false, "AMDGPU.jl is loaded but not functional: no ROCm GPU or driver")
    return (true, "AMDGPU.jl on $(AMDGPU.device())")
end

hip_attribute(attr) = Int(AMDGPU.HIP.attribute(AMDGPU.device(), attr))

function ScanWeaver.max_workgroupsize(::ROCBackend)
    return hip_attribute(AMDGPU.HIP.hipDeviceAttributeMaxThreadsPerBlock)
end

function ScanWeaver.local_memory_budget(::ROCBackend)
    return hip_attribute(AMDGPU.HIP.hipDeviceAttributeMaxSharedMemoryPerBlock)
end

"""
    ScanWeaver.elapsed_ms(f, ::ROCBackend) -> Float64

Times `f()` between two HIP events recorded on the task's stream.
"""
function ScanWeaver.elapsed_ms(f, ::ROCBackend)
    stream = AMDGPU.stream()
    start = AMDGPU.HIP.HIPEvent(stream; do_record = false, timing = true)
    stop = AMDGPU.HIP.HIPEvent(stream; do_record = false, timing = true)
    AMDGPU.HIP.record(start)
    f()
    AMDGPU.HIP.record(stop)
    AMDGPU.HIP.synchronize(stop)
    return Float64(AMDGPU.HIP.elapsed(start, stop)) * 1000
end

end
