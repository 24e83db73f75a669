"""Measure a GPU's default configurations per size class and write its device file.

For each size class (lanes, L) and dtype, every configuration of
``gpu_check.SWEEP`` is checked against a float64 reference on the device and
timed with CUDA events (median); the fastest goes into a device file in the
format of :mod:`scanweaver.tuning.devices`, which ``selective_scan`` uses on
any GPU whose name contains ``--match`` (the user's own tuning still wins).

Usage (on the GPU; about two minutes on an H200)::

    python bench/gpu_defaults.py --out python/scanweaver/tuning/devices/h200.json --match H200

Exit codes: 0 written, 1 no configuration passed for some class, 3 no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import gpu_check

#: (lanes, L) size classes: the latency case, many short lanes, many long lanes, few long lanes, one lane.
CLASSES = ((256, 1024), (12288, 4096), (12288, 65536), (16, 1 << 20), (1, 1 << 26))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--match", default=None, help="device-name substring the file applies to (default: the name)")
    ap.add_argument("--budget", type=float, default=240.0)
    args = ap.parse_args(argv)
    os.environ["SCANWEAVER_CACHE_DIR"] = tempfile.mkdtemp(prefix="sw-gpu-defaults-")
    try:
        import cupy as cp
        import scanweaver
        from scanweaver.runtime import REGISTRY, get_backend
    except ImportError as exc:
        print(f"gpu_defaults: NO GPU RUN: {exc}", file=sys.stderr)
        return 3
    avail = REGISTRY["cuda"].availability()
    if not avail.ok:
        print(f"gpu_defaults: NO GPU RUN: {avail.reason}", file=sys.stderr)
        return 3
    be = get_backend("cuda")
    name = avail.device.split(" (")[0]
    deadline = time.time() + args.budget
    entries, missing = [], []
    for lanes, L in CLASSES:
        ops = {k: v.reshape(lanes, L) for k, v in gpu_check.make_case(cp, (1, lanes, L)).items()}
        ref = gpu_check.reference(scanweaver, cp, ops)
        roof = gpu_check.roofline_ms(cp, ops, deadline)
        runs = []
        for schedule, cfgs in gpu_check.SWEEP.items():
            if schedule == "blelloch" and lanes < 256:
                continue
            for cfg in cfgs:
                if time.time() > deadline:
                    break
                try:
                    r = gpu_check.time_config(scanweaver, cp, be, ops, ref, schedule, cfg, deadline)
                except Exception as exc:  # a configuration that cannot run here is skipped, with the reason
                    print(f"  {lanes}x{L} {schedule} {cfg}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                if "kernel_ms" in r:
                    runs.append(r)
        del ops, ref
        cp.get_default_memory_pool().free_all_blocks()
        if not runs:
            missing.append((lanes, L))
            continue
        best = min(runs, key=lambda r: r["kernel_ms"])
        entries.append({"dtype": "float32", "lanes": lanes, "L": L, "schedule": best["schedule"],
                        "config": best["config"], "time_ms": best["kernel_ms"], "roofline_fraction": roof / best[
                            "kernel_ms"]})
        print(f"  {lanes}x{L}: {best['schedule']} {best['config']} {best['kernel_ms']:.4f} ms "
              f"({roof / best['kernel_ms']:.2f} of the roofline)", file=sys.stderr)
    doc = {"format": "scanweaver-device-configs", "version": 1, "backend": "cuda", "device": name,
           "match": args.match or name, "produced_by": "python bench/gpu_defaults.py",
           "measured": f"{time.strftime('%Y-%m-%d')}, scanweaver {scanweaver.__version__}, CuPy {cp.__version__}, "
                       f"{platform.node()}",
           "entries": entries}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} ({len(entries)} size classes)", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
