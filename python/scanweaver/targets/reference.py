"""The NumPy reference: a float64 sequential oracle and the schedule interpreter.

The interpreter executes a :class:`~scanweaver.ir.stages.ScheduleIR` op by op
on NumPy arrays; it is the definition of what each schedule op means, and the
paper's Python prototype lowering path.  Every other target is checked
against it and against the oracle.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..frontend.symbolic import NUMPY_FUNCTIONS
from ..ir.expr import Expr, evaluate
from ..ir.stages import AffineScanIR, ScheduleIR

OPS: dict[str, Callable[[dict, dict], None]] = {}


def op(name: str):
    """Registers the interpreter handler for schedule op ``name``."""

    def deco(fn):
        OPS[name] = fn
        return fn

    return deco


def eval_operand(e: Expr, inputs: dict[str, np.ndarray], dtype, shape) -> np.ndarray:
    """Evaluates an h-free expression elementwise, broadcast to ``shape``."""
    with np.errstate(all="ignore"):
        val = evaluate(e, lambda n: inputs[n].astype(dtype, copy=False), NUMPY_FUNCTIONS)
    return np.broadcast_to(np.asarray(val, dtype=dtype), shape)


def elements(ir: AffineScanIR, inputs: dict[str, np.ndarray], reset: np.ndarray | None, dtype):
    """The pairs (A_t, U_t) in scan order, with resets applied (A_t = 0)."""
    shape = next(iter(inputs.values())).shape
    A = np.array(eval_operand(ir.A, inputs, dtype, shape))
    U = np.array(eval_operand(ir.U, inputs, dtype, shape))
    if reset is not None:
        A[reset.astype(bool)] = 0
    return A, U


def project(ir: AffineScanIR, inputs: dict[str, np.ndarray], h: np.ndarray, hprev: np.ndarray, dtype):
    """y_t from h_t and h_{t-1} (both in time order)."""
    out = ir.output
    if out.is_identity:
        return h
    shape = h.shape
    with np.errstate(all="ignore"):
        y = eval_operand(out.new, inputs, dtype, shape) * h
        if not (out.old.op == "const" and out.old.value == 0):
            y = y + eval_operand(out.old, inputs, dtype, shape) * hprev
        if not (out.const.op == "const" and out.const.value == 0):
            y = y + eval_operand(out.const, inputs, dtype, shape)
    return y


def _time_order(arr, reverse):
    return arr[..., ::-1] if reverse else arr


def _prev_states(h: np.ndarray, h0: np.ndarray, reverse: bool) -> np.ndarray:
    """h_{t-1} in time order (h_{t+1} for reverse scans), h0 at the start."""
    hs = _time_order(h, reverse)
    prev = np.concatenate([h0[:, None], hs[:, :-1]], axis=1)
    return _time_order(prev, reverse)


def run(ir: AffineScanIR, schedule: ScheduleIR | None, inputs: dict[str, np.ndarray],
        h0: np.ndarray | None = None, reset: np.ndarray | None = None, dtype=np.float64):
    """Runs the scan on 2-D ``(lanes, L)`` operands.

    Args:
        ir: the affine normal form.
        schedule: the schedule to interpret; ``None`` runs the sequential oracle.
        inputs: operand name -> ``(lanes, L)`` array.
        h0: initial state per lane, or ``None`` for zeros.
        reset: boolean ``(lanes, L)`` mask, or ``None``.
        dtype: accumulation dtype (float64 for the oracle).

    Returns:
        ``(y, h_last)``: outputs ``(lanes, L)`` and the final state ``(lanes,)``.
    """
    lanes, L = next(iter(inputs.values())).shape
    reverse = ir.features.reverse
    A, U = elements(ir, inputs, reset, dtype)
    A, U = _time_order(A, reverse), _time_order(U, reverse)
    h0v = np.zeros(lanes, dtype) if h0 is None else np.asarray(h0, dtype).reshape(lanes)
    ctx = {"A": A, "U": U, "h0": h0v, "dtype": dtype, "h": np.empty((lanes, L), dtype)}
    ops = schedule.ops if schedule is not None else ()
    with np.errstate(all="ignore"):
        if not ops:
            OPS["sequential.scan"](ctx, {})
        for o in ops:
            OPS[o.name](ctx, dict(o.attrs))
    h = _time_order(ctx["h"], reverse)
    h_last = ctx["h"][:, -1].copy() if L else h0v.copy()
    hprev = _prev_states(h, h0v, reverse) if L else h
    return project(ir, inputs, h, hprev, dtype), h_last


def oracle(ir: AffineScanIR, inputs, h0=None, reset=None):
    """The float64 (complex128 for complex operands) sequential oracle: the definition of the right answer."""
    wide = np.complex128 if any(np.iscomplexobj(v) for v in (*inputs.values(), h0)) else np.float64
    return run(ir, None, {k: np.asarray(v, wide) for k, v in inputs.items()}, h0, reset, wide)


@op("sequential.scan")
def _sequential(ctx, attrs):
    A, U, out = ctx["A"], ctx["U"], ctx["h"]
    h = ctx["h0"].copy()
    for t in range(A.shape[1]):
        h = A[:, t] * h + U[:, t]
        out[:, t] = h


def _blocks(ctx, n):
    """A and U padded with the identity (1, 0) to whole blocks of n: (lanes, nb, n)."""
    A, U = ctx["A"], ctx["U"]
    lanes, L = A.shape
    nb = max(1, -(-L // n))
    pad = nb * n - L
    Ap = np.concatenate([A, np.ones((lanes, pad), A.dtype)], axis=1).reshape(lanes, nb, n)
    Up = np.concatenate([U, np.zeros((lanes, pad), U.dtype)], axis=1).reshape(lanes, nb, n)
    return Ap, Up


@op("chunked.reduce")
def _chunked_reduce(ctx, attrs):
    Ac, Uc = _blocks(ctx, attrs["chunk"])
    ga = np.ones(Ac.shape[:2], Ac.dtype)
    gu = np.zeros(Ac.shape[:2], Ac.dtype)
    for j in range(Ac.shape[2]):
        ga, gu = Ac[:, :, j] * ga, Ac[:, :, j] * gu + Uc[:, :, j]
    ctx["agg"] = (ga, gu)
    ctx["blocks"] = (Ac, Uc)


@op("chunked.scan")
def _chunked_scan(ctx, attrs):
    ga, gu = ctx["agg"]
    carry = np.empty_like(ga)
    h = ctx["h0"].copy()
    for c in range(ga.shape[1]):
        carry[:, c] = h
        h = ga[:, c] * h + gu[:, c]
    ctx["carry"] = carry


@op("chunked.propagate")
def _chunked_propagate(ctx, attrs):
    Ac, Uc = ctx["blocks"]
    h = ctx["carry"].copy()
    out = np.empty_like(Ac)
    for j in range(Ac.shape[2]):
        h = Ac[:, :, j] * h + Uc[:, :, j]
        out[:, :, j] = h
    L = ctx["A"].shape[1]
    ctx["h"][:] = out.reshape(out.shape[0], -1)[:, :L]


@op("blelloch.up")
def _blelloch_up(ctx, attrs):
    n = attrs["block"]
    pa, pu = (x.copy() for x in _blocks(ctx, n))
    ctx["elem"] = (pa.copy(), pu.copy())
    d = 1
    while d < n:
        r = np.arange(2 * d - 1, n, 2 * d)
        lft = r - d
        pa[..., r], pu[..., r] = pa[..., r] * pa[..., lft], pa[..., r] * pu[..., lft] + pu[..., r]
        d *= 2
    ctx["tree"] = (pa, pu)


@op("blelloch.root")
def _blelloch_root(ctx, attrs):
    pa, pu = ctx["tree"]
    ctx["totals"] = (pa[..., -1].copy(), pu[..., -1].copy())
    pa[..., -1], pu[..., -1] = 1, 0


@op("blelloch.down")
def _blelloch_down(ctx, attrs):
    n = attrs["block"]
    pa, pu = ctx["tree"]
    d = n // 2
    while d >= 1:
        r = np.arange(2 * d - 1, n, 2 * d)
        lft = r - d
        ta, tu = pa[..., lft].copy(), pu[..., lft].copy()
        pa[..., lft], pu[..., lft] = pa[..., r], pu[..., r]
        # prefix (earlier) then left subtree (later): t o p
        pa[..., r], pu[..., r] = ta * pa[..., r], ta * pu[..., r] + tu
        d //= 2


@op("blelloch.carry")
def _blelloch_carry(ctx, attrs):
    ta, tu = ctx["totals"]
    carry = np.empty_like(ta)
    h = ctx["h0"].copy()
    for b in range(ta.shape[1]):
        carry[:, b] = h
        h = ta[:, b] * h + tu[:, b]
    ctx["carry"] = carry


@op("blelloch.apply")
def _blelloch_apply(ctx, attrs):
    ea, eu = ctx["elem"]
    pa, pu = ctx["tree"]
    ia, iu = ea * pa, ea * pu + eu
    h = ia * ctx["carry"][..., None] + iu
    L = ctx["A"].shape[1]
    ctx["h"][:] = h.reshape(h.shape[0], -1)[:, :L]


# Handlers of the GPU schedule ops live in their own module and register into OPS.
from . import reference_gpu  # noqa: E402,F401
