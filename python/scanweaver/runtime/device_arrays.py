"""Device arrays (CuPy, PyTorch CUDA tensors, DLPack and ``__cuda_array_interface__`` producers, PyOpenCL).

:func:`kind` names the backend that takes a device array; :func:`prepare`
checks device operands the way :func:`scanweaver.arrays.prepare` checks NumPy
ones and hands them to that backend's :meth:`adopt_call` (CuPy views of
PyTorch tensors through DLPack on PyTorch's current stream, views of
``__cuda_array_interface__`` objects, one device copy of a non-contiguous
array), without host transfers; :func:`backend_for` resolves ``backend=``
for them; :func:`check_out` takes a device ``out=``; :func:`finish` returns
results as the caller's array type (PyTorch tensors for PyTorch tensors,
CuPy arrays for CuPy and other CUDA producers, PyOpenCL arrays for PyOpenCL),
and :func:`empty_outputs` makes them for empty inputs.  The libraries are never
imported here: arrays are recognised by their type's module and protocols.

Example:
    >>> import numpy as np
    >>> from scanweaver.runtime.device_arrays import kind
    >>> kind(np.zeros(3)) is None
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ScanInputError
from .base import REGISTRY, ScanArrays
from .device_plan import interface, overlapping

def owners() -> dict[str, str]:
    """Top-level module of a device array's type -> the backend that takes it without copies
    (each backend declares its ``array_modules``)."""
    return {m: cls.name for cls in REGISTRY.values() for m in cls.array_modules}

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
#: DLPack device types of CUDA memory (kDLCUDA, kDLCUDAHost is host memory, kDLCUDAManaged).
DLPACK_CUDA = (2, 13)


def kind(value: object) -> str | None:
    """The backend owning device array ``value`` (``cuda``, ``opencl``), or ``None`` for host data."""
    if value is None or isinstance(value, (np.ndarray, np.generic)):
        return None
    module = type(value).__module__.split(".")[0]
    owner = owners().get(module)
    if owner is not None:
        return owner
    if module == "torch":
        return "cuda" if getattr(value, "is_cuda", False) else None
    if hasattr(value, "__cuda_array_interface__"):
        return "cuda"
    dev = getattr(value, "__dlpack_device__", None)
    if dev is not None:
        try:
            return "cuda" if int(dev()[0]) in DLPACK_CUDA else None
        except Exception:  # a foreign protocol that misbehaves is host data to us
            return None
    return None


def operands_kind(api: str, operands: dict[str, object]) -> str | None:
    """The one device kind of ``operands`` (``None`` when all are host arrays); mixing kinds is an error."""
    kinds = {n: kind(v) for n, v in operands.items()}
    found = set(kinds.values()) - {None}
    if not found:
        return None
    if len(found) > 1 or None in kinds.values():
        desc = ", ".join(f"{n}: {k or 'host'}" for n, k in kinds.items())
        raise ScanInputError(f"{api}: operands mix host and device arrays ({desc}); pass all of them on one device")
    return found.pop()


def _check(api: str, name: str, value, shape: tuple, dtype=None):
    if tuple(value.shape) != shape:
        raise ScanInputError(f"{api}: {name} has shape {tuple(value.shape)}; it needs {shape}")
    if dtype is not None and np.dtype(value.dtype) != dtype:
        raise ScanInputError(f"{api}: {name} has dtype {value.dtype}; it needs {dtype} like the operands")
    return value


def prepare(api: str, operands: dict[str, object], h0: object = None, reset: object = None) -> ScanArrays:
    """Device operands of one shape ``(..., L)`` and one float dtype as :class:`ScanArrays`, without transfers.

    Raises:
        ScanInputError: naming the argument and what it needs.
    """
    owner = operands_kind(api, operands)
    assert owner is not None
    device = {n: v for n, v in (("h0", h0), ("reset", reset)) if v is not None and kind(v)}
    native, call = REGISTRY[owner].adopt_call(api, {**operands, **device})
    first = native[next(iter(operands))]
    shape, dtype = tuple(first.shape), np.dtype(first.dtype)
    if not shape:
        raise ScanInputError(f"{api}: operands need layout (..., L), got a scalar device array")
    if dtype not in FLOATS:
        raise ScanInputError(f"{api}: device operands need float32 or float64, got {dtype}")
    batch, L = shape[:-1], shape[-1]
    lanes = int(np.prod(batch, dtype=np.int64))
    inputs = {n: _check(api, n, native[n], shape, dtype).reshape(lanes, L) for n in operands}
    h0v = None
    if h0 is not None:
        h0v = (_check(api, "h0", native["h0"], batch, dtype) if "h0" in native else
               np.ascontiguousarray(np.asarray(h0), dtype=dtype)).reshape(lanes)
    rmask = None
    if reset is not None:
        if "reset" in native:
            r = native["reset"]
            if np.dtype(r.dtype) not in (np.dtype(np.bool_), np.dtype(np.uint8)):
                raise ScanInputError(f"{api}: device reset has dtype {r.dtype}; it needs bool or uint8")
            rmask = _check(api, "reset", r, shape).reshape(lanes, L).view(np.uint8)
        else:
            r = np.asarray(reset)
            if r.shape != shape:
                raise ScanInputError(f"{api}: reset has shape {r.shape}; it needs the operands' shape {shape}")
            rmask = np.ascontiguousarray(r != 0, dtype=np.uint8).reshape(lanes, L)
    return ScanArrays(inputs=inputs, h0=h0v, reset=rmask, batch_shape=batch, dtype=dtype, device=call)


def backend_for(api: str, arrays: ScanArrays, backend: str) -> str:
    """``backend`` resolved for the operands: ``auto`` becomes the device's owner; another backend is an error."""
    owner = operands_kind(api, arrays.inputs)
    if owner is None or backend == owner:
        return backend
    if backend == "auto":
        return owner
    raise ScanInputError(f"{api}: operands are {owner} device arrays but backend={backend!r}; "
                         f"use backend={owner!r} (or pass NumPy arrays)")


def on_device(arrays: ScanArrays) -> bool:
    """True when ``arrays`` came from device operands."""
    return arrays.device is not None


def check_out(api: str, out: object, shape: tuple, arrays: ScanArrays) -> Any:
    """Validates a device ``out=`` for device operands; returns the ``(lanes, L)`` native view to write ``y`` into."""
    owner = operands_kind(api, arrays.inputs)
    if arrays.device is None or owner is None or kind(out) != owner:
        raise ScanInputError(f"{api}: out must be a device array on the operands' device for device operands "
                             f"(and a NumPy array for NumPy operands); got {type(out).__name__}")
    native, _ = REGISTRY[owner].adopt_call(api, {"out": out}, writable=True)
    view = native["out"]
    if tuple(view.shape) != shape or np.dtype(view.dtype) != arrays.dtype:
        raise ScanInputError(f"{api}: out has shape {tuple(view.shape)} and dtype {view.dtype}; it needs shape "
                             f"{shape} and dtype {arrays.dtype}")
    written = interface(view)
    if written is not None:
        others = [*arrays.inputs.items(), ("h0", arrays.h0), ("reset", arrays.reset)]
        hit = overlapping(written, [None if v is None else interface(v) for _, v in others])
        if hit is not None:
            raise ScanInputError(f"{api}: out overlaps {others[hit][0]} in device memory; pass a separate output "
                                 "buffer")
    arrays.device.out = out
    return view.reshape(arrays.lanes, arrays.L)


def empty_outputs(arrays: ScanArrays, shape: tuple, state: tuple) -> tuple[Any, Any]:
    """``y`` (zeros of ``shape``) and ``h_last`` (a copy of ``h0``, else zeros of ``state``) for empty inputs,
    in the backend's array type."""
    from .base import get_backend

    owner = operands_kind("scan", arrays.inputs)
    assert owner is not None
    be = get_backend(owner)
    ny, nh = int(np.prod(shape)), int(np.prod(state))
    y = be.empty(max(ny, 1), arrays.dtype, zero=True)[:ny].reshape(shape)
    if arrays.h0 is not None and nh:
        h = be.to_device(arrays.h0).copy()
    else:
        h = be.empty(max(nh, 1), arrays.dtype, zero=True)[:nh]
    return y, h.reshape(state)


def finish(arrays: ScanArrays, y: Any, h_last: Any, shape: tuple, state: tuple, return_state: bool):
    """The call's results as the caller's array type: ``y`` (or the caller's ``out``), and ``h_last``."""
    call = arrays.device
    assert call is not None
    with call.context():
        yv = call.out if call.out is not None else call.wrap(y.reshape(shape))
        return (yv, call.wrap(h_last.reshape(state))) if return_state else yv


def result(value, shape: tuple):
    """A device result reshaped to ``shape`` (no copy)."""
    return value.reshape(shape)
