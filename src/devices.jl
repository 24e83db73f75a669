# Devices by name, as the Python facade spells them, and the facade's entry
# point. GPU devices gain their methods in the package extensions, which load
# with the GPU package (`using CUDA` ...).

"""
    DEVICE_PACKAGES

Device name => the Julia package that provides its arrays and kernels.
"""
const DEVICE_PACKAGES = (
    cpu = "KernelAbstractions",
    cuda = "CUDA",
    amdgpu = "AMDGPU",
    oneapi = "oneAPI",
    metal = "Metal",
)

function device_hint(device::Symbol)
    if !haskey(DEVICE_PACKAGES, device)
        return "unknown device :$device; known devices: $(join(keys(DEVICE_PACKAGES), ", "))"
    end
    pkg = DEVICE_PACKAGES[device]
    return "device :$device needs $pkg.jl loaded: run `using $pkg` " *
        "(install it with `import Pkg; Pkg.add(\"$pkg\")`)"
end

"""
    device_array_type(Val(device)) -> Type

The array type kernels run on for `device` (`Array` for `:cpu`); the GPU
package extensions add `CuArray`, `ROCArray`, `oneArray` and `MtlArray`.
"""
device_array_type(::Val{:cpu}) = Array
device_array_type(::Val{D}) where {D} = throw(ArgumentError(device_hint(D)))

"""
    device_backend(Val(device)) -> KernelAbstractions.Backend

The KernelAbstractions backend of `device` (`CPU()` for `:cpu`); the GPU
package extensions add `CUDABackend()`, `ROCBackend()`, `oneAPIBackend()` and
`MetalBackend()`.
"""
device_backend(::Val{:cpu}) = CPU()
device_backend(::Val{D}) where {D} = throw(ArgumentError(device_hint(D)))

"""
    device_dtypes(device) -> Vector{String}

The `HOST_ELTYPES` keys (NumPy dtype names) `device` runs, asked of its
backend now rather than assumed: the 64-bit ones only where
`KernelAbstractions.supports_float64` says yes (oneAPI.jl and Metal.jl say no).
The Python facade calls this once per device.

# Examples
```julia-repl
julia> ScanWeaver.device_dtypes("cpu")
4-element Vector{String}:
 "float32"
 "float64"
 "complex64"
 "complex128"
```
"""
function device_dtypes(device::AbstractString)
    backend = device_backend(Val(Symbol(device)))
    wide = supports_float64(backend)
    return [
        String(name)
        for (name, T) in pairs(HOST_ELTYPES)
        if wide || !(T <: Union{Float64, ComplexF64})
    ]
end

"""
    device_status(device) -> (ok::Bool, reason::String)

Whether `device` (`"cpu"`, `"cuda"`, `"amdgpu"`, `"oneapi"`, `"metal"`) can run
scans in this session, with the device's name or the reason it cannot.

# Examples
```julia-repl
julia> ScanWeaver.device_status("cpu")
(true, "KernelAbstractions CPU, 1 Julia thread(s)")
```
"""
device_status(device::AbstractString) = device_status(Val(Symbol(device)))
device_status(::Val{:cpu}) = (
    true,
    "KernelAbstractions CPU, $(Threads.nthreads()) Julia thread(s)",
)
device_status(::Val{D}) where {D} = (false, device_hint(D))

const HOST_ELTYPES = (
    float32 = Float32,
    float64 = Float64,
    complex64 = ComplexF32,
    complex128 = ComplexF64,
)

function wrap_host(::Type{T}, address::Integer, dims::Dims) where {T}
    address == 0 && return nothing
    # fatou-ignore discouraged-function: zero-copy view of a NumPy buffer the Python caller keeps alive
    return unsafe_wrap(Array, Ptr{T}(UInt(address)), dims; own = false)
end

to_device(::Type, ::Nothing) = nothing
to_device(::Type{D}, A::Array) where {D} = D === Array ? A : D(A)

"""
    host_scan!(device, dtype, L, lanes, y, h_last, a, b, x, c, h0, reset;
               reverse = false, schedule = "auto", tunables...) -> nothing

The Python facade's entry point. The array arguments are addresses of
C-contiguous host buffers in `dtype` (a key of `HOST_ELTYPES`; `reset` is
`UInt8`), `0` for absent ones: `(lanes, L)` row-major in Python, which is
`(L, lanes)` column-major here, so they are wrapped without copying. On
`"cpu"` the kernels read and write those buffers directly; on a GPU device the
inputs are copied over and `y`, `h_last` copied back. The caller keeps the
buffers alive and checks their sizes.
"""
function host_scan!(
    device::AbstractString,
    dtype::AbstractString,
    L::Integer,
    lanes::Integer,
    y::Integer,
    h_last::Integer,
    a::Integer,
    b::Integer,
    x::Integer,
    c::Integer,
    h0::Integer,
    reset::Integer;
    reverse::Bool = false,
    schedule::AbstractString = "auto",
    tunables...,
)
    scan = host_scanner(device, dtype, L, lanes; reverse, schedule, tunables...)
    scan(y, h_last, a, b, x, c, h0, reset)
    return nothing
end

"""
    HostScanner{T, D, S}

What [`host_scanner`](@ref) returns: the scan of `(L, lanes)` host buffers of
element type `T` on arrays of type `D` (`Array` on `"cpu"`), its direction
and its schedule, resolved once, so that a call is compiled for its types and
dispatches on nothing but which buffers are absent.
"""
struct HostScanner{T, D, S <: ScanSchedule}
    L::Int
    lanes::Int
    reverse::Bool
    schedule::S
end

"""
    host_scanner(device, dtype, L, lanes; reverse = false, schedule = "auto", tunables...)

[`host_scan!`](@ref) with everything but the eight addresses fixed: a
[`HostScanner`](@ref), called as `scan(y, h_last, a, b, x, c, h0, reset)`.
The Python facade makes one per call signature and calls it with integers
only; passing keyword arguments from Python through PythonCall costs about as
much as a small scan. The schedule is resolved here, once: a call costs about
3 us more than the scan itself (20 us before, when each call resolved it).

# Examples
```julia-repl
julia> a = fill(0.5f0, 4, 1); b = ones(Float32, 4, 1); y = similar(a);

julia> scan = ScanWeaver.host_scanner("cpu", "float32", 4, 1; schedule = "sequential");

julia> GC.@preserve a b y scan(UInt(pointer(y)), 0, UInt(pointer(a)), UInt(pointer(b)), 0, 0, 0, 0);

julia> vec(y)
4-element Vector{Float32}:
 1.0
 1.5
 1.75
 1.875
```
"""
function host_scanner(
    device::AbstractString,
    dtype::AbstractString,
    L::Integer,
    lanes::Integer;
    reverse::Bool = false,
    schedule::AbstractString = "auto",
    tunables...,
)
    api = :host_scanner
    haskey(HOST_ELTYPES, Symbol(dtype)) ||
        throw(ArgumentError(
            "$api: dtype must be one of $(join(keys(HOST_ELTYPES), ", ")), got $dtype",
        ))
    T = HOST_ELTYPES[Symbol(dtype)]
    where_ = Val(Symbol(device))
    D, backend = device_array_type(where_), device_backend(where_)
    L, lanes = Int(L), Int(lanes)
    given = (; workgroupsize = nothing, items_per_thread = nothing, chunk = nothing, tunables...)
    check_schedule(api, Symbol(schedule), given)
    proxy = Matrix{T}(undef, 0, 0)
    P = pair_type(proxy, proxy, nothing)
    S = fieldtype(P, :U)
    s = scan_schedule(Symbol(schedule), given, backend, L, lanes, P, S)
    check_config(api, s, backend, P, S)
    return HostScanner{T, D, typeof(s)}(L, lanes, reverse, s)
end

function (scan::HostScanner{T, D})(y, h_last, a, b, x, c, h0, reset) where {T, D}
    dims = (scan.L, scan.lanes)
    host = (
        y = wrap_host(T, y, dims),
        h_last = wrap_host(T, h_last, (scan.lanes,)),
        a = wrap_host(T, a, dims),
        b = wrap_host(T, b, dims),
        x = wrap_host(T, x, dims),
        c = wrap_host(T, c, dims),
        h0 = wrap_host(T, h0, (scan.lanes,)),
        reset = wrap_host(UInt8, reset, dims),
    )
    dev = map(A -> to_device(D, A), host)
    selective_scan!(
        dev.y,
        dev.a,
        dev.b,
        dev.x,
        dev.c;
        h0 = dev.h0,
        reset = dev.reset,
        reverse = scan.reverse,
        h_last = dev.h_last,
        schedule = scan.schedule,
    )
    KernelAbstractions.synchronize(array_backend(dev.a))
    if D !== Array
        copyto!(host.y, dev.y)
        host.h_last === nothing || copyto!(host.h_last, dev.h_last)
    end
    return nothing
end
