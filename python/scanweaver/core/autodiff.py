"""Gradients of recurrences on arrays: the framework-neutral core of ``scanweaver.torch`` and ``scanweaver.jax``.

:func:`prepare_call` validates a call once (the forward's operands, kept by
reference, are its residuals), :func:`forward` runs it, and :func:`backward`
runs stage ``adjoint`` (:mod:`scanweaver.ir.adjoint`) on the same backend:
the fused C kernel on ``cpu``, the backend's own reverse scans elsewhere.
:func:`vjp` packages both for NumPy users.

Why the IR is differentiated rather than the gates evaluated with framework
ops: gates such as ``exp(delta * A)`` or ``sigmoid(g)`` are expressions of the
inputs, and evaluating them with PyTorch or JAX ops around a core scan of
``(A_t, U_t)`` would materialise A, U and their gradients as full arrays in
both passes (two more reads and writes per element per gate, on every
framework separately).  :mod:`scanweaver.ir.derivative` differentiates the
expressions symbolically instead, and the adjoint stage evaluates them and
their derivatives inside the same fused kernels, element by element, so the
backward reads the operands once and writes one gradient per operand, on
every backend, with no framework in the loop.

States (``states=``): ``"recompute"`` (the default, as Mamba does) keeps
nothing but the operands, and the backward recomputes h_t tile by tile from
checkpoints while the tile is in cache; ``"save"`` has the forward compute
and keep the states ``(..., L)`` (k times that for a dense state), so the
backward reads them instead.  On the CPU recomputing is faster in both
passes (``bench/autograd.py`` measures both): the forward stays the plain
kernel, and the recompute costs a multiply-add per element on data the
backward reads anyway.

Memory: ``y`` and the gradients come from :data:`scanweaver.runtime.host_pool.POOL`,
which hands back the arrays of the previous training step once nothing refers
to them (fresh pages cost as much as the kernels here).

Example:
    >>> import numpy as np, scanweaver
    >>> a = np.full((1, 3), 0.5); b = x = c = np.ones((1, 3))
    >>> y, pullback = scanweaver.vjp(scanweaver.selective_scan, a, b, x, c, backend="numpy")
    >>> y.tolist(), pullback(np.ones((1, 3)))["x"].tolist()
    ([[1.0, 1.5, 1.75]], [[1.75, 1.5, 1.0]])
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from .recurrence import Recurrence
from .dispatch import check_dtype, check_kind, pick_backend
from ..arrays import prepare
from ..errors import ScanInputError
from ..ir.adjoint import AdjointIR
from ..ir.expr import is_const
from ..ir.stages import AffineScanIR, Features
from ..passes import lower
from ..passes.adjoint import adjoint
from ..runtime import Backend, ScanArrays, device_arrays
from ..runtime.adjoint import array_module, previous, states as run_states
from ..runtime.base import Cotangents
from ..runtime.host_pool import POOL
from ..targets.reference import project

#: How the backward gets the forward's states h_t.
STATES = ("recompute", "save")


@dataclass
class Residuals:
    """One validated call: what the backward needs from the forward.

    Attributes:
        rec: the recurrence.
        arrays: the prepared ``(lanes, L)`` operands, h0 and reset mask (views of the caller's arrays
            when no conversion was needed).
        backend: the backend both passes run on.
        affine: the forward's stage ``affine_scan``.
        shapes, dtypes: each operand's shape and dtype as given (gradients come back in them).
        states: the forward's states in time order (``states="save"``), else ``None``.
    """

    rec: Recurrence
    arrays: ScanArrays
    backend: Backend
    affine: AffineScanIR
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    states: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        """The operands' common shape ``(..., L)``."""
        return (*self.arrays.batch_shape, self.arrays.L)

    @property
    def state_shape(self) -> tuple[int, ...]:
        """Shape of h0 and the final state: ``(...)``, or ``(..., k)`` for a dense state."""
        k = self.affine.state_size
        return self.arrays.batch_shape if k == 1 else (*self.arrays.batch_shape, k)


@functools.lru_cache(maxsize=256)
def _affine(rec: Recurrence, dtype: str, feats: Features):
    """Stage ``affine_scan`` of ``rec`` for a call, lowered once per (recurrence, dtype, features)."""
    return lower(rec.scan_ir(dtype, feats)).affine


def prepare_call(rec: Recurrence, operands: dict, *, h0=None, reset=None, reverse: bool = False,
                 cu_seqlens=None, backend: str = "auto") -> Residuals:
    """Validates a call of ``rec`` (shapes, dtypes, backend) without running it.

    Raises:
        ScanInputError: for bad arrays, or complex operands (no gradients for complex scans).
    """
    api = rec.name
    arrays = prepare(api, operands, h0, reset, broadcast=rec.broadcast, cu_seqlens=cu_seqlens,
                     reverse=bool(reverse), state_size=rec.state_size)
    dtype = np.dtype(arrays.dtype)
    if dtype.kind == "c":
        raise ScanInputError(f"{api}: gradients of complex scans are not supported (got {dtype}); "
                             "use float32 or float64 operands")
    be = pick_backend(device_arrays.backend_for(api, arrays, backend), dtype.name, rec.kind)
    check_dtype(api, be, dtype.name)
    check_kind(api, be, rec.kind)
    feats = Features(reverse=bool(reverse), has_h0=arrays.h0 is not None, has_reset=arrays.reset is not None)
    affine = _affine(rec, dtype.name, feats)
    shapes = {n: tuple(v.shape) for n, v in operands.items()}
    dtypes = {n: np.dtype(v.dtype) for n, v in operands.items()}
    return Residuals(rec, arrays, be, affine, shapes, dtypes)


def check_states(states: object, api: str = "selective_scan") -> str:
    """``states`` when it is one of :data:`STATES`, else :class:`ScanInputError` naming it."""
    if states not in STATES:
        raise ScanInputError(f"{api}: states must be one of {', '.join(STATES)}; got {states!r}")
    return states


def forward(res: Residuals, *, states: str = "recompute", schedule: str = "auto", config="auto", **tunables):
    """Runs the forward of a prepared call; returns ``(y, h_last)`` and keeps saved states in ``res``.

    ``y`` has the operands' shape in their result dtype; ``h_last`` the state shape in the
    accumulation dtype.
    """
    check_states(states, res.rec.name)
    arr, rec = res.arrays, res.rec
    full = res.shape
    h0 = None if arr.h0 is None else arr.h0.reshape(res.state_shape)
    if states == "recompute":
        ops = [arr.inputs[n].reshape(full) for n in rec.inputs]
        reset = None if arr.reset is None else arr.reset.reshape(full)
        host = array_module(ops[0]) is np
        out = POOL.empty(full, arr.out_dtype or arr.dtype) if host else None
        return rec(*ops, h0=h0, reset=reset, reverse=res.affine.features.reverse, return_state=True,
                   backend=res.backend.name, schedule=schedule, config=config, out=out, **tunables)
    if array_module(arr.inputs[rec.inputs[0]]) is not np:
        raise ScanInputError(f"{rec.name}: states='save' runs on host arrays; use states='recompute' on "
                             f"{res.backend.name} device arrays")
    h, h_last = run_states(res.backend, res.affine, arr)
    res.states = h
    h0v = arr.h0.reshape(h.shape[0], *h.shape[2:]) if arr.h0 is not None else np.zeros((h.shape[0], *h.shape[2:]),
                                                                                        arr.dtype)
    old = res.affine.output.old
    reads_old = any(not is_const(e, 0.0) for e in (old if isinstance(old, tuple) else (old,)))
    hprev = previous(h, h0v, res.affine.features.reverse) if reads_old else h  # unread when y ignores h_{t-1}
    y = project(res.affine, arr.inputs, h, hprev, arr.dtype)
    out_dtype = arr.out_dtype or arr.dtype
    return np.asarray(y).reshape(full).astype(out_dtype, copy=False), np.asarray(h_last).reshape(res.state_shape)


@functools.lru_cache(maxsize=256)
def _adjoint(affine: AffineScanIR, wrt: tuple[str, ...], dh0: bool, dh_last: bool, saved: bool) -> AdjointIR:
    return adjoint(affine, wrt, dh0=dh0, dh_last=dh_last, saved_states=saved)


def sum_to(g, shape: tuple[int, ...]):
    """``g`` summed over the axes along which an operand of ``shape`` was broadcast."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, g.shape, strict=True)) if n == 1 and m != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def backward(res: Residuals, dy, dh_last=None, *, wrt: tuple[str, ...] | None = None, dh0: bool = True):
    """Runs stage ``adjoint`` of a forward call.

    Args:
        res: the call's residuals.
        dy: dL/dy with the operands' shape.
        dh_last: dL/dh_L with the state shape, or ``None``.
        wrt: operands to differentiate (default: all).
        dh0: also return dL/dh0 (when the call had h0).

    Returns:
        ``(grads, dh0)``: operand name -> gradient in the operand's own shape and
        dtype, and dL/dh0 (``None`` without h0 or when not asked).

    Raises:
        ScanInputError: when ``dy`` or ``dh_last`` has the wrong shape.
    """
    arr, api = res.arrays, res.rec.name
    xp = array_module(arr.inputs[res.rec.inputs[0]])
    lanes, L, dtype = arr.lanes, arr.L, arr.dtype

    def cotangent(name, value, shape, flat):
        v = xp.asarray(value)
        if tuple(v.shape) != tuple(shape):
            raise ScanInputError(f"{api}: {name} has shape {tuple(v.shape)}; it needs {tuple(shape)}")
        return xp.ascontiguousarray(v, dtype=dtype).reshape(flat)

    k = res.affine.state_size
    flat_state = (lanes,) if k == 1 else (lanes, k)
    dyv = cotangent("dy", dy, res.shape, (lanes, L))
    dhl = None if dh_last is None else cotangent("dh_last", dh_last, res.state_shape, flat_state)
    wrt = tuple(res.rec.inputs) if wrt is None else tuple(wrt)
    unknown = sorted(set(wrt) - set(res.rec.inputs))
    if unknown:
        raise ScanInputError(f"{api}: wrt names unknown operand(s) {', '.join(unknown)}; "
                             f"operands are {', '.join(res.rec.inputs)}")
    adj = _adjoint(res.affine, wrt, bool(dh0), dhl is not None, res.states is not None)
    empty = POOL.empty if xp is np else xp.empty
    grads = {n: empty((lanes, L), dtype) for n in adj.wrt}
    dh0v = xp.empty(flat_state, dtype) if adj.dh0 else None
    res.backend.backward(adj, arr, Cotangents(dy=dyv, grads=grads, dh_last=dhl, states=res.states, dh0=dh0v))
    out = {n: sum_to(grads[n].reshape(res.shape), res.shapes[n]).astype(res.dtypes[n], copy=False)
           for n in adj.wrt}
    return out, None if dh0v is None else dh0v.reshape(res.state_shape)


def recurrence_of(api: str, fn, operands: tuple) -> Recurrence:
    """The recurrence a call of ``fn`` with ``operands`` runs: ``fn`` itself, or what an operation's entry
    point declares (``fn.recurrence_for(operands)``, e.g. :func:`scanweaver.selective_scan`).

    Raises:
        ScanInputError: ``fn`` is neither.
    """
    if isinstance(fn, Recurrence):
        return fn
    pick = getattr(fn, "recurrence_for", None)
    if pick is not None:
        return pick(tuple(operands))
    raise ScanInputError(f"{api}: fn must be a @scanweaver.recurrence or scanweaver.selective_scan, got {fn!r}")


def vjp(fn, *operands, h0=None, reset=None, reverse: bool = False, return_state: bool = False, cu_seqlens=None,
        backend: str = "auto", states: str = "recompute", **tunables):
    """Runs ``fn`` forward and returns ``(out, pullback)`` for reverse-mode gradients.

    Args:
        fn: a :class:`~scanweaver.Recurrence` or :func:`scanweaver.selective_scan`.
        *operands: its operands (``c`` may be omitted or None for ``selective_scan``).
        h0, reset, reverse, return_state, cu_seqlens, backend: as for the forward call.
        states: ``"recompute"`` or ``"save"`` (see the module docstring).
        **tunables: the forward's schedule, config and tunables.

    Returns:
        ``(out, pullback)``: ``out`` is ``y`` or ``(y, h_last)``; ``pullback(dy, dh_last=None)``
        returns a dict operand name -> gradient (plus ``"h0"`` when h0 was given).
    """
    rec = recurrence_of("vjp", fn, operands)
    ops = [v for v in operands if v is not None]
    res = prepare_call(rec, dict(zip(rec.inputs, ops, strict=True)), h0=h0, reset=reset, reverse=reverse,
                       cu_seqlens=cu_seqlens, backend=backend)
    y, h_last = forward(res, states=states, **tunables)

    def pullback(dy, dh_last=None) -> dict:
        grads, dh0 = backward(res, dy, dh_last)
        return grads | ({"h0": dh0} if dh0 is not None else {})

    return ((y, h_last) if return_state else y), pullback
