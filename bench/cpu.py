"""CPU benchmark: the selective scan (with c, float32) against the memory roofline.

For each shape, in one process: the roofline kernel (``y = a*b + x*c``, the
scan's traffic, OpenMP on every core), the ``chunked`` C kernel with the
backend's default configuration, the naive ``sequential`` C kernel, and a
NumPy loop over L vectorised over lanes.  Times are medians of ``--repeats``
runs after one warm-up, the three C kernels timed round-robin so that all
see the same machine; kernels write into preallocated outputs, like the
roofline (``api_ns_per_element`` is the public call, which also allocates
and first-touches ``y``).  The NumPy loop of the long sequence is timed on a
prefix (``numpy_loop.measured_L``): 2^24 Python iterations would take minutes.
The report names the instruction set and vector width the kernels were built
for (from the compiler's predefined macros with the kernel flags).

Usage::

    python bench/cpu.py [--json] [--repeats N] [--shapes 4096x4096,1x16777216]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import scanweaver
from scanweaver.arrays import prepare
from scanweaver.runtime import get_backend
from scanweaver.runtime.host import cpu_model, cpu_threads
from scanweaver.runtime.toolchain import vector_isa
from scanweaver.runtime import roofline
from scanweaver.runtime.roofline import bytes_per_element

SHAPES = ((4096, 4096), (1, 2**24))
#: Longest prefix of L the NumPy loop is timed on.
NUMPY_MAX_STEPS = 2**16


def median_time(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def operands(lanes: int, L: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "a": rng.uniform(0.9, 1.0, (lanes, L)).astype(np.float32),
        "b": rng.standard_normal((lanes, L), np.float32),
        "x": rng.standard_normal((lanes, L), np.float32),
        "c": rng.standard_normal((lanes, L), np.float32),
    }


def kernel_call(ops: dict, schedule: str) -> tuple:
    """The C kernel of ``schedule`` with default tunables (a zero-argument call), and those tunables."""
    be = get_backend("cpu")
    lanes, L = ops["a"].shape
    rec = scanweaver.api.SELECTIVE
    stages = rec.lower(backend="cpu", schedule=schedule, dtype="float32", lanes=lanes, L=L,
                       **be.default_config(schedule, lanes, L, "float32"))
    y, h_last = np.empty((lanes, L), np.float32), np.empty(lanes, np.float32)
    call = be.bind(stages, prepare("bench", ops), y, h_last)
    call.keep = (y, h_last)
    return call, stages.schedule.config


def interleaved_medians(calls: dict, repeats: int) -> dict:
    """Median seconds of each call, timed round-robin (one warm-up each, :func:`roofline.interleave`), so
    that every kernel sees the same drift of a shared machine."""
    return {name: r.median for name, r in roofline.interleave(calls, repeats, min_seconds=0.0).items()}


def numpy_loop_time(ops: dict, repeats: int) -> tuple[float, int]:
    """Seconds per element of a Python loop over t, each step vectorised over lanes."""
    steps = min(ops["a"].shape[1], NUMPY_MAX_STEPS)
    a, b, x, c = (np.ascontiguousarray(ops[k][:, :steps].T) for k in "abxc")
    y = np.empty_like(a)

    def loop() -> None:
        h = np.zeros(a.shape[1], np.float32)
        for t in range(steps):
            h = a[t] * h + b[t] * x[t]
            np.multiply(c[t], h, out=y[t])

    return median_time(loop, max(1, repeats // 2)) / (steps * a.shape[1]), steps


def bench_shape(lanes: int, L: int, repeats: int) -> dict:
    n = lanes * L
    bpe = bytes_per_element("float32")
    ops = operands(lanes, L)
    chunked, config = kernel_call(ops, "chunked")
    sequential, _ = kernel_call(ops, "sequential")
    threads = int(config.get("threads", 0))  # the roofline runs on the kernel's own thread count
    med = interleaved_medians({"roofline": roofline.bind(lanes, L, "float32", threads), "chunked": chunked,
                               "sequential": sequential}, repeats)
    roof, ours, seq = med["roofline"], med["chunked"], med["sequential"]
    api = median_time(lambda: scanweaver.selective_scan(**ops, backend="cpu"), max(1, repeats // 2))
    np_per_el, np_steps = numpy_loop_time(ops, repeats)

    def row(seconds: float) -> dict:
        return {"ns_per_element": seconds / n * 1e9, "GB_per_s": bpe * n / seconds / 1e9}

    return {
        "lanes": lanes, "L": L,
        "roofline": row(roof),
        "chunked": {**row(ours), "config": config, "api_ns_per_element": api / n * 1e9},
        "sequential": row(seq),
        "numpy_loop": {"ns_per_element": np_per_el * 1e9, "measured_L": np_steps},
        "roofline_fraction": roof / ours,
        "speedup_vs_sequential": seq / ours,
    }


def table(results: list[dict]) -> str:
    lines = [f"{'shape':>12} {'kernel':>10} {'ns/el':>7} {'GB/s':>6} {'roof.frac':>9} {'vs seq':>7}"]
    for r in results:
        shape = f"{r['lanes']}x{r['L']}"
        for name in ("roofline", "chunked", "sequential"):
            e = r[name]
            frac = r["roofline"]["ns_per_element"] / e["ns_per_element"]
            vs = r["sequential"]["ns_per_element"] / e["ns_per_element"]
            lines.append(f"{shape:>12} {name:>10} {e['ns_per_element']:7.3f} {e['GB_per_s']:6.1f} "
                         f"{frac:9.2f} {vs:7.2f}")
        lines.append(f"{shape:>12} {'numpy loop':>10} {r['numpy_loop']['ns_per_element']:7.2f}"
                     f"   (on L={r['numpy_loop']['measured_L']});  public call {r['chunked']['api_ns_per_element']:.3f}"
                     f" ns/el;  chunked config {r['chunked']['config']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--repeats", type=int, default=7, help="timed runs per kernel (median reported)")
    p.add_argument("--shapes", default=",".join(f"{a}x{b}" for a, b in SHAPES), help="LANESxL,...")
    args = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    results = [bench_shape(lanes, L, args.repeats) for lanes, L in shapes]
    isa, vbytes = vector_isa()
    report = {"device": f"{cpu_model()} ({cpu_threads()} threads)", "isa": isa, "vector_bytes": vbytes,
              "dtype": "float32", "shapes": results}
    head = f"{report['device']}, {isa}: {vbytes}-byte vectors in the chunked kernel"
    print(json.dumps(report, indent=2) if args.json else f"{head}\n{table(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
