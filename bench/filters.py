"""Dense recurrences as filters: a biquad (direct form II transposed) against ``scipy.signal.lfilter``.

The biquad is ``@scanweaver.recurrence(state_size=2)`` with its five coefficients passed as Python
floats (scalar operands: one compiled kernel for every filter, no (lanes, L) coefficient arrays), on
the ``cpu`` backend's default path: the ``chunked`` schedule, whose dense kernel runs the stripes of a
tile side by side in vector lanes.  In one process, timed round-robin (median of ``--repeats`` after a
warm-up): ScanWeaver into a preallocated ``out``, ScanWeaver's naive ``sequential`` kernel,
``lfilter`` along the last axis, and a copy of the signal (``np.copyto``, the memory floor), on one
float64 signal of 2^22 samples and on 64 signals of 2^16.  Every ScanWeaver result is first checked
against ``lfilter`` (relative error 1e-9).  Targets: at least 3x ``lfilter`` on the one long signal, and
no slower than it on many signals.

Usage::

    python bench/filters.py [--json] [--repeats N] [--shapes 1x4194304,64x65536]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import scanweaver
from scanweaver.runtime.host import cpu_model, cpu_threads
from scanweaver.runtime.toolchain import vector_isa

SHAPES = ((1, 2**22), (64, 2**16))
#: A stable resonant section: poles at radius 0.9, angle 0.3 rad.
B = (0.2, 0.3, 0.1)
A = (1.0, -2 * 0.9 * float(np.cos(0.3)), 0.81)


@scanweaver.recurrence(state_size=2)
def biquad(h, b0, b1, b2, a1, a2, x):
    """Direct form II transposed: y = b0 x + z1; z1' = b1 x - a1 y + z2; z2' = b2 x - a2 y."""
    y = b0 * x + h[0]
    return (b1 * x - a1 * y + h[1], b2 * x - a2 * y), y


def round_robin(calls: dict, repeats: int) -> dict:
    """Median seconds of each call, timed in turn so that all see the same load of a shared machine."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_shape(lanes: int, L: int, repeats: int) -> dict:
    from scipy.signal import lfilter

    x = np.random.default_rng(0).standard_normal((lanes, L))
    out = np.empty_like(x)
    want = lfilter(B, A, x, axis=-1)
    coef = (*B, *A[1:])
    error = {}
    for schedule in ("auto", "sequential"):
        got = biquad(*coef, x, backend="cpu", schedule=schedule)
        error[schedule] = float(np.abs(got - want).max() / np.abs(want).max())
        if error[schedule] > 1e-9:
            raise SystemExit(f"bench/filters.py: {schedule} differs from lfilter by {error[schedule]:.3g} (relative)")
    info = biquad.last
    med = round_robin({
        "scanweaver": lambda: biquad(*coef, x, backend="cpu", out=out),
        "scanweaver sequential": lambda: biquad(*coef, x, backend="cpu", schedule="sequential", out=out),
        "lfilter": lambda: lfilter(B, A, x, axis=-1),
        "copy": lambda: np.copyto(out, x),
    }, repeats)
    n = lanes * L
    return {"lanes": lanes, "L": L, "schedule": "chunked", "config": info.config,
            "ns_per_sample": {k: v / n * 1e9 for k, v in med.items()},
            "speedup_vs_lfilter": med["lfilter"] / med["scanweaver"],
            "sequential_speedup_vs_lfilter": med["lfilter"] / med["scanweaver sequential"],
            "copy_fraction": med["copy"] / med["scanweaver"], "relative_error": error}


def table(results: list[dict]) -> str:
    lines = [f"{'shape':>11} {'entry':>22} {'ns/sample':>10} {'vs lfilter':>10}"]
    for r in results:
        shape = f"{r['lanes']}x{r['L']}"
        base = r["ns_per_sample"]["lfilter"]
        for name, ns in r["ns_per_sample"].items():
            lines.append(f"{shape:>11} {name:>22} {ns:10.3f} {base / ns:9.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--repeats", type=int, default=9, help="timed runs per entry (median reported)")
    p.add_argument("--shapes", default=",".join(f"{a}x{b}" for a, b in SHAPES), help="LANESxL,...")
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    results = [bench_shape(lanes, L, args.repeats) for lanes, L in shapes]
    isa, vbytes = vector_isa()
    report = {"device": f"{cpu_model()} ({cpu_threads()} threads)", "isa": isa, "vector_bytes": vbytes,
              "dtype": "float64", "filter": {"b": B, "a": A}, "shapes": results}
    head = f"{report['device']}, {isa}: {vbytes}-byte vectors"
    print(json.dumps(report, indent=2) if args.json else f"{head}\n{table(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
