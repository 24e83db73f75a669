"""Every CUDA kernel family against its float64 host reference, forward and backward.

Each family runs through ``scanweaver.torch`` on float32 tensors that need
gradients, on a small shape past one time tile; its output and the gradient
of ``sum(y * w)`` for every input are compared with the float64 loop of
:mod:`scanweaver.benchmarks.model_refs` (relative to the reference's largest
value).  The families:

* ``scan``: the selective scan (the vector-state kernels: the scan and its adjoint);
* ``mamba1``: the fused Mamba-1 kernels (softplus, D);
* ``gla``, ``simple_gla``, ``retnet``, ``rwkv6``, ``mamba2_gated``: the fused matrix-state kernels with each
  decay form and readout, Mamba-2 with every gate (softplus, clamp, ``D (H, P)``, ``silu(z)``);
* ``delta``, ``gated_delta``: the delta-rule family, where this tree has its PyTorch entry (``delta``
  without one: its NumPy entry's forward on the backend; else skipped, with the reason).

On the GPU (``cuda``) every call of ours also runs with ``cupy.asnumpy``
refused, so a call whose CUDA tensors would go through host memory fails.
``--dry-run`` runs the same checks on CPU tensors with ``backend="opencl"``
(PoCL standing in for the GPU: the same GPU kernel text) on tiny shapes.

Usage::

    python bench/gpu_families.py [--out FILE] [--budget SECONDS] [--dry-run]

Writes the results (JSON) to ``--out`` after every family.  Exit codes: 0 every family that ran passed;
1 one failed (or raised); 3 no GPU (without ``--dry-run``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

#: Largest relative error (to the reference's largest value) that passes: float32 recurrences.
TOLERANCE = 2e-3
#: Family -> (model of :mod:`scanweaver.benchmarks.model_refs`, check shape, dry-run shape).
SHAPES = {
    "scan": ("scan", (2, 48, 1333), (2, 3, 77)),
    "mamba1": ("mamba1", (2, 32, 16, 333), (1, 4, 3, 37)),
    "gla": ("gla", (2, 77, 4, 64, 64), (1, 19, 2, 5, 6)),
    "simple_gla": ("simple_gla", (2, 77, 4, 128, 64), (1, 19, 2, 5, 6)),
    "retnet": ("retnet", (2, 77, 4, 64, 128), (1, 19, 2, 5, 6)),
    "rwkv6": ("rwkv6", (2, 77, 4, 64, 64), (1, 19, 2, 5, 6)),
    "mamba2_gated": ("mamba2_gated", (2, 77, 8, 64, 128), (1, 19, 2, 3, 5)),
    "delta": ("delta", (2, 77, 4, 64, 64), (1, 19, 2, 5, 6)),
    "gated_delta": ("gated_delta", (2, 77, 4, 64, 64), (1, 19, 2, 5, 6)),
}
#: The families a dry run checks (each compiles its kernels on PoCL: a few seconds apiece).
DRY = ("mamba2_gated",)


def _call(family: str, backend: str):
    """``call(inputs) -> y`` of our entry for ``family`` (ImportError where this tree has none)."""
    import scanweaver
    import scanweaver.torch as swt

    from scanweaver.benchmarks.model_refs import DT_LIMIT

    kw = {"backend": backend}
    calls = {  # family -> (our entry point, how the family calls it)
        "scan": ("selective_scan", lambda f: lambda i: f(i["a"], i["b"], i["x"], i["c"], **kw)),
        "mamba1": ("mamba_selective_scan", lambda f: lambda i: f(i["u"], i["delta"], i["A"], i["B"], i["C"], i["D"],
                                                                 delta_bias=i["delta_bias"], delta_softplus=True,
                                                                 **kw)),
        "gla": ("linear_attention", lambda f: lambda i: f(i["q"], i["k"], i["v"], g=i["g"], **kw)[0]),
        "simple_gla": ("linear_attention", lambda f: lambda i: f(i["q"], i["k"], i["v"], g_head=i["g"], **kw)[0]),
        "retnet": ("linear_attention", lambda f: lambda i: f(i["q"], i["k"], i["v"], decay=i["decay"], **kw)[0]),
        "rwkv6": ("rwkv6", lambda f: lambda i: f(i["r"], i["k"], i["v"], i["w"], i["u"], **kw)[0]),
        "mamba2_gated": ("mamba2_scan", lambda f: lambda i: f(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"],
                                                              z=i["z"], dt_bias=i["dt_bias"], dt_softplus=True,
                                                              dt_limit=DT_LIMIT, **kw)),
        "delta": ("delta_rule", lambda f: lambda i: f(i["q"], i["k"], i["v"], i["beta"], **kw)[0]),
        "gated_delta": ("gated_delta_rule", lambda f: lambda i: f(i["q"], i["k"], i["v"], i["g"], i["beta"], **kw)[0]),
    }
    name, make = calls[family]
    fn = getattr(swt, name, None)
    if fn is None and family == "delta" and hasattr(scanweaver, name):
        return _forward_only(getattr(scanweaver, name), ("q", "k", "v", "beta"), backend)
    if fn is None:
        raise ImportError(f"scanweaver.torch.{name} does not exist in this tree")
    return make(fn)


def _forward_only(fn, names: tuple[str, ...], backend: str):
    """A NumPy entry point as a family's call (no gradients: the check compares the output only)."""
    import torch

    def call(i):
        args = (i[n].detach().cpu().numpy() for n in names)
        return torch.from_numpy(fn(*args, backend=backend)[0]).to(i[names[0]].device)

    call.forward_only = True
    return call


@contextlib.contextmanager
def no_host_copies(on_gpu: bool):
    """On the GPU: ``cupy.asnumpy`` raises inside the block (our calls must keep CUDA tensors on the device)."""
    if not on_gpu:
        yield
        return
    import cupy

    def refuse(*args, **kwargs):
        raise AssertionError("a CUDA tensor's data went through host memory (cupy.asnumpy)")

    saved = cupy.asnumpy
    cupy.asnumpy = refuse
    try:
        yield
    finally:
        cupy.asnumpy = saved


def check_family(family: str, dry: bool) -> dict:
    """One family's check: ``{"family", "status", "errors", "reason", "seconds"}``."""
    from scanweaver.benchmarks import models

    model, shape, dry_shape = SHAPES[family]
    row: dict = {"family": family, "model": model, "shape": list(dry_shape if dry else shape), "status": "skipped"}
    t0 = time.perf_counter()
    try:
        call = _call(family, "opencl" if dry else "cuda")
    except ImportError as exc:
        row["reason"] = str(exc)
        return row
    try:
        with no_host_copies(not dry):
            row["errors"] = models.check(call, model, tuple(row["shape"]), device="cpu" if dry else "cuda")
        bad = {k: v for k, v in row["errors"].items() if not v <= TOLERANCE}
        forward_only = getattr(call, "forward_only", False)
        row["status"] = "failed" if bad or (len(row["errors"]) < 2 and not forward_only) else "ok"
        if bad:
            row["reason"] = f"over {TOLERANCE:g} against the float64 reference: {bad}"
        elif forward_only:
            row["reason"] = "forward only: this tree has no PyTorch entry for it (NumPy arrays through the backend)"
        elif len(row["errors"]) < 2:
            row["reason"] = "no gradients came back"
    except Exception as exc:  # an error is a failed family, with the reason
        row.update(status="error", reason=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc(limit=6))
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def gpu_reason() -> str | None:
    """``None`` when the cuda backend and PyTorch's CUDA run here, else why not."""
    try:
        import torch

        from scanweaver.runtime import REGISTRY
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    avail = REGISTRY["cuda"].availability()
    if not avail.ok:
        return f"cuda backend unavailable: {avail.reason}"
    return None if torch.cuda.is_available() else "PyTorch sees no CUDA device"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the JSON results here (after every family)")
    ap.add_argument("--budget", type=float, default=float("inf"), help="families not started by then are skipped")
    ap.add_argument("--dry-run", action="store_true", help="PoCL (backend='opencl') on CPU tensors, tiny shapes")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    report: dict = {"dry_run": args.dry_run, "tolerance": TOLERANCE, "families": []}
    why = None
    if args.dry_run:
        try:
            import torch  # noqa: F401

            from scanweaver.runtime import REGISTRY

            avail = REGISTRY["opencl"].availability()
            why = None if avail.ok else f"opencl backend unavailable: {avail.reason}"
        except ImportError as exc:
            why = f"{type(exc).__name__}: {exc}"
    else:
        why = gpu_reason()
    if why is not None:
        report.update(status="no_device", reason=why)
        print(f"gpu_families: NO RUN: {why}", file=sys.stderr)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
        return 0 if args.dry_run else 3
    for family in (DRY if args.dry_run else SHAPES):
        spent = time.perf_counter() - start
        row = check_family(family, args.dry_run) if spent < args.budget else {
            "family": family, "status": "skipped", "reason": f"time budget: {spent:.0f} s of {args.budget:g} s spent"}
        report["families"].append(row)
        errs = row.get("errors")
        print(f"  {family:13s} {row['status']:8s} {max(errs.values()) if errs else float('nan'):.1e}  "
              f"{row.get('reason', '')}", file=sys.stderr, flush=True)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    failed = [r for r in report["families"] if r["status"] in ("failed", "error")]
    report["status"] = "failed" if failed else "ok"
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
