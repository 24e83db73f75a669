"""One-shot GPU check of the ``cuda`` backend: correctness of every schedule, then speed.

1. Correctness: every GPU schedule against a float64 oracle on several shapes
   (L = 1, odd, past one tile, many tiles) with h0, resets, reverse and
   return_state.
2. Speed: the float32 selective scan y = c*h, h = a*h + b*x for
   (B, D, L) = (8, 1536, 4096), (8, 1536, 65536), a latency case
   (1, 256, 1024) and one sequence of L = 2^26.  Inputs are generated on the
   device (CuPy random); times are CUDA events around the kernels, warm-up
   excluded, median of repeats.  Bandwidth counts 4 reads and 1 write of
   float32 per element and is compared with the device's own measured
   device-to-device copy bandwidth (read + write).  A few configurations of
   each multi-element schedule are timed and the best is reported.

Targets on an H200: >= 0.8 of copy bandwidth on the large cases, < 0.016 ms
per call for the L = 1024 latency case.

Usage::

    python bench/gpu_check.py [--json] [--budget SECONDS]

Exit codes: 0 ran (or no GPU here: the reason is printed), 1 a correctness
check failed, 2 bad arguments.  Every case is guarded: a failure is recorded
and the run goes on; a global time budget skips what would not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import numpy as np

ELEMENT_BYTES = 5 * 4  # a, b, x, c read and y written, float32
SPEED_CASES = [("large_L4096", (8, 1536, 4096)), ("large_L65536", (8, 1536, 65536)),
               ("latency_L1024", (1, 256, 1024)), ("single_L2^26", (1, 1, 2**26))]
CHECK_SHAPES = [(1, 1, 1), (3, 37, 1000), (1, 2, 4097), (2, 3, 70001)]
TUNINGS = {
    "hybrid": [{}, {"workgroup_size": 256, "items_per_thread": 16, "lanes_per_group": 1},
               {"workgroup_size": 128, "items_per_thread": 16, "lanes_per_group": 1},
               {"workgroup_size": 512, "items_per_thread": 8, "lanes_per_group": 1},
               {"workgroup_size": 256, "items_per_thread": 4, "lanes_per_group": 1}],
    "lookback": [{}, {"workgroup_size": 512, "items_per_thread": 16}, {"workgroup_size": 256, "items_per_thread": 32},
                 {"workgroup_size": 128, "items_per_thread": 32}],
    "reduce_then_scan": [{}, {"workgroup_size": 512, "items_per_thread": 16, "tiles_per_block": 8}],
    "blelloch": [{}],
}


def log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, flush=True)


def copy_bandwidth(cp, nbytes: int = 2**30) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), best of 10."""
    src = cp.random.random(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for i in range(12):
        start.record()
        cp.copyto(dst, src)
        end.record()
        end.synchronize()
        if i >= 2:
            best = min(best, cp.cuda.get_elapsed_time(start, end))
    del src, dst
    return 2 * nbytes / (best * 1e-3) / 1e9


def check_correctness(scanweaver, schedules, quiet: bool) -> list[dict]:
    rng = np.random.default_rng(7)
    rows = []
    for schedule in schedules:
        for shape in CHECK_SHAPES:
            for reverse in (False, True):
                row = {"schedule": schedule, "shape": list(shape), "reverse": reverse}
                try:
                    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
                    b, x, c = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
                    h0 = rng.standard_normal(shape[:-1]).astype(np.float32)
                    reset = rng.random(shape) < 0.01
                    y, hl = scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=reverse,
                                                      return_state=True, backend="cuda", schedule=schedule)
                    ey, eh = scanweaver.selective_scan(*(v.astype(np.float64) for v in (a, b, x, c)), h0=h0,
                                                       reset=reset, reverse=reverse, return_state=True,
                                                       backend="numpy", schedule="sequential")
                    scale = max(1.0, float(np.abs(ey).max()))
                    err = max(float(np.abs(y - ey).max()), float(np.abs(hl - eh).max())) / scale
                    row.update(max_rel_error=err, ok=bool(err < 1e-3))
                except Exception as exc:
                    row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                rows.append(row)
                log(f"  check {schedule:17s} {str(shape):18s} reverse={reverse!s:5s} "
                    f"{'ok' if row['ok'] else 'FAIL'} {row.get('max_rel_error', row.get('error', ''))}", quiet)
    return rows


def time_case(scanweaver, cp, be, shape, schedule, cfg, deadline) -> dict:
    from scanweaver.runtime.base import ScanArrays

    B, D, L = shape
    lanes = B * D
    stages = scanweaver.api.SELECTIVE.lower(backend="cuda", schedule=schedule, lanes=lanes, L=L, **cfg)
    ops = {"a": cp.random.uniform(0.5, 1.0, (lanes, L), dtype=cp.float32)}
    for n in ("b", "x", "c"):
        ops[n] = cp.random.standard_normal((lanes, L), dtype=cp.float32)
    arrays = ScanArrays(inputs=ops, h0=None, reset=None, batch_shape=(B, D), dtype=np.dtype(np.float32))
    be.run(stages, arrays)  # compile + warm-up
    times, walls = [], []
    t_end = time.time() + 1.0
    while len(times) < 5 or (len(times) < 50 and time.time() < t_end):
        if time.time() > deadline:
            break
        w0 = time.perf_counter()
        be.run(stages, arrays)
        walls.append((time.perf_counter() - w0) * 1e3)
        times.append(be.last_ms)
    ms = float(np.median(times))
    del ops, arrays
    cp.get_default_memory_pool().free_all_blocks()
    return {"schedule": schedule, "config": stages.schedule.config, "ms": ms, "wall_ms": float(np.median(walls)),
            "GBps": lanes * L * ELEMENT_BYTES / (ms * 1e-3) / 1e9, "repeats": len(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON report")
    ap.add_argument("--budget", type=float, default=420.0, help="global time budget in seconds")
    args = ap.parse_args(argv)
    quiet = args.json
    t0 = time.time()
    deadline = t0 + args.budget
    report = {"status": "ok", "checks": [], "cases": []}
    try:
        import cupy as cp
        import scanweaver
        from scanweaver.runtime import REGISTRY, get_backend

        avail = REGISTRY["cuda"].availability()
    except Exception as exc:  # no CuPy, or a broken install
        avail, cp = None, None
        reason = f"{type(exc).__name__}: {exc}"
    else:
        reason = avail.reason
    if avail is None or not avail.ok:
        report.update(status="unavailable", reason=f"cuda backend unavailable: {reason}")
        print(json.dumps(report) if quiet else f"gpu_check: no GPU run: {report['reason']}")
        return 0
    be = get_backend("cuda")
    report["device"] = avail.device
    log(f"device: {avail.device}", quiet)
    report["checks"] = check_correctness(scanweaver, list(be.schedules), quiet)
    try:
        report["copy_GBps"] = copy_bandwidth(cp)
    except Exception as exc:
        report["copy_GBps"] = None
        report["copy_error"] = f"{type(exc).__name__}: {exc}"
    log(f"copy bandwidth: {report['copy_GBps']} GB/s", quiet)
    for name, shape in SPEED_CASES:
        lanes, L = shape[0] * shape[1], shape[2]
        default = be.default_schedule(lanes, L)
        order = [default] + [s for s in TUNINGS if s != default]
        if lanes < 256:
            order = [s for s in order if s != "blelloch"]
        case = {"case": name, "shape": list(shape), "default_schedule": default, "runs": [], "failures": []}
        for schedule in order:
            for cfg in TUNINGS[schedule]:
                if time.time() > deadline:
                    case["failures"].append({"schedule": schedule, "config": cfg, "error": "time budget spent"})
                    continue
                try:
                    case["runs"].append(time_case(scanweaver, cp, be, shape, schedule, cfg, deadline))
                except Exception as exc:
                    case["failures"].append({"schedule": schedule, "config": cfg,
                                             "error": f"{type(exc).__name__}: {exc}",
                                             "trace": traceback.format_exc(limit=3)})
                    cp.get_default_memory_pool().free_all_blocks()
        if case["runs"]:
            best = min(case["runs"], key=lambda r: r["ms"])
            case["best"] = best
            if report.get("copy_GBps"):
                case["fraction_of_copy"] = best["GBps"] / report["copy_GBps"]
        report["cases"].append(case)
        best = case.get("best")
        timing = "failed" if best is None else \
            f"{best['schedule']:17s} {best['ms']:10.4f} ms {best['GBps']:8.1f} GB/s"
        log(f"  {name:14s} {timing} {case.get('fraction_of_copy', float('nan')):6.3f} of copy", quiet)
    report["elapsed_s"] = time.time() - t0
    ok = all(r["ok"] for r in report["checks"])
    report["status"] = "ok" if ok else "correctness_failed"
    if quiet:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
