"""Differentiable operations as forward/backward pairs of array kernels, wrapped once per framework.

A :class:`KernelPair` says how to run an operation forward on arrays (NumPy,
or CuPy for the ``cuda`` backend), which arrays to keep for the backward,
how to run the backward, and the shapes of its results without running it.
:mod:`scanweaver.torch` turns every registered pair into one ``torch.library``
custom op with a registered autograd formula (so it works under
``torch.compile``), and :mod:`scanweaver.jax` into a ``jax.custom_vjp``
function whose kernels run through ``jax.pure_callback``.  The pairs are found
by name in :data:`PAIRS`; a new differentiable kernel (a fused Mamba scan,
say) registers a pair and gets both framework wrappers for free::

    PAIRS.register()(KernelPair("my_op", forward, backward, shapes, n_outputs=1))
    y = scanweaver.torch.call("my_op", [u, delta, A], {"softplus": True})[0]

Options are a dict of Python literals (bool, int, float, str, None, and tuples,
lists and dicts of them); they reach the kernels unchanged and are part of
the op's identity under ``torch.compile`` and ``jax.jit``.

Example:
    >>> import numpy as np
    >>> pair = PAIRS.get("scan")
    >>> ops = [np.full((1, 3), 0.5), np.ones((1, 3)), np.ones((1, 3)), np.ones((1, 3)), None, None]
    >>> opts = {"recurrence": "selective_scan", "backend": "numpy"}
    >>> y, h_last, states = pair.forward(ops, opts)
    >>> y.tolist(), [g.tolist() for g in pair.backward(ops, [states], [np.ones((1, 3)), None],
    ...                                               [False, False, True, False, False, False], opts)]
    ([[1.0, 1.5, 1.75]], [[[1.75, 1.5, 1.0]]])
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import autodiff
from .api import SELECTIVE, SELECTIVE_NO_C, Recurrence
from .arrays import compute_dtype, result_dtype
from .errors import ScanInputError
from .registry import Registry


@dataclass(frozen=True)
class KernelPair:
    """A differentiable operation on arrays.

    Attributes:
        name: its name (``scanweaver::<name>`` is not used: one generic custom op dispatches by it).
        forward: ``forward(inputs, options) -> results``: ``inputs`` a list of arrays or ``None``
            (absent optional inputs); ``results`` the outputs followed by the residuals, all arrays.
        backward: ``backward(inputs, residuals, cotangents, needs, options) -> grads``: one
            cotangent (or ``None``) per output, one flag per input; returns one gradient per
            input with ``needs`` set, in order, each shaped and typed like its input.
        shapes: ``shapes(specs, options) -> [(shape, dtype)]`` of the results, from ``specs``
            (``(shape, numpy dtype)`` or ``None`` per input), without running anything.
        n_outputs: how many of the results are outputs (the rest are residuals).
    """

    name: str
    forward: Callable
    backward: Callable
    shapes: Callable
    n_outputs: int


#: Every kernel pair, by name.
PAIRS: Registry[KernelPair] = Registry("kernel pair")
#: Recurrences reachable from the ``scan`` pair's ``recurrence`` option (see :func:`recurrence_key`).
RECURRENCES: Registry[Recurrence] = Registry("recurrence")


def recurrence_key(rec: Recurrence) -> str:
    """Registers ``rec`` for the framework ops; returns its key (its name, made unique per normal form)."""
    key = rec.name
    if key in RECURRENCES and RECURRENCES.get(key) is not rec:
        key = f"{rec.name}.{rec.signature('float64')}"
    RECURRENCES.add(key, rec, replace=True)
    return key


RECURRENCES.add(SELECTIVE.name, SELECTIVE)
RECURRENCES.add(SELECTIVE_NO_C.name, SELECTIVE_NO_C)


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


PAIRS.register()(KernelPair("scan", _scan_forward, _scan_backward, _scan_shapes, n_outputs=2))


@functools.lru_cache(maxsize=256)
def parse_options(text: str) -> dict:
    """A pair's options from their ``repr`` (as framework ops carry them), parsed once per text.

    The dict is shared between calls: read it, do not change it.
    """
    return ast.literal_eval(text)


def scan_options(rec: Recurrence, *, reverse: bool = False, cu_seqlens=None, backend: str = "auto",
                 schedule: str = "auto", config="auto", states: str = "recompute", **tunables) -> dict:
    """The ``scan`` pair's options for a call of ``rec`` (checked where a framework wrapper cannot)."""
    if states not in autodiff.STATES:
        raise ScanInputError(f"{rec.name}: states must be one of {', '.join(autodiff.STATES)}; got {states!r}")
    cu = None if cu_seqlens is None else [int(v) for v in np.asarray(cu_seqlens).reshape(-1)]
    return {"recurrence": recurrence_key(rec), "reverse": bool(reverse), "cu_seqlens": cu, "backend": backend,
            "schedule": schedule, "config": config, "states": states, "tunables": dict(tunables)}
