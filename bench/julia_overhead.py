"""The juliacall overhead per call of ``selective_scan(..., backend="julia")`` at (1, 16, 1024) float32.

    PYTHON_JULIACALL_EXE=... PYTHON_JULIACALL_PROJECT=... python bench/julia_overhead.py [--json]

Times, round-robin after warm-up calls, the public Python call on the julia backend (``device="cpu"``)
and the same scan timed inside Julia (``selective_scan!`` on Julia arrays of the same size, default
schedule), so only the crossing into Julia and the façade's Python work differ; the overhead is their
difference (min/median/max over the rounds). It is split in two: the crossing (the plan's call into
Julia, a C call of ``ScanWeaver.host_scanner_entry``'s function, minus the scan inside Julia) and the
façade's Python work (the public call minus the plan's call), which every backend pays. For scale, the
``cpu`` backend's whole call at the same shape (its façade work plus a C scan) is timed in the same rounds.
Target: at most 8 us per call. Needs Julia with ScanWeaver (see the README's Julia section).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import scanweaver
    from scanweaver.julia import session
    from scanweaver.runtime import REGISTRY

    ok, why = session.probe()
    if not ok:
        print(f"skipped: {why}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 0.99, (1, 16, 1024)).astype(np.float32)
    b, x, c = (rng.standard_normal((1, 16, 1024)).astype(np.float32) for _ in range(3))
    want = scanweaver.selective_scan(a, b, x, c, backend="numpy")
    got = scanweaver.selective_scan(a, b, x, c, backend="julia", device="cpu")
    if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
        print("failed: the julia backend's result differs from numpy's", file=sys.stderr)
        return 1
    jl = session.main()
    inner = jl.seval("""let a = 0.5f0 .+ 0.49f0 .* rand(Float32, 1024, 16), y = similar(a),
            b = randn(Float32, 1024, 16), x = randn(Float32, 1024, 16), c = randn(Float32, 1024, 16)
        n -> begin
            t = time_ns()
            for _ in 1:n
                ScanWeaver.selective_scan!(y, a, b, x, c)
            end
            (time_ns() - t) / n / 1e3
        end
    end""")
    inner(10)
    from scanweaver.api import SELECTIVE

    plan = next(p for p in SELECTIVE._plans.values() if p.backend.name == "julia")
    if plan.invoke is None:
        print("failed: the julia plan has no fast invoker", file=sys.stderr)
        return 1
    y = np.empty_like(a)
    buffers = (*(m.reshape(16, 1024) for m in (a, b, x, c)), y.reshape(16, 1024), None, None, None)
    public, invoke, julia_us, cpu_us = [], [], [], []
    have_cpu = REGISTRY["cpu"].availability().ok
    for _ in range(args.rounds):
        t = time.perf_counter()
        scanweaver.selective_scan(a, b, x, c, backend="julia", device="cpu")
        public.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        plan.invoke(buffers, 16, 1024)
        invoke.append((time.perf_counter() - t) * 1e6)
        julia_us.append(float(inner(1)))
        if have_cpu:  # the C backend's whole call at the same shape: the facade's Python work plus a C scan
            t = time.perf_counter()
            scanweaver.selective_scan(a, b, x, c, backend="cpu")
            cpu_us.append((time.perf_counter() - t) * 1e6)

    def spread(v):
        return {"min": float(np.min(v)), "median": float(np.median(v)), "max": float(np.max(v))}

    def minus(p, q):  # medians and minima of two timings, each over the rounds (a round's own difference
        return {"min": float(np.min(p) - np.min(q)), "median": float(np.median(p) - np.median(q))}  # is noise)

    result = {"shape": [1, 16, 1024], "rounds": args.rounds, "public_us": spread(public),
              "plan_invoke_us": spread(invoke), "in_julia_us": spread(julia_us),
              "overhead_us": minus(public, julia_us), "crossing_us": minus(invoke, julia_us),
              "facade_us": minus(public, invoke), "target_us": 8}
    if cpu_us:
        result["cpu_backend_public_us"] = spread(cpu_us)

    def fig(key):
        return f"{result[key]['median']:.1f} (min {result[key]['min']:.1f})"

    print(json.dumps(result) if args.json else
          f"(1, 16, 1024) float32, medians over {args.rounds} rounds (min): public call {fig('public_us')} us, "
          f"its plan's call into Julia {fig('plan_invoke_us')}, the same scan inside Julia {fig('in_julia_us')}; "
          f"overhead (public - inside) {fig('overhead_us')} us a call (target <= 8) = the crossing (plan call - "
          f"inside) {fig('crossing_us')} + the facade's Python work (public - plan call) {fig('facade_us')}"
          + (f"; the cpu backend's whole call {fig('cpu_backend_public_us')}" if cpu_us else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
