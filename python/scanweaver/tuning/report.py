"""What a tune found: best, median, worst and default configuration, and a plot of the space.

:func:`summarize` turns Kernel Tuner's results into a :class:`TuneReport`
(the same code for real tunes and simulation replays).  ``report.table()``
is the text table, ``report.to_json()`` the machine-readable summary, and
``report.plot(path)`` draws every evaluated configuration's time, sorted,
with the median, the best and the default marked (in the manner of the
KernelTuner.jl paper's figure 4).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .session import failure_of, result_time
from .space import SearchSpace


#: How the reason of a configuration begins when its Ray shard was lost (:mod:`.cluster`).
LOST_SHARD = "Ray worker lost"


@dataclass
class Evaluation:
    """One configuration and its outcome.

    Attributes:
        schedule: schedule family.
        config: its tunables (runtime keywords).
        time_ms: measured time, or ``None`` when skipped.
        reason: why it was skipped (``None`` when it ran and was right).
        times: its timed runs (ms), whose spread says whether the machine was quiet.
    """

    schedule: str
    config: dict
    time_ms: float | None
    reason: str | None = None
    times: list[float] | None = None

    def label(self) -> str:
        """``schedule(k=v, ...)``."""
        return f"{self.schedule}({', '.join(f'{k}={v}' for k, v in sorted(self.config.items()))})"


@dataclass(repr=False)
class TuneReport:
    """The outcome of one tune; printed (``str`` or ``repr``), it is its :meth:`table`.

    Attributes:
        backend, device, strategy: what was tuned where, and how.
        signature, dtype, shape: the problem.
        space_size: valid configurations in the search space.
        evaluations: every configuration the strategy visited (skipped ones included).
        default: the default configuration's evaluation (``None`` when it cannot be timed).
        store_path, kt_cache: where the result and Kernel Tuner's cache were written.
        timing: how configurations were timed.
        wall_s: seconds the tune took.
        notes: remarks for the reader.
        confirmed: re-measured times of ``best`` and ``default`` (``tune(confirm=N)``).
    """

    backend: str
    device: str
    strategy: str
    signature: str
    dtype: str
    shape: tuple
    space_size: int
    evaluations: list[Evaluation]
    default: Evaluation | None = None
    store_path: str | None = None
    kt_cache: str | None = None
    timing: str = ""
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    confirmed: dict[str, list[float]] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__

    @property
    def ok(self) -> list[Evaluation]:
        """Evaluations that ran and were right, fastest first."""
        return sorted((e for e in self.evaluations if e.time_ms is not None), key=lambda e: e.time_ms)

    def coverage(self) -> str:
        """``""`` when every valid configuration of the space was visited, else how many were (a partial search;
        configurations of a lost shard count as not visited)."""
        lost = sum(1 for e in self.evaluations if e.reason and e.reason.startswith(LOST_SHARD))
        visited = len(self.evaluations) - lost
        if visited >= self.space_size:
            return ""
        return f"{visited} of {self.space_size} configurations measured" + (
            f" ({lost} lost with their shard)" if lost else "")

    @property
    def skipped(self) -> list[Evaluation]:
        """Evaluations that failed to compile, crashed or were wrong."""
        return [e for e in self.evaluations if e.time_ms is None]

    @property
    def best(self) -> Evaluation | None:
        return self.ok[0] if self.ok else None

    @property
    def worst(self) -> Evaluation | None:
        return self.ok[-1] if self.ok else None

    @property
    def median_ms(self) -> float | None:
        return float(np.median([e.time_ms for e in self.ok])) if self.ok else None

    @property
    def median(self) -> Evaluation | None:
        """The evaluation nearest the median time."""
        ok = self.ok
        return ok[(len(ok) - 1) // 2] if ok else None

    @property
    def default_ms(self) -> float | None:
        """The default's time: its re-measured median when confirmed, else its measurement."""
        if self.confirmed.get("default"):
            return float(np.median(self.confirmed["default"]))
        return self.default.time_ms if self.default else None

    @property
    def best_ms(self) -> float | None:
        """The best's time as compared with the default (re-measured median when confirmed)."""
        if self.confirmed.get("best") and self.confirmed.get("default"):
            return float(np.median(self.confirmed["best"]))
        return self.best.time_ms if self.best else None

    @property
    def stores_default(self) -> bool:
        """True when the default is the verdict, stored and reported as such: re-measured alternately with the
        best (``confirm``) it was no slower, or (not re-measured) it lies outside the searched space and was
        measured faster than everything the search found."""
        best, default = self.confirmed.get("best"), self.confirmed.get("default")
        if best and default:
            return float(np.median(default)) <= float(np.median(best))
        return (self.best is not None and self.default is not None and self.default.time_ms is not None
                and self.default.time_ms < self.best.time_ms)

    @property
    def default_outside(self) -> bool:
        """True when the default was measured but is not one of the searched space's configurations."""
        return self.default is not None and all(e.label() != self.default.label() for e in self.evaluations)

    def busy(self) -> str:
        """Why the times are uncertain (:func:`scanweaver.runtime.roofline.busy_reason` of the best's, the
        default's and the re-measured runs), ``""`` when the machine looked quiet."""
        from ..runtime.roofline import busy_reason, spreads_of

        runs = {f"the {name} configuration": e.times for name, e in (("best", self.best), ("default", self.default))
                if e is not None and e.times}
        runs.update({f"the {name}'s re-measurements": ts for name, ts in self.confirmed.items() if len(ts) > 1})
        return busy_reason(spreads_of(runs))

    def speedup(self, other_ms: float | None, best_ms: float | None = None) -> float | None:
        """``other_ms / best`` (how much faster the best is)."""
        best_ms = best_ms if best_ms is not None else (self.best.time_ms if self.best else None)
        if other_ms is None or not best_ms:
            return None
        return other_ms / best_ms

    def to_json(self) -> dict:
        """The summary ``scanweaver tune --json`` prints."""
        best = self.best
        return {
            "backend": self.backend, "device": self.device, "strategy": self.strategy,
            "signature": self.signature, "dtype": self.dtype, "shape": list(self.shape),
            "space_size": self.space_size, "evaluated": len(self.ok), "skipped": len(self.skipped),
            "best_schedule": best.schedule if best else None,
            "best_config": {"schedule": best.schedule, **best.config} if best else None,
            "best_ms": best.time_ms if best else None,
            "median_ms": self.median_ms,
            "worst_ms": self.worst.time_ms if self.worst else None,
            "default_config": {"schedule": self.default.schedule, **self.default.config} if self.default else None,
            "default_ms": self.default_ms,
            "speedup_vs_median": self.speedup(self.median_ms),
            "speedup_vs_default": self.speedup(self.default_ms, self.best_ms),
            "skipped_reasons": {e.label(): e.reason for e in self.skipped},
            "store_path": self.store_path, "kt_cache": self.kt_cache, "timing": self.timing,
            "wall_s": round(self.wall_s, 3), "notes": self.notes, "confirmed": self.confirmed,
            "stored": ("default" if self.stores_default else "best") if best else None,  # (or would be)
            "quiet": not self.busy(), "busy": self.busy(),
        }

    def table(self) -> str:
        """A text table: best, median, worst, default, with ratios and counts."""
        rows = [("best", self.best), ("median", self.median), ("worst", self.worst), ("default", self.default)]
        width = max([len(e.label()) for _, e in rows if e] + [13])
        lines = [f"tuned {self.backend} on {self.device} ({self.strategy}), shape {tuple(self.shape)} {self.dtype}",
                 f"{'':8} {'configuration':<{width}} {'time (ms)':>10}"]
        for name, e in rows:
            if e is None:
                lines.append(f"{name:8} {'(not measured)':<{width}} {'-':>10}")
            else:
                t = f"{e.time_ms:.4f}" if e.time_ms is not None else (e.reason or "failed")
                lines.append(f"{name:8} {e.label():<{width}} {t:>10}")
        fmt = lambda v: f"{v:.2f}x" if v is not None else "-"  # noqa: E731
        vs_default = self.speedup(self.default_ms, self.best_ms)
        confirmed = self.confirmed.get("best") and self.confirmed.get("default")
        lines.append(f"best/median speedup {fmt(self.speedup(self.median_ms))}, best/default speedup "
                     f"{fmt(vs_default)}" + (f" (re-measured alternately {len(self.confirmed['best'])}x: best "
                                              f"{self.best_ms:.4g} ms, default {self.default_ms:.4g} ms)"
                                              if confirmed else ""))
        lines.append(f"evaluated {len(self.ok)}, skipped {len(self.skipped)} of {self.space_size} configurations "
                     f"in {self.wall_s:.1f} s" + ("; the default, outside the searched space, was measured too"
                                                   if self.default_outside else ""))
        for e in self.skipped:
            lines.append(f"  skipped {e.label()}: {e.reason}")
        lines.extend(f"note: {n}" for n in self.notes)
        busy = self.busy()
        if busy:
            lines.append(f"note: {busy}; the times and speedups above are uncertain: tune again on a quiet machine")
        if self.store_path and self.best is not None:
            chosen = self.default if self.stores_default and self.default else self.best
            why = ("" if not self.stores_default else " (re-measured, the default was no slower than the search's best)"
                   if confirmed else " (measured faster than everything the search found)")
            lines.append(f"stored {'the default' if self.stores_default else 'the best'} {chosen.label()}{why} "
                         f"in {self.store_path}")
        elif self.store_path:
            lines.append(f"stored in {self.store_path}")
        return "\n".join(lines)

    def plot(self, path: str | Path) -> Path | None:
        """Saves a PNG of every configuration's time, sorted (``None`` without matplotlib or results)."""
        fig = self.figure()
        if fig is None:
            return None
        import matplotlib.pyplot as plt

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    def figure(self):
        """The matplotlib figure :meth:`plot` saves: every configuration's time by rank (integer ticks), the
        best, worst, median and default marked; ``None`` without matplotlib or results."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        ok = self.ok
        if not ok:
            return None
        from matplotlib.ticker import MaxNLocator

        fig, ax = plt.subplots(figsize=(7, 4))
        scheds = sorted({e.schedule for e in ok})
        colors = {s: plt.cm.tab10(i % 10) for i, s in enumerate(scheds)}
        for s in scheds:
            xs = [i for i, e in enumerate(ok, 1) if e.schedule == s]
            ax.scatter(xs, [ok[i - 1].time_ms for i in xs], s=14, color=colors[s], label=s)
        ax.axhline(self.median_ms, color="grey", ls="--", lw=1, label=f"median {self.median_ms:.3g} ms")
        ax.scatter([1], [ok[0].time_ms], marker="*", s=160, color="gold", edgecolor="k", zorder=3,
                   label=f"best {ok[0].time_ms:.3g} ms")
        ax.scatter([len(ok)], [ok[-1].time_ms], marker="v", s=70, color="tab:red", edgecolor="k", zorder=3,
                   label=f"worst {ok[-1].time_ms:.3g} ms")
        if self.default_ms is not None:
            rank = int(np.searchsorted([e.time_ms for e in ok], self.default_ms)) + 1
            ax.scatter([min(rank, len(ok))], [self.default_ms], marker="D", s=60, color="k", zorder=3,
                       label=f"default {self.default_ms:.3g} ms")
        ax.set_yscale("log")
        ax.set_xlim(0.5, len(ok) + 0.5)
        times = [e.time_ms for e in ok] + ([self.default_ms] if self.default_ms is not None else [])
        pad = max(1.5, (max(times) / min(times)) ** 0.08)  # room for the markers above the worst, below the best
        ax.set_ylim(min(times) / pad, max(times) * pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("configuration (rank by time, 1 = best)")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"{self.backend}: {self.device}\nshape {tuple(self.shape)} {self.dtype}, {len(ok)} configurations",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        return fig

    def save(self, out: str | Path, stem: str = "tune") -> list[Path]:
        """Writes ``<stem>.json``, ``<stem>.txt`` and (with matplotlib) ``<stem>.png`` into ``out``."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / f"{stem}.json", out / f"{stem}.txt"]
        body = {**self.to_json(), "evaluations": [asdict(e) for e in self.evaluations]}
        paths[0].write_text(json.dumps(body, indent=1, default=str) + "\n")
        paths[1].write_text(self.table() + "\n")
        png = self.plot(out / f"{stem}.png")
        return paths + ([png] if png else [])


def evaluations(results: list[dict], space: SearchSpace) -> list[Evaluation]:
    """Kernel Tuner results -> one :class:`Evaluation` per distinct configuration."""
    seen: dict[str, Evaluation] = {}
    for r in results:
        if not r:
            continue
        params = {k: r[k] for k in space.params}
        key = space.key(params)
        if key in seen:
            continue
        schedule, config = space.split(params)
        t = result_time(r)
        times = r.get("times")
        runs = [float(v) for v in times] if isinstance(times, (list, tuple)) and t is not None else None
        seen[key] = Evaluation(schedule, config, t, None if t is not None else failure_of(r), runs)
    return list(seen.values())


def summarize(results: list[dict], space: SearchSpace, *, default: dict | None = None,
              default_results: list[dict] = (), **meta) -> TuneReport:
    """A :class:`TuneReport` from Kernel Tuner results.

    Args:
        results: Kernel Tuner results of the strategy (tune or replay); those outside ``space`` (a default
            it does not hold) count only as the default.
        space: the search space they came from.
        default: Kernel Tuner params of the default configuration (``None``: not measurable).
        default_results: further results to find the default in when the strategy did not visit it.
        **meta: the report's other fields (backend, device, strategy, ...).
    """
    default_eval = None
    if default is not None:
        key = space.key(default)
        for r in [*results, *default_results]:
            if r and space.key({k: r[k] for k in space.params}) == key:
                default_eval = evaluations([r], space)[0]
                break
    inside = [r for r in results if r and space.contains({k: r.get(k) for k in space.params})]
    return TuneReport(space_size=space.size, evaluations=evaluations(inside, space), default=default_eval, **meta)
