"""Tuning benchmark on the ``cpu`` backend: what Kernel Tuner finds, and what a budget finds.

1. Brute force: tune the selective scan (with c, float32) for B*D = 4096
   lanes and L = 4096 (shape (8, 512, 4096)) over the whole cpu search space
   (Kernel Tuner ``lang="C"``, each configuration compiled with the runtime's
   flags, verified against the float64 oracle, timed by the kernel itself,
   median of the repeated runs).  Reports best, median, worst and default
   times, best/median and best/default; best and default are then re-measured
   alternately ``--confirm`` times (fresh compiles) and best/default uses
   those medians, so that load drift between the sweep and the default's own
   measurement cannot skew it.
2. Budgeted strategies: ``random_sample`` and ``bayes_opt`` with at most 25%
   of the space, replayed in Kernel Tuner's simulation mode over the
   brute-force measurements (so every strategy sees the same timings), for
   ``--seeds`` seeds each.  Reports how often the budgeted best is within 10%
   of the brute-force best.
3. Check: the next ``selective_scan`` call picks the tuned configuration up
   (``source == "tuned"``) and its time against the default's, measured in
   this process through the public API (median of ``--repeats`` calls each,
   the two alternated so that load drift on a shared machine hits both).

Targets: best/default >= 1.0 (within noise); a budgeted strategy within 10%
of the brute-force best.  Uses the per-user cache unless
``SCANWEAVER_CACHE_DIR`` is set; ``--fresh`` re-measures everything.

``--parallel N`` instead compares, on the same space, the wall time of a
sequential brute-force tune with a tune spread over N Ray workers
(``scanweaver.tune(..., parallel=N)``; a local Ray instance declaring N
logical GPUs unless ``RAY_ADDRESS`` names a cluster), both re-measured from
scratch and neither stored, and whether both found the same best schedule
family.  On one machine the shards share its cores and memory, so their
timings disturb each other: the speed-up is of the tune's wall time, not a
statement about the kernels.

Usage::

    python bench/tuning.py [--json] [--fresh] [--seeds N] [--repeats N]
    python bench/tuning.py --parallel 2 [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

import scanweaver
from scanweaver.api import SELECTIVE
from scanweaver.tuning.kt import replay

SHAPE = (8, 512, 4096)
BUDGET = 0.25
WITHIN = 1.10


def budgeted(cachefile: str, space_size: int, best_ms: float, seeds: int) -> dict:
    """Each budgeted strategy over ``seeds`` replays: how often it lands within 10% of the best."""
    fevals = max(1, math.floor(BUDGET * space_size))
    out = {}
    for strategy in ("random_sample", "bayes_opt"):
        ratios = []
        for seed in range(seeds):
            rep = replay(cachefile, strategy=strategy, max_fevals=fevals, seed=seed)
            ratios.append(rep.best.time_ms / best_ms if rep.best else float("inf"))
        out[strategy] = {
            "max_fevals": fevals, "seeds": seeds,
            "within_10pct": sum(r <= WITHIN for r in ratios) / seeds,
            "median_ratio_to_best": statistics.median(ratios), "worst_ratio_to_best": max(ratios),
        }
    return out


def time_pair(first, second, repeats: int) -> tuple[float, float]:
    """Median ms of two calls, alternated so that machine-load drift hits both alike."""
    first(), second()
    a, b = [], []
    for _ in range(repeats):
        for fn, out in ((first, a), (second, b)):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(a), statistics.median(b)


def parallel_vs_sequential(n: int) -> dict:
    """Wall time of a sequential and an ``n``-way Ray tune of the same space (both fresh, neither stored)."""
    import os

    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(num_gpus=n, include_dashboard=False, log_to_driver=False)
    kw = dict(backend="cpu", shape=SHAPE, dtype="float32", strategy="brute_force", fresh=True, progress=False,
              record=False)
    seq = scanweaver.tune(SELECTIVE, **kw)
    par = scanweaver.tune(SELECTIVE, parallel=n, **kw)
    ray.shutdown()
    ranks = {e.label(): i for i, e in enumerate(seq.ok)}
    return {"parallel": n, "space_size": seq.space_size, "device": seq.device, "ray": par.notes[0],
            "sequential_wall_s": seq.wall_s, "parallel_wall_s": par.wall_s, "wall_speedup": seq.wall_s / par.wall_s,
            "sequential_best": seq.best.label(), "parallel_best": par.best.label(),
            "same_best_family": seq.best.schedule == par.best.schedule,
            "parallel_best_rank_in_sequential": ranks.get(par.best.label()),
            "parallel_skipped": len(par.skipped)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--fresh", action="store_true", help="re-measure instead of reusing Kernel Tuner's cache")
    ap.add_argument("--seeds", type=int, default=20, help="replays per budgeted strategy")
    ap.add_argument("--repeats", type=int, default=15, help="timed calls in the check")
    ap.add_argument("--confirm", type=int, default=5, help="alternate re-measurements of best and default")
    ap.add_argument("--parallel", type=int, metavar="N", help="compare with a tune over N Ray workers instead")
    args = ap.parse_args(argv)
    if args.parallel:
        res = parallel_vs_sequential(args.parallel)
        if args.json:
            print(json.dumps(res, indent=1))
        else:
            print(f"{res['space_size']} configurations on {res['device']}: "
                  f"sequential {res['sequential_wall_s']:.1f} s, "
                  f"{res['parallel']} Ray workers {res['parallel_wall_s']:.1f} s ({res['wall_speedup']:.2f}x); best "
                  f"{res['sequential_best']} vs {res['parallel_best']} (rank {res['parallel_best_rank_in_sequential']} "
                  f"in the sequential sweep)")
        return 0

    rep = scanweaver.tune(SELECTIVE, backend="cpu", shape=SHAPE, dtype="float32", strategy="brute_force",
                          fresh=args.fresh, progress=not args.json, confirm=args.confirm)
    summary = rep.to_json()
    summary["budgeted"] = budgeted(rep.kt_cache, rep.space_size, rep.best.time_ms, args.seeds)
    ordered = sorted(e.time_ms for e in rep.ok)
    summary["sweep_near_best"] = sum(t <= WITHIN * ordered[0] for t in ordered)

    rng = np.random.default_rng(0)
    a = rng.uniform(0.6, 0.99, SHAPE).astype(np.float32)
    b, x, c = (rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3))
    scanweaver.selective_scan(a, b, x, c, backend="cpu")
    source = SELECTIVE.last.source
    tuned_ms, default_ms = time_pair(lambda: scanweaver.selective_scan(a, b, x, c, backend="cpu"),
                                     lambda: scanweaver.selective_scan(a, b, x, c, backend="cpu", config="default"),
                                     args.repeats)
    summary["api_check"] = {"source": source, "tuned_call_ms": tuned_ms, "default_call_ms": default_ms,
                            "speedup": default_ms / tuned_ms}
    summary["targets"] = {
        "tuned_at_least_default": summary["speedup_vs_default"] is not None and summary["speedup_vs_default"] >= 1.0,
        "budgeted_within_10pct": any(v["within_10pct"] >= 0.5 for v in summary["budgeted"].values()),
    }
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
        return 0
    print(rep.table())
    for name, v in summary["budgeted"].items():
        print(f"{name} at {v['max_fevals']} evaluations (<= 25% of {rep.space_size}): within 10% of the best in "
              f"{v['within_10pct']:.0%} of {v['seeds']} replays, median {v['median_ratio_to_best']:.3f}x the best")
    chk = summary["api_check"]
    print(f"next selective_scan call: source={chk['source']}, {chk['tuned_call_ms']:.2f} ms tuned vs "
          f"{chk['default_call_ms']:.2f} ms default ({chk['speedup']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
