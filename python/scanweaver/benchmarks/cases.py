"""Benchmark cases: shapes, operands and the float64 oracle every entry is checked against.

Operands follow the paper's bounded setting: gates ``a ~ U(0.9, 0.999)``,
``b, x, c`` standard normal, layout ``(B, D, L)``.  The oracle is a float64
sequential scan of the same (rounded) operands, so an entry's error is its
own, not the inputs' rounding.

Example:
    >>> from scanweaver.benchmarks.cases import Case, make_inputs, oracle64
    >>> case = Case("tiny", (1, 2, 5))
    >>> ops = make_inputs(case)
    >>> oracle64(ops).shape
    (1, 2, 5)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Gate range of the bounded setting: decays, but slowly enough that the past matters.
GATE_LOW, GATE_HIGH = 0.9, 0.999
#: Time steps per block of the two-level oracle used for long sequences.
ORACLE_BLOCK = 4096
#: Relative tolerance (max |y - y*| / max |y*| per lane, worst lane) for a pass.
TOLERANCE = {"float32": 2e-3, "float64": 1e-9}


@dataclass(frozen=True)
class Case:
    """One problem size.

    Attributes:
        name: short label used in tables and file names.
        shape: ``(B, D, L)``.
        dtype: ``float32`` or ``float64``.
        group: ``sweep`` (latency against L) or ``shape`` (a fixed peer shape).
        headline: the shape the targets are stated for (slow-to-compile peers run only here).
        device: where operands and the oracle live: ``host`` (NumPy) or ``cuda`` (CuPy: made on the
            GPU, the oracle computed there in float64, no host copies of large arrays).
    """

    name: str
    shape: tuple[int, int, int]
    dtype: str = "float32"
    group: str = "shape"
    headline: bool = False
    notes: tuple[str, ...] = field(default=())
    device: str = "host"

    @property
    def lanes(self) -> int:
        """Independent sequences (B * D)."""
        return self.shape[0] * self.shape[1]

    @property
    def L(self) -> int:
        """Sequence length."""
        return self.shape[2]

    @property
    def elements(self) -> int:
        """B * D * L."""
        return self.lanes * self.L

    @property
    def bytes_moved(self) -> int:
        """Bytes a scan with ``c`` must move: four operands read, one output written."""
        return 5 * self.elements * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class Settings:
    """How hard to measure.

    Attributes:
        quick: the seconds-long smoke mode.
        min_repeats, max_repeats: timed runs per entry (after the warm-up).
        budget_s: keep repeating (up to ``max_repeats``) until this much time is timed.
        max_call_s: entries whose estimated call exceeds this are capped (skipped with the reason).
        max_compile_s: entries that compile for longer than this (e.g. torch.compile) are left out.
    """

    quick: bool = False
    min_repeats: int = 5
    max_repeats: int = 50
    budget_s: float = 1.0
    max_call_s: float = 4.0
    max_compile_s: float = 120.0

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        """The defaults of ``--quick`` or of a full run."""
        if quick:
            return cls(quick=True, min_repeats=3, max_repeats=10, budget_s=0.05, max_call_s=0.5, max_compile_s=5.0)
        return cls()


def _xp(a):
    """NumPy, or CuPy for a CuPy array (the oracle and error run where the data is)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def make_device_inputs(case: Case, seed: int = 0) -> dict:
    """Operands of ``case`` generated on the GPU (CuPy), same distributions as :func:`make_inputs`."""
    import cupy

    cupy.random.seed(seed)
    ops = {"a": cupy.random.uniform(GATE_LOW, GATE_HIGH, case.shape, dtype=case.dtype)}
    for name in ("b", "x", "c"):
        ops[name] = cupy.random.standard_normal(case.shape, dtype=case.dtype)
    return ops


def make_inputs(case: Case, constant_a: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Operands ``a, b, x, c`` of ``case.shape`` in ``case.dtype``.

    Args:
        case: the problem size.
        constant_a: make ``a`` constant over time per lane (the filter special case).
        seed: generator seed (same seed, same operands).
    """
    rng = np.random.default_rng(seed)
    B, D, L = case.shape
    if constant_a:
        a = np.broadcast_to(rng.uniform(GATE_LOW, GATE_HIGH, (B, D, 1)), case.shape)
    else:
        a = rng.uniform(GATE_LOW, GATE_HIGH, case.shape)
    ops = {"a": a}
    for name in ("b", "x", "c"):
        ops[name] = rng.standard_normal(case.shape, dtype=np.float32 if case.dtype == "float32" else np.float64)
    return {k: np.ascontiguousarray(v, dtype=case.dtype) for k, v in ops.items()}


def _scan_time_major(A: np.ndarray, U: np.ndarray) -> np.ndarray:
    """h_t = A_t*h_{t-1} + U_t from h = 0 over axis 0 (contiguous rows, one step per row)."""
    xp = _xp(A)
    h = xp.zeros(A.shape[1:], A.dtype)
    out = xp.empty_like(U)
    for t in range(A.shape[0]):
        xp.multiply(A[t], h, out=h)
        h += U[t]
        out[t] = h
    return out


def oracle64(ops: dict[str, np.ndarray], block: int = ORACLE_BLOCK) -> np.ndarray:
    """y = c*h of the selective scan, computed in float64.

    Short sequences run one sequential loop; sequences longer than ``block``
    are cut into blocks scanned side by side, whose carries are chained by a
    second sequential loop (exact algebra, float64 rounding only).

    Args:
        ops: ``a, b, x, c`` of layout ``(..., L)`` (NumPy, or CuPy: then computed on the GPU).
        block: time steps per block for long sequences.

    Returns:
        ``y`` in float64, same shape as the operands.
    """
    xp = _xp(ops["a"])
    a, b, x, c = (xp.asarray(ops[k], xp.float64) for k in ("a", "b", "x", "c"))
    shape = a.shape
    L = shape[-1]
    A = a.reshape(-1, L)
    U = (b * x).reshape(-1, L)
    lanes = A.shape[0]
    if block >= L:
        h = _scan_time_major(xp.ascontiguousarray(A.T), xp.ascontiguousarray(U.T)).T
    else:
        nb = -(-L // block)
        pad = nb * block - L
        Ap = xp.concatenate([A, xp.ones((lanes, pad))], axis=1).reshape(lanes * nb, block)
        Up = xp.concatenate([U, xp.zeros((lanes, pad))], axis=1).reshape(lanes * nb, block)
        At, Ut = xp.ascontiguousarray(Ap.T), xp.ascontiguousarray(Up.T)
        local = _scan_time_major(At, Ut)
        prod = xp.cumprod(At, axis=0)
        agg_a = prod[-1].reshape(lanes, nb)
        agg_u = local[-1].reshape(lanes, nb)
        carry = _scan_time_major(xp.ascontiguousarray(agg_a.T), xp.ascontiguousarray(agg_u.T)).T
        carry_in = xp.concatenate([xp.zeros((lanes, 1)), carry[:, :-1]], axis=1).reshape(lanes * nb)
        h = (local + prod * carry_in).T.reshape(lanes, nb * block)[:, :L]
    return h.reshape(shape) * c


def relative_error(y: np.ndarray, ref: np.ndarray) -> float:
    """Worst lane's ``max_t |y - y*| / max_t |y*|`` (``inf`` for a wrong shape or non-finite values)."""
    xp = _xp(ref)
    y = xp.asarray(y)
    if y.shape != ref.shape:
        return float("inf")
    L = ref.shape[-1]
    y2 = y.reshape(-1, L).astype(xp.float64)
    r2 = ref.reshape(-1, L)
    if not bool(xp.all(xp.isfinite(y2))):
        return float("inf")
    scale = xp.maximum(xp.abs(r2).max(axis=1), np.finfo(np.float64).tiny)
    return float((xp.abs(y2 - r2).max(axis=1) / scale).max())
