"""What a tune is about: a recurrence, a backend, a problem shape and dtype, and its test data.

A :class:`TuneProblem` makes the operands (seeded, non-uniform random data
that keeps the recurrence stable), the float64 oracle answer, and the
tolerance every configuration's output must meet to count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import ScanInputError
from ..frontend import RECURRENCES
from ..ir.stages import DTYPES, Features


def resolve_recurrence(rec):
    """A :class:`~scanweaver.Recurrence` from one, from a function that names one
    (``scanweaver.selective_scan``), or from a registered name (``"selective_scan"``)."""
    if hasattr(rec, "scan_ir") and hasattr(rec, "signature"):
        return rec
    named = getattr(rec, "recurrence", None)
    if named is not None:
        return named
    if rec is None or isinstance(rec, str):
        found = RECURRENCES.get(rec or "selective_scan", None)
        if found is not None:
            return found
    raise ScanInputError(f"tune: expected a scanweaver.Recurrence, scanweaver.selective_scan or a recurrence name "
                         f"({', '.join(repr(n) for n in RECURRENCES.names())}), got {rec!r}")


@dataclass(frozen=True)
class TuneProblem:
    """One tuning problem.

    Attributes:
        recurrence: the :class:`~scanweaver.Recurrence` to tune.
        backend: backend name.
        shape: operand shape ``(..., L)``; lanes are the product of the leading sizes.
        dtype: ``float32`` or ``float64``.
        features: call-site features the kernel is built for (default: plain forward scan).
        seed: seed of the test data.

    Example:
        >>> from scanweaver.tuning.problem import TuneProblem
        >>> p = TuneProblem("selective_scan", "numpy", (2, 3, 17))
        >>> p.lanes, p.L, sorted(p.inputs())
        (6, 17, ['a', 'b', 'c', 'x'])
    """

    recurrence: object
    backend: str
    shape: tuple
    dtype: str = "float32"
    features: Features = field(default_factory=Features)
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "recurrence", resolve_recurrence(self.recurrence))
        shape = tuple(int(s) for s in self.shape)
        if not shape or any(s < 1 for s in shape):
            raise ScanInputError(f"tune: shape must be positive sizes (..., L), got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        if self.dtype not in DTYPES:
            raise ScanInputError(f"tune: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    @property
    def lanes(self) -> int:
        """Independent sequences: the product of the leading sizes."""
        return int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def L(self) -> int:
        """Sequence length."""
        return self.shape[-1]

    @cached_property
    def stages(self):
        """The recurrence lowered to ``assoc_scan`` (no schedule) for this dtype and features."""
        from ..passes import lower

        return lower(self.recurrence.scan_ir(self.dtype, self.features))

    @cached_property
    def signature(self) -> str:
        """The store key of the recurrence (:meth:`Recurrence.signature`)."""
        return self.recurrence.signature(self.dtype)

    def inputs(self) -> dict[str, np.ndarray]:
        """Operands ``(lanes, L)``: decays in [0.6, 0.99) for inputs of A, N(0, 1) for the rest."""
        rng = np.random.default_rng(self.seed)
        in_a = self.stages.affine.A.inputs()
        out = {}
        for name in self.stages.affine.inputs:
            shape = (self.lanes, self.L)
            v = rng.uniform(0.6, 0.99, shape) if name in in_a else rng.standard_normal(shape)
            out[name] = np.ascontiguousarray(v, dtype=self.dtype)
        return out

    def h0(self) -> np.ndarray | None:
        """Initial states when the features ask for them."""
        if not self.features.has_h0:
            return None
        return np.random.default_rng(self.seed + 1).standard_normal(self.lanes).astype(self.dtype)

    def reset(self) -> np.ndarray | None:
        """A sparse reset mask when the features ask for one."""
        if not self.features.has_reset:
            return None
        return (np.random.default_rng(self.seed + 2).random((self.lanes, self.L)) < 0.01).astype(np.uint8)

    def oracle(self, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The float64 sequential answer ``(y, h_last)`` for ``inputs``."""
        from ..targets import reference

        return reference.oracle(self.stages.affine, inputs, self.h0(), self.reset())

    def tolerance(self, answer: np.ndarray) -> float:
        """Absolute tolerance for ``answer``: machine epsilon x 64 x sqrt(L) x the answer's scale.

        Rounding errors of a scan grow like a random walk along L, so the
        allowance grows with sqrt(L); it is relative to the largest magnitude.
        """
        eps = float(np.finfo(self.dtype).eps)
        scale = float(np.max(np.abs(answer))) if answer.size else 1.0
        return 64.0 * eps * math.sqrt(self.L) * max(scale, 1.0)

    def check(self, y: np.ndarray, answer: np.ndarray, atol: float) -> str | None:
        """Why output ``y`` is wrong, or ``None`` when it matches ``answer`` within ``atol``."""
        y = np.asarray(y).reshape(answer.shape)
        if not np.all(np.isfinite(y)):
            return f"wrong result: {int(np.sum(~np.isfinite(y)))} non-finite outputs"
        err = np.abs(y.astype(np.float64) - answer)
        worst = float(err.max()) if err.size else 0.0
        if worst > atol:
            lane, t = np.unravel_index(int(err.argmax()), answer.shape)
            return f"wrong result: max error {worst:.3g} > atol {atol:.3g} at lane {lane}, t {t}"
        return None
