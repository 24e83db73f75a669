"""Tuning spread over a Ray cluster: shards of the search space, each tuned by Kernel Tuner on one device.

``scanweaver.tune(..., parallel=N)`` splits the valid configurations of the
search space into N shards (every N-th configuration, so each shard spans
every schedule family) and runs one Ray task per shard.  A task asks Ray for
one device (one GPU when the cluster has GPUs, else one CPU), rebuilds the
problem there (test data, float64 oracle, search space, kernel), and tunes
its shard with the ordinary sequential Kernel Tuner through
:class:`~.session.KernelTunerSession`: the timing is Kernel Tuner's, failing
configurations are skipped with their reason, verification runs against
the oracle, and the shard's Kernel Tuner cache (on the worker) resumes an
interrupted shard.  The driver merges the shards' results and reports and
stores the best one as a sequential tune would.

A worker that dies, or a shard that raises, loses that shard only: its
configurations are reported as skipped with the reason (``Ray worker
lost``), not cached as failed, so the next tune measures them; tasks are not
retried (a configuration that crashes its process would crash the retry too).

Why not Kernel Tuner's own Ray runner (``tune_kernel(..., parallel=N)``)?
In Kernel Tuner 1.5.0 ``tune_kernel`` builds its ``ParallelRunner`` itself
(a fixed runner could only be injected by replacing a module attribute), the
runner fails before the first result (``TypeError: unhashable type: 'list'``
at ``kernel_tuner/runners/parallel.py:361``: ``result.get(objective)`` with
the objective list that ``interface.py`` made), and a configuration that does
not compile, or an actor that dies, ends the whole tune.  Shards keep every
Kernel Tuner feature ScanWeaver relies on and need nothing of that runner.

Shards that time on the host's own cores (the ``cpu`` and ``numpy`` backends, and any backend when the
cluster has no GPUs: PoCL is the host's cores too) take turns on each host: a shard holds the host's timing
lock (a file lock in the cache directory) while it measures, so a 2-thread configuration is never timed
while another shard's configurations run on the same cores (measured side by side on a 2-core host, such
configurations took 10-30 times their time alone).  Compiling and verifying still run side by side; the
report says whether the shards' timing windows on each host were disjoint.

Strategies: ``brute_force`` shards partition the space exactly; a budgeted
strategy runs on every shard with ``max_fevals`` split in proportion.

Example:
    >>> import ray, scanweaver
    >>> ray.init(num_gpus=2)  # doctest: +SKIP
    >>> report = scanweaver.tune(backend="cpu", shape=(8, 512, 4096), parallel=2)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time

from ..errors import ScanInputError, ScanWeaverError
from .problem import TuneProblem
from .report import LOST_SHARD, TuneReport, summarize
from .session import SKIP_REASON
from .space import SearchSpace

#: seconds a shard may run beyond the tune's ``time_limit`` before it is cancelled and reported lost
GRACE_S = 300.0
#: Backends whose kernels are timed on the host's cores whatever device the Ray task holds.
HOST_TIMED = ("cpu", "numpy")
#: Seconds a shard waits for its host's timing lock when the tune has no ``time_limit``.
HOST_WAIT_S = 24 * 3600.0


def host_timing(enabled: bool, time_limit: float | None):
    """The host's timing lock (see the module notes) when ``enabled``, else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    from . import store
    from .atomic import locked

    wait = HOST_WAIT_S if time_limit is None else time_limit + GRACE_S
    return locked(store.cache_dir() / "tune-host-timing", timeout=wait, what="tune: the host's timing lock")


@dataclasses.dataclass(frozen=True)
class ShardSpace(SearchSpace):
    """A search space restricted to one shard's configurations (``keep``: their Kernel Tuner keys)."""

    keep: frozenset = frozenset()

    def why_invalid(self, p: dict) -> str | None:
        why = super().why_invalid(p)
        if why is None and self.key(p) not in self.keep:
            return "measured by another shard"
        return why


def shard_of(space: SearchSpace, index: int, count: int) -> list[dict]:
    """The configurations of shard ``index`` of ``count``: every ``count``-th valid one from ``index``."""
    return space.configs()[index::count]


def run_shard(problem: TuneProblem, index: int, count: int, opts: dict) -> dict:
    """One Ray task: tunes shard ``index`` of ``count`` on this worker's device (see the module notes)."""
    from .exchange import provenance
    from .kt import prepare

    t0 = time.monotonic()
    prep = prepare(problem, schedule=opts["schedule"], strategy=opts["strategy"], values=opts["values"],
                   iterations=opts["iterations"], fresh=opts["fresh"], cache_suffix=f"-shard{index}of{count}")
    full = prep.space
    configs = full.configs()
    mine = configs[index::count]
    fields = {f.name: getattr(full, f.name) for f in dataclasses.fields(SearchSpace)}
    prep.session.space = ShardSpace(**fields, keep=frozenset(full.key(p) for p in mine))
    results: list[dict] = []
    window = (0.0, 0.0)
    if mine:
        budget = opts["max_fevals"]
        if budget is not None:
            budget = max(1, math.ceil(budget * len(mine) / len(configs)))
        with host_timing(opts.get("host_timed", False), opts["time_limit"]):
            window = (time.time(), 0.0)
            results = prep.session.run(strategy=opts["strategy"], max_fevals=budget, time_limit=opts["time_limit"],
                                       seed=opts["seed"] + index)
            window = (window[0], time.time())
    default_results: list[dict] = []
    d = prep.default
    keys = [full.key(p) for p in configs]
    owner = keys.index(full.key(d)) % count if d is not None and full.key(d) in keys else 0
    if d is not None and index == owner and all(full.key(d) != full.key(r) for r in results if r):
        with host_timing(opts.get("host_timed", False), opts["time_limit"]):
            default_results = prep.session.run(only=d, seed=opts["seed"])  # the default may lie outside the space
    who = provenance()
    return {"shard": index, "count": count, "device": prep.device, "space": full.to_json(), "default": d,
            "results": [r for r in results if r], "default_results": [r for r in default_results if r],
            "timing": prep.target.timing, "kt_cache": str(prep.session.cachefile), "wall_s": time.monotonic() - t0,
            "window": window, **who}


def connect(address: str | None):
    """The ``ray`` module, initialised: an existing connection, ``address``/``$RAY_ADDRESS``, or a new local Ray.

    Returns:
        ``(ray, started)``: ``started`` when this call started Ray (the caller shuts it down).
    """
    try:
        import ray
    except ImportError as exc:
        raise ScanWeaverError(f"tune: parallel tuning needs Ray ({exc}); install the extra: "
                              "pip install scanweaver[cluster]") from None
    if ray.is_initialized():
        return ray, False
    ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    return ray, True


def _reason(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def _gather(ray, refs: list, deadline: float | None) -> dict[int, dict | str]:
    """Every shard's outcome: its result dict, or why it was lost."""
    pending = {ref: i for i, ref in enumerate(refs)}
    outcomes: dict[int, dict | str] = {}
    while pending:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait)
        if not ready:
            for ref, i in pending.items():
                ray.cancel(ref, force=True)
                outcomes[i] = f"timed out (still running {GRACE_S:.0f} s after the time limit)"
            break
        for ref in ready:
            i = pending.pop(ref)
            try:
                outcomes[i] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                outcomes[i] = _reason(exc)
    return outcomes


def tune_parallel(problem: TuneProblem, *, parallel: int, ray_address: str | None, schedule, strategy: str,
                  max_fevals: int | None, time_limit: float | None, seed: int, iterations: int, fresh: bool,
                  values: dict | None) -> tuple[TuneReport, dict]:
    """Tunes ``problem`` in ``parallel`` shards over Ray; returns the merged report and who measured the best.

    Raises:
        ScanInputError: ``parallel`` is not a positive integer.
        ScanWeaverError: Ray is missing, every shard failed, or the workers have different devices.
    """
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ScanInputError(f"tune: parallel must be a positive number of Ray workers, got {parallel!r}")
    ray, started = connect(ray_address)
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        resources = {"num_gpus": 1} if gpus >= 1 else {"num_cpus": 1}
        task = ray.remote(max_retries=0, **resources)(run_shard)
        opts = {"schedule": schedule, "strategy": strategy, "values": values, "iterations": iterations,
                "fresh": fresh, "max_fevals": max_fevals, "time_limit": time_limit, "seed": seed,
                "host_timed": problem.backend in HOST_TIMED or "num_cpus" in resources}
        refs = [task.remote(problem, i, parallel, opts) for i in range(parallel)]
        deadline = None if time_limit is None else time.monotonic() + time_limit + GRACE_S
        outcomes = _gather(ray, refs, deadline)
    finally:
        if started:
            ray.shutdown()
    return merge(problem, outcomes, parallel, strategy, resources)


def _turns(done: dict[int, dict]) -> list[str]:
    """Per host with several shards: whether their timing windows were disjoint (timed in turn)."""
    notes = []
    for host in sorted({o["host"] for o in done.values()}):
        spans = sorted(tuple(o["window"]) for o in done.values() if o["host"] == host and o.get("window", (0, 0))[1])
        if len(spans) < 2:
            continue
        apart = all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        notes.append(f"{host}: {len(spans)} shards timed in turn" if apart else
                     f"{host}: {len(spans)} shards timed concurrently (their times share the host's cores)")
    return notes


def merge(problem: TuneProblem, outcomes: dict[int, dict | str], count: int, strategy: str,
          resources: dict) -> tuple[TuneReport, dict]:
    """The report of a sharded tune from the shards' outcomes (a lost shard's configurations are skipped)."""
    done = {i: o for i, o in outcomes.items() if isinstance(o, dict)}
    lost = {i: o for i, o in outcomes.items() if not isinstance(o, dict)}
    if not done:
        raise ScanWeaverError("tune: every shard failed: " + "; ".join(f"shard {i}: {why}" for i, why in lost.items()))
    devices = sorted({o["device"] for o in done.values()})
    if len(devices) > 1:
        raise ScanWeaverError(f"tune: the Ray workers have different devices ({', '.join(devices)}); a tuned "
                              "configuration is per device: tune each kind on workers of that kind")
    first = done[min(done)]
    if any(o["space"] != first["space"] for o in done.values()):
        raise ScanWeaverError("tune: the shards built different search spaces (device limits differ between workers)")
    space = SearchSpace.from_json(first["space"])
    results = [r for o in done.values() for r in o["results"]]
    for i, why in lost.items():
        results += [{**p, SKIP_REASON: f"{LOST_SHARD} (shard {i + 1} of {count}): {why}"}
                    for p in shard_of(space, i, count)]
    report = summarize(results, space, default=first["default"],
                       default_results=[r for o in done.values() for r in o["default_results"]],
                       backend=problem.backend, device=devices[0], strategy=strategy, signature=problem.signature,
                       dtype=problem.dtype, shape=problem.shape, kt_cache=None, timing=first["timing"])
    hosts = sorted({o["host"] for o in done.values()})
    report.notes.append(f"parallel: {count} shards as Ray tasks ({', '.join(f'{k}={v}' for k, v in resources.items())}"
                        f" each) on {', '.join(hosts)}; {len(done)} finished"
                        + (f", {len(lost)} lost" if lost else ""))
    report.notes.extend(f"shard {i + 1} of {count} lost: {why}" for i, why in sorted(lost.items()))
    report.notes.extend(_turns(done))
    if first["default"] is None:
        report.notes.append("the default schedule is outside the tuned space; its time was not measured")
    who = {"host": first["host"], "user": first["user"], "versions": first["versions"]}
    if report.best is not None:
        best = space.key(space.join(report.best.schedule, report.best.config))
        for o in done.values():
            if any(space.key({k: r[k] for k in space.params}) == best for r in o["results"]):
                who = {"host": o["host"], "user": o["user"], "versions": o["versions"]}
    return report, who
