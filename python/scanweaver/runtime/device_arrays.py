"""Device arrays (CuPy, PyOpenCL) passed straight to the GPU backend that owns them.

:func:`kind` names the backend of a device array; :func:`prepare` checks
device operands the way :func:`scanweaver.arrays.prepare` checks NumPy ones,
but only reshapes them (no copies, no transfers); :func:`backend_for`
resolves ``backend=`` for them; :func:`result` shapes what comes back.
The libraries are never imported here: arrays are recognised by type module.

Example:
    >>> import numpy as np
    >>> from scanweaver.runtime.device_arrays import kind
    >>> kind(np.zeros(3)) is None
    True
"""

from __future__ import annotations

import numpy as np

from ..errors import ScanInputError
from .base import ScanArrays

#: Top-level module of a device array's type -> the backend that takes it without copies.
OWNERS = {"cupy": "cuda", "pyopencl": "opencl"}
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def kind(value: object) -> str | None:
    """The backend owning device array ``value`` (``cuda``, ``opencl``), or ``None`` for host data."""
    if isinstance(value, np.ndarray):
        return None
    return OWNERS.get(type(value).__module__.split(".")[0])


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


def _flat(api: str, name: str, value, shape: tuple, dtype=None):
    if tuple(value.shape) != shape:
        raise ScanInputError(f"{api}: {name} has shape {tuple(value.shape)}; it needs {shape}")
    if not value.flags.c_contiguous:
        raise ScanInputError(f"{api}: device array {name} must be C-contiguous (copy it on the device first)")
    if dtype is not None and np.dtype(value.dtype) != dtype:
        raise ScanInputError(f"{api}: {name} has dtype {value.dtype}; it needs {dtype} like the operands")
    return value


def prepare(api: str, operands: dict[str, object], h0: object = None, reset: object = None) -> ScanArrays:
    """Device operands of one shape ``(..., L)`` and one float dtype as :class:`ScanArrays`, without copies.

    Raises:
        ScanInputError: naming the argument and what it needs.
    """
    first = next(iter(operands.values()))
    shape, dtype = tuple(first.shape), np.dtype(first.dtype)
    if not shape:
        raise ScanInputError(f"{api}: operands need layout (..., L), got a scalar device array")
    if dtype not in FLOATS:
        raise ScanInputError(f"{api}: device operands need float32 or float64, got {dtype}")
    batch, L = shape[:-1], shape[-1]
    lanes = int(np.prod(batch, dtype=np.int64))
    inputs = {n: _flat(api, n, v, shape, dtype).reshape(lanes, L) for n, v in operands.items()}
    h0v = None
    if h0 is not None:
        h0v = (_flat(api, "h0", h0, batch, dtype) if kind(h0) else
               np.ascontiguousarray(np.asarray(h0), dtype=dtype)).reshape(lanes)
    rmask = None
    if reset is not None:
        if kind(reset):
            if np.dtype(reset.dtype) not in (np.dtype(np.bool_), np.dtype(np.uint8)):
                raise ScanInputError(f"{api}: device reset has dtype {reset.dtype}; it needs bool or uint8")
            rmask = _flat(api, "reset", reset, shape).reshape(lanes, L).view(np.uint8)
        else:
            r = np.asarray(reset)
            if r.shape != shape:
                raise ScanInputError(f"{api}: reset has shape {r.shape}; it needs the operands' shape {shape}")
            rmask = np.ascontiguousarray(r != 0, dtype=np.uint8).reshape(lanes, L)
    return ScanArrays(inputs=inputs, h0=h0v, reset=rmask, batch_shape=batch, dtype=dtype)


def backend_for(api: str, arrays: ScanArrays, backend: str) -> str:
    """``backend`` resolved for the operands: ``auto`` becomes the device's owner; another backend is an error."""
    owner = operands_kind(api, arrays.inputs)
    if owner is None or backend == owner:
        return backend
    if backend == "auto":
        return owner
    raise ScanInputError(f"{api}: operands are {owner} device arrays but backend={backend!r}; "
                         f"use backend={owner!r} (or pass NumPy arrays)")


def result(value, shape: tuple):
    """A device result reshaped to ``shape`` (no copy)."""
    return value.reshape(shape)
