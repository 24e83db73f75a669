"""The IR stages: ``scan`` -> ``affine_scan`` -> ``assoc_scan`` -> ``schedule``.

Each stage is a frozen dataclass, so a stage hashes into compile-cache keys,
and each has one deterministic text form (:mod:`scanweaver.ir.printer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .expr import Expr, ONE, ZERO

DTYPES = ("float32", "float64", "complex64", "complex128")


@dataclass(frozen=True)
class Features:
    """Call-site features every schedule honours.

    Attributes:
        reverse: scan from t = L-1 down to 0 (h_t = A_t h_{t+1} + U_t).
        has_h0: an initial state per lane enters the first element.
        has_reset: a per-element mask sets A_t = 0 (a segment starts at t).
        return_state: the final state h_L (h_0 for reverse) is written per lane.
        operands: ``(name, layout)`` of operands passed without materialising a broadcast: layout
            ``scalar`` (one value for every lane and step) or ``lane`` (one value per lane, every step);
            operands not listed are ``full`` (one value per lane and step).
    """

    reverse: bool = False
    has_h0: bool = False
    has_reset: bool = False
    return_state: bool = False
    operands: tuple[tuple[str, str], ...] = ()

    def layout(self, name: str) -> str:
        """``full``, ``scalar`` or ``lane``: how operand ``name`` is laid out in memory."""
        return dict(self.operands).get(name, "full")

    def text(self) -> str:
        on = [k for k in ("reverse", "has_h0", "has_reset", "return_state") if getattr(self, k)]
        on += [f"{name}:{layout}" for name, layout in self.operands]
        return "{" + ", ".join(on) + "}"


@dataclass(frozen=True)
class ScanIR:
    """Stage ``scan``: the user's recurrence as traced.

    Attributes:
        name: the recurrence's name (the step function's).
        inputs: per-step operands, in kernel-argument order.
        next_state: h_t as an expression of ``h`` (h_{t-1}) and the inputs.
        output: y_t as an expression of ``h``, ``h'`` (h_t) and the inputs;
            ``None`` means y_t = h_t (its first component for a vector state).
        dtype: storage dtype of inputs and outputs.
        features: call-site features.
        state_size: k, the length of a vector state; ``next_state`` is then a
            tuple of k expressions over ``h[0] .. h[k-1]``.
    """

    name: str
    inputs: tuple[str, ...]
    next_state: Expr | tuple[Expr, ...]
    output: Expr | None
    dtype: str = "float32"
    features: Features = field(default_factory=Features)
    state_size: int = 1


@dataclass(frozen=True)
class OutputForm:
    """y_t = new * h_t + old * h_{t-1} + const, each an expression of inputs only.

    For a vector state of size k, ``new`` and ``old`` are tuples of k
    coefficients (y_t = sum_j new[j] h_t[j] + old[j] h_{t-1}[j] + const).
    """

    new: Expr | tuple[Expr, ...] = ONE
    old: Expr | tuple[Expr, ...] = ZERO
    const: Expr = ZERO

    @property
    def is_identity(self) -> bool:
        """True when y_t = h_t."""
        return self == OutputForm()


@dataclass(frozen=True)
class AffineScanIR:
    """Stage ``affine_scan``: the normal form h_t = A_t * h_{t-1} + U_t.

    Attributes:
        name: recurrence name.
        inputs: operands, in kernel-argument order.
        kind: transition kind: ``diagonal`` (one scalar A per lane and step)
            or ``dense`` (a k x k matrix A_t per lane and step).
        A: the transition, an expression of the inputs only; for ``dense`` a
            tuple of k*k expressions, row-major.
        U: the offset, an expression of the inputs only; a tuple of k for ``dense``.
        output: the output projection.
        dtype: storage dtype.
        features: call-site features.
        state_size: k (1 for ``diagonal``).
    """

    name: str
    inputs: tuple[str, ...]
    kind: str
    A: Expr | tuple[Expr, ...]
    U: Expr | tuple[Expr, ...]
    output: OutputForm
    dtype: str
    features: Features
    state_size: int = 1


@dataclass(frozen=True)
class AssocScanIR:
    """Stage ``assoc_scan``: an associative scan over affine pairs.

    The combine is ``(A2, U2) o (A1, U1) = (A2*A1, A2*U1 + U2)`` (later after
    earlier) with identity ``(1, 0)``; a reset replaces A_t by 0.
    """

    affine: AffineScanIR
    combine: str = "affine_compose"

    @property
    def features(self) -> Features:
        """The call-site features."""
        return self.affine.features


@dataclass(frozen=True)
class ScheduleOp:
    """One schedule step, e.g. ``chunked.reduce`` with its attributes."""

    name: str
    attrs: tuple[tuple[str, object], ...] = ()

    def attr(self, key: str) -> object:
        """The attribute ``key``."""
        return dict(self.attrs)[key]


@dataclass(frozen=True)
class ScheduleIR:
    """Stage ``schedule``: the assoc scan with a chosen schedule and its tunables.

    Attributes:
        assoc: the scan being scheduled.
        schedule: schedule name (``sequential``, ``chunked``, ``blelloch`` ...).
        params: tunables as sorted ``(name, value)`` pairs.
        ops: the schedule's steps in execution order.
    """

    assoc: AssocScanIR
    schedule: str
    params: tuple[tuple[str, object], ...]
    ops: tuple[ScheduleOp, ...]

    @property
    def config(self) -> dict[str, object]:
        """The tunables as a dict (the keywords the runtime accepts)."""
        return dict(self.params)
