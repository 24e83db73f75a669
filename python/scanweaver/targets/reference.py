"""The NumPy reference: a float64 sequential oracle and the schedule interpreter.

The interpreter executes a :class:`~scanweaver.ir.stages.ScheduleIR` op by op
on NumPy arrays; it is the definition of what each schedule op means, and the
paper's Python prototype lowering path.  Every other target is checked
against it and against the oracle.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ir.functions import NUMPY
from ..ir.expr import Expr, evaluate, is_const
from ..ir.stages import AffineScanIR, ScheduleIR
from ..registry import Discovery, Registry
from ..schedules import get_schedule
from .base import TARGETS

#: Schedule op name -> its interpreter handler ``fn(ctx, attrs)`` (this module and ``reference_*``).
OPS: Registry[Callable[[dict, dict], None]] = Registry(
    "interpreter op", (Discovery("scanweaver.targets", ("reference*",)),))


def op(name: str):
    """Registers the interpreter handler for schedule op ``name``."""
    return OPS.register(name)


@TARGETS.register
class Interpreter:
    """The NumPy interpreter as a target (``numpy``): it implements every schedule whose ops all have handlers."""

    target = "numpy"

    @classmethod
    def implements(cls, schedule: str, kind: str) -> bool:
        """True when every op of ``schedule`` (at its defaults) has a handler and the ops handle ``kind``."""
        sched = get_schedule(schedule)
        return kind in sched.kinds and all(o.name in OPS for o in sched.ops(sched.defaults()))


def eval_operand(e: Expr, inputs: dict[str, np.ndarray], dtype, shape) -> np.ndarray:
    """Evaluates an h-free expression elementwise, broadcast to ``shape``."""
    with np.errstate(all="ignore"):
        val = evaluate(e, lambda n: inputs[n].astype(dtype, copy=False), NUMPY)
    return np.broadcast_to(np.asarray(val, dtype=dtype), shape)


class Diagonal:
    """Pair algebra of scalar transitions: A and U have no trailing state axes."""

    def __init__(self, k: int = 1):
        self.k = k

    def compose(self, a2, u2, a1, u1):
        """(A2, U2) o (A1, U1): later after earlier.  A zero factor keeps the product zero and a zero U1 gives U2
        (:meth:`carry`) even where the other side's product has overflowed."""
        with np.errstate(invalid="ignore", over="ignore"):
            return np.where((a2 == 0) | (a1 == 0), 0, a2 * a1).astype(a2.dtype, copy=False), self.carry(a2, u2, u1)

    def apply(self, a, u, h):
        """A*h + U (one step)."""
        return a * h + u

    def carry(self, a, u, h):
        """A*h + U for an aggregate (A, U) of many steps entered with the carry h: a zero carry gives U even where
        the product A has overflowed (growing transitions), as the kernels' ``sw_carry`` (inf * 0 is NaN)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return np.where(h == 0, u, a * h + u).astype(np.result_type(u, h), copy=False)

    def identity(self, shape, dtype):
        """(1, 0) with leading ``shape``."""
        return np.ones(shape, dtype), np.zeros(shape, dtype)

    def state_shape(self, shape) -> tuple:
        """Shape of states with leading ``shape``."""
        return tuple(shape)


class Dense(Diagonal):
    """Pair algebra of k x k transitions: A is ``(..., k, k)``, U and h ``(..., k)``."""

    def compose(self, a2, u2, a1, u1):
        return a2 @ a1, (a2 @ u1[..., None])[..., 0] + u2

    def apply(self, a, u, h):
        return (a @ h[..., None])[..., 0] + u

    def carry(self, a, u, h):
        """A h + U with the zero entries of h taking no part (the kernels' ``sw_dcarry``)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return (np.where(h[..., None, :] == 0, 0, a) @ h[..., None])[..., 0] + u

    def identity(self, shape, dtype):
        eye = np.broadcast_to(np.eye(self.k, dtype=dtype), (*shape, self.k, self.k)).copy()
        return eye, np.zeros((*shape, self.k), dtype)

    def state_shape(self, shape) -> tuple:
        return (*shape, self.k)


def algebra(ir: AffineScanIR) -> Diagonal:
    """The pair algebra of ``ir``'s transition kind."""
    return Dense(ir.state_size) if ir.kind == "dense" else Diagonal()


def _components(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def elements(ir: AffineScanIR, inputs: dict[str, np.ndarray], reset: np.ndarray | None, dtype):
    """The pairs (A_t, U_t) in time order, with resets applied (A_t = 0).

    Diagonal: ``(lanes, L)`` each; dense: A ``(lanes, L, k, k)``, U ``(lanes, L, k)``.
    """
    shape = next(iter(inputs.values())).shape
    if ir.kind == "dense":
        k = ir.state_size
        A = np.stack([eval_operand(e, inputs, dtype, shape) for e in ir.A], axis=-1).reshape(*shape, k, k)
        U = np.stack([eval_operand(e, inputs, dtype, shape) for e in ir.U], axis=-1)
    else:
        A = np.array(eval_operand(ir.A, inputs, dtype, shape))
        U = np.array(eval_operand(ir.U, inputs, dtype, shape))
    if reset is not None:
        A[reset.astype(bool)] = 0
    return A, U


def project(ir: AffineScanIR, inputs: dict[str, np.ndarray], h: np.ndarray, hprev: np.ndarray, dtype):
    """y_t from h_t and h_{t-1} (both in time order; a trailing state axis for dense)."""
    out = ir.output
    if out.is_identity:
        return h
    shape = next(iter(inputs.values())).shape
    dense = ir.kind == "dense"
    with np.errstate(all="ignore"):
        y = np.zeros(shape, dtype)
        for j, (new, old) in enumerate(zip(_components(out.new), _components(out.old), strict=True)):
            hj, pj = (h[..., j], hprev[..., j]) if dense else (h, hprev)
            if not is_const(new, 0.0):
                y = y + eval_operand(new, inputs, dtype, shape) * hj
            if not is_const(old, 0.0):
                y = y + eval_operand(old, inputs, dtype, shape) * pj
        if not is_const(out.const, 0.0):
            y = y + eval_operand(out.const, inputs, dtype, shape)
    return y


def _time_order(arr, reverse):
    return arr[:, ::-1] if reverse else arr


def prev_states(h: np.ndarray, h0: np.ndarray, reverse: bool) -> np.ndarray:
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
        h0: initial state per lane (``(lanes, k)`` for a dense state), or ``None`` for zeros.
        reset: boolean ``(lanes, L)`` mask, or ``None``.
        dtype: accumulation dtype (float64 for the oracle).

    Returns:
        ``(y, h_last)``: outputs ``(lanes, L)`` and the final state ``(lanes,)``
        (``(lanes, k)`` for a dense state).
    """
    lanes, L = next(iter(inputs.values())).shape
    reverse = ir.features.reverse
    alg = algebra(ir)
    A, U = elements(ir, inputs, reset, dtype)
    A, U = _time_order(A, reverse), _time_order(U, reverse)
    state = alg.state_shape((lanes,))
    h0v = np.zeros(state, dtype) if h0 is None else np.asarray(h0, dtype).reshape(state)
    ctx = {"A": A, "U": U, "h0": h0v, "dtype": dtype, "alg": alg, "h": np.empty(alg.state_shape((lanes, L)), dtype)}
    ops = schedule.ops if schedule is not None else ()
    with np.errstate(all="ignore"):
        if not ops:
            OPS["sequential.scan"](ctx, {})
        for o in ops:
            OPS[o.name](ctx, dict(o.attrs))
    h = _time_order(ctx["h"], reverse)
    h_last = ctx["h"][:, -1].copy() if L else h0v.copy()
    hprev = prev_states(h, h0v, reverse) if L else h
    return project(ir, inputs, h, hprev, dtype), h_last


def oracle(ir: AffineScanIR, inputs, h0=None, reset=None):
    """The float64 (complex128 for complex operands) sequential oracle: the definition of the right answer."""
    wide = np.complex128 if any(np.iscomplexobj(v) for v in (*inputs.values(), h0)) else np.float64
    return run(ir, None, {k: np.asarray(v, wide) for k, v in inputs.items()}, h0, reset, wide)


@op("sequential.scan")
def _sequential(ctx, attrs):
    A, U, out, alg = ctx["A"], ctx["U"], ctx["h"], ctx["alg"]
    h = ctx["h0"].copy()
    for t in range(A.shape[1]):
        h = alg.apply(A[:, t], U[:, t], h)
        out[:, t] = h


def _blocks(ctx, n):
    """A and U padded with the identity (1, 0) to whole blocks of n: ``(lanes, nb, n, ...)``."""
    A, U, alg = ctx["A"], ctx["U"], ctx["alg"]
    lanes, L = A.shape[:2]
    nb = max(1, -(-L // n))
    pa, pu = alg.identity((lanes, nb * n - L), A.dtype)
    Ap = np.concatenate([A, pa], axis=1).reshape(lanes, nb, n, *A.shape[2:])
    Up = np.concatenate([U, pu], axis=1).reshape(lanes, nb, n, *U.shape[2:])
    return Ap, Up


def _store(ctx, h):
    """Writes blocked states ``(lanes, nb, n, ...)`` back to ``ctx['h']`` without the padding."""
    L = ctx["A"].shape[1]
    ctx["h"][:] = h.reshape(h.shape[0], -1, *h.shape[3:])[:, :L]


def _chain(ctx, ga, gu):
    """Carry-in state of each consecutive aggregate ``ga/gu[:, b]``, starting from h0."""
    alg = ctx["alg"]
    carry = np.empty(alg.state_shape(ga.shape[:2]), ga.dtype)
    h = ctx["h0"].copy()
    for b in range(ga.shape[1]):
        carry[:, b] = h
        h = alg.carry(ga[:, b], gu[:, b], h)
    return carry


@op("chunked.reduce")
def _chunked_reduce(ctx, attrs):
    alg = ctx["alg"]
    Ac, Uc = _blocks(ctx, attrs["chunk"])
    ga, gu = alg.identity(Ac.shape[:2], Ac.dtype)
    for j in range(Ac.shape[2]):
        ga, gu = alg.compose(Ac[:, :, j], Uc[:, :, j], ga, gu)
    ctx["agg"] = (ga, gu)
    ctx["blocks"] = (Ac, Uc)


@op("chunked.scan")
def _chunked_scan(ctx, attrs):
    ctx["carry"] = _chain(ctx, *ctx["agg"])


@op("chunked.propagate")
def _chunked_propagate(ctx, attrs):
    alg = ctx["alg"]
    Ac, Uc = ctx["blocks"]
    h = ctx["carry"].copy()
    out = np.empty(alg.state_shape(Ac.shape[:3]), Ac.dtype)
    for j in range(Ac.shape[2]):
        h = alg.apply(Ac[:, :, j], Uc[:, :, j], h)
        out[:, :, j] = h
    _store(ctx, out)


@op("blelloch.up")
def _blelloch_up(ctx, attrs):
    n, alg = attrs["block"], ctx["alg"]
    pa, pu = (x.copy() for x in _blocks(ctx, n))
    ctx["elem"] = (pa.copy(), pu.copy())
    d = 1
    while d < n:
        r = np.arange(2 * d - 1, n, 2 * d)
        lft = r - d
        pa[:, :, r], pu[:, :, r] = alg.compose(pa[:, :, r], pu[:, :, r], pa[:, :, lft], pu[:, :, lft])
        d *= 2
    ctx["tree"] = (pa, pu)


@op("blelloch.root")
def _blelloch_root(ctx, attrs):
    pa, pu = ctx["tree"]
    ctx["totals"] = (pa[:, :, -1].copy(), pu[:, :, -1].copy())
    pa[:, :, -1], pu[:, :, -1] = ctx["alg"].identity(pa.shape[:2], pa.dtype)


@op("blelloch.down")
def _blelloch_down(ctx, attrs):
    n, alg = attrs["block"], ctx["alg"]
    pa, pu = ctx["tree"]
    d = n // 2
    while d >= 1:
        r = np.arange(2 * d - 1, n, 2 * d)
        lft = r - d
        ta, tu = pa[:, :, lft].copy(), pu[:, :, lft].copy()
        pa[:, :, lft], pu[:, :, lft] = pa[:, :, r], pu[:, :, r]
        # prefix (earlier) then left subtree (later): t o p
        pa[:, :, r], pu[:, :, r] = alg.compose(ta, tu, pa[:, :, r], pu[:, :, r])
        d //= 2


@op("blelloch.carry")
def _blelloch_carry(ctx, attrs):
    ctx["carry"] = _chain(ctx, *ctx["totals"])


@op("blelloch.apply")
def _blelloch_apply(ctx, attrs):
    alg = ctx["alg"]
    ea, eu = ctx["elem"]
    pa, pu = ctx["tree"]
    ia, iu = alg.compose(ea, eu, pa, pu)
    _store(ctx, alg.carry(ia, iu, ctx["carry"][:, :, None]))

