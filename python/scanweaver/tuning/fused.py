"""Tuning a fused operation's kernel (:mod:`scanweaver.fused`) with Kernel Tuner, and storing the best.

The same flow as :func:`scanweaver.tuning.kt.tune`, over the operation's
tunables for the backend's target family (``chunk``, ``width``, ``threads`` on
``cpu``; ``workgroup_size``, ``items_per_thread`` on GPUs): the search space is
a :class:`FusedSpace` (one "schedule", ``fused:<op>``), each backend's Kernel
Tuner target builds the kernel (``KernelTunerTarget.fused_kernel``), every
configuration's output is checked against the float64 NumPy definition, and
the best goes into the tuned store under the operation's signature
(:meth:`~scanweaver.fused.FusedOp.signature`), where the fused calls of
:func:`scanweaver.mamba_selective_scan` find it (``scanweaver.mamba.last.source
== "tuned"``), those of the matrix-state operations (``matrix_state``: its
``algorithm`` for their forward, its other tunables for both parts;
``scanweaver.matrix.last``) and those of the delta rule (``delta_rule``, tuned on
Gated DeltaNet's features; ``scanweaver.matrix.last`` too).

Example:
    >>> from scanweaver.tuning.fused import tune_fused
    >>> report = tune_fused("mamba1", backend="cpu", shape=(1, 64, 16, 512), max_fevals=4)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..errors import BackendUnavailable, ScanInputError, api_boundary
from ..fused import REGISTRY as FUSED
from ..fused.delta_rule import DeltaRuleFeatures
from ..fused.delta_rule import forward_reference as delta_reference
from ..fused.mamba1 import Mamba1Features, forward_reference
from ..fused.matrix_state import MatrixStateFeatures
from ..fused.matrix_state import forward_reference as matrix_reference
from ..schedules import Tunable
from . import store
from .langs import get_target
from .report import TuneReport, summarize
from .session import KernelTunerSession, check_budget, require_kernel_tuner, reused_cache_notes
from .space import VALUE_FILTERS, Limits, SearchSpace

#: The store's "schedule" of a fused operation's entries.
PREFIX = store.FUSED_PREFIX


class FusedSpace(SearchSpace):
    """The search space of a fused operation: its tunables, no schedule families."""

    def why_rejected(self, p: dict) -> str | None:
        lim = self.limits
        wg = p.get("workgroup_size")
        if wg is not None and lim.max_workgroup is not None and wg > lim.max_workgroup:
            return f"workgroup_size={wg} exceeds the device's {lim.max_workgroup}"
        return None


def build_fused_space(op: str, backend: str, family: str, limits: Limits,
                      values: dict[str, tuple] | None = None, fixed: dict[str, object] | None = None) -> FusedSpace:
    """The space of ``op``'s tunables for target ``family`` on ``backend`` (values filtered by their rules
    and the limits, or ``values`` where given); tunables in ``fixed`` are not searched, nor those only the
    backward reads (a tune measures the forward; ``values`` for one is refused)."""
    params, owners, pinned = {}, {}, {}
    name, fused = PREFIX + op, FUSED.get(op)
    skipped = sorted(set(values or {}) & fused.backward_only)
    if skipped:
        raise ScanInputError(f"tune: {', '.join(skipped)} of the fused {op} kernel is read by its backward only; "
                             "a tune measures the forward")
    for t in fused.tunables_for(family):
        if t.name in fused.backward_only:  # the kernel's text reads it, the forward does not: its default
            pinned[t.name] = t.default
            continue
        if t.name in (fixed or {}):
            continue
        cand = _candidates(t, limits, (values or {}).get(t.name))
        params[t.name], owners[t.name], pinned[t.name] = cand, {name: frozenset(cand)}, t.default
    if not params:
        raise ScanInputError(f"tune: the fused {op} kernel has no tunables on {family} targets")
    return FusedSpace(backend, (name,), params, owners, pinned, limits)


def _candidates(t: Tunable, lim: Limits, given: tuple | None) -> tuple:
    vals = tuple(v for v in (given if given is not None else t.values) if not t.problem(v))
    if given is None and t.name in VALUE_FILTERS:
        vals = VALUE_FILTERS[t.name](vals, lim)
    if not vals:
        raise ScanInputError(f"tune: no valid value of {t.name} in {given!r}; {t.doc}")
    return tuple(sorted(vals))


@dataclass(frozen=True)
class FusedProblem:
    """One tuning problem of the fused Mamba-1 forward: shape ``(batch, D, N, L)``, a Mamba layer's features
    (B and C per step, D, z, delta_bias, softplus), seeded non-uniform data.

    ``lanes`` and ``L`` are what the device limits and the store's size buckets see (``lanes = batch*D``).
    """

    op: str
    backend: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    seed: int = 0
    #: The shape's sizes, and the output the tune checks.
    dims: ClassVar[tuple[str, ...]] = ("batch", "D", "N", "L")
    output: ClassVar[str] = "y"

    @property
    def lanes(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def L(self) -> int:
        return self.shape[3]

    @property
    def features(self) -> Mamba1Features:
        return Mamba1Features(self.dtype, self.shape[2], has_D=True, has_z=True, has_bias=True, softplus=True)

    @property
    def sizes(self) -> dict[str, int]:
        batch, dim, _, L = self.shape
        return {"batch": batch, "dim": dim, "L": L, "groups_b": 1, "groups_c": 1}

    def inputs(self) -> dict[str, np.ndarray]:
        """The forward's input arrays in ABI layout (Mamba-like gates: dt mostly in (0.001, 0.1))."""
        batch, dim, N, L = self.shape
        rng = np.random.default_rng(self.seed)
        raw = {"u": rng.standard_normal((batch, dim, L)), "delta": rng.standard_normal((batch, dim, L)) - 4,
               "A": -(1 + 15 * rng.random((dim, N))), "B": rng.standard_normal((batch, 1, N, L)),
               "C": rng.standard_normal((batch, 1, N, L)), "D": rng.standard_normal(dim),
               "z": rng.standard_normal((batch, dim, L)), "delta_bias": rng.random(dim) - 0.5}
        return {k: np.ascontiguousarray(v, dtype=self.dtype) for k, v in raw.items()}

    def oracle(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The float64 y of the fused operation's NumPy definition."""
        w = {k: v.astype(np.float64) for k, v in inputs.items()}
        return forward_reference(w["u"], w["delta"], w["A"], w["B"], w["C"], w["D"], w["z"], w["delta_bias"], True)[0]

    def check(self, y, answer: np.ndarray) -> str | None:
        """Why the kernel's ``y`` is wrong, or ``None`` (tolerance: 64 eps sqrt(L) x max|y|)."""
        y = np.asarray(y).reshape(answer.shape)
        atol = 64 * float(np.finfo(self.dtype).eps) * math.sqrt(self.L) * max(1.0, float(np.abs(answer).max()))
        if not np.all(np.isfinite(y)):
            return "wrong result: non-finite outputs"
        worst = float(np.abs(y - answer).max())
        return None if worst <= atol else f"wrong result: max error {worst:.3g} > atol {atol:.3g}"


@dataclass(frozen=True)
class MatrixProblem(FusedProblem):
    """One tuning problem of the matrix-state forward: shape ``(batch, T, H, K, V)``, GLA's features (a log
    decay per key in (log 0.9, log 0.999), readout after), seeded non-uniform data; ``lanes = batch*H``."""

    dims: ClassVar[tuple[str, ...]] = ("batch", "T", "H", "K", "V")
    output: ClassVar[str] = "o"

    @property
    def lanes(self) -> int:
        return self.shape[0] * self.shape[2]

    @property
    def L(self) -> int:
        return self.shape[1]

    @property
    def features(self) -> MatrixStateFeatures:  # type: ignore[override]
        return MatrixStateFeatures(self.dtype, self.shape[3], self.shape[4], "key")

    @property
    def sizes(self) -> dict[str, int]:
        batch, T, H, _, _ = self.shape
        return {"batch": batch, "T": T, "H": H, "Hq": H, "nseq": batch}

    def inputs(self) -> dict[str, np.ndarray]:
        batch, T, H, K, V = self.shape
        rng = np.random.default_rng(self.seed)
        raw = {"q": rng.standard_normal((batch, T, H, K)), "k": rng.standard_normal((batch, T, H, K)) / np.sqrt(K),
               "v": rng.standard_normal((batch, T, H, V)), "g": np.log(rng.uniform(0.9, 0.999, (batch, T, H, K)))}
        return {k: np.ascontiguousarray(v, dtype=self.dtype) for k, v in raw.items()}

    def oracle(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        w = {k: v.astype(np.float64) for k, v in inputs.items()}
        return matrix_reference(w["q"], w["k"], w["v"], w["g"], decay="key")[0]


@dataclass(frozen=True)
class DeltaRuleProblem(MatrixProblem):
    """One tuning problem of the delta-rule forward: shape ``(batch, T, H, K, V)``, Gated DeltaNet's features
    (Qwen3-Next's: a log decay per head in (log 0.9, log 0.999), beta in (0, 1), q and k L2-normalised in the
    kernel), seeded non-uniform data; ``lanes = batch*H``."""

    @property
    def features(self) -> DeltaRuleFeatures:  # type: ignore[override]
        return DeltaRuleFeatures(self.dtype, self.shape[3], self.shape[4], gate="scalar", l2norm=True)

    def inputs(self) -> dict[str, np.ndarray]:
        batch, T, H, K, V = self.shape
        rng = np.random.default_rng(self.seed)
        raw = {"q": rng.standard_normal((batch, T, H, K)), "k": rng.standard_normal((batch, T, H, K)),
               "v": rng.standard_normal((batch, T, H, V)), "g": np.log(rng.uniform(0.9, 0.999, (batch, T, H))),
               "beta": rng.uniform(0.05, 0.95, (batch, T, H))}
        return {k: np.ascontiguousarray(v, dtype=self.dtype) for k, v in raw.items()}

    def oracle(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        w = {k: v.astype(np.float64) for k, v in inputs.items()}
        return delta_reference(w["q"], w["k"], w["v"], w["beta"], g=w["g"], l2norm=True)[0]


#: Fused operation -> its tuning problem.
PROBLEMS: dict[str, type[FusedProblem]] = {"mamba1": FusedProblem, "matrix_state": MatrixProblem,
                                           "delta_rule": DeltaRuleProblem}


def fused_arguments(problem: FusedProblem, inputs: dict[str, np.ndarray]) -> tuple[list, int]:
    """The forward kernel's arguments in ABI order for Kernel Tuner, and the index of ``y``.

    Kernel Tuner cannot pass NULL: arrays the features switch off are one-element arrays (never read).
    """
    op = FUSED.get(problem.op)
    shapes = op.shapes("forward", problem.features, problem.sizes)
    args, out = [], -1
    for p in op.params("forward"):
        if p.kind == "int":
            args.append(np.int64(problem.sizes[p.name]))
        elif p.name in inputs:
            args.append(inputs[p.name].ravel())
        elif p.kind == "out":
            out = len(args) if p.name == problem.output else out
            args.append(np.zeros(math.prod(shapes[p.name]), problem.dtype))
        else:
            args.append(np.zeros(1, np.uint8 if p.dtype == "uint8" else problem.dtype))
    return args, out


@api_boundary
def tune_fused(op: str = "mamba1", *, backend: str = "cpu", shape=(2, 768, 16, 2048), dtype: str = "float32",
               strategy: str = "brute_force", max_fevals: int | None = None, time_limit: float | None = None,
               seed: int = 0, record: bool = True, progress: bool = True, out: str | Path | None = None,
               iterations: int = 7, fresh: bool = False, values: dict[str, tuple] | None = None,
               device: str | None = None) -> TuneReport:
    """Tunes the forward kernel of fused operation ``op`` on ``backend`` for one shape.

    Args are those of :func:`scanweaver.tuning.kt.tune` (``shape`` is ``(batch, D, N, L)`` for ``mamba1``,
    ``(batch, T, H, K, V)`` for ``matrix_state`` and ``delta_rule``: see :data:`PROBLEMS`).

    Raises:
        ScanWeaverError: Kernel Tuner is not installed (``pip install scanweaver[tune]``).
        BackendUnavailable: the backend cannot run or cannot be tuned here, or has no rendering of ``op``.
    """
    from ..runtime import get_backend
    from ..targets.fused import family_of

    t0 = time.monotonic()
    check_budget(max_fevals, time_limit)
    if op not in FUSED:
        raise ScanInputError(f"tune: unknown fused operation {op!r}; known: {', '.join(FUSED.names())}")
    kind = PROBLEMS.get(op)
    if kind is None:
        raise ScanInputError(f"tune: the fused {op} kernel has no tuning problem; tunable: {', '.join(PROBLEMS)}")
    if len(tuple(shape)) != len(kind.dims) or any(int(s) < 1 for s in shape):
        raise ScanInputError(f"tune: the fused {op} kernel needs shape ({', '.join(kind.dims)}) of positive sizes, "
                             f"got {tuple(shape)}")
    problem = kind(op, backend, tuple(int(s) for s in shape), dtype, seed)
    target = get_target(backend)
    target.select_device(device)
    why = target.unavailable()
    if why:
        raise BackendUnavailable(f"tune: backend {backend!r} cannot be tuned here: {why}")
    be = get_backend(backend)
    if not FUSED.get(op).runs_on(be.target, "forward") or not hasattr(target, "fused_kernel"):
        raise BackendUnavailable(f"tune: backend {backend!r} has no tunable fused {op} kernel")
    require_kernel_tuner()
    from kernel_tuner.interface import strategy_map

    if strategy not in strategy_map:
        raise ScanInputError(f"tune: unknown strategy {strategy!r}; Kernel Tuner has {', '.join(sorted(strategy_map))}")
    device = be.availability().device
    family = family_of(be.target)
    narrowed, fixed = target.fused_values(dict(values or {}))
    space = build_fused_space(op, backend, family, target.limits(problem), narrowed, fixed)
    inputs = problem.inputs()
    answer = problem.oracle(inputs)
    workdir = store.cache_dir() / "kernel_tuner" / backend
    spec = target.fused_kernel(problem, space, inputs, workdir)
    spec.device_options = {**target.device_options(), **spec.device_options}
    blob = json.dumps([backend, device, FUSED.get(op).signature(problem.features), dtype, list(problem.shape),
                       {k: list(v) for k, v in space.params.items()}, spec.fingerprint], default=str)
    cachefile = workdir / f"{op}-{dtype}-{'x'.join(map(str, problem.shape))}-" \
                          f"{hashlib.sha256(blob.encode()).hexdigest()[:12]}.json"
    if fresh and cachefile.exists():
        cachefile.unlink()
    reused = reused_cache_notes(cachefile)
    session = KernelTunerSession(spec, space, cachefile,
                                 check=lambda y: problem.check(target.fused_result(y, answer.shape), answer),
                                 progress=progress, iterations=iterations,
                                 answer=target.fused_answer(answer.astype(dtype)))
    base, _ = FUSED.get(op).defaults(family, "forward", problem.features, problem.sizes,
                                     be.fused_defaults(op, problem.features, problem.sizes), target=be.target)
    default_cfg = FUSED.get(op).resolve(family, {}, base, "tune")
    default_cfg = {k: v for k, v in default_cfg.items() if k not in fixed}
    default = space.join(space.schedules[0], default_cfg) if space.contains(space.join(space.schedules[0],
                                                                                     default_cfg)) else None
    results = session.search(strategy=strategy, max_fevals=max_fevals, time_limit=time_limit, seed=seed,
                             default=default)
    signature = FUSED.get(op).signature(problem.features)
    report = summarize(results, space, default=default, backend=backend, device=device,
                       strategy=strategy, signature=signature, dtype=dtype, shape=problem.shape,
                       kt_cache=str(cachefile), timing=target.timing, notes=[*reused, *session.notes])
    if record and report.best is not None:
        best = report.best
        entry = store.Entry(backend=backend, device=device, signature=signature, dtype=dtype, lanes=problem.lanes,
                            L=problem.L, schedule=best.schedule, config=dict(best.config), time_ms=best.time_ms,
                            default_ms=report.default_ms, strategy=strategy,
                            kt_cache=str(cachefile.relative_to(store.cache_dir())), partial=report.coverage())
        report.store_path = str(store.record(entry))
    report.wall_s = time.monotonic() - t0
    if out is not None:
        report.save(out)
    return report


__all__ = ["PREFIX", "PROBLEMS", "FusedProblem", "MatrixProblem", "FusedSpace", "build_fused_space",
           "fused_arguments", "tune_fused"]
