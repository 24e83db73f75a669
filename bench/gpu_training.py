"""Training on a GPU: forward + backward of the selective scan on CUDA tensors, ScanWeaver beside the GPU peers.

(B, D, L) = (8, 1536, 4096) float32 by default, y = c * h, a random dL/dy, every
array made on the device, in one process:

* ScanWeaver: ``scanweaver.torch.selective_scan`` on CUDA tensors (the ``cuda``
  backend through DLPack, on PyTorch's current stream), then ``y.backward(dy)``;
* accelerated-scan's autograd: ``c * scan(a, b * x)`` with its Triton kernel
  (``accelerated_scan.scalar``) and its CUDA C++ warp kernel
  (``accelerated_scan.warp``, built by PyTorch at the first import, about 70 s;
  ``--skip-warp`` leaves it out);
* ``torch.compile``d ``associative_scan`` over affine pairs (the pointwise
  combine on CUDA, generic where pointwise does not compile), autograd;
* ``jax.vjp`` of ``jax.lax.associative_scan`` under ``jax.jit`` on JAX's GPU;
* the PyTorch loop over L with autograd (timed once when one warm step is slow).

Every entry's gradients (da, db, dx, dc) are checked first against a float64
reference computed on the host (``scanweaver.vjp`` on the ``cpu`` backend); a
wrong entry is reported as failed and never timed, a missing one as skipped
with its reason.  Time: wall time of one training step (forward, backward,
device synchronisation), median of ``--repeats`` after a warm-up (which
compiles).  Reported as ratios to the fastest peer.

Usage::

    python bench/gpu_training.py [--json] [--out FILE] [--shape 8,1536,4096] [--repeats 10]
                                 [--skip-warp] [--skip-compile] [--allow-no-gpu] [--device cpu]

``--device cpu`` runs the same entries on CPU tensors (those that need CUDA are
skipped with their reason): a smoke test of this script where there is no GPU.

Exit codes: 0 ran; 3 no CUDA device here (0 with ``--allow-no-gpu``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time

import numpy as np

#: A warm step slower than this (seconds) is timed once.
SLOW_S = 2.0
NAMES = ("a", "b", "x", "c")


def operands(shape, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ops = {"a": rng.uniform(0.9, 1.0, shape).astype(np.float32)}
    ops |= {k: rng.standard_normal(shape, np.float32) for k in ("b", "x", "c", "dy")}
    return ops


def reference(ops) -> dict[str, np.ndarray]:
    """float64 gradients on the host: ScanWeaver's vjp on the cpu backend (checked in the test suite)."""
    import scanweaver

    wide = {k: ops[k].astype(np.float64) for k in (*NAMES, "dy")}
    _, pullback = scanweaver.vjp(scanweaver.selective_scan, *(wide[k] for k in NAMES), backend="cpu")
    return pullback(wide["dy"])


#: Where the tensors live: ``cuda``, or ``cpu`` for a smoke run of this script where there is no GPU.
DEVICE = "cuda"


def _sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _leaves(ops):
    import torch

    return ([torch.from_numpy(ops[k]).to(DEVICE).requires_grad_() for k in NAMES],
            torch.from_numpy(ops["dy"]).to(DEVICE))


def _torch_step(forward, ops):
    """A training step of ``forward(a, b, x, c) -> y`` under autograd: ``y.backward(dy)``, synchronised."""
    leaves, dy = _leaves(ops)

    def step():
        for t in leaves:
            t.grad = None
        forward(*leaves).backward(dy)
        _sync()
        return [t.grad for t in leaves]

    return step


def ours(ops):
    import scanweaver.torch as swt

    return _torch_step(lambda a, b, x, c: swt.selective_scan(a, b, x, c), ops)


def _combine(left, right):
    a1, u1 = left
    a2, u2 = right
    return a2 * a1, a2 * u1 + u2


def accelerated(module: str):
    def make(ops):
        L = ops["a"].shape[-1]
        if L < 32 or L & (L - 1):
            raise RuntimeError(f"accelerated-scan needs L a power of two >= 32, got L={L}")
        scan = importlib.import_module(f"accelerated_scan.{module}").scan
        return _torch_step(lambda a, b, x, c: c * scan(a.contiguous(), (b * x).contiguous()), ops)

    return make


def compiled_assoc(ops):
    import torch
    from torch._higher_order_ops.associative_scan import associative_scan

    from scanweaver.benchmarks.peers.gpu_peers import _pointwise_reason

    mode = "pointwise" if _pointwise_reason() is None else "generic"
    fn = torch.compile(lambda a, b, x, c: c * associative_scan(_combine, (a, b * x), dim=-1, combine_mode=mode)[1],
                       dynamic=False)
    return _torch_step(fn, ops)


def torch_loop(ops):
    import torch

    def forward(a, b, x, c):
        h = torch.zeros(a.shape[:-1], device=a.device)
        ys = []
        for at, bt, xt, ct in zip(a.unbind(-1), b.unbind(-1), x.unbind(-1), c.unbind(-1), strict=True):
            h = at * h + bt * xt
            ys.append(ct * h)
        return torch.stack(ys, dim=-1)

    return _torch_step(forward, ops)


def jax_assoc(ops):
    import jax
    import jax.numpy as jnp

    if DEVICE == "cuda" and not any(d.platform == "gpu" for d in jax.devices()):
        raise RuntimeError(f"JAX sees no GPU here (devices: {jax.devices()})")

    def fwd(a, b, x, c):
        return c * jax.lax.associative_scan(_combine, (a, b * x), axis=-1)[1]

    @jax.jit
    def grads(a, b, x, c, dy):
        return jax.vjp(fwd, a, b, x, c)[1](dy)

    args = [jax.device_put(jnp.asarray(ops[k])) for k in (*NAMES, "dy")]
    return lambda: jax.block_until_ready(grads(*args))


#: name -> maker of a step returning (da, db, dx, dc) on the device
ENTRIES = {
    "ScanWeaver (scanweaver.torch)": ours,
    "accelerated-scan (Triton) + autograd": accelerated("scalar"),
    "accelerated-scan (CUDA warp scan) + autograd": accelerated("warp"),
    "PyTorch associative_scan (torch.compile)": compiled_assoc,
    "JAX associative_scan (jit, vjp)": jax_assoc,
    "PyTorch loop + autograd": torch_loop,
}
OURS = next(iter(ENTRIES))


def _host(g) -> np.ndarray:
    return np.asarray(g.detach().cpu().numpy() if hasattr(g, "detach") else g, np.float64)


def measure(name, make, ops, want, repeats: int) -> dict:
    try:
        step = make(ops)
        t0 = time.perf_counter()
        got = step()  # the check, and the compilation of compiled entries
        first = time.perf_counter() - t0
    except Exception as exc:  # a peer that cannot run here is reported, not fatal
        return {"status": f"skipped: {type(exc).__name__}: {exc}"[:300]}
    errors = {k: float(np.linalg.norm(_host(g) - want[k]) / np.linalg.norm(want[k]))
              for k, g in zip(NAMES, got, strict=True)}
    worst = max(errors.values())
    if not worst < 1e-3:
        return {"status": f"failed: gradient relative error {worst:.2e} against the float64 reference",
                "grad_rel_errors": errors}
    times = []
    for _ in range(repeats):  # the first of these is warm (the checked call compiled)
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        if times[0] > SLOW_S:
            break
    return {"status": "ok", "grad_rel_errors": errors, "median_ms": statistics.median(times) * 1e3,
            "min_ms": min(times) * 1e3, "repeats": len(times), "first_call_s": first}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the JSON record")
    ap.add_argument("--out", help="also write the JSON record to this file")
    ap.add_argument("--shape", default="8,1536,4096", help="B,D,L (default 8,1536,4096)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip-warp", action="store_true", help="leave out accelerated-scan's warp kernel (70 s build)")
    ap.add_argument("--skip-compile", action="store_true", help="leave out torch.compile (minutes to compile)")
    ap.add_argument("--allow-no-gpu", action="store_true", help="exit 0 when no CUDA device is here")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: a smoke run of this script on CPU tensors (no GPU figures)")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    try:
        import torch

        why = None if DEVICE == "cpu" or torch.cuda.is_available() else "torch.cuda.is_available() is False"
    except ImportError as exc:
        why = f"PyTorch is not installed ({exc})"
    if why:
        print(f"gpu_training: NO GPU RUN: {why}", file=sys.stderr)
        return 0 if args.allow_no_gpu else 3
    shape = tuple(int(v) for v in args.shape.split(","))
    ops = operands(shape)
    want = reference(ops)
    entries = {k: v for k, v in ENTRIES.items()
               if not (args.skip_warp and "warp" in k) and not (args.skip_compile and "torch.compile" in k)}
    results = {name: measure(name, make, ops, want, args.repeats) for name, make in entries.items()}
    ok = {k: v for k, v in results.items() if v["status"] == "ok" and k != OURS}
    fastest = min(ok, key=lambda k: ok[k]["median_ms"]) if ok else None
    mine = results[OURS]
    rec = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else f"cpu (smoke run: {DEVICE})",
           "torch": torch.__version__, "shape": list(shape),
           "dtype": "float32", "entries": results, "fastest_peer": fastest,
           "speedup_vs_fastest_peer": (ok[fastest]["median_ms"] / mine["median_ms"]
                                       if fastest and mine["status"] == "ok" else None)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
    if args.json:
        print(json.dumps(rec, indent=1))
        return 0
    print(f"training step (forward + backward), {shape} float32, {rec['device']}")
    for name, r in results.items():
        print(f"  {name:48s} " + (f"{r['median_ms']:9.3f} ms" if r["status"] == "ok" else r["status"]))
    if rec["speedup_vs_fastest_peer"]:
        print(f"ScanWeaver vs the fastest peer ({fastest}): {rec['speedup_vs_fastest_peer']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
