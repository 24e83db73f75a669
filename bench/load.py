"""Degradation under load: the scan's time per call while busy processes hold k of the host's cores.

For k = 0 .. cores-1, k competing processes spin, one pinned to each of the first k cores of this process's
affinity mask; the scan (``selective_scan`` on ``cpu``, default configuration, float32, shape
``(4, 64, 4096)`` by default) is timed per call (median of ``--calls``), next to the same call with
``threads=1`` pinned to a free core.  Degradation is ``time(k) / time(0)``; proportional to the lost cores
means at most ``cores / (cores - k)``.

Usage::

    python bench/load.py [--json] [--calls N] [--shape 4,64,4096]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import scanweaver
from scanweaver.runtime.cpu_backend import cpu_model

SPIN = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass\n"


def per_call_ms(fn, calls: int) -> float:
    """Median milliseconds of one call of ``fn`` over ``calls`` calls (after a warm-up)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(shape: tuple[int, ...], calls: int) -> dict:
    """Per-call times with k busy cores, for every k, and the ratios."""
    cores = sorted(os.sched_getaffinity(0))
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1, shape).astype(np.float32)
    b, x, c = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))

    def default():
        scanweaver.selective_scan(a, b, x, c, backend="cpu")

    def one():
        scanweaver.selective_scan(a, b, x, c, backend="cpu", threads=1)

    rows = []
    for k in range(len(cores)):
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)]) for cpu in cores[:k]]
        try:
            time.sleep(0.3)  # the spinners are running
            free = set(cores[k:])
            ms = per_call_ms(default, calls)
            mine = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {min(free)})
            try:
                one_ms = per_call_ms(one, calls)
            finally:
                os.sched_setaffinity(0, mine)
        finally:
            for p in spinners:
                p.kill()
                p.wait()
        rows.append({"busy": k, "default_ms": ms, "one_thread_pinned_ms": one_ms})
    base = rows[0]["default_ms"]
    for r in rows:
        r["degradation"] = r["default_ms"] / base
        r["proportional"] = len(cores) / (len(cores) - r["busy"])
    return {"cpu": cpu_model(), "cores": len(cores), "shape": list(shape), "calls": calls, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--calls", type=int, default=200, help="timed calls per point (median)")
    parser.add_argument("--shape", default="4,64,4096", help="operand shape (..., L)")
    args = parser.parse_args(argv)
    res = measure(tuple(int(v) for v in args.shape.split(",")), args.calls)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{res['cpu']}, {res['cores']} cores, shape {tuple(res['shape'])}, median of {res['calls']} calls")
    print("busy cores  default ms  degradation  proportional  1 thread pinned ms")
    for r in res["rows"]:
        print(f"{r['busy']:>10}  {r['default_ms']:>10.3f}  {r['degradation']:>11.2f}  {r['proportional']:>12.2f}"
              f"  {r['one_thread_pinned_ms']:>18.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
