"""Training benchmark: forward + backward of the selective scan on the CPU, against the peers.

(B, D, L) = (8, 512, 4096) float32 by default, y = c * h, a random dL/dy, in
one process:

* ScanWeaver through PyTorch (``scanweaver.torch.selective_scan``, then
  ``y.backward(dy)``, gradients set to None between steps as ``zero_grad``
  does), with the states recomputed (the default) and saved; the forward
  alone under ``torch.no_grad``; the fused backward kernel alone into
  preallocated buffers.  Each repeat times the forward and the backward of
  one training step; all of ours are timed round-robin with the two memory
  rooflines (elementwise C kernels with the forward's traffic, 4 reads and
  1 write, and the backward's, 5 reads and 4 writes; OpenMP on every core).
* Peers, each checked against our gradients first: the same computation as
  a PyTorch loop over L with autograd; ``torch.compile``d
  ``associative_scan`` forward and backward; ``jax.vjp`` of
  ``jax.lax.associative_scan`` under ``jax.jit``.  Compilation is excluded.

Targets: our backward at most 2x our forward; our forward + backward at
least 10x faster than the fastest peer.

Usage::

    python bench/autograd.py [--json] [--repeats N] [--shape 8,512,4096] [--peers loop,jax,compile]
                             [--no-compile] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from scanweaver.runtime import roofline
from scanweaver.runtime.cpu_backend import cpu_model, cpu_threads

#: Peers slower than this per call are timed once.
SLOW_S = 2.0


def summary(times: list[float]) -> dict:
    """Median, min and quartiles in milliseconds."""
    ms = sorted(t * 1e3 for t in times)
    q = statistics.quantiles(ms, n=4) if len(ms) > 1 else [ms[0]] * 3
    return {"median_ms": statistics.median(ms), "min_ms": ms[0], "q1_ms": q[0], "q3_ms": q[2], "repeats": len(ms)}


def operands(shape, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ops = {"a": rng.uniform(0.9, 1.0, shape).astype(np.float32)}
    ops |= {k: rng.standard_normal(shape, np.float32) for k in ("b", "x", "c", "dy")}
    return ops


def ours(ops: dict, repeats: int) -> tuple[dict, dict]:
    """Round-robin timing of our training step (both state modes), forward alone, the backward kernel
    alone and the two rooflines; returns the summaries and our gradients."""
    import torch

    import scanweaver.torch as swt
    from scanweaver.api import SELECTIVE
    from scanweaver.core.autodiff import _adjoint, prepare_call
    from scanweaver.runtime.base import Cotangents
    from scanweaver.runtime.cpu_adjoint import fused_backward

    names = ("a", "b", "x", "c")
    leaves = {k: torch.from_numpy(ops[k]).requires_grad_() for k in names}
    dy = torch.from_numpy(ops["dy"])
    lanes, L = int(np.prod(ops["a"].shape[:-1])), ops["a"].shape[-1]

    def step(states):
        def fwd():
            return swt.selective_scan(*(leaves[k] for k in names), backend="cpu", states=states)
        return fwd

    def inference():
        with torch.no_grad():
            swt.selective_scan(*(leaves[k] for k in names), backend="cpu")

    res = prepare_call(SELECTIVE, {k: ops[k] for k in names}, backend="cpu")
    adj = _adjoint(res.affine, names, False, False, False)
    cot = Cotangents(dy=ops["dy"].reshape(lanes, L), grads={k: np.zeros((lanes, L), np.float32) for k in names})
    calls = {
        "backward_kernel": lambda: fused_backward(adj, res.arrays, cot),
        "roofline_forward": roofline.bind_traffic(lanes, L, "float32", 4, 1),
        "roofline_backward": roofline.bind_traffic(lanes, L, "float32", 5, 4),
        "forward_inference": inference,
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for mode in ("recompute", "save"):
        times[f"{mode}.forward"], times[f"{mode}.backward"] = [], []
    grads = {}
    for r in range(repeats + 1):
        for mode in ("recompute", "save"):
            for t in leaves.values():
                t.grad = None
            t0 = time.perf_counter()
            y = step(mode)()
            t1 = time.perf_counter()
            y.backward(dy)
            t2 = time.perf_counter()
            if r:
                times[f"{mode}.forward"].append(t1 - t0)
                times[f"{mode}.backward"].append(t2 - t1)
            grads[mode] = {k: leaves[k].grad.numpy().copy() for k in names}
            del y
        for k, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if r:
                times[k].append(time.perf_counter() - t0)
    for k in names:
        np.testing.assert_allclose(grads["save"][k], grads["recompute"][k], rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(cot.grads[k].reshape(ops[k].shape), grads["recompute"][k], rtol=1e-5, atol=1e-5)
    out = {k: summary(v) for k, v in times.items()}
    for mode in ("recompute", "save"):
        fb = [f + b for f, b in zip(times[f"{mode}.forward"], times[f"{mode}.backward"], strict=True)]
        out[f"{mode}.forward+backward"] = summary(fb)
    return out, grads["recompute"]


def _torch_tensors(ops):
    import torch

    return [torch.from_numpy(ops[k].copy()).requires_grad_() for k in ("a", "b", "x", "c")], \
        torch.from_numpy(ops["dy"])


def torch_loop(ops):
    """The scan as a PyTorch loop over L, differentiated by autograd.  The steps come from ``unbind``:
    indexing ``a[..., t]`` would make autograd write a full-size zero gradient per step."""
    import torch

    leaves, dy = _torch_tensors(ops)

    def run():
        a, b, x, c = (v.unbind(-1) for v in leaves)
        h = torch.zeros(leaves[0].shape[:-1])
        ys = []
        for t in range(len(a)):
            h = a[t] * h + b[t] * x[t]
            ys.append(c[t] * h)
        y = torch.stack(ys, dim=-1)
        return torch.autograd.grad(y, leaves, dy)

    return run


def _combine(left, right):
    a1, u1 = left
    a2, u2 = right
    return a2 * a1, a2 * u1 + u2


def torch_compiled_assoc(ops):
    """``torch.compile``d ``associative_scan`` (generic combine: the pointwise mode needs CUDA), fwd + bwd."""
    import torch
    from torch._higher_order_ops.associative_scan import associative_scan

    leaves, dy = _torch_tensors(ops)

    def fwd(a, b, x, c):
        return c * associative_scan(_combine, (a, b * x), dim=-1, combine_mode="generic")[1]

    compiled = torch.compile(fwd, dynamic=False)
    return lambda: torch.autograd.grad(compiled(*leaves), leaves, dy)


def jax_assoc(ops):
    """``jax.vjp`` of ``jax.lax.associative_scan`` under ``jax.jit``."""
    import jax
    import jax.numpy as jnp

    def fwd(a, b, x, c):
        return c * jax.lax.associative_scan(_combine, (a, b * x), axis=-1)[1]

    @jax.jit
    def train(a, b, x, c, dy):
        y, pullback = jax.vjp(fwd, a, b, x, c)
        return y, pullback(dy)

    args = [jax.device_put(jnp.asarray(ops[k])) for k in ("a", "b", "x", "c", "dy")]
    return lambda: [np.asarray(g) for g in jax.block_until_ready(train(*args))[1]]


#: --peers key -> (table name, maker, compiles on its first call)
PEERS = {
    "loop": ("PyTorch loop + autograd", torch_loop, False),
    "jax": ("JAX associative_scan (jit, vjp)", jax_assoc, True),
    "compile": ("PyTorch associative_scan (torch.compile)", torch_compiled_assoc, True),
}


def peers(ops, ours_grads, repeats: int, which: list[str]) -> dict:
    out = {}
    for name, make, compiles in (PEERS[k] for k in which):
        try:
            run = make(ops)
            t0 = time.perf_counter()
            grads = run()  # the correctness check (and the compilation of compiled peers)
            first = time.perf_counter() - t0
        except Exception as exc:  # a peer that cannot run here is reported, not fatal
            out[name] = {"status": f"skipped: {type(exc).__name__}: {exc}"[:300]}
            continue
        got = np.asarray(grads[0].detach() if hasattr(grads[0], "detach") else grads[0])
        err = float(np.linalg.norm(got - ours_grads["a"]) / np.linalg.norm(ours_grads["a"]))
        if not err < 1e-3:
            out[name] = {"status": f"failed: da relative error {err:.2e} against ours"}
            continue
        times = [] if compiles else [first]
        # An eager peer slower than SLOW_S per call is timed by its checked call alone.
        for _ in range(0 if (not compiles and first > SLOW_S) else repeats - len(times)):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        out[name] = {"status": "ok", "da_relative_error": err, **summary(times)}
    return out


def report(shape, res: dict, peer: dict) -> dict:
    lanes_L = int(np.prod(shape))
    fwd = res["recompute.forward"]["median_ms"]
    bwd = res["recompute.backward"]["median_ms"]
    fb = res["recompute.forward+backward"]["median_ms"]
    ok = {k: v for k, v in peer.items() if v.get("status") == "ok"}
    fastest = min(ok, key=lambda k: ok[k]["median_ms"]) if ok else None
    ratios = {
        "backward_over_forward": bwd / fwd,
        "saved_backward_over_forward": res["save.backward"]["median_ms"] / res["save.forward"]["median_ms"],
        "backward_roofline_fraction": res["roofline_backward"]["median_ms"] / res["backward_kernel"]["median_ms"],
        "step_backward_roofline_fraction": res["roofline_backward"]["median_ms"] / bwd,
        "forward_roofline_fraction": res["roofline_forward"]["median_ms"] / fwd,
        "fastest_peer": fastest,
        "speedup_vs_fastest_peer": ok[fastest]["median_ms"] / fb if fastest else None,
        "ns_per_element_forward_backward": fb * 1e6 / lanes_L,
    }
    return {
        "machine": f"{cpu_model()} ({cpu_threads()} threads)",
        "shape": list(shape), "dtype": "float32",
        "ours": res, "peers": peer, "ratios": ratios,
        "targets": {"backward_over_forward": {"max": 2.0, "met": ratios["backward_over_forward"] <= 2.0},
                    "speedup_vs_fastest_peer": {"min": 10.0, "met": bool(fastest)
                                                and ratios["speedup_vs_fastest_peer"] >= 10.0}},
    }


def table(rec: dict) -> str:
    o, p, r = rec["ours"], rec["peers"], rec["ratios"]
    rows = [("ScanWeaver forward (training step)", o["recompute.forward"]),
            ("ScanWeaver backward, states recomputed (default)", o["recompute.backward"]),
            ("ScanWeaver forward + backward, recomputed", o["recompute.forward+backward"]),
            ("ScanWeaver forward, states saved", o["save.forward"]),
            ("ScanWeaver backward, states saved", o["save.backward"]),
            ("ScanWeaver forward + backward, saved", o["save.forward+backward"]),
            ("ScanWeaver forward alone (no_grad)", o["forward_inference"]),
            ("fused backward kernel alone (preallocated)", o["backward_kernel"]),
            ("roofline, forward traffic (4 reads, 1 write)", o["roofline_forward"]),
            ("roofline, backward traffic (5 reads, 4 writes)", o["roofline_backward"])]
    lines = [f"selective scan fwd+bwd, {tuple(rec['shape'])} float32, {rec['machine']}", "",
             "| entry | median ms | min ms |", "|---|---|---|"]
    lines += [f"| {name} | {s['median_ms']:.1f} | {s['min_ms']:.1f} |" for name, s in rows]
    for name, v in p.items():
        lines.append(f"| {name} (fwd+bwd) | {v['median_ms']:.1f} | {v['min_ms']:.1f} |" if v.get("status") == "ok"
                     else f"| {name} (fwd+bwd) | {v['status']} | |")
    sp = r["speedup_vs_fastest_peer"]
    lines += ["", f"backward / forward: {r['backward_over_forward']:.2f} (target <= 2; saved states: "
                  f"{r['saved_backward_over_forward']:.2f})",
              f"fwd+bwd speedup over the fastest peer ({r['fastest_peer']}): "
              + (f"{sp:.1f}x (target >= 10)" if sp else "no peer ran"),
              f"backward kernel at {r['backward_roofline_fraction']:.2f} of its roofline "
              f"({r['step_backward_roofline_fraction']:.2f} for the whole backward step)"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the JSON record instead of the table")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--shape", default="8,512,4096", help="B,D,L (default 8,512,4096)")
    parser.add_argument("--peers", default="loop,jax,compile",
                        help=f"comma-separated peers to run, of {', '.join(PEERS)} (default: all); 'none' for none")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer (minutes to compile)")
    parser.add_argument("--quick", action="store_true", help="(2, 64, 1024), 3 repeats, no torch.compile")
    args = parser.parse_args(argv)
    shape = (2, 64, 1024) if args.quick else tuple(int(v) for v in args.shape.split(","))
    repeats = 3 if args.quick else args.repeats
    ops = operands(shape)
    res, grads = ours(ops, repeats)
    which = [] if args.peers == "none" else [k.strip() for k in args.peers.split(",")]
    unknown = sorted(set(which) - set(PEERS))
    if unknown:
        parser.error(f"--peers: unknown {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    if args.no_compile or args.quick:
        which = [k for k in which if k != "compile"]
    peer = peers(ops, grads, repeats, which)
    rec = report(shape, res, peer)
    print(json.dumps(rec, indent=2) if args.json else table(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
