module ScanWeaverOneAPIExt

using oneAPI: oneAPI, oneArray
import ScanWeaver

# oneAPI has no timing events in KernelAbstractions: ScanWeaver.elapsed_ms
# falls back to the host clock around `KernelAbstractions.synchronize`.

ScanWeaver.device_array_type(::Val{:oneapi}) = oneArray

function ScanWeaver.device_status(::Val{:oneapi})
    oneAPI.functional() ||
        return (
            false,
            "oneAPI.jl is loaded but not functional: no Intel GPU or Level Zero driver",
        )
    return (true, "oneAPI.jl on $(oneAPI.device())")
end

end
