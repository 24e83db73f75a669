"""Measure a GPU's default configurations per size class and write its device file.

For each size class (lanes, L), every configuration of ``gpu_check.SWEEP`` is
checked against a float64 reference on the device and timed with CUDA
events (median); the fastest goes into a device file in the format of
:mod:`scanweaver.tuning.devices`, which ``selective_scan`` uses on any GPU
whose name contains the file's ``match`` (the user's own tuning still wins).
The device's name is read from the driver (``nvidia-smi``, else CuPy); the
match and the file's name follow from it (:func:`match_of`: ``NVIDIA H200``
-> ``H200``, ``h200.json``), so the same call serves an H100, an H200 or
another NVIDIA part.  The file is written after every size class, so a
time limit keeps what was measured.

Usage (on the GPU; about a minute on an H200)::

    python bench/gpu_defaults.py --out-dir python/scanweaver/tuning/devices [--budget SECONDS]

``--dry-run`` measures the ``opencl`` backend (PoCL standing in for the GPU) on one tiny size class and two
configurations, timed with the host clock, into a file for that device: the flow, not the figures.

Exit codes: 0 written, 1 no configuration passed for some class, 3 no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gpu_check

#: (lanes, L) size classes: the latency case, many short lanes, many long lanes, few long lanes, one lane.
CLASSES = ((256, 1024), (12288, 4096), (12288, 65536), (16, 1 << 20), (1, 1 << 26))
#: The dry run's size class and configurations.
DRY_CLASSES = ((64, 300),)
DRY_SWEEP = {"hybrid": [{"workgroup_size": 64, "items_per_thread": 4, "lanes_per_group": 1}],
             "reduce_then_scan": [{"workgroup_size": 64, "items_per_thread": 4, "tiles_per_block": 2}]}


def driver_name() -> str | None:
    """The first GPU's name as the NVIDIA driver reports it (``nvidia-smi``), or ``None``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return lines[0] if lines else None


def match_of(name: str) -> str:
    """The part of a device name a device file matches: its first word with a digit, up to a dash
    (``NVIDIA H200`` -> ``H200``, ``NVIDIA H100 80GB HBM3`` -> ``H100``, ``NVIDIA A100-SXM4-80GB`` -> ``A100``);
    the whole name when no word has a digit."""
    for word in name.split():
        if re.search(r"\d", word):
            return word.split("-")[0]
    return name


def file_name(match: str) -> str:
    """The device file's name for ``match`` (``H200`` -> ``h200.json``)."""
    return re.sub(r"[^a-z0-9]+", "-", match.lower()).strip("-") + ".json"


def sweep(classes, sweep_configs, measure_class, measure, deadline, write) -> list:
    """The fastest checked configuration per size class; ``write(entries)`` after each class.

    ``measure_class(lanes, L) -> (state, roofline_ms)``; ``measure(state, schedule, cfg) -> ms or None`` (None:
    it did not pass its check).  Returns the classes no configuration passed.
    """
    entries, missing = [], []
    for lanes, L in classes:
        state, roof = measure_class(lanes, L)
        runs = []
        for schedule, cfgs in sweep_configs.items():
            if schedule == "blelloch" and lanes < 256:
                continue
            for cfg in cfgs:
                if time.time() > deadline:
                    break
                try:
                    ms = measure(state, schedule, cfg)
                except Exception as exc:  # a configuration that cannot run here is skipped, with the reason
                    print(f"  {lanes}x{L} {schedule} {cfg}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                if ms is not None:
                    runs.append((ms, schedule, cfg))
        del state
        if not runs:
            missing.append((lanes, L))
            continue
        ms, schedule, cfg = min(runs, key=lambda r: r[0])
        entries.append({"dtype": "float32", "lanes": lanes, "L": L, "schedule": schedule, "config": cfg,
                        "time_ms": ms, "roofline_fraction": roof / ms})
        print(f"  {lanes}x{L}: {schedule} {cfg} {ms:.4f} ms ({roof / ms:.2f} of the roofline)", file=sys.stderr)
        write(entries)
    return missing


def _cuda(scanweaver, deadline):
    """``(measure_class, measure)`` on the GPU: CuPy operands, CUDA-event times (``gpu_check``)."""
    import cupy as cp

    from scanweaver.runtime import get_backend

    be = get_backend("cuda")

    def measure_class(lanes, L):
        cp.get_default_memory_pool().free_all_blocks()
        ops = {k: v.reshape(lanes, L) for k, v in gpu_check.make_case(cp, (1, lanes, L)).items()}
        return (ops, gpu_check.reference(scanweaver, cp, ops)), gpu_check.roofline_ms(cp, ops, deadline)

    def measure(state, schedule, cfg):
        r = gpu_check.time_config(scanweaver, cp, be, *state, schedule, cfg, deadline)
        return r.get("kernel_ms")

    return measure_class, measure


def _dry(scanweaver):
    """``(measure_class, measure)`` of the dry run: the ``opencl`` backend on NumPy operands, the host clock."""
    rng = np.random.default_rng(11)

    def host_ms(fn, repeats=3):
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def measure_class(lanes, L):
        ops = {"a": rng.uniform(0.9, 0.999, (lanes, L)).astype(np.float32)}
        ops.update({n: rng.standard_normal((lanes, L)).astype(np.float32) for n in ("b", "x", "c")})
        ref = scanweaver.selective_scan(*(v.astype(np.float64) for v in ops.values()), backend="numpy",
                                        schedule="sequential")
        return (ops, ref), host_ms(lambda: ops["a"] * ops["b"] + ops["x"] * ops["c"])

    def measure(state, schedule, cfg):
        ops, ref = state
        run = lambda: scanweaver.selective_scan(*ops.values(), backend="opencl", schedule=schedule,  # noqa: E731
                                                config=cfg)
        err = float(np.abs(run() - ref).max() / np.abs(ref).max())
        return host_ms(run) if err <= gpu_check.TOLERANCE else None

    return measure_class, measure


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", type=Path, help="write <device>.json here (e.g. python/scanweaver/tuning/devices)")
    ap.add_argument("--out", type=Path, default=None, help="the file itself (overrides --out-dir)")
    ap.add_argument("--match", default=None, help="device-name substring the file applies to (default: from the name)")
    ap.add_argument("--budget", type=float, default=240.0)
    ap.add_argument("--dry-run", action="store_true", help="the opencl backend (PoCL) on one tiny size class")
    args = ap.parse_args(argv)
    if args.out is None and args.out_dir is None:
        ap.error("give --out-dir or --out")
    os.environ["SCANWEAVER_CACHE_DIR"] = tempfile.mkdtemp(prefix="sw-gpu-defaults-")
    backend = "opencl" if args.dry_run else "cuda"
    try:
        import scanweaver
        from scanweaver.runtime import REGISTRY

        if not args.dry_run:
            import cupy  # noqa: F401
    except ImportError as exc:
        print(f"gpu_defaults: NO GPU RUN: {exc}", file=sys.stderr)
        return 3
    avail = REGISTRY[backend].availability()
    if not avail.ok:
        print(f"gpu_defaults: NO GPU RUN: {avail.reason}", file=sys.stderr)
        return 3
    name = (None if args.dry_run else driver_name()) or avail.device.split(" (")[0]
    match = args.match or match_of(name)
    out = args.out or args.out_dir / file_name(match)
    deadline = time.time() + args.budget
    measure_class, measure = _dry(scanweaver) if args.dry_run else _cuda(scanweaver, deadline)

    def write(entries):
        doc = {"format": "scanweaver-device-configs", "version": 1, "backend": backend, "device": name,
               "match": match, "produced_by": "python bench/gpu_defaults.py" + (" --dry-run" if args.dry_run else ""),
               "measured": f"{time.strftime('%Y-%m-%d')}, scanweaver {scanweaver.__version__}, {platform.node()}",
               "entries": entries}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")

    print(f"gpu_defaults: {name} (match {match!r}) -> {out}", file=sys.stderr)
    missing = sweep(DRY_CLASSES if args.dry_run else CLASSES, DRY_SWEEP if args.dry_run else gpu_check.SWEEP,
                    measure_class, measure, deadline, write)
    print(f"wrote {out}; size classes without a passing configuration: {missing or 'none'}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
