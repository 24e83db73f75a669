"""The matrix-state scans' chunked form beside their recurrence on the GPU: correctness, then which is faster.

For GLA (per-key decay), simple GLA (per-head decay), Mamba-2 (one q/k group),
Gated DeltaNet and RWKV-7 (the delta rule: its chunked WY forward and backward),
through ``scanweaver.torch`` on float32 CUDA tensors: each algorithm
(``algorithm="recurrent"``, ``algorithm="chunked"``) is first checked, output
and every gradient, against the float64 host reference of
:mod:`scanweaver.benchmarks.model_refs` on a shape past several chunks (with
every copy of a CUDA tensor to the host refused); then forward and forward +
backward are timed (median of ``--repeats``, synchronised) on each timed shape,
for each algorithm and for the default (no ``algorithm`` given; the backward
is forward + backward less the forward).  ``recurrent / chunked`` per shape and
part is what the GPU's rule is set from (``MatrixState.chunked_from``);
``default_train_speedup`` checks it.  On the first timed shape of each model,
each kernel's device time in one forward and one backward of each algorithm
and of the default (``kernels``: name -> ms summed over its launches, from the
backend's ``kernel_log``) says where the device's time goes, and a
``torch.profiler`` trace of one forward and one training step of each
(``profile``: wall and device-busy milliseconds, the operations of most host
and most device time) says how much of a call's time is the host's.

``--dry-run`` runs the same flow on CPU tensors with ``backend="opencl"`` (PoCL
standing in for the GPU) on tiny shapes.

Usage::

    python bench/gpu_chunked.py [--out FILE] [--budget SECONDS] [--repeats N] [--dry-run]

Writes the rows (JSON) to ``--out`` after every one.  Exit codes: 0 every check passed; 1 one failed (or
raised); 3 no GPU (without ``--dry-run``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

from gpu_families import TOLERANCE, no_host_copies

#: Model -> (check shape, timed shapes, dry-run shape); GLA and Mamba-2 at the CPU benchmark's shapes.
SHAPES = {
    "gla": ((2, 200, 4, 64, 64), ((4, 2048, 16, 64, 64), (1, 8192, 8, 128, 128), (16, 512, 16, 64, 64)),
            (1, 19, 2, 5, 6)),
    "simple_gla": ((2, 200, 4, 64, 64), ((4, 2048, 16, 64, 64), (1, 8192, 8, 128, 128)), (1, 19, 2, 5, 6)),
    "mamba2": ((2, 200, 4, 64, 64), ((2, 2048, 24, 64, 128), (1, 8192, 24, 64, 128)), (1, 19, 2, 3, 5)),
    "gated_delta": ((2, 200, 4, 64, 64), ((4, 2048, 16, 128, 128), (1, 8192, 8, 128, 128)), (1, 19, 2, 5, 6)),
    "rwkv7": ((2, 200, 4, 64, 64), ((4, 2048, 16, 64, 64), (1, 8192, 8, 128, 128)), (1, 19, 2, 5, 6)),
}
ALGORITHMS = ("recurrent", "chunked")
#: What each timed shape runs: both algorithms, then the default (the rule of ``MatrixState.chunked_from``).
TIMED = (*ALGORITHMS, "default")


def entry(model: str, backend: str, algorithm: str):
    """``call(inputs) -> y`` of ours for ``model`` with ``algorithm`` (``default``: none given)."""
    import scanweaver.torch as swt

    kw = {"backend": backend, **({} if algorithm == "default" else {"algorithm": algorithm})}
    if model == "gla":
        return lambda i: swt.linear_attention(i["q"], i["k"], i["v"], g=i["g"], **kw)[0]
    if model == "simple_gla":
        return lambda i: swt.linear_attention(i["q"], i["k"], i["v"], g_head=i["g"], **kw)[0]
    if model == "gated_delta":
        return lambda i: swt.gated_delta_rule(i["q"], i["k"], i["v"], i["g"], i["beta"], **kw)[0]
    if model == "rwkv7":
        return lambda i: swt.rwkv7(i["r"], i["w"], i["k"], i["v"], i["a"], i["b"], **kw)[0]
    return lambda i: swt.mamba2_scan(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                                     dt_softplus=True, **kw)


def time_ms(fn, repeats: int, sync) -> float:
    """Median milliseconds of ``fn()`` after one warm-up, ``sync()`` after each."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timings(call, ins: dict, repeats: int, sync) -> tuple[float, float]:
    """Median milliseconds of the forward and of forward + backward (every input's gradient)."""
    import torch

    w = torch.randn_like(call(ins))
    return (time_ms(lambda: call(ins), repeats, sync),
            time_ms(lambda: torch.autograd.grad(call(ins), list(ins.values()), w, allow_unused=True), repeats, sync))


def kernel_times(be, call, ins: dict, sync) -> dict[str, dict[str, float]]:
    """Each kernel's device ms (summed over its launches) in one forward and in one backward of ``call``."""
    import torch

    out = {}
    try:
        be.kernel_log = []
        y = call(ins)
        sync()
        out["forward"], be.kernel_log = be.kernel_log, []
        torch.autograd.grad(y, list(ins.values()), torch.ones_like(y), allow_unused=True)
        sync()
        out["backward"] = be.kernel_log
    finally:
        be.kernel_log = None
    summed: dict[str, dict[str, float]] = {}
    for part, log in out.items():
        for name, ms in log:
            summed.setdefault(part, {})[name] = summed.get(part, {}).get(name, 0.0) + ms
    return summed


def profile(call, ins: dict, sync, rows: int = 12) -> dict:
    """Where one forward and one forward + backward of ``call`` spend their time, by ``torch.profiler``: wall
    milliseconds of each (synchronised, with the profiler on), the device's busy milliseconds (every kernel and
    copy, ScanWeaver's and PyTorch's), and the ``rows`` operations of most host time and of most device time."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    w = torch.randn_like(call(ins))
    parts = {"forward": lambda: call(ins),
             "train": lambda: torch.autograd.grad(call(ins), list(ins.values()), w, allow_unused=True)}
    out = {}
    for part, fn in parts.items():
        fn()
        sync()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            sync()
            wall = (time.perf_counter() - t0) * 1e3
        events = prof.key_averages()
        device = [e for e in events if getattr(e, "self_device_time_total", 0) > 0]
        out[part] = {
            "wall_ms": wall,
            "device_busy_ms": sum(e.self_device_time_total for e in device) / 1e3,
            "host": [(e.key, e.count, round(e.cpu_time_total / 1e3, 4), round(e.self_cpu_time_total / 1e3, 4))
                     for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:rows]],
            "device": [(e.key, e.count, round(e.self_device_time_total / 1e3, 4))
                       for e in sorted(device, key=lambda e: -e.self_device_time_total)[:rows]]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_chunked.json"))
    ap.add_argument("--budget", type=float, default=150.0, help="rows not started by then are skipped")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    import torch

    import scanweaver
    from scanweaver.benchmarks import model_refs, models
    from scanweaver.runtime import get_backend

    if not args.dry_run and models.cuda_reason() is not None:
        print(models.cuda_reason(), file=sys.stderr)
        return 3
    device, backend = ("cpu", "opencl") if args.dry_run else ("cuda", "cuda")
    sync = (lambda: None) if args.dry_run else torch.cuda.synchronize
    rows: list[dict] = []
    failed = False
    start = time.perf_counter()

    def write():
        args.out.write_text(json.dumps(rows, indent=1) + "\n")

    for model, (check_shape, timed, dry_shape) in SHAPES.items():
        for algorithm in ALGORITHMS:  # correctness first: a wrong algorithm is not timed
            row = {"model": model, "algorithm": algorithm, "kind": "check",
                   "shape": list(dry_shape if args.dry_run else check_shape)}
            try:
                with no_host_copies(not args.dry_run):
                    row["errors"] = models.check(entry(model, backend, algorithm), model, tuple(row["shape"]), device)
                    row["ran"] = scanweaver.matrix.last.algorithm  # the backward's
                    with torch.no_grad():
                        entry(model, backend, algorithm)(model_refs.inputs(model, tuple(row["shape"]), torch.float32,
                                                                           device))
                    row["ran_forward"] = scanweaver.matrix.last.algorithm
                bad = {k: v for k, v in row["errors"].items() if not v <= TOLERANCE}
                row["status"] = "failed" if bad or row["ran"] != algorithm or row["ran_forward"] != algorithm or \
                    len(row["errors"]) < 2 else "ok"
            except Exception as exc:  # reported as a failure, with where it came from
                row.update(status="failed", reason=f"{type(exc).__name__}: {exc}",
                           trace=traceback.format_exc(limit=4)[-1500:])
            failed |= row["status"] != "ok"
            rows.append(row)
            print(f"{model:10s} {algorithm:9s} check {row['shape']}: {row['status']} "
                  f"{max(row.get('errors', {'-': float('nan')}).values()):.2e} (ran {row.get('ran_forward')} forward, "
                  f"{row.get('ran')} backward)", flush=True)
            write()
        for shape in ((dry_shape,) if args.dry_run else timed):
            row = {"model": model, "kind": "time", "shape": list(shape), "status": "skipped"}
            rows.append(row)
            if time.perf_counter() - start > args.budget:
                row["reason"] = f"time budget: {args.budget:g} s spent before it started"
                write()
                continue
            try:
                ins = {k: v.requires_grad_(True) for k, v in
                       model_refs.inputs(model, tuple(shape), torch.float32, device).items()}
                for algorithm in TIMED:
                    row[f"{algorithm}_forward_ms"], row[f"{algorithm}_train_ms"] = timings(
                        entry(model, backend, algorithm), ins, args.repeats, sync)
                    row[f"{algorithm}_backward_ms"] = row[f"{algorithm}_train_ms"] - row[f"{algorithm}_forward_ms"]
                    row[f"{algorithm}_ran"] = scanweaver.matrix.last.algorithm  # the backward's
                row["forward_speedup"] = row["recurrent_forward_ms"] / row["chunked_forward_ms"]
                row["train_speedup"] = row["recurrent_train_ms"] / row["chunked_train_ms"]
                row["backward_speedup"] = row["recurrent_backward_ms"] / row["chunked_backward_ms"]
                row["default_train_speedup"] = row["recurrent_train_ms"] / row["default_train_ms"]
                if shape == (dry_shape if args.dry_run else timed[0]):
                    row["kernels"] = {alg: kernel_times(get_backend(backend), entry(model, backend, alg), ins, sync)
                                      for alg in TIMED}
                    if not args.dry_run:
                        row["profile"] = {alg: profile(entry(model, backend, alg), ins, sync) for alg in TIMED}
                row["status"] = "ok"
            except Exception as exc:  # a shape that does not run is reported, not hidden
                row.update(status="error", reason=f"{type(exc).__name__}: {exc}")
                failed = True
            figures = ", ".join(f"{k} {v:.3g}" for k, v in row.items() if k.endswith(("_ms", "_speedup")))
            print(f"{model:10s} time {shape}: {figures} {row.get('reason', '')}", flush=True)
            write()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
