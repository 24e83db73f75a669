"""The cost of the zero-carry guard (``sw_carry`` and the guarded ``sw_compose``) on the default schedules.

Each kernel runs twice in one process, alternately (which goes first alternating too): as emitted, and
with the guard's text taken out of the same source (``sw_carry`` back to ``a * h + u``, the composed
product back to ``A2 * A1``, the C split tile's rescan removed: the kernels as they were before the
guard).  Reported per case: the median time of each over ``--repeats`` rounds and their ratio (guarded /
unguarded), and the ratio of the fastest runs (the least disturbed on a shared machine).  GPU schedules
time the device (profiling events; on PoCL that is the CPU, indicative only); the C kernels time the call.

Usage::

    python bench/carry_guard.py [--json] [--repeats N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np

from scanweaver.api import SELECTIVE
from scanweaver.arrays import prepare
from scanweaver.runtime import REGISTRY, get_backend

#: (backend, schedule or "auto", lanes, L, extra tunables)
CASES = (
    ("cpu", "auto", 4096, 4096, {}),
    ("cpu", "chunked", 1, 1 << 24, {"threads": 2}),
    ("opencl", "auto", 64, 1 << 16, {}),
    ("opencl", "hybrid", 256, 4096, {}),
    ("opencl", "reduce_then_scan", 4, 1 << 18, {}),
    ("opencl", "lookback", 4, 1 << 18, {}),
    ("cuda", "auto", 8 * 1536, 4096, {}),
    ("cuda", "hybrid", 8 * 1536, 4096, {}),
    ("cuda", "reduce_then_scan", 1, 1 << 26, {}),
    ("cuda", "lookback", 1, 1 << 26, {}),
)


def unguarded(source: str) -> str:
    """``source`` without the zero-carry guard (what the kernels computed before it)."""
    out = source
    for zero in ("0.0f", "0.0"):
        out = out.replace(f"{{ return h == {zero} ? u : a * h + u; }}", "{ return a * h + u; }")
    out = out.replace("const SW_T a = (later.a == (SW_T)0 || earlier.a == (SW_T)0) ? (SW_T)0 : later.a * earlier.a;",
                      "const SW_T a = later.a * earlier.a;")
    c_split = """  const int finite = ga - ga == (SW_T)0;  /* false for inf and NaN */
  if (!finite && h != (SW_T)0) {
    sw_replay(sw, lane, s0, s1, &h);
    carry[tile + 1] = h;
    sw_flag_set(ready + tile + 1);
    return;
  }
"""
    return out.replace(c_split, "")


def timed(be, stages, arrays) -> float:
    """Seconds of one run: the device time where the backend reports one, else the call's."""
    t0 = time.perf_counter()
    be.run(stages, arrays)
    wall = time.perf_counter() - t0
    ms = getattr(be, "last_ms", None)
    return ms * 1e-3 if isinstance(ms, float) and ms == ms and be.name != "cpu" else wall


def case(backend: str, schedule: str, lanes: int, L: int, tunables: dict, repeats: int) -> dict:
    be = get_backend(backend)
    rng = np.random.default_rng(lanes + L)
    a = rng.uniform(0.5, 1.0, (lanes, L)).astype(np.float32)
    b, x, c = (rng.standard_normal((lanes, L)).astype(np.float32) for _ in range(3))
    arrays = prepare("bench", {"a": a, "b": b, "x": x, "c": c})
    stages = be.emit(SELECTIVE.lower(backend=backend, schedule=schedule, lanes=lanes, L=L, **tunables))
    plain = dataclasses.replace(stages, kernel=unguarded(stages.kernel))
    assert plain.kernel != stages.kernel, "the guard's text was not found in the kernel"
    y_guard, _ = be.run(stages, arrays)
    y_plain, _ = be.run(plain, arrays)
    assert np.allclose(y_guard, y_plain, rtol=1e-5, atol=1e-5)
    guard, bare = [], []
    for i in range(repeats):  # which runs first alternates too: no order bias
        for kernel in ((stages, plain) if i % 2 else (plain, stages)):
            (guard if kernel is stages else bare).append(timed(be, kernel, arrays))
    g, p = statistics.median(guard), statistics.median(bare)
    return {"backend": backend, "schedule": stages.schedule.schedule, "lanes": lanes, "L": L,
            "guarded_ms": g * 1e3, "unguarded_ms": p * 1e3, "ratio": g / p, "ratio_of_fastest": min(guard) / min(bare)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--repeats", type=int, default=15, help="alternating rounds per case (median reported)")
    args = ap.parse_args()
    rows = [case(*c, repeats=args.repeats) for c in CASES if REGISTRY[c[0]].availability().ok]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['backend']:7s} {r['schedule']:17s} {r['lanes']:>5d} x {r['L']:<9d} guarded {r['guarded_ms']:8.3f} ms"
              f"  unguarded {r['unguarded_ms']:8.3f} ms  ratio {r['ratio']:.3f}"
              f" (fastest runs: {r['ratio_of_fastest']:.3f})")


if __name__ == "__main__":
    main()
