"""The juliacall overhead per call of ``selective_scan(..., backend="julia")`` at (1, 16, 1024) float32.

    PYTHON_JULIACALL_EXE=... PYTHON_JULIACALL_PROJECT=... python bench/julia_overhead.py [--json]

Times, round-robin after warm-up calls, the public Python call on the julia backend (``device="cpu"``)
and the same scan timed inside Julia (``selective_scan!`` on Julia arrays of the same size, default
schedule), so only the juliacall crossing and the façade's Python work differ; the overhead is their
difference.
Target: under 50 us per call. Needs Julia with ScanWeaver (see the README's Julia section).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import scanweaver
    from scanweaver.julia import session

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
    public, julia_us = [], []
    for _ in range(args.rounds):
        t = time.perf_counter()
        scanweaver.selective_scan(a, b, x, c, backend="julia", device="cpu")
        public.append((time.perf_counter() - t) * 1e6)
        julia_us.append(float(inner(1)))
    pub, ker = float(np.median(public)), float(np.median(julia_us))
    result = {"shape": [1, 16, 1024], "public_us": pub, "in_julia_us": ker, "overhead_us": pub - ker,
              "target_us": 50}
    print(json.dumps(result) if args.json else
          f"(1, 16, 1024) float32: public call {pub:.1f} us, the same scan inside Julia {ker:.1f} us, "
          f"juliacall + façade overhead {pub - ker:.1f} us per call (target < 50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
