"""GPU check of the ``cuda`` backend: correctness of every schedule, then the default path against the roofline.

1. Correctness: every GPU schedule against the float64 host oracle on several
   shapes (L = 1, odd, past one tile, many tiles) with h0, resets, reverse and
   return_state, in float32 and float64.
2. Speed, float32, y = c*h, h = a*h + b*x, on (B, D, L) = (8, 1536, 4096),
   (8, 1536, 65536), the latency case (1, 256, 1024) and one sequence of
   2^26.  Inputs are generated on the device (CuPy).  For each case:

   * the roofline: ``y = a*b + x*c`` (an elementwise CuPy kernel with the scan's
     own traffic, 4 reads and 1 write): CUDA events around its launch, median
     of repeats after a warm-up;
   * the default path: the public ``selective_scan(a, b, x, c)`` on CuPy arrays
     with no tuning store (``SCANWEAVER_CACHE_DIR`` points at an empty
     directory), as device time (``kernel_ms``: the backend's own CUDA events
     right around its kernel launches, median, so host-side preparation of the
     call is not counted), as events around the whole call (``call_event_ms``), as back-to-back calls
     (N calls, one synchronisation, per call) and as one call's wall time
     (call plus synchronisation, median);
   * a sweep of configurations of each schedule, every one checked against a
     float64 reference before it is timed (the plain ``sequential`` kernel in
     float64 on the device, ``reduce_then_scan`` for one long lane, both checked
     against the host oracle in part 1);
     the best is reported beside the default.

   Fractions are roofline time / scan time.  Targets (issue 15, H200): the
   default path at >= 0.85 of the roofline on the two large cases, >= 0.7 on
   2^26, and the public call on (1, 256, 1024) within 0.03 ms wall.

Usage::

    python bench/gpu_check.py [--json] [--budget SECONDS] [--out FILE] [--allow-no-gpu]

Exit codes: 0 ran and every check passed; 1 a correctness check failed (or a
timed configuration was wrong); 2 bad arguments; 3 no GPU here (0 with
``--allow-no-gpu``, for CI).  Every case is guarded: a failure is recorded and
the run goes on; a global time budget skips what would not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback

import numpy as np

ELEMENT_BYTES = 5 * 4  # a, b, x, c read and y written, float32
SPEED_CASES = [("latency_L1024", (1, 256, 1024)), ("large_L4096", (8, 1536, 4096)),
               ("large_L65536", (8, 1536, 65536)), ("single_L2^26", (1, 1, 2**26))]
CHECK_SHAPES = [(1, 1, 1), (3, 37, 1000), (1, 2, 4097), (2, 3, 70001)]
TARGETS = {"large_L4096": 0.85, "large_L65536": 0.85, "single_L2^26": 0.7}
LATENCY_TARGET_MS = 0.03
SWEEP = {
    "hybrid": [{"workgroup_size": w, "items_per_thread": i, "lanes_per_group": 1}
               for w, i in ((128, 4), (256, 4), (256, 8), (512, 4), (256, 16), (128, 16))],
    "reduce_then_scan": [{"workgroup_size": w, "items_per_thread": i, "tiles_per_block": t}
                         for w, i, t in ((256, 4, 4), (256, 8, 4), (512, 4, 8), (256, 16, 2))],
    "lookback": [{"workgroup_size": w, "items_per_thread": i} for w, i in ((256, 8), (256, 16), (512, 8), (128, 16))],
    "blelloch": [{"workgroup_size": 256}, {"workgroup_size": 512}],
}
TOLERANCE = 2e-3


def log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, flush=True)


def median_ms(cp, fn, repeats: int = 20, deadline: float = float("inf")) -> float:
    """Median CUDA-event time of ``fn()`` in ms (one warm-up call excluded)."""
    fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
        if time.time() > deadline and len(times) >= 3:
            break
    return statistics.median(times)


def device_ms(be, fn, repeats: int = 20, deadline: float = float("inf")) -> float:
    """Median device time in ms of the kernels ``fn()`` launches, as the backend records it with ``be.timing``
    set (CUDA events right around its launches): host-side preparation of the call is not in it."""
    be.timing = True
    try:
        fn()
        times = []
        for _ in range(repeats):
            be.last_ms = float("nan")
            fn()
            if not np.isfinite(be.last_ms):
                raise RuntimeError("the cuda backend recorded no kernel time for this call")
            times.append(be.last_ms)
            if time.time() > deadline and len(times) >= 3:
                break
    finally:
        be.timing = False
    return statistics.median(times)


def check_correctness(scanweaver, schedules, quiet: bool) -> list[dict]:
    rng = np.random.default_rng(7)
    rows = []
    for dtype in (np.float32, np.float64):
        for schedule in schedules:
            for shape in CHECK_SHAPES:
                for reverse in (False, True):
                    row = {"schedule": schedule, "shape": list(shape), "dtype": np.dtype(dtype).name,
                           "reverse": reverse}
                    try:
                        a = rng.uniform(0.5, 1.0, shape).astype(dtype)
                        b, x, c = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
                        h0 = rng.standard_normal(shape[:-1]).astype(dtype)
                        reset = rng.random(shape) < 0.01
                        y, hl = scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=reverse,
                                                          return_state=True, backend="cuda", schedule=schedule)
                        ey, eh = scanweaver.selective_scan(*(v.astype(np.float64) for v in (a, b, x, c)), h0=h0,
                                                           reset=reset, reverse=reverse, return_state=True,
                                                           backend="numpy", schedule="sequential")
                        scale = max(1.0, float(np.abs(ey).max()))
                        err = max(float(np.abs(y - ey).max()), float(np.abs(hl - eh).max())) / scale
                        tol = TOLERANCE if dtype == np.float32 else 1e-9
                        row.update(max_rel_error=err, ok=bool(err < tol))
                    except Exception as exc:
                        row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
                    rows.append(row)
                    if not row["ok"] or not quiet:
                        log(f"  check {row['dtype']} {schedule:17s} {str(shape):18s} reverse={reverse!s:5s} "
                            f"{'ok' if row['ok'] else 'FAIL'} {row.get('max_rel_error', row.get('error', ''))}",
                            quiet and row["ok"])
    return rows


def make_case(cp, shape):
    B, D, L = shape
    cp.random.seed(11)
    ops = {"a": cp.random.uniform(0.9, 0.999, (B, D, L), dtype=cp.float32)}
    for n in ("b", "x", "c"):
        ops[n] = cp.random.standard_normal((B, D, L), dtype=cp.float32)
    return ops


def reference(scanweaver, cp, ops):
    """float64 y on the device, from a schedule checked against the host oracle in part 1: the plain
    ``sequential`` kernel for many lanes, ``reduce_then_scan`` for few long ones (one thread per lane would
    take tens of seconds on 2^26 dependent steps)."""
    o64 = {k: v.astype(cp.float64) for k, v in ops.items()}
    lanes = ops["a"].size // ops["a"].shape[-1]
    y = scanweaver.selective_scan(**o64, schedule="sequential" if lanes >= 256 else "reduce_then_scan",
                                  config="default")
    del o64
    return y


def rel_error(cp, y, ref) -> float:
    L = ref.shape[-1]
    d = cp.abs(y.reshape(-1, L).astype(cp.float64) - ref.reshape(-1, L)).max(axis=1)
    scale = cp.maximum(cp.abs(ref.reshape(-1, L)).max(axis=1), 1e-300)
    err = float((d / scale).max())
    return err if np.isfinite(err) else float("inf")


def time_default(scanweaver, cp, be, ops, ref, deadline) -> dict:
    """The public call as users make it: device time, back-to-back per call, one call's wall time."""
    call = lambda: scanweaver.selective_scan(ops["a"], ops["b"], ops["x"], ops["c"])  # noqa: E731
    y = call()
    cp.cuda.get_current_stream().synchronize()
    info = scanweaver.api.SELECTIVE.last
    row = {"schedule": info.schedule, "config": dict(info.config), "config_source": info.source,
           "max_rel_error": rel_error(cp, y, ref)}
    row["ok"] = row["max_rel_error"] <= TOLERANCE
    del y
    row["kernel_ms"] = device_ms(be, call, deadline=deadline)
    row["call_event_ms"] = median_ms(cp, call, deadline=deadline)  # events around the whole Python call
    n = 50
    call()
    cp.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    cp.cuda.get_current_stream().synchronize()
    row["back_to_back_ms"] = (time.perf_counter() - t0) * 1e3 / n
    walls = []
    for _ in range(30):
        t0 = time.perf_counter()
        call()
        cp.cuda.get_current_stream().synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    row["wall_ms"] = statistics.median(walls)
    return row


def time_config(scanweaver, cp, be, ops, ref, schedule, cfg, deadline) -> dict:
    """One configuration: checked against the float64 reference first, then device time (events, median)."""
    row = {"schedule": schedule, "config": cfg}
    run = lambda: scanweaver.selective_scan(ops["a"], ops["b"], ops["x"], ops["c"], schedule=schedule,  # noqa: E731
                                            config=cfg)
    y = run()
    row["max_rel_error"] = rel_error(cp, y, ref)
    row["ok"] = row["max_rel_error"] <= TOLERANCE
    del y
    if not row["ok"]:
        return row
    row["kernel_ms"] = device_ms(be, run, deadline=deadline)
    return row


def roofline_ms(cp, ops, deadline) -> float:
    y = cp.empty_like(ops["a"])
    k = cp.ElementwiseKernel("T a, T b, T x, T c", "T y", "y = a * b + x * c", "sw_roofline")
    return median_ms(cp, lambda: k(ops["a"], ops["b"], ops["x"], ops["c"], y), deadline=deadline)


def run_case(scanweaver, cp, be, name, shape, deadline, quiet) -> dict:
    lanes = shape[0] * shape[1]
    case = {"case": name, "shape": list(shape), "runs": [], "failures": []}
    ops = make_case(cp, shape)
    ref = reference(scanweaver, cp, ops)
    roof = roofline_ms(cp, ops, deadline)
    case["roofline_ms"] = roof
    case["roofline_GBps"] = lanes * shape[2] * ELEMENT_BYTES / (roof * 1e-3) / 1e9
    try:
        case["default"] = d = time_default(scanweaver, cp, be, ops, ref, deadline)
        d["fraction_of_roofline"] = roof / d["kernel_ms"]
    except Exception as exc:
        case["failures"].append({"default": True, "error": f"{type(exc).__name__}: {exc}",
                                 "trace": traceback.format_exc(limit=3)})
    for schedule, cfgs in SWEEP.items():
        if schedule == "blelloch" and lanes < 256:
            continue
        for cfg in cfgs:
            if time.time() > deadline:
                case["failures"].append({"schedule": schedule, "config": cfg, "error": "time budget spent"})
                continue
            try:
                r = time_config(scanweaver, cp, be, ops, ref, schedule, cfg, deadline)
                if "kernel_ms" in r:
                    r["fraction_of_roofline"] = roof / r["kernel_ms"]
                case["runs"].append(r)
            except Exception as exc:
                case["failures"].append({"schedule": schedule, "config": cfg, "error": f"{type(exc).__name__}: {exc}"})
    timed = [r for r in case["runs"] if "kernel_ms" in r]
    if timed:
        case["best"] = min(timed, key=lambda r: r["kernel_ms"])
    target = TARGETS.get(name)
    d = case.get("default", {})
    if target is not None and "fraction_of_roofline" in d:
        case["target"] = {"fraction_of_roofline": target, "met": d["fraction_of_roofline"] >= target}
    if name == "latency_L1024" and "wall_ms" in d:
        case["target"] = {"wall_ms": LATENCY_TARGET_MS, "met": d["wall_ms"] <= LATENCY_TARGET_MS}
    del ops, ref
    cp.get_default_memory_pool().free_all_blocks()
    best = case.get("best", {})
    log(f"  {name:14s} roofline {roof:.4f} ms | default {d.get('schedule')} {d.get('kernel_ms', float('nan')):.4f} ms "
        f"({d.get('fraction_of_roofline', float('nan')):.2f}), b2b {d.get('back_to_back_ms', float('nan')):.4f}, "
        f"wall {d.get('wall_ms', float('nan')):.4f} | best {best.get('schedule')} {best.get('config')} "
        f"{best.get('kernel_ms', float('nan')):.4f} ms ({best.get('fraction_of_roofline', float('nan')):.2f})", quiet)
    return case


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON report")
    ap.add_argument("--out", default=None, help="also write the JSON report to this file")
    ap.add_argument("--budget", type=float, default=300.0, help="global time budget in seconds")
    ap.add_argument("--allow-no-gpu", action="store_true", help="exit 0 when no GPU is present (for CI)")
    args = ap.parse_args(argv)
    quiet = args.json
    t0 = time.time()
    deadline = t0 + args.budget
    os.environ["SCANWEAVER_CACHE_DIR"] = tempfile.mkdtemp(prefix="sw-gpu-check-")  # no tuning store: defaults
    report: dict = {"status": "ok", "checks": [], "cases": []}
    try:
        import cupy as cp
        import scanweaver
        from scanweaver.runtime import REGISTRY, get_backend

        avail = REGISTRY["cuda"].availability()
        reason = avail.reason
    except Exception as exc:  # no CuPy, or a broken install
        avail, reason = None, f"{type(exc).__name__}: {exc}"
    if avail is None or not avail.ok:
        report.update(status="no_gpu", reason=f"cuda backend unavailable: {reason}")
        print(json.dumps(report) if quiet else f"gpu_check: NO GPU RUN: {report['reason']}",
              file=sys.stdout if quiet else sys.stderr)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(json.dumps(report, indent=1) + "\n")
        return 0 if args.allow_no_gpu else 3
    be = get_backend("cuda")
    report["device"] = avail.device
    log(f"device: {avail.device}", quiet)

    def partial() -> None:  # what is done so far, so that a time limit keeps it
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(json.dumps({**report, "status": "partial"}, indent=1, default=str) + "\n")

    report["checks"] = check_correctness(scanweaver, list(be.schedules), quiet)
    partial()
    for name, shape in SPEED_CASES:
        try:
            report["cases"].append(run_case(scanweaver, cp, be, name, shape, deadline, quiet))
        except Exception as exc:
            report["cases"].append({"case": name, "shape": list(shape), "error": f"{type(exc).__name__}: {exc}",
                                    "trace": traceback.format_exc(limit=4)})
            cp.get_default_memory_pool().free_all_blocks()
        partial()
    report["elapsed_s"] = time.time() - t0
    checks_ok = all(r["ok"] for r in report["checks"])
    timed_ok = all(r["ok"] for c in report["cases"] for r in c.get("runs", []) + [c.get("default", {"ok": True})])
    report["status"] = "ok" if checks_ok and timed_ok else "correctness_failed"
    report["targets"] = {c["case"]: c["target"] for c in report["cases"] if "target" in c}
    text = json.dumps(report, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(json.dumps(report, default=str) if quiet else text)
    return 0 if report["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
