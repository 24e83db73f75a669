"""The ``scan`` kernel pair: any compiled recurrence, forward and backward, for the framework adapters.

``scanweaver.torch.apply`` / ``scanweaver.jax.apply`` (and the ``selective_scan``
entries) run the pair ``scan``: the forward is the recurrence's own call (its plan on
repeated calls), the backward is stage ``adjoint`` (:mod:`scanweaver.ir.adjoint`) on
the same backend (:mod:`scanweaver.core.autodiff`).  The option ``recurrence``
names the recurrence in :data:`scanweaver.frontend.RECURRENCES` (:func:`recurrence_key`).

Example:
    >>> import numpy as np
    >>> from scanweaver.calls.pairs import PAIRS
    >>> pair = PAIRS.get("scan")
    >>> ops = [np.full((1, 3), 0.5), np.ones((1, 3)), np.ones((1, 3)), np.ones((1, 3)), None, None]
    >>> opts = {"recurrence": "selective_scan", "backend": "numpy"}
    >>> y, h_last, states = pair.forward(ops, opts)
    >>> y.tolist(), [g.tolist() for g in pair.backward(ops, [states], [np.ones((1, 3)), None],
    ...                                               [False, False, True, False, False, False], opts)]
    ([[1.0, 1.5, 1.75]], [[[1.75, 1.5, 1.0]]])
"""

from __future__ import annotations

import numpy as np

from ...arrays import compute_dtype, result_dtype
from ...calls.pairs import PAIRS, KernelPair
from ...checks import seqlens_option
from ...core import autodiff
from ...core.recurrence import Recurrence
from ...errors import ScanInputError
from ...frontend import RECURRENCES
from . import api as _api  # noqa: F401  (registers selective_scan's recurrences)


def recurrence_key(rec: Recurrence) -> str:
    """Registers ``rec`` for the framework ops; returns its key (its name, made unique per normal form)."""
    key = rec.name
    if key in RECURRENCES and RECURRENCES.get(key) is not rec:
        key = f"{rec.name}.{rec.signature('float64')}"
    RECURRENCES.add(key, rec, replace=True)
    return key


def _scan_call(inputs: list, options: dict):
    rec = RECURRENCES.get(options["recurrence"])
    n = len(rec.inputs)
    ops, (h0, reset) = inputs[:n], inputs[n:]
    res = autodiff.prepare_call(rec, dict(zip(rec.inputs, ops, strict=True)), h0=h0, reset=reset,
                                reverse=options.get("reverse", False), cu_seqlens=options.get("cu_seqlens"),
                                backend=options.get("backend", "auto"))
    return rec, res


def _scan_forward(inputs: list, options: dict) -> list:
    if options.get("states", "recompute") == "recompute":
        direct = _forward_direct(inputs, options)
        if direct is not None:
            return direct
    _, res = _scan_call(inputs, options)
    y, h_last = autodiff.forward(res, states=options.get("states", "recompute"), schedule=options.get(
        "schedule", "auto"), config=options.get("config", "auto"), **options.get("tunables", {}))
    xp = autodiff.array_module(y)
    # Recomputing keeps no states: an empty residual shaped (..., 0) (leading axes batch under vmap).
    states = res.states.reshape(_saved_shape(res.shape, res.affine.state_size)) if res.states is not None \
        else xp.empty((*res.shape[:-1], 0), res.arrays.dtype)
    return [y, h_last, states]


def _forward_direct(inputs: list, options: dict) -> list | None:
    """The forward of a call whose backward recomputes its states, on host arrays: the recurrence's own call.

    Nothing of the prepared call is kept for the backward (it prepares the
    call again from the saved inputs), so the forward can be the plain call,
    which finds its per-signature plan on repeated calls (a framework call of
    a small problem then costs what the framework's dispatch does, not a full
    validation and lowering).  ``None`` (the prepared path runs) for device
    arrays and complex operands (whose gradients the prepared path refuses).
    """
    rec = RECURRENCES.get(options["recurrence"])
    n = len(rec.inputs)
    ops, (h0, reset) = inputs[:n], inputs[n:]
    if not all(type(v) is np.ndarray and v.dtype.kind != "c" for v in ops):
        return None
    if any(v is not None and type(v) is not np.ndarray for v in (h0, reset)):
        return None
    y, h_last = rec(*ops, h0=h0, reset=reset, reverse=options.get("reverse", False), return_state=True,
                    cu_seqlens=options.get("cu_seqlens"), backend=options.get("backend", "auto"),
                    schedule=options.get("schedule", "auto"), config=options.get("config", "auto"),
                    **options.get("tunables", {}))
    return [y, h_last, np.empty((*y.shape[:-1], 0), h_last.dtype)]


def _scan_backward(inputs: list, residuals: list, cotangents: list, needs: list, options: dict) -> list:
    rec, res = _scan_call(inputs, options)
    n = len(rec.inputs)
    if options.get("states", "recompute") == "save":
        k = res.affine.state_size
        res.states = residuals[0].reshape((res.arrays.lanes, res.arrays.L) if k == 1 else
                                          (res.arrays.lanes, res.arrays.L, k))
    wrt = tuple(name for name, need in zip(rec.inputs, needs[:n], strict=True) if need)
    dy, dh_last = cotangents
    if dy is None:
        dy = autodiff.array_module(res.arrays.inputs[rec.inputs[0]]).zeros(res.shape, res.arrays.dtype)
    grads, dh0 = autodiff.backward(res, dy, dh_last, wrt=wrt, dh0=needs[n])
    out = [grads[name] for name in wrt]
    if needs[n]:
        out.append(dh0.astype(inputs[n].dtype, copy=False))
    return out


def _scan_shapes(specs: list, options: dict) -> list:
    rec = RECURRENCES.get(options["recurrence"])
    ops = [s for s in specs[: len(rec.inputs)]]
    if any(s is None for s in ops):
        raise ScanInputError(f"{rec.name}: every operand is required ({', '.join(rec.inputs)})")
    try:
        shape = tuple(np.broadcast_shapes(*(s[0] for s in ops))) if rec.broadcast else tuple(ops[0][0])
    except ValueError:
        raise ScanInputError(f"{rec.name}: operand shapes do not broadcast together: "
                             f"{', '.join(str(tuple(s[0])) for s in ops)}") from None
    dtypes = [s[1] for s in ops]
    wide = compute_dtype(dtypes)
    k = rec.state_size
    state = shape[:-1] if k == 1 else (*shape[:-1], k)
    saved = _saved_shape(shape, k) if options.get("states") == "save" else (*shape[:-1], 0)
    return [(shape, result_dtype(dtypes)), (state, wide), (saved, wide)]


def _saved_shape(shape: tuple, k: int) -> tuple:
    return tuple(shape) if k == 1 else (*shape, k)


PAIRS.register()(KernelPair("scan", _scan_forward, _scan_backward, _scan_shapes, n_outputs=2, batches=True))


def scan_options(rec: Recurrence, *, reverse: bool = False, cu_seqlens=None, backend: str = "auto",
                 schedule: str = "auto", config="auto", states: str = "recompute", **tunables) -> dict:
    """The ``scan`` pair's options for a call of ``rec`` (checked where a framework wrapper cannot)."""
    if states not in autodiff.STATES:
        raise ScanInputError(f"{rec.name}: states must be one of {', '.join(autodiff.STATES)}; got {states!r}")
    cu = seqlens_option(rec.name, cu_seqlens)
    return {"recurrence": recurrence_key(rec), "reverse": bool(reverse), "cu_seqlens": cu, "backend": backend,
            "schedule": schedule, "config": config, "states": states, "tunables": dict(tunables)}
