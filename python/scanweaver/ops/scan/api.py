"""``selective_scan``: h_t = a_t*h_{t-1} + b_t*x_t, y_t = c_t*h_t over the last axis, the paper's scan.

Two compiled recurrences carry it, with and without the readout ``c``; they are
registered by name in :data:`scanweaver.frontend.RECURRENCES` so that lower
layers (tuning, calibration) can name them.
"""

from __future__ import annotations

from ...calls.declare import operation
from ...core.recurrence import Recurrence
from ...core.autodiff import check_states
from ...frontend import RECURRENCES


def _selective(h, a, b, x, c):
    h = a * h + b * x
    return h, c * h


def _selective_noc(h, a, b, x):
    return a * h + b * x


SELECTIVE = Recurrence(_selective, name="selective_scan", broadcast=False)
SELECTIVE_NO_C = Recurrence(_selective_noc, name="selective_scan_h", broadcast=False)
RECURRENCES.add("selective_scan", SELECTIVE)
RECURRENCES.add("selective_scan_h", SELECTIVE_NO_C)
def _recurrence(args: dict) -> Recurrence:
    """The recurrence a call runs: with the readout ``c``, or without it."""
    return SELECTIVE_NO_C if args.get("c") is None else SELECTIVE


@operation(arrays=("a", "b", "x", "c", "h0", "reset"), recurrence=_recurrence, frameworks=("torch", "jax", "dask"))
def selective_scan(a, b, x, c=None, *, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
                   backend: str = "auto", schedule: str = "auto", config="auto", cu_seqlens=None, out=None,
                   states: str = "recompute", **tunables):
    """The selective scan h_t = a_t*h_{t-1} + b_t*x_t, y_t = c_t*h_t over the last axis.

    Operands share one layout ``(..., L)`` (the paper's ``(B, D, L)``), in
    float32 or float64 (float16/bfloat16 accumulate in float32; complex on
    backends that list it in ``dtypes``); y = h when ``c`` is None.  Runs the best stored tuned
    configuration for this device and problem size when there is one.

    Args:
        a, b, x: operands of shape ``(..., L)``.
        c: output projection of shape ``(..., L)``, or None.
        h0: initial state of shape ``(...)``.
        reset: boolean mask ``(..., L)``; True at t starts a new segment.
        reverse: scan from t = L-1 down to 0.
        return_state: also return h_L (h_0 of the reversed scan).
        cu_seqlens: offsets ``[0, ..., L]`` of sequences packed along L (varlen batches).
        out: a preallocated C-contiguous output of shape ``(..., L)`` (see :meth:`Recurrence.__call__`);
            NumPy or device arrays only.
        states: for gradients (PyTorch, JAX): ``"recompute"`` (the backward recomputes the states from
            checkpoints) or ``"save"`` (the forward keeps them); see :mod:`scanweaver.core.autodiff`.
        backend: ``auto``, ``numpy``, ``cpu``, ``opencl``, ``cuda`` or ``julia``.
        schedule: ``auto`` or a schedule name (``sequential``, ``chunked`` ...).
        config: ``auto``, ``default`` or a dict of tunables.
        **tunables: schedule tunables such as ``chunk=4096`` or ``threads=2``.

    Returns:
        ``y`` of shape ``(..., L)``, or ``(y, h_last)`` with ``return_state``.

    Example:
        >>> import numpy as np, scanweaver
        >>> a = np.full((1, 4), 0.5); b = np.ones((1, 4)); x = np.ones((1, 4))
        >>> scanweaver.selective_scan(a, b, x, backend="numpy").tolist()
        [[1.0, 1.5, 1.75, 1.875]]
    """
    check_states(states)
    rec = SELECTIVE_NO_C if c is None else SELECTIVE
    return rec._run((a, b, x) if c is None else (a, b, x, c), tunables, h0, reset, reverse, return_state, backend,
                    schedule, config, cu_seqlens, out)


#: The recurrence :func:`selective_scan` runs (with ``c``), for APIs that take either.
selective_scan.recurrence = SELECTIVE  # type: ignore[attr-defined]
