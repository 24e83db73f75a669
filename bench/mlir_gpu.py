"""The iree backend's cuda modules on a GPU: prepared where IREE's compiler is, run where the GPU is.

The GPU machine has no IREE compiler (and no package index), so the modules are compiled
beforehand and travel with the working tree, beside IREE's runtime (15 MB)::

    python bench/mlir_gpu.py --prepare .deps/iree          # here: cuda modules + manifest.json
    pip install --target .deps/site iree-base-runtime      # the runtime for the GPU machine's Python
    python bench/mlir_gpu.py --run .deps/iree [--json]     # there (bench/gpu_session.sh step 7)

``--run`` loads each module with ``iree.runtime`` on the ``cuda`` driver, uploads the operands
once, and times the module on device-resident arrays (wall time per call; IREE's synchronous
call waits for the GPU), checks ``y`` against the float64 NumPy oracle, and times the ``cuda``
(CuPy) backend and a device-to-device copy on the same data for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import scanweaver
from scanweaver.ir.stages import Features
from scanweaver.passes import lower

SHAPE = (8 * 1536, 4096)
MODULES = {"sequential": {}, "chunked": {"chunk": 256}}


def prepare(directory: Path) -> int:
    from scanweaver.runtime.iree_backend import compile_module
    from scanweaver.runtime.iree_devices import compile_flags
    from scanweaver.targets.mlir_target import MLIRRenderer

    directory.mkdir(parents=True, exist_ok=True)
    manifest = {"flags": list(compile_flags("cuda")), "modules": {}}
    for schedule, cfg in MODULES.items():
        stages = lower(scanweaver.api.SELECTIVE.scan_ir("float32", Features()), schedule, cfg, ())
        (directory / f"{schedule}.vmfb").write_bytes(compile_module(MLIRRenderer().render(stages), "cuda"))
        manifest["modules"][schedule] = cfg
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {', '.join(MODULES)} modules to {directory} ({' '.join(manifest['flags'])})")
    return 0


def _median(fn, repeats: int = 10) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(directory: Path, as_json: bool) -> int:
    import iree.runtime as rt

    manifest = json.loads((directory / "manifest.json").read_text())
    lanes, L = SHAPE
    rng = np.random.default_rng(0)
    ops = [rng.uniform(0.9, 1.0, SHAPE).astype(np.float32)] + [rng.standard_normal(SHAPE, np.float32)
                                                                for _ in range(3)]
    want = scanweaver.selective_scan(*(o[:64].astype(np.float64) for o in ops), backend="numpy")
    cfg = rt.Config("cuda")
    args = [rt.asdevicearray(cfg.device, o) for o in ops]
    nbytes = 5 * lanes * L * 4
    report = {"shape": SHAPE, "flags": manifest["flags"], "iree": {}}
    for schedule in manifest["modules"]:
        ctx = rt.SystemContext(config=cfg)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, (directory / f"{schedule}.vmfb").read_bytes()))
        fn = ctx.modules.module["sw_scan"]
        y = np.asarray(fn(*args)[0].to_host())
        seconds = _median(lambda fn=fn: fn(*args))
        report["iree"][schedule] = {"ms": seconds * 1e3, "GB_per_s": nbytes / seconds / 1e9,
                                    "max_rel_err": float(np.abs(y[:64] - want).max() / np.abs(want).max())}
    try:
        import cupy as cp

        dev = [cp.asarray(o) for o in ops]
        cuda = _median(lambda: (scanweaver.selective_scan(*dev, backend="cuda"), cp.cuda.Device().synchronize()))
        copy = _median(lambda: (cp.copyto(dev[1], dev[2]), cp.cuda.Device().synchronize()))
        report["cuda_backend"] = {"ms": cuda * 1e3, "GB_per_s": nbytes / cuda / 1e9}
        report["copy_GB_per_s"] = 2 * lanes * L * 4 / copy / 1e9
    except ImportError as exc:
        report["cuda_backend"] = f"not timed: {exc}"
    print(json.dumps(report, indent=1) if as_json else
          "\n".join([f"iree {s}: {r['ms']:.3f} ms, {r['GB_per_s']:.0f} GB/s, rel.err {r['max_rel_err']:.1e}"
                     for s, r in report["iree"].items()] + [f"cuda backend / copy: {report.get('cuda_backend')} "
                                                            f"/ {report.get('copy_GB_per_s')} GB/s"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prepare", type=Path, metavar="DIR", help="compile the cuda modules into DIR")
    mode.add_argument("--run", type=Path, metavar="DIR", help="run the modules of DIR on the cuda driver")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    return prepare(args.prepare) if args.prepare else run(args.run, args.json)


if __name__ == "__main__":
    sys.exit(main())
