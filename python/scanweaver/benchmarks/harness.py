"""The harness: check each entry against the float64 oracle, then time it.

For every case of a suite and every selected entry: skip it with the reason
when it cannot run here or would be too slow; otherwise call it once (the
warm-up, which also compiles) and compare that result with the oracle; a
wrong result is reported as ``failed`` and never timed.  Then time repeated
calls, excluding the warm-up, and keep median, quartiles, min and max.

Example:
    >>> from scanweaver.benchmarks import harness, suites
    >>> from scanweaver.benchmarks.cases import Settings
    >>> run = harness.run(suites.get("paper", quick=True), Settings.for_mode(True), progress=False)
    >>> any(r.status == "ok" for r in run.results)
    True
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from collections.abc import Callable

import numpy as np

from . import machine
from .cases import TOLERANCE, Case, Settings, make_device_inputs, make_inputs, oracle64, relative_error
from .peers import Peer, entries
from .progress import Progress


@dataclass
class Result:
    """One entry on one case.

    Attributes:
        status: ``ok`` (checked and timed), ``failed`` (wrong result: not timed),
            ``skipped`` (cannot run here, or capped) or ``error`` (raised).
        reason: why it was failed, skipped or errored.
        error: max relative error against the oracle (``None`` when unchecked).
        median_s, q25_s, q75_s, min_s, max_s: seconds per call over ``repeats`` timed calls.
        warmup_s: the first call (compilation included), not part of the statistics.
    """

    case: str
    shape: tuple[int, int, int]
    dtype: str
    group: str
    entry: str
    label: str
    kind: str
    recurrence: str
    paper: bool
    checked: bool
    status: str = "skipped"
    reason: str = ""
    device: str = ""
    error: float | None = None
    median_s: float | None = None
    q25_s: float | None = None
    q75_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    repeats: int = 0
    warmup_s: float | None = None
    wall_s: float = 0.0
    details: dict = field(default_factory=dict)

    @property
    def elements(self) -> int:
        """B * D * L."""
        return int(np.prod(self.shape))

    @property
    def ns_per_element(self) -> float | None:
        """Median nanoseconds per element."""
        return None if self.median_s is None else self.median_s / self.elements * 1e9

    @property
    def gbps(self) -> float | None:
        """Effective bandwidth of the median call: 4 operands read, 1 written."""
        if self.median_s is None:
            return None
        return 5 * self.elements * np.dtype(self.dtype).itemsize / self.median_s / 1e9

    def to_dict(self) -> dict:
        """JSON-ready record (derived figures included)."""
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["error"] = None if self.error is None or not np.isfinite(self.error) else self.error
        d["ns_per_element"] = self.ns_per_element
        d["gbps"] = self.gbps
        return d


@dataclass
class Run:
    """Everything one benchmark invocation measured."""

    suite: str
    settings: Settings
    results: list[Result]
    meta: dict
    cases: list[Case]


def summarise(times: list[float]) -> dict[str, float]:
    """Median, quartiles, min and max of ``times`` (seconds)."""
    ts = sorted(times)
    if len(ts) >= 2:
        q = statistics.quantiles(ts, n=4, method="inclusive")
        q25, q75 = q[0], q[2]
    else:
        q25 = q75 = ts[0]
    return {"median_s": statistics.median(ts), "q25_s": q25, "q75_s": q75, "min_s": ts[0], "max_s": ts[-1]}


def time_calls(fn: Callable[[], object], settings: Settings) -> list[float]:
    """Times ``fn`` at least ``min_repeats`` times, more (up to ``max_repeats``) until ``budget_s`` is spent."""
    times: list[float] = []
    while len(times) < settings.max_repeats:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= settings.min_repeats and sum(times) >= settings.budget_s:
            break
        if len(times) >= 3 and times[0] > settings.max_call_s / 2:
            break  # slow calls: three samples keep a full run inside its time limit
    return times


class Operands:
    """Operands and oracle per case and variant, built once, on first use."""

    def __init__(self, case: Case):
        self.case = case
        self._ops: dict[str, dict[str, np.ndarray]] = {}
        self._ref: dict[str, np.ndarray] = {}

    def ops(self, variant: str) -> dict[str, np.ndarray]:
        if variant not in self._ops:
            if self.case.device == "cuda":
                if variant != "default":
                    raise ValueError(f"device cases make only the default operands, not {variant!r}")
                self._ops[variant] = make_device_inputs(self.case)
            else:
                self._ops[variant] = make_inputs(self.case, constant_a=variant == "constant_a")
        return self._ops[variant]

    def oracle(self, variant: str) -> np.ndarray:
        if variant not in self._ref:
            self._ref[variant] = oracle64(self.ops(variant))
        return self._ref[variant]


def _result(peer: Peer, case: Case) -> Result:
    return Result(case=case.name, shape=case.shape, dtype=case.dtype, group=case.group, entry=peer.name,
                  label=peer.label, kind=peer.kind, recurrence=peer.recurrence, paper=peer.paper,
                  checked=peer.checked)


def measure(peer: Peer, case: Case, data: Operands, settings: Settings, keep: dict | None = None) -> Result:
    """Checks ``peer`` on ``case`` against the oracle, then times it (see the module docstring); the timed
    call goes into ``keep[peer.name]`` when given (for :func:`beside_roofline`)."""
    res = _result(peer, case)
    try:
        reason = peer.availability() or peer.skip_reason(case, settings)
        if reason:
            res.reason = reason
            return res
        res.device = peer.device()
        fn = peer.prepare(data.ops(peer.variant))
        t0 = time.perf_counter()
        out = fn()
        res.warmup_s = time.perf_counter() - t0
        res.details = peer.details()
        if peer.checked:
            got = out if case.device == "cuda" else peer.to_numpy(out)  # device results are checked on the device
            res.error = relative_error(got, data.oracle(peer.variant))
            tol = TOLERANCE[case.dtype]
            if not res.error <= tol:
                res.status = "failed"
                res.reason = f"wrong result: max relative error {res.error:.3g} > {tol:g} (not timed)"
                return res
        del out
        times = time_calls(fn, settings)
        if keep is not None:
            keep[peer.name] = fn
    except Exception as exc:  # a peer that raises is reported, and the run goes on
        res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
        return res
    res.status, res.repeats = "ok", len(times)
    res.__dict__.update(summarise(times))
    return res


def run(plan, settings: Settings, backend: str | None = None, progress: bool = True,
        log: Callable[[str], None] | None = None, budget_s: float = float("inf"),
        on_case: Callable[[Run], None] | None = None) -> Run:
    """Runs every selected entry on every case of ``plan``.

    Args:
        plan: a :class:`~scanweaver.benchmarks.suites.Suite`.
        settings: repeats, budgets and caps.
        backend: restrict ScanWeaver entries to one backend (``None``: all available).
        progress: show a progress bar (rich or tqdm when installed) on stderr.
        log: receives one line per finished entry when no bar is shown.
        budget_s: entries not started within this many seconds are skipped, with that reason.
        on_case: receives the run so far after every case (to write it before a time limit cuts the run).
    """
    peers = entries(backend)
    work = [(case, [p for p in peers if plan.selects(case, p)]) for case in plan.cases]
    total = sum(len(ps) for _, ps in work)
    bar = Progress(total, enabled=progress)
    results: list[Result] = []
    start = time.perf_counter()
    try:
        for case, selected in work:
            data = Operands(case)
            calls: dict = {}
            for peer in selected:
                bar.describe(f"{case.name}: {peer.label}")
                t0 = time.perf_counter()
                if t0 - start < budget_s:
                    res = measure(peer, case, data, settings, calls)
                else:
                    res = _result(peer, case)
                    res.reason = f"time budget: {t0 - start:.0f} s of {budget_s:g} s spent before it started"
                res.wall_s = time.perf_counter() - t0
                results.append(res)
                bar.advance()
                if log is not None and not bar.visible:
                    log(_line(res))
            beside_roofline(case, [r for r in results if r.case == case.name], calls, settings)
            del data, calls
            gc.collect()
            if on_case is not None:
                on_case(_run(plan, settings, list(results), backend, start))
    finally:
        bar.close()
    return _run(plan, settings, results, backend, start)


def _run(plan, settings: Settings, results: list[Result], backend: str | None, start: float) -> Run:
    meta = machine.describe()
    meta["suite"] = plan.name
    meta["backend"] = backend or "all"
    meta["elapsed_s"] = round(time.perf_counter() - start, 1)
    return Run(plan.name, settings, results, meta, list(plan.cases))


def beside_roofline(case: Case, results: list[Result], calls: dict, settings: Settings) -> None:
    """Times our default path interleaved with the roofline on its own thread count and records the verdict
    of :func:`scanweaver.runtime.roofline.judge` in its ``details["roofline"]`` (what the report's roofline
    fraction and ``quiet`` come from); nothing when the default path did not run on this host's cores."""
    from ..runtime import get_backend
    from ..runtime.roofline import compare, scan_threads

    me = next((r for r in results if r.kind == "ours" and r.entry.endswith(":auto") and r.status == "ok"), None)
    if me is None or me.entry not in calls or not me.details.get("backend") or case.device == "cuda":
        return
    backend = me.details["backend"]
    threads = scan_threads(backend, me.details.get("config", {}), get_backend(backend).availability().device)
    if threads is None:
        me.details["roofline"] = {"fraction": None, "quiet": None,
                                  "note": f"the default path ran on an accelerator ({backend}); the roofline is a "
                                          "kernel of this host's cores"}
        return
    B, D, L = case.shape
    try:
        cmp = compare(calls[me.entry], B * D, L, case.dtype, threads, repeats=settings.min_repeats,
                      min_seconds=min(settings.budget_s, 1.0))
    except Exception as exc:  # the comparison is a report figure: its failure is reported, the run goes on
        me.details["roofline"] = {"fraction": None, "quiet": None, "note": f"{type(exc).__name__}: {exc}"[:300]}
        return
    me.details["roofline"] = {"fraction": cmp.fraction, "quiet": cmp.quiet, "note": cmp.reason,
                              "threads": cmp.threads, "scan_s": cmp.seconds, "roofline_s": cmp.roofline_s,
                              "spreads": cmp.spreads}


def _line(r: Result) -> str:
    if r.status == "ok":
        return f"  {r.case:>22}  {r.label:<44} {r.median_s * 1e3:10.3f} ms  (n={r.repeats}, {r.wall_s:.1f} s)"
    return f"  {r.case:>22}  {r.label:<44} {r.status}: {r.reason}"


def stderr_log(line: str) -> None:
    """Default ``log``: one line to stderr."""
    print(line, file=sys.stderr, flush=True)
