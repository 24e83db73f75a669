"""A memory roofline for CPU scans, and the rule that compares a scan with it honestly.

``y = a*b + x*c`` reads four arrays and writes one, exactly the memory
traffic of a selective scan with ``c``, but has no dependency between
elements; built like the scan kernels (same compiler and flags) with OpenMP,
its time is the best a memory-bound scan could do here on as many threads.
``roofline_fraction = roofline_time / scan_time``.  :func:`bind_traffic`
builds the same kind of kernel for any number of arrays read and written
(the backward pass of a scan reads five and writes four).

A fraction is only worth printing when both kernels ran under the same
conditions: :func:`compare` runs the roofline on the scan's own thread count
(the cpu backend's ``threads`` tunable and its rule for ``threads=0``),
interleaves the two round-robin and takes each one's median; :func:`judge`
then calls the machine busy when a kernel's rounds spread widely
(:data:`BUSY_SPREAD`) or the fraction comes out impossible (above
:data:`MAX_FRACTION`), and an impossible fraction is never reported as one.
``scanweaver run``, ``scanweaver bench`` and ``scanweaver tune`` all judge
their timings by :func:`busy_reason`.

Example:
    >>> from scanweaver.runtime.roofline import measure_roofline
    >>> measure_roofline(64, 4096, "float32", repeats=3) > 0
    True
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import ScanInputError
from ..targets.c_source import THREADS
from .toolchain import find_toolchain

#: Operands read and written per element (a, b, x, c in; y out).
READS, WRITES = 4, 1

#: A kernel's rounds whose interquartile range exceeds this share of their median say the machine was busy
#: (on a quiet machine the rounds of one kernel agree within a few percent).
BUSY_SPREAD = 0.25
#: A scan cannot move its bytes faster than an elementwise kernel with the same traffic on as many threads;
#: a fraction above this (5% of timer and cache noise) means the two did not run under the same conditions.
MAX_FRACTION = 1.05

#: ``sw_threads()`` (the scan kernels' thread rule, ``SW_THREADS`` 0 = the free cores) and what it needs.
_THREADS_PRELUDE = """
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define SW_MIN(p, q) ((p) < (q) ? (p) : (q))
#define SW_THREADS @THREADS@
""" + THREADS

_SOURCE = """
#define SW_T {ctype}
void sw_roofline(const SW_T* restrict a, const SW_T* restrict b, const SW_T* restrict x,
                 const SW_T* restrict c, SW_T* restrict y, long n) {{
  const int nt = sw_threads();
#pragma omp parallel for simd schedule(static) num_threads(nt)
  for (long i = 0; i < n; ++i) y[i] = a[i] * b[i] + x[i] * c[i];
}}
"""

_CTYPES = {"float32": "float", "float64": "double"}


def _check_threads(threads: int) -> int:
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
        raise ScanInputError(f"roofline: threads must be an int >= 0 (0 = the free cores), got {threads!r}")
    return int(threads)


def kernel(dtype: str, threads: int = 0):
    """The compiled ``sw_roofline(a, b, x, c, y, n)`` for ``dtype`` (ctypes function).

    Args:
        dtype: ``float32`` or ``float64``.
        threads: OpenMP threads, by the scan kernels' rule: a positive count, or 0 for the free
            cores (every core less those other processes keep busy), as the cpu backend's default.
    """
    threads = _check_threads(threads)
    source = _THREADS_PRELUDE.replace("@THREADS@", str(threads)) + _SOURCE.format(ctype=_CTYPES[dtype])
    fn = find_toolchain().load(source).sw_roofline
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


def bind(lanes: int, L: int, dtype: str = "float32", threads: int = 0):
    """A zero-argument call of the roofline kernel on fresh operands of ``lanes * L`` elements.

    For benchmarks that interleave the roofline with the kernels they compare
    against it, so that both see the same machine state; ``threads`` as in :func:`kernel`.
    """
    if dtype not in _CTYPES:
        raise ScanInputError(f"roofline: dtype must be float32 or float64, got {dtype!r}")
    n = lanes * L
    rng = np.random.default_rng(0)
    ops = [rng.uniform(0.5, 1.0, n).astype(dtype) for _ in range(READS)]
    y = np.empty(n, dtype)
    fn = kernel(dtype, threads)
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


@dataclass(frozen=True)
class Rounds:
    """The timed rounds of one call (seconds), in the order they ran.

    Example:
        >>> r = Rounds((1.0, 1.1, 0.9, 1.0))
        >>> r.median, round(r.spread, 3)
        (1.0, 0.05)
    """

    times: tuple[float, ...]

    @property
    def median(self) -> float:
        """The median round."""
        return float(statistics.median(self.times))

    @property
    def spread(self) -> float:
        """Interquartile range over the median (0 with fewer than two rounds)."""
        if len(self.times) < 2 or self.median <= 0:
            return 0.0
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return float((q[2] - q[0]) / self.median)


def interleave(calls: Mapping[str, Callable[[], object]], repeats: int, min_seconds: float = 0.2,
               max_rounds: int = 50) -> dict[str, Rounds]:
    """Times every call round-robin after one warm-up each, so that all of them see the same state of a
    shared machine: at least ``repeats`` rounds, more (up to ``max_rounds``) until ``min_seconds`` passed.

    Example:
        >>> rounds = interleave({"sum": lambda: sum(range(1000)), "noop": lambda: None}, repeats=3)
        >>> sorted(rounds), all(len(r.times) >= 3 for r in rounds.values())
        (['noop', 'sum'], True)
    """
    if repeats < 1:
        raise ScanInputError(f"interleave: repeats must be >= 1, got {repeats}")
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    start = time.perf_counter()
    while times and (min(len(t) for t in times.values()) < repeats or (
            time.perf_counter() - start < min_seconds and min(len(t) for t in times.values()) < max_rounds)):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: Rounds(tuple(t)) for name, t in times.items()}


def _share(v: float) -> str:
    return f"{v:.0%}" if v < 10 else f"{v:.0f}x their median"


def busy_reason(spreads: Mapping[str, float], fraction: float | None = None) -> str:
    """Why timings cannot be trusted as they stand, in words; ``""`` when the machine looked quiet.

    Args:
        spreads: each timed kernel's :attr:`Rounds.spread`.
        fraction: the roofline fraction measured, if any.

    Example:
        >>> busy_reason({"scan": 0.02, "roofline": 0.03}, 0.7)
        ''
        >>> busy_reason({"scan": 0.6}).split(":")[0]
        'the machine was busy'
    """
    why = []
    if fraction is not None and fraction > MAX_FRACTION:
        why.append(f"the roofline kernel ran {fraction:.2f}x as long as the scan, which no scan can beat, "
                   "so one of them was held up")
    noisy = {k: v for k, v in spreads.items() if v > BUSY_SPREAD}
    if noisy:
        why.append("rounds of " + ", ".join(f"{k} varied by {_share(v)}" for k, v in noisy.items())
                   + f" (interquartile range over median; a quiet machine stays under {BUSY_SPREAD:.0%})")
    return "the machine was busy: " + "; ".join(why) if why else ""


@dataclass(frozen=True)
class Comparison:
    """A scan timed beside the roofline (see :func:`compare`).

    Attributes:
        seconds: the scan's median round.
        roofline_s: the roofline's median round (``None`` when there is none).
        threads: the thread count both ran with (0: the free cores, by the scan kernels' rule).
        fraction: ``roofline_s / seconds``, or ``None`` when not measured or impossible (above
            :data:`MAX_FRACTION`).
        quiet: False when the rounds say the machine was busy (then ``reason`` says how).
        reason: why there is no roofline and why the figures are uncertain; ``""`` when neither.
        spreads: each kernel's :attr:`Rounds.spread`.
    """

    seconds: float
    roofline_s: float | None
    threads: int | None
    fraction: float | None
    quiet: bool
    reason: str = ""
    spreads: dict[str, float] = field(default_factory=dict)


def judge(rounds: Mapping[str, Rounds], threads: int | None, scan: str = "scan",
          roofline: str = "roofline", missing: str = "") -> Comparison:
    """The :class:`Comparison` that the rounds of ``scan`` (and ``roofline`` when timed) support.

    Example:
        >>> c = judge({"scan": Rounds((2.0, 2.0, 2.1)), "roofline": Rounds((3.0, 3.0, 3.0))}, threads=1)
        >>> c.quiet, c.fraction, c.reason.startswith("the machine was busy")
        (False, None, True)
    """
    spreads = {name: r.spread for name, r in rounds.items()}
    seconds = rounds[scan].median
    roof = rounds[roofline].median if roofline in rounds else None
    raw = roof / seconds if roof is not None and seconds > 0 else None
    why = busy_reason(spreads, raw)
    fraction = raw if raw is not None and raw <= MAX_FRACTION else None
    return Comparison(seconds, roof, threads if roof is not None else None, fraction, not why,
                      "; ".join(x for x in (missing, why) if x), spreads)


def compare(call: Callable[[], object], lanes: int, L: int, dtype: str = "float32", threads: int | None = 0,
            repeats: int = 5, min_seconds: float = 0.2) -> Comparison:
    """Times ``call`` (a scan over ``lanes x L``) interleaved with the roofline on the same thread count.

    Args:
        call: one scan, with its output preallocated.
        lanes, L, dtype: the problem (the roofline moves the same bytes).
        threads: the scan's OpenMP threads (0: the free cores); ``None`` when it does not run on this
            host's cores (a GPU): the scan is timed alone and there is no fraction.
        repeats, min_seconds: as in :func:`interleave`.

    Returns:
        The :class:`Comparison`; no roofline (``fraction`` ``None``, ``reason`` saying why) without a C
        compiler, for a dtype the kernel lacks, or with ``threads=None``.
    """
    calls: dict[str, Callable[[], object]] = {"scan": call}
    missing = ""
    if threads is None:
        missing = "the scan ran on an accelerator; the roofline is a kernel of this host's cores"
    elif dtype not in _CTYPES:
        missing = f"no roofline kernel for {dtype}"
    else:
        try:
            calls["roofline"] = bind(lanes, L, dtype, threads)
        except Exception as exc:  # no compiler: the fraction is reported as missing, with the reason
            missing = f"the roofline kernel could not be built: {type(exc).__name__}: {exc}"[:300]
    return judge(interleave(calls, repeats, min_seconds), threads, missing=missing)


def scan_threads(backend: str, config: Mapping[str, object], device: str = "") -> int | None:
    """The threads a scan with ``config`` ran with on this host's cores, by the cpu kernels' rule (0: the free
    cores), or ``None`` when it ran on an accelerator (no host roofline applies).

    Args:
        backend: the backend that ran it.
        config: its tunables (``CallInfo.config``).
        device: the backend's device description (for ``opencl``: PoCL's CPU device is ``pthread-...``
            or ``cpu-...``).

    Example:
        >>> scan_threads("cpu", {"threads": 2}), scan_threads("numpy", {}), scan_threads("cuda", {})
        (2, 1, None)
    """
    import os

    if "threads" in config:
        return int(config["threads"])  # type: ignore[call-overload]
    if backend == "numpy":
        return 1  # NumPy's elementwise passes run on one core
    if backend == "cuda" or config.get("device", "cpu") != "cpu":
        return None
    if backend == "opencl" and not (device.lower().startswith("cpu") or "pthread" in device.lower()):
        return None
    return os.cpu_count() or 1  # PoCL's, Julia's and IREE's CPU runtimes use every core


def spreads_of(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """:attr:`Rounds.spread` of each list of times (for timings made elsewhere, e.g. by Kernel Tuner)."""
    return {name: Rounds(tuple(ts)).spread for name, ts in samples.items() if len(ts)}
