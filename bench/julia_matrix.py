"""The matrix-state forward and backward and the delta-rule forward of ScanWeaver.jl against the C backend.

    PYTHON_JULIACALL_EXE=... PYTHON_JULIACALL_PROJECT=... python bench/julia_matrix.py [--json] [--rounds N]

At (batch, T, H, K, V) = (1, 1024, 8, 64, 64), float32, simple-GLA decay (one log decay per head and step):
``scanweaver.linear_attention(..., backend="julia")`` and ``backend="cpu"`` timed alternately in the same
rounds after warm-up calls (so both see the same load), then the backward of the fused operation
(``scanweaver.ops.matrix_state.kernels.backward``, every gradient) the same way, then the Gated DeltaNet forward
(``scanweaver.gated_delta_rule`` with in-kernel L2 normalisation, one beta per head and step) at the same
shape. Reports min/median/max of each and of the per-round ratio julia / cpu. Target: the Julia matrix-state
forward within 2x of the C backend's.
``--json`` writes bench/results/julia_matrix.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "results" / "julia_matrix.json"


def spread(values) -> dict:
    return {"min": float(np.min(values)), "median": float(np.median(values)), "max": float(np.max(values))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shape", default="1,1024,8,64,64", help="batch,T,H,K,V")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import scanweaver
    from scanweaver.julia import session
    from scanweaver.ops.matrix_state import kernels
    from scanweaver.ops.matrix_state.operands import operands
    from scanweaver.runtime import REGISTRY

    ok, why = session.probe()
    if not ok or not REGISTRY["cpu"].availability().ok:
        print(f"skipped: {why or 'the cpu backend is unavailable'}", file=sys.stderr)
        return 2
    B, T, H, K, V = (int(s) for s in args.shape.split(","))
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, (B, T, H)).astype(np.float32)
    do = rng.standard_normal((B, T, H, V)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (B, T, H)).astype(np.float32)
    ops = operands("bench", q, k, v, g, decay="scalar")
    results = {"shape": {"batch": B, "T": T, "H": H, "K": K, "V": V}, "dtype": "float32",
               "julia_threads": int(session.seval("Threads.nthreads()")), "rounds": args.rounds,
               "omp_threads": os.environ.get("OMP_NUM_THREADS", "")}
    parts = {
        "forward": lambda be: scanweaver.linear_attention(q, k, v, g_head=g, backend=be),
        "backward": lambda be: kernels.backward(ops, do, backend=be),
        "delta_rule_forward": lambda be: scanweaver.gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                                                     backend=be),
    }
    for part, run in parts.items():
        first = {be: run(be) for be in ("julia", "cpu")}  # warm-up: compiles and loads
        key = "dq" if part == "backward" else 0
        a, b = first["julia"][key], first["cpu"][key]
        err = float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(1.0, np.abs(np.asarray(b)).max()))
        times = {"julia": [], "cpu": []}
        for _ in range(args.rounds):
            for be in ("julia", "cpu"):
                t = time.perf_counter()
                run(be)
                times[be].append((time.perf_counter() - t) * 1e3)
        ratio = np.asarray(times["julia"]) / np.asarray(times["cpu"])
        results[part] = {"julia_ms": spread(times["julia"]), "cpu_ms": spread(times["cpu"]),
                         "julia_over_cpu": spread(ratio), "max_rel_difference": err}
        r = results[part]
        print(f"{part}: julia {r['julia_ms']['median']:.2f} ms ({r['julia_ms']['min']:.2f}-{r['julia_ms']['max']:.2f}),"
              f" cpu (C) {r['cpu_ms']['median']:.2f} ms ({r['cpu_ms']['min']:.2f}-{r['cpu_ms']['max']:.2f}); "
              f"julia / cpu {r['julia_over_cpu']['median']:.2f} ({r['julia_over_cpu']['min']:.2f}-"
              f"{r['julia_over_cpu']['max']:.2f}); max relative difference {err:.2g}"
              + ("  (target <= 2)" if part == "forward" else ""), flush=True)
    if args.json:
        OUT.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
