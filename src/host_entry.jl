# A `HostScanner` as a C function, for the Python facade's per-call path: a
# call through PythonCall converts each Python integer and costs tens of
# microseconds; a C function pointer is called by the facade's checked C
# trampoline (`scanweaver.runtime.fastcall`) like a compiled kernel, with the
# buffers' addresses and two sizes, at the cost of a C call.

"""
    HostEntry

A [`HostScanner`](@ref) as a C function `int f(y, h_last, a, b, x, c, h0,
reset, lanes, L)` of addresses (`0` for absent buffers) and two `long` sizes:
`pointer` is its address, `cfunction` keeps it alive, and a call that fails
returns 1 and leaves the error's message in `error[]` (no Julia exception
crosses into C).
"""
struct HostEntry{F}
    cfunction::F
    pointer::UInt
    error::Base.RefValue{String}
end

"""
    host_scanner_entry(scan::HostScanner) -> HostEntry

The C entry point of `scan` (see [`HostEntry`](@ref)); the caller keeps the
returned object while it uses the pointer. `lanes` and `L` must be the
scanner's own (they are checked).

# Examples
```julia-repl
julia> scan = ScanWeaver.host_scanner("cpu", "float32", 4, 1; schedule = "sequential");

julia> entry = ScanWeaver.host_scanner_entry(scan); a = fill(0.5f0, 4); y = similar(a);

julia> GC.@preserve a y ccall(reinterpret(Ptr{Cvoid}, entry.pointer), Cint,
           (UInt, UInt, UInt, UInt, UInt, UInt, UInt, UInt, Clong, Clong),
           UInt(pointer(y)), 0, UInt(pointer(a)), UInt(pointer(a)), 0, 0, 0, 0, 1, 4)
0
```
"""
function host_scanner_entry(scan::HostScanner)
    error = Ref("")
    call = function (y, h_last, a, b, x, c, h0, reset, lanes, L)
        try
            if lanes != scan.lanes || L != scan.L
                throw(DimensionMismatch(
                    "host scanner: called with (lanes, L) = ($lanes, $L); it scans ($(scan.lanes), $(scan.L))",
                ))
            end
            scan(y, h_last, a, b, x, c, h0, reset)
            return Cint(0)
        catch err
            error[] = sprint(showerror, err)
            return Cint(1)
        end
    end
    cf = @cfunction(
        $call,
        Cint,
        (UInt, UInt, UInt, UInt, UInt, UInt, UInt, UInt, Clong, Clong),
    )
    return HostEntry(cf, UInt(Base.unsafe_convert(Ptr{Cvoid}, cf)), error)
end

"The message of the last failed call of `entry` (see [`HostEntry`](@ref))."
host_entry_error(entry::HostEntry) = entry.error[]
