"""The backward pass on any backend, composed from the backend's own scans.

:func:`generic_backward` runs stage ``adjoint`` with nothing but the
backend's forward machinery: the states h_t come from the forward recurrence
lowered with the states as its output (:func:`~scanweaver.passes.adjoint.state_scan`),
the adjoint g_t from the reverse recurrence of lam
(:func:`~scanweaver.passes.adjoint.adjoint_scan`), each lowered with the
backend's default schedule and compiled like any other scan; the gradients
are then evaluated elementwise (:mod:`scanweaver.targets.reference_adjoint`).
A dense state of size k takes k runs of each scan (one output component
each).  Backends with a fused backward kernel (``cpu``) override
:meth:`~scanweaver.runtime.base.Backend.backward` and use this for the rest.

Example:
    >>> import numpy as np
    >>> from scanweaver.api import SELECTIVE
    >>> from scanweaver.passes.adjoint import adjoint
    >>> from scanweaver.runtime import ScanArrays, get_backend
    >>> from scanweaver.runtime.base import Cotangents
    >>> ones = np.ones((1, 3))
    >>> arrays = ScanArrays({"a": 0.5 * ones, "b": ones, "x": ones, "c": ones}, None, None, (1,), np.dtype("float64"))
    >>> cot = Cotangents(dy=ones, grads={"x": np.empty((1, 3))})
    >>> generic_backward(get_backend("numpy"), adjoint(SELECTIVE.lower().affine, ("x",)), arrays, cot)
    >>> cot.grads["x"].tolist()
    [[1.75, 1.5, 1.0]]
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

from ..ir.adjoint import AdjointIR
from ..ir.stages import AffineScanIR, ScanIR
from ..passes import lower
from ..passes.adjoint import adjoint_scan, state_scan
from ..targets.reference_adjoint import gradients
from .base import Backend, Cotangents, ScanArrays


def array_module(value: object):
    """``numpy`` for NumPy arrays, else the top-level module of the array's type (``cupy``)."""
    if isinstance(value, np.ndarray):
        return np
    return importlib.import_module(type(value).__module__.split(".")[0])


@functools.lru_cache(maxsize=256)
def _emitted(backend: Backend, scan: ScanIR, schedule: str, config: tuple):
    return backend.emit(lower(scan, schedule, dict(config), backend.extra_tunables))


def run_scan(backend: Backend, scan: ScanIR, arrays: ScanArrays):
    """Runs stage ``scan`` on ``backend`` with its default schedule and tunables; returns ``(y, h_last)``."""
    kind = "dense" if scan.state_size > 1 else "diagonal"
    schedule = backend.default_schedule_for(kind, arrays.lanes, arrays.L)
    config = backend.default_config(schedule, arrays.lanes, arrays.L, scan.dtype)
    stages = _emitted(backend, scan, schedule, tuple(sorted(config.items())))
    return backend.run(stages, arrays)


def states(backend: Backend, fwd: AffineScanIR, arrays: ScanArrays):
    """h_t of every element in time order, ``(lanes, L)`` or ``(lanes, L, k)``, and the final state."""
    k = fwd.state_size
    runs = [run_scan(backend, state_scan(fwd, j), arrays) for j in range(k)]
    xp = array_module(runs[0][0])
    h = runs[0][0].reshape(arrays.lanes, arrays.L) if k == 1 else xp.stack([y for y, _ in runs], axis=-1)
    return xp.ascontiguousarray(h), runs[0][1]


def previous(h, h0, reverse: bool):
    """h_{t-1} in time order (h_{t+1} for a reverse scan), ``h0`` where the scan starts."""
    prev = array_module(h).empty_like(h)
    if reverse:
        prev[:, :-1], prev[:, -1] = h[:, 1:], h0
    else:
        prev[:, 1:], prev[:, 0] = h[:, :-1], h0
    return prev


def keep_mask(arrays: ScanArrays):
    """``1 - reset`` in the scan's dtype, or ``None`` without resets."""
    if arrays.reset is None:
        return None
    return 1 - arrays.reset.astype(arrays.dtype)


def generic_backward(backend: Backend, adj: AdjointIR, arrays: ScanArrays, cot: Cotangents) -> None:
    """Fills ``cot.grads`` (and ``cot.dh0``) for stage ``adj`` with ``backend``'s scans."""
    fwd, k = adj.forward, adj.state_size
    lanes, L = arrays.lanes, arrays.L
    xp = array_module(cot.dy)
    state = (lanes,) if k == 1 else (lanes, k)
    h0 = arrays.h0.reshape(state) if arrays.h0 is not None else xp.zeros(state, arrays.dtype)
    h = cot.states if cot.states is not None else states(backend, fwd, arrays)[0]
    keep = keep_mask(arrays)
    ins = {**arrays.inputs, adj.cotangent: cot.dy, **({adj.keep: keep} if adj.keep else {})}
    lam = ScanArrays(inputs=ins, h0=cot.dh_last if adj.dh_last else None, reset=None, batch_shape=(lanes,),
                     dtype=arrays.dtype)
    runs = [run_scan(backend, adjoint_scan(adj, j), lam) for j in range(k)]
    g = runs[0][0].reshape(lanes, L) if k == 1 else xp.stack([y.reshape(lanes, L) for y, _ in runs], axis=-1)
    gradients(adj, arrays.inputs, cot.dy, keep, h, previous(h, h0, fwd.features.reverse), g, cot.grads)
    if cot.dh0 is not None:
        cot.dh0[...] = runs[0][1].reshape(state)
