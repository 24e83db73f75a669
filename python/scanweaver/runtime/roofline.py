"""A memory roofline for CPU scans: an elementwise kernel with the scan's traffic.

``y = a*b + x*c`` reads four arrays and writes one, exactly the memory
traffic of a selective scan with ``c``, but has no dependency between
elements; built like the scan kernels (same compiler and flags) with OpenMP
on every core, its time is the best a memory-bound scan could do here.
``roofline_fraction = roofline_time / scan_time``.  :func:`bind_traffic`
builds the same kind of kernel for any number of arrays read and written
(the backward pass of a scan reads five and writes four).

Example:
    >>> from scanweaver.runtime.roofline import measure_roofline
    >>> measure_roofline(64, 4096, "float32", repeats=3) > 0
    True
"""

from __future__ import annotations

import ctypes
import statistics
import time

import numpy as np

from ..errors import ScanInputError
from .toolchain import find_toolchain

#: Operands read and written per element (a, b, x, c in; y out).
READS, WRITES = 4, 1

_SOURCE = """
#define SW_T {ctype}
void sw_roofline(const SW_T* restrict a, const SW_T* restrict b, const SW_T* restrict x,
                 const SW_T* restrict c, SW_T* restrict y, long n) {{
#pragma omp parallel for simd schedule(static)
  for (long i = 0; i < n; ++i) y[i] = a[i] * b[i] + x[i] * c[i];
}}
"""

_CTYPES = {"float32": "float", "float64": "double"}


def kernel(dtype: str):
    """The compiled ``sw_roofline(a, b, x, c, y, n)`` for ``dtype`` (ctypes function)."""
    fn = find_toolchain().load(_SOURCE.format(ctype=_CTYPES[dtype])).sw_roofline
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_long]
    fn.restype = None
    return fn


def bytes_per_element(dtype: str) -> int:
    """Bytes a scan with ``c`` moves per element (four reads, one write)."""
    return (READS + WRITES) * np.dtype(dtype).itemsize


def measure_roofline(lanes: int, L: int, dtype: str = "float32", repeats: int = 5) -> float:
    """Median seconds of the roofline kernel over ``lanes * L`` elements (one warm-up excluded).

    Args:
        lanes: independent sequences.
        L: sequence length.
        dtype: ``float32`` or ``float64``.
        repeats: timed runs.

    Returns:
        The median time in seconds.
    """
    if dtype not in _CTYPES:
        raise ScanInputError(f"measure_roofline: dtype must be float32 or float64, got {dtype!r}")
    if lanes < 1 or L < 1 or repeats < 1:
        raise ScanInputError(f"measure_roofline: lanes, L and repeats must be >= 1, got {lanes}, {L}, {repeats}")
    call = bind(lanes, L, dtype)
    times = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        call()
        dt = time.perf_counter() - t0
        if i:
            times.append(dt)
    return statistics.median(times)


def bind(lanes: int, L: int, dtype: str = "float32"):
    """A zero-argument call of the roofline kernel on fresh operands of ``lanes * L`` elements.

    For benchmarks that interleave the roofline with the kernels they compare
    against it, so that both see the same machine state.
    """
    if dtype not in _CTYPES:
        raise ScanInputError(f"roofline: dtype must be float32 or float64, got {dtype!r}")
    n = lanes * L
    rng = np.random.default_rng(0)
    ops = [rng.uniform(0.5, 1.0, n).astype(dtype) for _ in range(READS)]
    y = np.empty(n, dtype)
    fn = kernel(dtype)
    ptrs = [o.ctypes.data for o in ops] + [y.ctypes.data]

    def call() -> None:
        fn(*ptrs, n)

    call.keep = (ops, y)  # the arrays live as long as the call
    return call


def roofline_ns_per_element(lanes: int, L: int, dtype: str = "float32", repeats: int = 5) -> float:
    """:func:`measure_roofline` in nanoseconds per element."""
    return measure_roofline(lanes, L, dtype, repeats) / (lanes * L) * 1e9


def traffic_kernel(dtype: str, reads: int, writes: int):
    """The compiled ``sw_traffic(r0.., w0.., n)``: ``w_j[i] = r_j[i] * r_last[i]`` (+ the other reads into
    ``w_0``), every array touched once, OpenMP over every core (ctypes function)."""
    T = _CTYPES[dtype]
    params = [f"const SW_T* restrict r{j}" for j in range(reads)] + [f"SW_T* restrict w{j}" for j in range(writes)]
    last = f"r{reads - 1}[i]"
    body = [f"w{j}[i] = r{j % reads}[i] * {last}" for j in range(writes)]
    body[0] += "".join(f" + r{j}[i]" for j in range(writes, reads - 1))
    src = (f"#define SW_T {T}\nvoid sw_traffic({', '.join(params)}, long n) {{\n"
           f"#pragma omp parallel for simd schedule(static)\n  for (long i = 0; i < n; ++i) {{ "
           + "; ".join(body) + "; }\n}\n")
    fn = find_toolchain().load(src).sw_traffic
    fn.argtypes = [ctypes.c_void_p] * (reads + writes) + [ctypes.c_long]
    fn.restype = None
    return fn


def bind_traffic(lanes: int, L: int, dtype: str = "float32", reads: int = READS, writes: int = WRITES):
    """Like :func:`bind`, for a kernel that reads ``reads`` arrays and writes ``writes`` (fresh operands).

    Example:
        >>> call = bind_traffic(4, 1024, "float32", reads=5, writes=4)
        >>> call(); len(call.keep[1])
        4
    """
    if dtype not in _CTYPES:
        raise ScanInputError(f"roofline: dtype must be float32 or float64, got {dtype!r}")
    if reads < 1 or writes < 1 or writes > reads:
        raise ScanInputError(f"roofline: needs 1 <= writes <= reads, got reads={reads}, writes={writes}")
    n = lanes * L
    rng = np.random.default_rng(0)
    ins = [rng.uniform(0.5, 1.0, n).astype(dtype) for _ in range(reads)]
    outs = [np.zeros(n, dtype) for _ in range(writes)]
    fn = traffic_kernel(dtype, reads, writes)
    ptrs = [a.ctypes.data for a in (*ins, *outs)]

    def call() -> None:
        fn(*ptrs, n)

    call.keep = (ins, outs)  # type: ignore[attr-defined]
    return call
