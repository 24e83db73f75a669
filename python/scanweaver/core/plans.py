"""Explicit call plans for hot loops: :func:`plan`.

Every scan call keeps a plan per signature by itself (:mod:`scanweaver.core.fastpath`);
:func:`plan` hands one out, so that a loop skips even finding it.
"""

from __future__ import annotations

import numpy as np

from . import fastpath
from .autodiff import recurrence_of
from .recurrence import Recurrence
from ..errors import ScanInputError, api_boundary


@api_boundary
def plan(recurrence, shape, dtype="float32", *, with_c: bool = True, h0: bool = False, reset: bool = False,
         reverse: bool = False, return_state: bool = False, backend: str = "auto", schedule: str = "auto",
         config="auto", **tunables) -> fastpath.Plan:
    """A compiled call for one signature, for hot loops: ``plan(a, b, x, c, out=y)``.

    Every scan call already keeps such a plan per signature and reuses it
    automatically (a repeated call costs a few microseconds beyond the kernel);
    an explicit plan also skips finding it.  The plan checks each call's
    arrays against its signature (shape, dtype, C order) and raises
    :class:`ScanInputError` naming the first that differs.

    Args:
        recurrence: a :class:`Recurrence`, or :func:`selective_scan`.
        shape: the operands' shape ``(..., L)`` (all operands share it).
        dtype: the operands' dtype (``float32`` or ``float64``).
        with_c: for :func:`selective_scan`: operands ``(a, b, x, c)`` (else ``(a, b, x)``).
        h0, reset: calls pass ``h0`` / a boolean ``reset`` mask.
        reverse, return_state, backend, schedule, config, **tunables: as for the call.

    Returns:
        a :class:`~scanweaver.core.fastpath.Plan`; ``plan(*operands, h0=..., reset=..., out=...)``.

    Example:
        >>> import numpy as np, scanweaver
        >>> p = scanweaver.plan(scanweaver.selective_scan, (4, 256), "float32")
        >>> ops = [np.full((4, 256), v, np.float32) for v in (0.5, 1.0, 1.0, 2.0)]
        >>> y = np.empty((4, 256), np.float32)
        >>> p(*ops, out=y) is y, float(y[0, 1])
        (True, 3.0)
    """
    if not isinstance(recurrence, Recurrence):
        if not callable(getattr(recurrence, "recurrence_for", None)):
            raise ScanInputError(f"plan: recurrence must be a scanweaver.Recurrence or scanweaver.selective_scan, "
                                 f"got {type(recurrence).__name__}")
        recurrence = recurrence_of("plan", recurrence, (None,) * 3 + ((0.0,) if with_c else (None,)))
    shape = tuple(int(n) for n in shape)
    dt = np.dtype(dtype)
    if not shape or any(n < 1 for n in shape) or dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ScanInputError(f"plan: shape must be positive sizes (..., L) and dtype float32 or float64; got "
                             f"shape {shape}, dtype {dt}")
    rng = np.random.default_rng(0)
    operands = [rng.uniform(0.5, 1.0, shape).astype(dt) for _ in recurrence.inputs]
    state = shape[:-1] if recurrence.state_size == 1 else (*shape[:-1], recurrence.state_size)
    h = np.zeros(state, dt) if h0 else None
    r = np.zeros(shape, bool) if reset else None
    recurrence(*operands, h0=h, reset=r, reverse=reverse, return_state=return_state, backend=backend,
               schedule=schedule, config=config, **tunables)
    key = fastpath.call_key(tuple(operands), h, r, None,
                            fastpath.flags(reverse, return_state, backend, schedule, config, tunables))
    found = recurrence._plans.get(key) if key is not None else None
    if not isinstance(found, fastpath.Plan):
        raise ScanInputError(f"plan: calls of {recurrence.name} with these arguments cannot be planned (they need "
                             "conversions each call); call the recurrence directly")
    return found
