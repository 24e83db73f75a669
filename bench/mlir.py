"""MLIR/IREE benchmark: the ``iree`` backend on ``llvm-cpu`` beside the ``cpu`` (C) backend and the roofline.

For each shape, in one process (float32, selective scan with c): the memory
roofline (``y = a*b + x*c``, the scan's traffic, OpenMP on every core), the C
backend's default kernel, and the ``iree`` backend's modules for each schedule
it runs, timed round-robin (medians of ``--repeats`` runs after a warm-up).
The iree figures are the backend's whole call (operands imported without a
copy, the module invoked, ``y`` mapped back), the C figures the kernel call on
preallocated outputs.  Also reported: the compile time of the default module
(``iree-compile`` on a cold cache) and the fraction of the C backend's speed.
The target is at least 0.5 of the C backend on the many-lane shape.

Usage::

    python bench/mlir.py [--json] [--repeats N] [--shapes 4096x4096,1x16777216]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import scanweaver
from scanweaver.arrays import prepare
from scanweaver.runtime import get_backend, roofline
from scanweaver.runtime.host import cpu_model, cpu_threads
from scanweaver.runtime.iree_backend import compile_module
from scanweaver.runtime.roofline import bytes_per_element

sys.path.insert(0, str(Path(__file__).parent))
from cpu import interleaved_medians, kernel_call, operands  # noqa: E402

SHAPES = ((4096, 4096), (1, 2**24))


def iree_call(ops: dict, schedule: str, config: dict):
    """The iree backend's run of ``schedule`` on prepared operands (a zero-argument call), and its stages."""
    be = get_backend("iree")
    lanes, L = ops["a"].shape
    stages = scanweaver.api.SELECTIVE.lower(backend="iree", schedule=schedule, dtype="float32", lanes=lanes, L=L,
                                            **config)
    arrays = prepare("bench", ops)
    be.function(stages)  # compiled (or loaded) before timing
    return (lambda: be.run(stages, arrays)), stages


def compile_seconds(stages) -> float:
    """``iree-compile`` time of one module on a cold cache."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        compile_module(stages.kernel, "llvm-cpu", Path(tmp))
        return time.perf_counter() - t0


def configs(lanes: int, L: int) -> dict[str, dict]:
    """The iree schedules timed: the backend's default for the shape first, then the others."""
    chunk = 16384 if lanes == 1 else 2048
    out = {"sequential": {}, "chunked": {"chunk": chunk}, "blelloch": {"workgroup_size": 256}}
    default = get_backend("iree").default_schedule(lanes, L)
    return {default: out.pop(default), **out}


def bench_shape(lanes: int, L: int, repeats: int) -> dict:
    n = lanes * L
    bpe = bytes_per_element("float32")
    ops = operands(lanes, L)
    c_call, c_config = kernel_call(ops, "chunked")
    calls = {"roofline": roofline.bind(lanes, L, "float32"), "cpu": c_call}
    stages = {}
    for schedule, cfg in configs(lanes, L).items():
        calls[f"iree.{schedule}"], stages[schedule] = iree_call(ops, schedule, cfg)
    y_c = np.empty((lanes, L), np.float32)
    c_call()
    y_c[:] = c_call.keep[0]
    errors = {s: float(np.abs(np.asarray(calls[f"iree.{s}"]()[0]) - y_c).max()) for s in stages}
    med = interleaved_medians(calls, repeats)
    default = next(iter(stages))

    def row(seconds: float) -> dict:
        return {"ns_per_element": seconds / n * 1e9, "GB_per_s": bpe * n / seconds / 1e9,
                "roofline_fraction": med["roofline"] / seconds, "fraction_of_cpu": med["cpu"] / seconds}

    return {
        "lanes": lanes, "L": L,
        "roofline": row(med["roofline"]),
        "cpu": {**row(med["cpu"]), "config": c_config},
        "iree": {s: {**row(med[f"iree.{s}"]), "config": dict(stages[s].schedule.config),
                     "max_abs_diff_vs_cpu": errors[s]} for s in stages},
        "iree_default": default,
        "compile_seconds": compile_seconds(stages[default]),
    }


def table(results: list[dict]) -> str:
    lines = [f"{'shape':>12} {'kernel':>16} {'ns/el':>7} {'GB/s':>6} {'roof.frac':>9} {'of cpu':>7}"]
    for r in results:
        shape = f"{r['lanes']}x{r['L']}"
        rows = [("roofline", r["roofline"]), ("cpu (C)", r["cpu"])]
        rows += [(f"iree {s}", e) for s, e in r["iree"].items()]
        for name, e in rows:
            lines.append(f"{shape:>12} {name:>16} {e['ns_per_element']:7.3f} {e['GB_per_s']:6.1f} "
                         f"{e['roofline_fraction']:9.2f} {e['fraction_of_cpu']:7.2f}")
        lines.append(f"{shape:>12} iree default {r['iree_default']}: module compile {r['compile_seconds']:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per kernel (median reported)")
    p.add_argument("--shapes", default=",".join(f"{a}x{b}" for a, b in SHAPES), help="LANESxL,...")
    args = p.parse_args(argv)
    if not get_backend("iree", require_available=False).availability().ok:
        print(f"bench/mlir.py: {get_backend('iree', require_available=False).availability().reason}")
        return 1
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    results = [bench_shape(lanes, L, args.repeats) for lanes, L in shapes]
    report = {"device": f"{cpu_model()} ({cpu_threads()} threads)", "dtype": "float32", "shapes": results}
    print(json.dumps(report, indent=2) if args.json else f"{report['device']}\n{table(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
