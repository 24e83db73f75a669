"""The ``cpu`` backend: C kernels from :mod:`scanweaver.targets.c_target`, compiled once and cached.

Kernels are built by the system C compiler (:mod:`.toolchain`) with OpenMP
when it is available and called through :mod:`ctypes`.  Every argument is
checked before the call (dtypes, shapes, contiguity, sizes), so a bad array
raises :class:`~scanweaver.errors.ScanInputError` instead of crashing.

Tunables beyond the schedule's: ``threads`` (0 = the free cores: every core less those other
processes keep busy) and ``interleave`` (lanes a thread streams side by side in the ``chunked``
schedule).

Example:
    >>> import numpy as np, scanweaver
    >>> a = np.full((2, 5), 0.5, np.float32); b = np.ones_like(a); x = np.ones_like(a)
    >>> scanweaver.selective_scan(a, b, x, backend="cpu")[0].tolist()
    [1.0, 1.5, 1.75, 1.875, 1.9375]
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import warnings
from collections.abc import Callable

import numpy as np

from ..errors import ScanInputError
from ..fused import REGISTRY as FUSED
from ..fused import FusedCall
from ..ir import Stages
from ..schedules import Tunable
from ..schedules.base import MAX_THREADS, threads_rule
from ..targets.c_target import CRenderer
from ..targets.fused import kernel_for
from . import calibrate, fastcall, host_pool, toolchain
from .host import core_kinds, cpu_model, cpu_threads
from .toolchain import simd_bytes, vector_isa

__all__ = ["CpuBackend", "cpu_model", "cpu_threads", "simd_bytes", "state_shape"]
from .base import Availability, Backend, ScanArrays, register

#: Chunk (scan positions per tile) when one lane's tiles are spread over threads: big
#: enough that the chained hand-off between threads is rare, small enough that a tile's
#: operands (16384 x 4 arrays x 4 bytes = 256 KiB) are still in L2 for the second pass.
#: One lane of 2^24 float32 on 2 AVX-512 cores: 8192 0.83, 16384 0.86, 32768 0.87 of the
#: roofline (measured in one run, with prefetching).
SPLIT_CHUNK = 16384
#: Lanes a thread streams side by side.  One is best measured here: the block scan already
#: hides the multiply-add latency, and every further lane adds five memory streams.
INTERLEAVE = 1


def _interleave_rule(value: object) -> str | None:
    return None if 1 <= value <= 32 else "it must be between 1 and 32"


@register
class CpuBackend(Backend):
    """Compiled C on the host's cores (OpenMP when the compiler has it)."""

    name = "cpu"
    target = "c"
    broadcast_operands = True
    kinds = ("diagonal", "dense")
    auto_priority = 10
    extra_tunables = (
        Tunable("threads", 0, (0, 1, 2, 4, 8, 16), f"OpenMP threads (at most {MAX_THREADS}); "
                "0 uses the cores other processes leave free",
                threads_rule),
        Tunable("interleave", INTERLEAVE, (1, 2, 4),
                "lanes one thread streams side by side (chunked)", _interleave_rule),
    )

    def __init__(self) -> None:
        self._renderer = CRenderer()
        self._functions: dict[str, ctypes._CFuncPtr] = {}
        self._fused: dict[FusedCall, ctypes._CFuncPtr] = {}
        self._lock = threading.Lock()

    @classmethod
    def probe(cls) -> Availability:
        reason = toolchain.missing_reason()
        if reason:
            return Availability(False, reason)
        kinds = core_kinds()
        return Availability(True, device=f"{cpu_model()} ({cpu_threads()} threads{': ' + kinds if kinds else ''})")

    def default_schedule(self, lanes: int, L: int) -> str:
        return "chunked"

    def details(self) -> dict[str, object]:
        tc = toolchain.find_toolchain()
        isa, vbytes = vector_isa()
        cutoff = calibrate.stored_cutoff()
        version = tc.identity.splitlines()[1:2] or [tc.command[0]]
        return {"compiler": version[0], "flags": " ".join(tc.flags),
                "vectors": f"{isa}, {vbytes}-byte vectors in the chunked kernel",
                "openmp": "yes" if tc.openmp else "; ".join(tc.notes) or "no",
                "threads_cutoff": cutoff if cutoff is not None else "measured on first use"}

    def default_config(self, schedule: str, lanes: int, L: int, dtype: str) -> dict[str, object]:
        """One thread below the machine's measured cut-off (:func:`.calibrate.threads_cutoff`),
        every core above it; ``chunked`` tiles of :data:`SPLIT_CHUNK`."""
        cfg: dict[str, object] = {"threads": 1} if calibrate.one_thread(lanes * L) else {}
        if schedule == "chunked":
            cfg["chunk"] = SPLIT_CHUNK
        return cfg

    def emit(self, stages: Stages) -> Stages:
        return dataclasses.replace(stages, kernel=self._renderer.render(stages), target="c")

    def function(self, stages: Stages):
        """The compiled ``sw_scan`` of ``stages`` (built or loaded once per process)."""
        if stages.kernel is None or stages.target != "c":
            stages = self.emit(stages)
        src = stages.kernel
        with self._lock:
            fn = self._functions.get(src)
        if fn is None:
            tc = toolchain.find_toolchain()
            _single_thread_notice(tc)
            fn = tc.load(src).sw_scan
            nptr = len(stages.affine.inputs) + 4
            fn.argtypes = [ctypes.c_void_p] * nptr + [ctypes.c_long, ctypes.c_long]
            fn.restype = ctypes.c_int
            with self._lock:
                self._functions[src] = fn
        return fn

    def bind(self, stages: Stages, arrays: ScanArrays, y: np.ndarray, h_last: np.ndarray) -> Callable[[], None]:
        """A call of the kernel on checked arrays, writing ``y`` and ``h_last`` (for timing loops).

        Raises:
            ScanInputError: when an array does not fit the kernel.
        """
        fn = self.function(stages)
        args = _checked_args(stages, arrays, np.dtype(stages.affine.dtype), y, h_last)
        lanes, L = arrays.lanes, arrays.L

        def call() -> None:
            if lanes == 0 or L == 0:
                h_last[:] = arrays.h0 if arrays.h0 is not None else 0
                return
            rc = fn(*args, lanes, L)
            if rc != 0:
                raise MemoryError(f"cpu backend: the kernel could not allocate its scratch memory (status {rc})")

        return call

    def fast_invoker(self, stages: Stages, lanes: int, L: int):
        """``invoke(buffers, lanes, L)`` calling the kernel of ``stages`` directly (see :mod:`.fastcall`).

        ``buffers`` are the operands in ABI order, then ``y``, ``h0``, ``hlast``, ``reset`` (NumPy
        arrays, or ``None`` for an absent ``h0``/``reset``); every buffer's size, alignment and
        writability is checked in C before the call, for exactly this ``(lanes, L)``.
        """
        fn = self.function(stages)
        feats = stages.affine.features
        item = np.dtype(stages.affine.dtype).itemsize
        n, k = lanes * L, stages.affine.state_size
        per = {"full": n, "scalar": 1, "lane": lanes}  # elements the kernel reads of each operand layout
        slots = [fastcall.Slot(per[feats.layout(name)] * item, item) for name in stages.affine.inputs]
        slots += [fastcall.Slot(n * item, item, written=True),
                  fastcall.Slot(lanes * k * item if feats.has_h0 else 0, item, optional=True),
                  fastcall.Slot(lanes * k * item, item, written=True, optional=True),
                  fastcall.Slot(n if feats.has_reset else 0, 1, optional=True)]
        return fastcall.invoker(ctypes.cast(fn, ctypes.c_void_p).value, slots)

    def backward(self, adjoint, arrays: ScanArrays, cot) -> None:
        """The fused C backward kernel for diagonal transitions (:mod:`.cpu_adjoint`), else the generic one."""
        from .cpu_adjoint import fused_backward

        if not fused_backward(adjoint, arrays, cot):
            super().backward(adjoint, arrays, cot)

    def run(self, stages: Stages, arrays: ScanArrays):
        dtype = np.dtype(stages.affine.dtype)
        first = next(iter(arrays.inputs.values()))
        y = arrays.out if arrays.out is not None else \
            host_pool.output((arrays.lanes, arrays.L), dtype, first.ctypes.data if first.size else None)
        h_last = np.empty(state_shape(stages, arrays.lanes), dtype)
        self.bind(stages, arrays, y, h_last)()
        return y, h_last

    def fused_defaults(self, op: str, features, sizes: dict[str, int]) -> dict[str, object]:
        """``width``: the CPU's vector (16 float32 with AVX-512, 8 with AVX2); one thread for small problems;
        then the rendering's own defaults by shape, where it has them."""
        item = np.dtype(features.dtype).itemsize
        cfg: dict[str, object] = {"width": max(4, min(16, simd_bytes() // item))}
        if calibrate.one_thread(FUSED.get(op).work(features, sizes)):
            cfg["threads"] = 1
        kernel = kernel_for(self.target, op)
        if kernel is not None and kernel.defaults is not None:
            cfg.update(kernel.defaults(features, sizes))
        return cfg

    def fused_function(self, call: FusedCall):
        """The compiled entry point of ``call`` (built or loaded once per process)."""
        with self._lock:
            fn = self._fused.get(call)
        if fn is None:
            kernel = kernel_for(self.target, call.op)
            if kernel is None or call.part not in kernel.parts:
                return None
            lib = toolchain.find_toolchain().load(kernel.render(self._renderer, call))
            fn = getattr(lib, kernel.entry(call.part))
            params = FUSED.get(call.op).params(call.part)
            fn.argtypes = [ctypes.c_long if p.kind == "int" else ctypes.c_void_p for p in params]
            fn.restype = ctypes.c_int
            with self._lock:
                self._fused[call] = fn
        return fn

    def fused_invoker(self, call: FusedCall, sizes: dict[str, int]):
        """``invoke(buffers, *sizes)`` calling the C rendering of ``call`` directly (see :mod:`.fastcall`),
        or ``None`` when there is none.

        ``buffers`` are the arrays of the operation's parameters in ABI order (``None`` where a parameter
        is switched off or not asked for), ``sizes`` its ``int`` parameters; every buffer is checked in C
        against the layout of exactly these ``sizes``.
        """
        fn = self.fused_function(call)
        if fn is None:
            return None
        op = FUSED.get(call.op)
        slots, n_sizes = [], 0
        for p, enabled, shape, dtype in op.layout(call.part, call.features, tuple(sorted(sizes.items()))):
            if p.kind == "int":
                n_sizes += 1
                continue
            need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize if enabled else 0
            slots.append(fastcall.Slot(need, dtype.itemsize, written=p.kind == "out",
                                       optional=p.optional or not enabled))
        return fastcall.invoker(ctypes.cast(fn, ctypes.c_void_p).value, slots, n_sizes)

    def run_fused(self, call: FusedCall, arrays: dict[str, object], sizes: dict[str, int]) -> None:
        """Runs the C rendering of ``call`` on checked NumPy arrays (outputs written in place)."""
        fn = self.fused_function(call)
        if fn is None:
            super().run_fused(call, arrays, sizes)
        args = FUSED.get(call.op).arguments(call.part, call.features, arrays, sizes, "cpu backend")
        limit = 2 ** (8 * ctypes.sizeof(ctypes.c_long) - 1) - 1
        for a in args:
            if isinstance(a, np.ndarray) and a.size > limit // 64:
                raise ScanInputError(f"cpu backend: an array of {a.size} elements exceeds the C long index range")
        rc = fn(*(a.ctypes.data if isinstance(a, np.ndarray) else a for a in args))
        if rc == 2:
            raise ScanInputError(f"cpu backend: the fused {call.op} kernel rejected its sizes {sizes} (or the "
                                 "offsets of cu_seqlens: 0, non-decreasing, ending at T)")
        if rc != 0:
            raise MemoryError(f"cpu backend: the fused {call.op} kernel could not allocate its scratch memory "
                              f"(status {rc})")


_noticed: set[toolchain.Toolchain] = set()


def _single_thread_notice(tc: toolchain.Toolchain) -> None:
    """One warning per compiler and process when kernels cannot use the other cores (no OpenMP)."""
    if tc.openmp or tc in _noticed or cpu_threads() < 2:
        return
    _noticed.add(tc)
    warnings.warn("scanweaver cpu backend: " + ("; ".join(tc.notes) or "no OpenMP: kernels run on one thread"),
                  RuntimeWarning, stacklevel=4)


def state_shape(stages: Stages, lanes: int) -> tuple[int, ...]:
    """Shape of h0 and h_last: ``(lanes,)``, or ``(lanes, k)`` for a dense state of size k."""
    k = stages.affine.state_size
    return (lanes,) if k == 1 else (lanes, k)


def _pointer(name: str, arr: np.ndarray | None, dtype: np.dtype, shape: tuple[int, ...]) -> int | None:
    """The data address of a checked array, or ``None`` for an absent optional one."""
    if arr is None:
        return None
    if not isinstance(arr, np.ndarray):
        raise ScanInputError(f"cpu backend: {name} must be a NumPy array, got {type(arr).__name__}")
    if arr.dtype != dtype:
        raise ScanInputError(f"cpu backend: {name} has dtype {arr.dtype}; the kernel was built for {dtype}")
    if arr.shape != shape:
        raise ScanInputError(f"cpu backend: {name} has shape {arr.shape}; it needs {shape}")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        raise ScanInputError(f"cpu backend: {name} must be C-contiguous and aligned "
                             "(scanweaver.arrays.aligned copies it once into aligned memory)")
    if arr.size and not arr.ctypes.data:
        raise ScanInputError(f"cpu backend: {name} has a null data pointer")
    return arr.ctypes.data or None


def _operand_pointer(name: str, arrays: ScanArrays, layout: str, dtype: np.dtype) -> int | None:
    """The address of operand ``name``, whose memory must have the ``layout`` the kernel reads."""
    arr = arrays.inputs[name]
    have = arrays.layouts.get(name, "full")
    if have != layout:
        raise ScanInputError(f"cpu backend: operand {name} is laid out as {have!r}; the kernel reads {layout!r}")
    if layout == "full":
        return _pointer(f"operand {name}", arr, dtype, (arrays.lanes, arrays.L))
    # a stride-0 view (arrays.prepare): one value, or one value per lane ``strides[0]`` apart
    lane_stride = 0 if layout == "scalar" else dtype.itemsize
    if (not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != (arrays.lanes, arrays.L)
            or arr.strides[1] != 0 or (arrays.lanes > 1 and arr.strides[0] != lane_stride)
            or not arr.flags.aligned):
        raise ScanInputError(f"cpu backend: operand {name} must be an aligned {dtype} view of shape "
                             f"{(arrays.lanes, arrays.L)} with strides ({lane_stride}, 0) for layout {layout!r}")
    return arr.ctypes.data


def _checked_args(stages: Stages, arrays: ScanArrays, dtype: np.dtype, y: np.ndarray, h_last: np.ndarray) -> list:
    """Validated ctypes arguments in ABI order (everything but ``nlanes`` and ``L``)."""
    aff, feats = stages.affine, stages.affine.features
    lanes, L = arrays.lanes, arrays.L
    if np.dtype(arrays.dtype) != dtype:
        raise ScanInputError(f"cpu backend: operands are {arrays.dtype}; the kernel was built for {dtype}")
    if set(arrays.inputs) != set(aff.inputs):
        raise ScanInputError(f"cpu backend: operands {sorted(arrays.inputs)} do not match the kernel's "
                             f"{list(aff.inputs)}")
    limit = 2 ** (8 * ctypes.sizeof(ctypes.c_long) - 1) - 1
    if lanes < 0 or L < 0 or lanes * max(L, 1) > limit:
        raise ScanInputError(f"cpu backend: lanes={lanes}, L={L}: lanes*L must fit the C long index ({limit})")
    shape = (lanes, L)
    args = [_operand_pointer(n, arrays, feats.layout(n), dtype) for n in aff.inputs]
    args.append(_pointer("y", y, dtype, shape))
    if feats.has_h0 and arrays.h0 is None:
        raise ScanInputError("cpu backend: the kernel reads h0 but none was given")
    if feats.has_reset and arrays.reset is None:
        raise ScanInputError("cpu backend: the kernel reads reset but none was given")
    state = state_shape(stages, lanes)
    args.append(_pointer("h0", arrays.h0, dtype, state) if feats.has_h0 else None)
    args.append(_pointer("hlast", h_last, dtype, state))
    args.append(_pointer("reset", arrays.reset, np.dtype(np.uint8), shape) if feats.has_reset else None)
    if lanes and L and any(a is None for a in args[: len(aff.inputs) + 1]):
        raise ScanInputError("cpu backend: an operand has no data")
    return args
