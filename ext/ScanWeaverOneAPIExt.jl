module ScanWeaverOneAPIExt

using oneAPI: oneAPI, oneAPIBackend, oneArray
import ScanWeaver

# oneAPI has no timing events in KernelAbstractions: ScanWeaver.elapsed_ms
# falls back to the host clock around `KernelAbstractions.synchronize`.
# oneAPI.jl declares `KernelAbstractions.supports_float64(::oneAPIBackend) = false`,
# so `ScanWeaver.device_dtypes("oneapi")` lists 32-bit types only.

ScanWeaver.device_array_type(::Val{:oneapi}) = oneArray
ScanWeaver.device_backend(::Val{:oneapi}) = oneAPIBackend()

function ScanWeaver.device_status(::Val{:oneapi})
    oneAPI.functional() ||
        return (
            false,
            "oneAPI.jl is loaded but not functional: no Intel GPU or Level Zero driver",
        )
    return (true, "oneAPI.jl on $(oneAPI.device())")
end

compute_properties() = oneAPI.oneL0.compute_properties(oneAPI.device())

ScanWeaver.max_workgroupsize(::oneAPIBackend) = compute_properties().maxTotalGroupSize
ScanWeaver.local_memory_budget(::oneAPIBackend) = compute_properties().maxSharedLocalMemory

end
