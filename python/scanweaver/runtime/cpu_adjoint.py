"""The ``cpu`` backend's backward pass: the fused C kernel of :mod:`scanweaver.targets.c_backward`.

Diagonal transitions run the fused kernel (compiled once per adjoint stage
and thread count, cached like the forward kernels); dense ones fall back to
the generic backward, which runs the ``cpu`` backend's own dense scan
kernels.  Every pointer is checked before the call.

Example:
    >>> import numpy as np
    >>> from scanweaver.api import SELECTIVE
    >>> from scanweaver.passes.adjoint import adjoint
    >>> from scanweaver.runtime import ScanArrays, get_backend
    >>> from scanweaver.runtime.base import Cotangents
    >>> ones = np.ones((1, 3))
    >>> arrays = ScanArrays({"a": 0.5 * ones, "b": ones, "x": ones, "c": ones}, None, None, (1,), np.dtype("float64"))
    >>> cot = Cotangents(dy=ones, grads={"x": np.empty((1, 3))})
    >>> get_backend("cpu").backward(adjoint(SELECTIVE.lower(dtype="float64").affine, ("x",)), arrays, cot)
    >>> cot.grads["x"].tolist()
    [[1.75, 1.5, 1.0]]
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np

from ..errors import ScanInputError
from ..ir.adjoint import AdjointIR
from ..targets.c_backward import render_backward
from . import toolchain
from .base import Cotangents, ScanArrays

#: Below this many elements the backward runs on one thread (as the forward does).
SMALL_PROBLEM = 1 << 15

_functions: dict[str, object] = {}
_lock = threading.Lock()


def _function(src: str, nptr: int):
    with _lock:
        fn = _functions.get(src)
    if fn is None:
        fn = toolchain.find_toolchain().load(src).sw_backward
        fn.argtypes = [ctypes.c_void_p] * nptr + [ctypes.c_long, ctypes.c_long]
        fn.restype = ctypes.c_int
        with _lock:
            _functions[src] = fn
    return fn


def _ptr(name: str, arr, dtype: np.dtype, shape: tuple, required: bool = True) -> int | None:
    if arr is None:
        if required:
            raise ScanInputError(f"cpu backward: {name} is missing")
        return None
    if not isinstance(arr, np.ndarray):
        raise ScanInputError(f"cpu backward: {name} must be a NumPy array, got {type(arr).__name__}")
    if arr.dtype != dtype or arr.shape != shape:
        raise ScanInputError(f"cpu backward: {name} has dtype {arr.dtype} and shape {arr.shape}; "
                             f"the kernel needs {dtype} {shape}")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        raise ScanInputError(f"cpu backward: {name} must be C-contiguous and aligned")
    return arr.ctypes.data or None


@functools.lru_cache(maxsize=128)
def _source(adj: AdjointIR, threads: int) -> str:
    """The kernel's C source, rendered once per stage and thread count (a training loop asks every step)."""
    return render_backward(adj, threads=threads)


def fused_backward(adj: AdjointIR, arrays: ScanArrays, cot: Cotangents, threads: int | None = None) -> bool:
    """Runs the fused kernel; ``False`` (nothing done) when it does not apply (dense transitions).

    Args:
        adj: stage ``adjoint``.
        arrays: the forward's prepared operands.
        cot: cotangents in, gradient buffers out.
        threads: OpenMP threads (``None``: one for small problems, else every core).

    Raises:
        ScanInputError: when an array does not fit the kernel.
    """
    fwd = adj.forward
    if fwd.kind != "diagonal" or fwd.dtype not in ("float32", "float64"):
        return False
    lanes, L = arrays.lanes, arrays.L
    dtype, shape = np.dtype(fwd.dtype), (lanes, L)
    if threads is None:
        threads = 1 if lanes * L < SMALL_PROBLEM else 0
    src = _source(adj, threads)
    args = [_ptr(f"operand {n}", arrays.inputs.get(n), dtype, shape) for n in fwd.inputs]
    args += [_ptr("dy", cot.dy, dtype, shape),
             _ptr("h0", arrays.h0, dtype, (lanes,), fwd.features.has_h0),
             _ptr("dh_last", cot.dh_last, dtype, (lanes,), adj.dh_last),
             _ptr("reset", arrays.reset, np.dtype(np.uint8), shape, fwd.features.has_reset),
             _ptr("states", cot.states, dtype, shape, adj.saved_states)]
    args += [_ptr(f"gradient of {n}", cot.grads.get(n), dtype, shape) for n in adj.wrt]
    args.append(_ptr("dh0", cot.dh0, dtype, (lanes,), False))
    fn = _function(src, len(args))
    if lanes and L:
        rc = fn(*args, lanes, L)
        if rc != 0:
            raise MemoryError(f"cpu backward: the kernel could not allocate its scratch memory (status {rc})")
    elif cot.dh0 is not None:
        cot.dh0[...] = cot.dh_last if cot.dh_last is not None else 0
    return True
