"""Validation of user arrays into :class:`~scanweaver.runtime.ScanArrays`."""

from __future__ import annotations

import numpy as np

from .errors import ScanInputError
from .runtime.base import ScanArrays

SUPPORTED = (np.dtype(np.float32), np.dtype(np.float64))


def _as_array(api: str, name: str, value: object) -> np.ndarray:
    if hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray):
        raise ScanInputError(
            f"{api}: {name} is a device array ({type(value).__name__}); pass NumPy arrays, "
            "or use backend='cuda', which accepts CuPy arrays"
        )
    try:
        arr = np.asarray(value)
    except Exception as exc:
        raise ScanInputError(f"{api}: {name} cannot be read as an array: {exc}") from exc
    if arr.dtype.kind == "c":
        raise ScanInputError(f"{api}: {name} has complex dtype {arr.dtype}; complex scans are not supported yet, "
                             "split into real and imaginary recurrences")
    if arr.dtype.kind not in "f" or arr.dtype not in SUPPORTED:
        raise ScanInputError(
            f"{api}: {name} has dtype {arr.dtype}; supported dtypes are float32 and float64 "
            f"(convert with {name}.astype(np.float32))"
        )
    return arr


def prepare(api: str, operands: dict[str, object], h0: object = None, reset: object = None,
            broadcast: bool = False) -> ScanArrays:
    """Checks shapes and dtypes and returns 2-D C-contiguous operands.

    Args:
        api: the public function's name, for error messages.
        operands: name -> array of layout ``(..., L)``.
        h0: initial state of shape ``(...)`` or ``None``.
        reset: boolean mask of layout ``(..., L)`` or ``None``.
        broadcast: broadcast operands to one shape instead of requiring equal shapes.

    Raises:
        ScanInputError: naming each argument, its shape or dtype, and the rule.
    """
    arrs = {n: _as_array(api, n, v) for n, v in operands.items()}
    for n, a in arrs.items():
        if a.ndim == 0:
            raise ScanInputError(f"{api}: {n} is a scalar; operands need layout (..., L), scanned over the last axis")
    shapes = {n: a.shape for n, a in arrs.items()}
    if broadcast:
        try:
            shape = np.broadcast_shapes(*shapes.values())
        except ValueError:
            desc = ", ".join(f"{n}{s}" for n, s in shapes.items())
            raise ScanInputError(f"{api}: operand shapes do not broadcast together: {desc}") from None
    else:
        shape = next(iter(shapes.values()))
        if any(s != shape for s in shapes.values()):
            desc = ", ".join(f"{n}{s}" for n, s in shapes.items())
            raise ScanInputError(f"{api}: operands must all have the same shape (..., L); got {desc}")
    dtype = np.result_type(*arrs.values())
    batch, L = tuple(shape[:-1]), shape[-1]
    lanes = int(np.prod(batch, dtype=np.int64))
    inputs = {n: np.ascontiguousarray(np.broadcast_to(a, shape), dtype=dtype).reshape(lanes, L)
              for n, a in arrs.items()}
    h0v = None
    if h0 is not None:
        h = np.asarray(h0)
        if h.dtype.kind not in "fiu":
            raise ScanInputError(f"{api}: h0 has dtype {h.dtype}; it needs a real float dtype")
        if h.shape != batch:
            raise ScanInputError(f"{api}: h0 has shape {h.shape}; it needs the operands' leading shape {batch}")
        h0v = np.ascontiguousarray(h, dtype=dtype).reshape(lanes)
    rmask = None
    if reset is not None:
        r = np.asarray(reset)
        if r.shape != shape:
            raise ScanInputError(f"{api}: reset has shape {r.shape}; it needs the operands' shape {shape}")
        if r.dtype != np.bool_ and r.dtype.kind not in "iu":
            raise ScanInputError(f"{api}: reset has dtype {r.dtype}; it needs a boolean mask")
        rmask = np.ascontiguousarray(r != 0, dtype=np.uint8).reshape(lanes, L)
    return ScanArrays(inputs=inputs, h0=h0v, reset=rmask, batch_shape=batch, dtype=np.dtype(dtype))
