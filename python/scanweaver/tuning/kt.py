"""``scanweaver.tune``: tune a recurrence on a backend with Kernel Tuner and store the best configuration.

The flow: build the problem's test data and float64 oracle answer, the
backend's search space (:mod:`.space`) and its Kernel Tuner kernel
(:mod:`.langs`), run the strategy (:mod:`.session`; failing configurations
are skipped with their reason), time the default configuration too, and
record the best one in the tuned-configuration store (:mod:`.store`), where
every later scan call on this device finds it.

Which schedules are tuned (and why):

* ``cpu`` (``lang="C"``): every schedule, each timed as one call of the
  emitted host function ``sw_scan_timed``, which runs all phases of the
  schedule (reduce, carry, propagate) and times itself.
* ``opencl`` / ``cuda`` (``lang="OpenCL"`` / ``"cupy"``): only schedules that
  are one kernel launch and need no zeroed scratch between launches
  (Kernel Tuner times one launch and does not reset buffers between its
  timed runs); the schedule family is a tunable over those.
* ``julia`` (``lang="julia"``): the ScanWeaver.jl kernels with ``Val``
  tunables, the Julia GPU backend passed explicitly.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import api_boundary, BackendUnavailable, ScanInputError
from ..ir.stages import Features
from . import store
from .exchange import provenance
from .langs import get_target
from .problem import TuneProblem
from .report import TuneReport, summarize
from .session import KernelTunerSession, check_budget, require_kernel_tuner, reused_cache_notes
from .space import SearchSpace, build_space

STRATEGIES_NOTE = "any Kernel Tuner strategy: brute_force, random_sample, bayes_opt, genetic_algorithm, ..."


def _cache_stem(problem: TuneProblem, device: str, space: SearchSpace, fingerprint: str) -> str:
    blob = json.dumps([problem.backend, device, problem.signature, problem.dtype, problem.lanes, problem.L,
                       problem.features.text(), {k: list(v) for k, v in space.params.items()}, fingerprint],
                      default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return f"{problem.recurrence.name}-{problem.dtype}-{problem.lanes}x{problem.L}-{digest}"


def default_params(problem: TuneProblem, space: SearchSpace) -> dict | None:
    """Kernel Tuner params of the backend's default configuration, or ``None`` if it is outside the space."""
    from ..runtime import get_backend

    be = get_backend(problem.backend)
    sched = be.default_schedule(problem.lanes, problem.L)
    if sched not in space.schedules:
        return None
    from ..passes.materialize_schedule import resolve_config

    cfg = resolve_config(sched, be.default_config(sched, problem.lanes, problem.L, problem.dtype), "tune",
                         be.extra_tunables)
    p = space.join(sched, cfg)
    return p if space.why_rejected(p) is None else None


def _confirm(report: TuneReport, session: KernelTunerSession, space: SearchSpace, default: dict | None,
             rounds: int) -> None:
    """Re-measures best and default alternately (each run in a throwaway cache) and updates ``report``."""
    from statistics import median

    from .session import result_time

    best = space.join(report.best.schedule, report.best.config)
    picks = {"best": best, **({"default": default} if default is not None and report.default else {})}
    times: dict[str, list[float]] = {name: [] for name in picks}
    for i in range(rounds):
        for name, p in picks.items():
            scratch = session.cachefile.with_name(f".confirm-{os.getpid()}-{i}-{name}.json")
            again = KernelTunerSession(session.spec, space, scratch, check=session.check, answer=session.answer,
                                       iterations=session.iterations)
            try:
                t = [result_time(r) for r in again.run(only=p) if r]
            finally:
                scratch.unlink(missing_ok=True)
            if t and t[0] is not None:
                times[name].append(t[0])
    report.confirmed = {name: ts for name, ts in times.items() if ts}
    if len(report.confirmed) == len(picks):
        report.notes.append(f"best/default: both re-measured alternately {rounds}x after the search "
                            f"(medians {median(times['best']):.4g} ms vs "
                            f"{median(times.get('default', [float('nan')])):.4g} ms)")


@dataclass
class Prepared:
    """A tuning problem made ready where its device is: backend, space, Kernel Tuner kernel and session.

    Attributes:
        problem: the problem.
        target: its Kernel Tuner target.
        device: the device name the store keys on.
        space: the search space.
        session: the Kernel Tuner session (cache file, verification against the oracle).
        default: Kernel Tuner params of the backend's default configuration, or ``None``.
        notes: remarks for the report (a reused Kernel Tuner cache).
    """

    problem: TuneProblem
    target: object
    device: str
    space: SearchSpace
    session: KernelTunerSession
    default: dict | None
    notes: list[str] = field(default_factory=list)


def prepare(problem: TuneProblem, *, schedule: str | tuple | None = None, strategy: str = "brute_force",
            values: dict[str, tuple] | None = None, progress: bool = False, iterations: int = 7,
            fresh: bool = False, cache_suffix: str = "", device: str | None = None) -> Prepared:
    """Checks the problem here and builds its space, kernel and session (see :func:`tune`).

    Raises:
        ScanWeaverError: Kernel Tuner is not installed.
        BackendUnavailable: the backend cannot be tuned here.
        ScanInputError: a bad schedule, strategy or an empty space.
    """
    target = get_target(problem.backend)
    target.select_device(device)
    why = target.unavailable()
    if why:
        raise BackendUnavailable(f"tune: backend {problem.backend!r} cannot be tuned here: {why}")
    from ..runtime import get_backend

    be = get_backend(problem.backend)
    device = be.availability().device
    tunable = target.schedules(be.schedules)
    wanted = (schedule,) if isinstance(schedule, str) else tuple(schedule or tunable)
    outside = [s for s in wanted if s not in tunable]
    if outside:
        raise ScanInputError(f"tune: schedule(s) {', '.join(outside)} cannot be tuned on {problem.backend!r} "
                             f"(tunable there: {', '.join(tunable)})")
    require_kernel_tuner()  # after the checks that need no Kernel Tuner, so their errors come first
    from kernel_tuner.interface import strategy_map

    if strategy not in strategy_map:
        raise ScanInputError(f"tune: unknown strategy {strategy!r}; Kernel Tuner has {', '.join(sorted(strategy_map))}")
    space = build_space(problem.backend, schedules=wanted, lanes=problem.lanes, L=problem.L, dtype=problem.dtype,
                        limits=target.limits(problem),
                        backend_owners=target.owners(wanted, [t.name for t in be.extra_tunables]),
                        pins=target.pins(wanted), values=values)
    if space.size == 0:
        raise ScanInputError(f"tune: the search space of {problem.backend!r} for shape {problem.shape} is empty")
    inputs = problem.inputs()
    answer = problem.oracle(inputs)[0]
    atol = problem.tolerance(answer)
    workdir = store.cache_dir() / "kernel_tuner" / problem.backend
    spec = target.kernel(problem, space, inputs, workdir)
    spec.device_options = {**target.device_options(), **spec.device_options}
    cachefile = workdir / f"{_cache_stem(problem, device, space, spec.fingerprint)}{cache_suffix}.json"
    if fresh and cachefile.exists():
        cachefile.unlink()
    notes = reused_cache_notes(cachefile)
    session = KernelTunerSession(spec, space, cachefile,
                                 check=lambda y: problem.check(target.as_lanes(y, problem), answer, atol),
                                 progress=progress, iterations=iterations,
                                 answer=target.answer_layout(answer.astype(problem.dtype)))
    return Prepared(problem, target, device, space, session, default_params(problem, space), notes)


@api_boundary
def tune(recurrence=None, *, backend: str = "cpu", shape=(8, 512, 4096), dtype: str = "float32",
         schedule: str | tuple | None = None, strategy: str = "brute_force", max_fevals: int | None = None,
         time_limit: float | None = None, features: Features = Features(), seed: int = 0, record: bool = True,
         progress: bool = True, out: str | Path | None = None, iterations: int = 7, fresh: bool = False,
         values: dict[str, tuple] | None = None, confirm: int = 0, parallel: int | None = None,
         ray_address: str | None = None, device: str | None = None) -> TuneReport:
    """Tunes ``recurrence`` on ``backend`` for one problem shape and stores the best configuration.

    After this, every scan call of that recurrence on this device (and the
    same dtype) runs the tuned configuration of the nearest tuned size, with
    no tuning code in the caller (``Recurrence.last.source == "tuned"``).

    Args:
        recurrence: a :class:`~scanweaver.Recurrence`, ``scanweaver.selective_scan``
            (the default) or a :class:`~scanweaver.tuning.problem.TuneProblem`.
        backend: ``cpu``, ``opencl``, ``cuda`` or ``julia``.
        shape: operand shape ``(..., L)``, e.g. ``(B, D, L)``.
        dtype: ``float32`` or ``float64``.
        schedule: restrict to one schedule family (or a tuple of them).
        strategy: a Kernel Tuner strategy (``brute_force``, ``random_sample``, ``bayes_opt`` ...).
        max_fevals: the most configurations measured, the default's included, with any strategy
            (``brute_force`` then measures a random sample of that many; ``None``: the strategy's own).
        time_limit: seconds for the whole tune.
        features: call-site features the kernels are built for.
        seed: seed of the test data and of the strategy.
        record: write the best configuration to the store.
        progress: show a progress bar (its total is the budget).
        out: directory for ``tune.json``, ``tune.txt`` and ``tune.png``.
        iterations: timed runs per configuration (the median counts).
        fresh: discard Kernel Tuner's cached measurements of this problem first.
        values: narrow tunables to these candidate values, e.g. ``{"chunk": (512, 1024)}``.
        confirm: after the search, re-measure the best and the default configuration
            alternately this many times each (fresh compiles, no cache) and report
            those medians, so that load drift on a shared machine between the
            sweep and the default's measurement cannot skew best/default; when the
            default is then no slower, the default is what gets stored (without
            ``confirm``, so is a default outside the searched space that measured
            faster than everything the search found). The table says which.
        parallel: spread the search space over this many Ray workers, each owning
            one device (:mod:`scanweaver.tuning.cluster`; ``pip install scanweaver[cluster]``).
        ray_address: the Ray cluster to use (default: ``$RAY_ADDRESS``, an already
            initialised Ray, or a new local instance).
        device: the device to tune on, for backends with a device choice (``julia``: ``cpu``,
            ``cuda``, ``amdgpu``, ``oneapi`` or ``metal``; default ``$SCANWEAVER_JULIA_DEVICE``, else ``cuda``).

    Returns:
        a :class:`~scanweaver.tuning.report.TuneReport`.

    Raises:
        ScanWeaverError: Kernel Tuner (or, with ``parallel``, Ray) is not installed.
        BackendUnavailable: the backend cannot run or cannot be tuned here.

    Example:
        >>> import scanweaver
        >>> report = scanweaver.tune(backend="cpu", shape=(64, 1024), max_fevals=4)  # doctest: +SKIP
        >>> report.best.config  # doctest: +SKIP
        {'chunk': 512, 'interleave': 8, 'threads': 2}
    """
    check_budget(max_fevals, time_limit)
    t0 = time.monotonic()
    if isinstance(recurrence, TuneProblem):
        problem = recurrence
    else:
        problem = TuneProblem(recurrence, backend, tuple(shape), dtype, features, seed)
    if parallel is not None:
        from .cluster import tune_parallel

        if confirm:
            raise ScanInputError("tune: confirm= re-measures on one device; run it without parallel=")
        if device is not None:
            raise ScanInputError("tune: device= tunes on one device; run it without parallel=")
        report, who = tune_parallel(problem, parallel=parallel, ray_address=ray_address, schedule=schedule,
                                    strategy=strategy, max_fevals=max_fevals, time_limit=time_limit, seed=seed,
                                    iterations=iterations, fresh=fresh, values=values)
        return _finish(report, problem, None, strategy, record, out, t0, who)
    prep = prepare(problem, schedule=schedule, strategy=strategy, values=values, progress=progress,
                   iterations=iterations, fresh=fresh, device=device)
    session, space, default = prep.session, prep.space, prep.default
    results = session.search(strategy=strategy, max_fevals=max_fevals, time_limit=time_limit, seed=seed,
                             default=default)
    report = summarize(results, space, default=default, backend=problem.backend,
                       device=prep.device, strategy=strategy, signature=problem.signature, dtype=problem.dtype,
                       shape=problem.shape, kt_cache=str(session.cachefile), timing=prep.target.timing,
                       notes=prep.notes + session.notes)
    if default is None:
        report.notes.append("the default schedule is outside the tuned space; its time was not measured")
    if confirm > 0 and report.best is not None:
        _confirm(report, session, space, default, confirm)
    session.cachefile.with_suffix(".space.json").write_text(json.dumps(
        {"space": space.to_json(), "default": default, "device": prep.device, "signature": problem.signature,
         "dtype": problem.dtype, "shape": list(problem.shape), "timing": prep.target.timing}, indent=1, default=str))
    return _finish(report, problem, prep, strategy, record, out, t0, provenance())


def _finish(report: TuneReport, problem: TuneProblem, prep: Prepared | None, strategy: str, record: bool,
            out, t0: float, who: dict) -> TuneReport:
    """Stores the best configuration (or the default, when re-measured no slower) and saves the report."""
    if record and report.best is not None:
        best = report.best
        # the times the table compares (re-measured medians after confirm=), so the store says what it says
        schedule, config, time_ms = best.schedule, dict(best.config), report.best_ms
        if prep is not None and prep.default is not None and report.stores_default:
            schedule, config = prep.space.split(prep.default)
            time_ms = report.default_ms
        kt_cache = ""
        if prep is not None:
            kt_cache = str(prep.session.cachefile.relative_to(store.cache_dir()))
        entry = store.Entry(backend=problem.backend, device=report.device, signature=problem.signature,
                            dtype=problem.dtype, lanes=problem.lanes, L=problem.L, schedule=schedule,
                            config=dict(config), time_ms=time_ms, default_ms=report.default_ms,
                            strategy=strategy, kt_cache=kt_cache, partial=report.coverage(), **who)
        if entry.partial:
            report.notes.append(f"partial search stored: {entry.partial}")
        report.store_path = str(store.record(entry))
    report.wall_s = time.monotonic() - t0
    if out is not None:
        report.save(out)
    return report


def replay(cachefile: str | Path, *, strategy: str = "brute_force", max_fevals: int | None = None,
           seed: int | None = 0) -> TuneReport:
    """Replays a strategy over a finished tune's Kernel Tuner cache (simulation mode, nothing runs).

    Needs the ``.space.json`` that :func:`tune` writes next to the cache.
    Useful to compare strategies on one set of measurements, and to test the
    selection logic deterministically.

    Example:
        >>> from scanweaver.tuning.kt import replay
        >>> replay("selective_scan-float32-64x1000-xxxx.json", strategy="random_sample", max_fevals=5)  # doctest: +SKIP
    """
    from .session import read_cached, replay as simulate

    cachefile = Path(cachefile)
    meta = json.loads(cachefile.with_suffix(".space.json").read_text())
    space = SearchSpace.from_json(meta["space"])
    results = simulate(cachefile, space, strategy=strategy, max_fevals=max_fevals, seed=seed)
    return summarize(results, space, default=meta.get("default"), default_results=read_cached(cachefile),
                     backend=space.backend, device=meta.get("device", ""), strategy=strategy,
                     signature=meta.get("signature", ""), dtype=meta.get("dtype", ""),
                     shape=tuple(meta.get("shape", ())), kt_cache=str(cachefile), timing=meta.get("timing", ""))
