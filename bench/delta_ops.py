"""The public delta-rule operations as a model calls them: forward + backward through ``scanweaver.torch`` and
``scanweaver.jax`` against peers written for autograd, the decode steps, and the peak memory of a long call.

* **Training** (float32, ``--threads`` threads for everyone): the loss ``sum(o * do)`` and its gradient with
  respect to every input, through ``scanweaver.torch.<op>`` (a custom op, inputs and outputs shared with NumPy,
  no copies) and through ``jax.jit(jax.value_and_grad(...))`` of ``scanweaver.jax.<op>``; against
  flash-linear-attention 0.6's naive references under PyTorch autograd, eager (recurrent and chunked) and
  ``torch.compile``'d (chunked; compiling the recurrent one would unroll T steps), and a JAX ``jit`` version
  (``lax.scan`` over chunks of 64 steps, each chunk ``jax.checkpoint``'d so that the backward keeps T / 64
  states, not T).  Every peer's dv is checked against ours; the ratios are the peer's time over
  ``scanweaver.torch``'s, in one run.
* **Decode**: one token of ``<op>_step`` on NumPy arrays and on tensors, state ``(N, H, K, V)``, against
  the time to stream the state once (a copy: one read, one write) in the same process; and the public call at
  T = 1 from a state, returning the new one (a serving loop's call), against its kernel alone (the direct call
  its plan makes): ``call / kernel`` is what the Python around the kernel costs.
* **Memory**: in a fresh process per operation, the peak resident memory of a forward and of a forward +
  backward through ``scanweaver.torch`` at (1, 8192, 16, 128, 128) beyond the inputs (``/proc/self/status``
  VmHWM after resetting it with ``/proc/self/clear_refs``), against the bytes of the inputs plus the outputs.

Usage::

    python bench/delta_ops.py [--json] [--quick] [--only gated,kda] [--threads 2] [--parts train,decode,memory]

(``python bench/delta_rule.py --public`` runs it too.)  ``--json`` writes bench/results/delta_ops.json, keeping
the rows of its last contents that this run did not measure (``--only``, ``--parts``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from delta_rule import FAMILIES, fla_peer, inputs, rel_err, timed

#: family -> (public operation, its array arguments in fla's positional order, in the fused op's names).
PUBLIC = {"deltanet": ("delta_rule", ("q", "k", "v", "beta")), "gated": ("gated_delta_rule", ("q", "k", "v", "g",
                                                                                               "beta")),
          "kda": ("kda", ("q", "k", "v", "g", "beta")), "rwkv7": ("rwkv7", ("q", "g", "k", "v", "a", "b"))}
SHAPES = ((1, 1024, 8, 64, 64), (1, 4096, 16, 128, 128))
QUICK = ((1, 128, 2, 16, 16),)
MEMORY_SHAPE = (1, 8192, 16, 128, 128)


def ours_torch(family: str, a: dict, do):
    """``run() -> grads`` of ``scanweaver.torch.<op>`` (scale 1, as fla's peers here)."""
    import torch

    import scanweaver.torch as swt

    op, names = PUBLIC[family]
    fn = getattr(swt, op)
    leaves = [torch.from_numpy(a[n]).requires_grad_() for n in names]
    dout = torch.from_numpy(do)

    def run():
        for x in leaves:
            x.grad = None
        o, _ = fn(*leaves, 1.0)
        (o * dout).sum().backward()
        return {n: x.grad for n, x in zip(names, leaves, strict=True)}
    return run


def ours_jax(family: str, a: dict, do):
    """``run() -> grads`` of ``jax.jit(jax.value_and_grad(...))`` over ``scanweaver.jax.<op>`` (the loss's value
    too: with ``grad`` alone XLA drops the forward callback, whose output the gradient does not need)."""
    import jax
    import jax.numpy as jnp

    import scanweaver.jax as swj

    op, names = PUBLIC[family]
    fn = getattr(swj, op)
    args = [jnp.asarray(a[n]) for n in names]
    dout = jnp.asarray(do)
    grad = jax.jit(jax.value_and_grad(lambda *xs: (fn(*xs, 1.0)[0] * dout).sum(), argnums=tuple(range(len(names)))))

    def run():
        out = grad(*args)[1]
        jax.block_until_ready(out)
        return dict(zip(names, out, strict=True))
    return run


def jax_peer(family: str, a: dict, do, chunk: int = 64):
    """``run() -> grads`` of the recurrence written in JAX: ``lax.scan`` over chunks of ``chunk`` steps, each a
    checkpointed ``lax.scan`` of the steps, under ``jit(value_and_grad)``."""
    import jax
    import jax.numpy as jnp

    gate, form = FAMILIES[family]
    names = PUBLIC[family][1]
    B, T, H, K = a["q"].shape
    V = a["v"].shape[-1]

    def step(S, x):
        d = 1.0 if gate == "none" else jnp.exp(x["g"])[..., None] if gate == "key" else jnp.exp(x["g"])[..., None,
                                                                                                          None]
        if form == "dplr":
            p = jnp.einsum("bhk,bhkv->bhv", x["a"], S)
            S = d * S + x["b"][..., None] * p[..., None, :] + x["k"][..., None] * x["v"][..., None, :]
        else:
            S = d * S
            u = x["beta"][..., None] * (x["v"] - jnp.einsum("bhkv,bhk->bhv", S, x["k"]))
            S = S + x["k"][..., None] * u[..., None, :]
        return S, jnp.einsum("bhk,bhkv->bhv", x["q"], S)

    inner = jax.checkpoint(lambda S, xc: jax.lax.scan(step, S, xc))

    def forward(*xs):
        x = {n: jnp.swapaxes(v, 0, 1).reshape(T // chunk, chunk, *jnp.swapaxes(v, 0, 1).shape[1:])
             for n, v in zip(names, xs, strict=True)}
        _, o = jax.lax.scan(inner, jnp.zeros((B, H, K, V), jnp.float32), x)
        return jnp.swapaxes(o.reshape(T, B, H, V), 0, 1)

    dout = jnp.asarray(do)
    args = [jnp.asarray(a[n]) for n in names]
    grad = jax.jit(jax.value_and_grad(lambda *xs: (forward(*xs) * dout).sum(), argnums=tuple(range(len(names)))))

    def run():
        out = grad(*args)[1]
        jax.block_until_ready(out)
        return dict(zip(names, out, strict=True))
    return run


def torch_peer(family: str, a: dict, do, chunked: bool, compiled: bool):
    """``run() -> grads`` of fla's naive reference under autograd (eager, or torch.compile'd)."""
    import torch

    fwd = fla_peer(family, chunked)
    if compiled:
        fwd = torch.compile(fwd)
    leaves = {n: torch.from_numpy(x.copy()).requires_grad_() for n, x in a.items()}
    dout = torch.from_numpy(do)

    def run():
        for x in leaves.values():
            x.grad = None
        fwd(leaves).backward(dout)
        return {n: x.grad for n, x in leaves.items()}
    return run


def once(fn) -> float:
    """Seconds of one call of ``fn()``."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_train(family: str, shape: tuple, repeats: int, threads: int, peers: tuple[str, ...]) -> dict:
    """One row: ``scanweaver.torch``'s forward + backward and each of ``peers`` (names of :data:`PEERS`), each
    peer's time over ours.  fla's references run with PyTorch on one thread and on ``threads`` (thousands of tiny
    ops: one thread was up to 12x faster on this busy machine); the faster counts."""
    import torch

    a = inputs(family, *shape)
    do = np.random.default_rng(1).standard_normal(a["v"].shape).astype(np.float32)
    ours = ours_torch(family, a, do)
    dv = np.asarray(ours()["v"]).copy()
    row: dict = {"family": family, "op": PUBLIC[family][0], "shape": shape, "scanweaver.torch fwd+bwd s":
                 timed(ours, repeats), "peers": {}}
    base = row["scanweaver.torch fwd+bwd s"]
    for name in peers:
        make = PEERS[name]
        counts = (1, threads) if name.startswith("fla") else (threads,)
        try:
            run = make(family, a, do)
            entry: dict = {}
            for n in counts:
                torch.set_num_threads(n)
                t0 = time.perf_counter()
                got = run()  # the first call (compilation, for the compiled ones)
                first = time.perf_counter() - t0
                # eager fla: that one call (seconds to minutes); compiled: one more; ours and JAX: the median
                t = first if "eager" in name else once(run) if "compile" in name else timed(run, repeats)
                entry[f"{n} threads"] = {"fwd+bwd s": t, "first call s": first}
            torch.set_num_threads(threads)
            t = min(e["fwd+bwd s"] for e in entry.values())
            row["peers"][name] = {"fwd+bwd s": t, "ratio": t / base, "scanweaver.torch s (this run)": base,
                                  "dv rel err": rel_err(np.asarray(got["v"]), dv), **entry}
        except Exception as exc:  # reported, not fatal
            row["peers"][name] = {"failed": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(f"  {family} {shape} {name}: {row['peers'][name]}", flush=True)
    return row


#: Peer name -> ``make(family, inputs, do) -> run``.
PEERS = {"scanweaver.jax jit(value_and_grad)": ours_jax,
         "JAX jit(value_and_grad) lax.scan, checkpointed chunks": jax_peer,
         "fla naive recurrent, eager": lambda f, a, do: torch_peer(f, a, do, False, False),
         "fla naive chunked, eager": lambda f, a, do: torch_peer(f, a, do, True, False),
         "fla naive chunked, torch.compile": lambda f, a, do: torch_peer(f, a, do, True, True)}


def peers_for(family: str, T: int, args) -> tuple[str, ...]:
    """The peers of one row: fla's only up to the lengths and families the options allow."""
    names = ["scanweaver.jax jit(value_and_grad)", "JAX jit(value_and_grad) lax.scan, checkpointed chunks"]
    if T <= 1024 or family in args.big_fla.split(","):
        names += ["fla naive recurrent, eager"] if args.recurrent_upto >= T else []
        names += ["fla naive chunked, eager"]
        upto = dict(p.split(":") for p in filter(None, args.compiled.split(",")))
        names += ["fla naive chunked, torch.compile"] if int(upto.get(family, -1)) >= T else []
    wanted = [p for p in args.peers.split(",") if p]
    return tuple(n for n in names if not wanted or any(w in n for w in wanted))


def bench_decode(family: str, N: int, H: int, K: int, V: int, repeats: int) -> dict:
    """One token of ``<op>_step`` (NumPy and PyTorch) against a copy of the state; the public call at T = 1
    (from a state, returning the new one, as a serving loop calls it) against its kernel alone."""
    import torch

    import scanweaver

    full = inputs(family, N, 1, H, K, V)
    a = {n: x[:, 0] for n, x in full.items()}
    op, names = PUBLIC[family]
    step = getattr(scanweaver, op + "_step")
    S = np.random.default_rng(2).standard_normal((N, H, K, V)).astype(np.float32)
    dst = np.empty_like(S)
    St, dt_ = torch.from_numpy(S), torch.empty(S.shape)
    ta = {n: torch.from_numpy(x) for n, x in a.items()}
    reps = max(repeats, 50)
    row = {"family": family, "op": op + "_step", "state": (N, H, K, V), "state MiB": S.nbytes / 2**20,
           "copy s": timed(lambda: np.copyto(dst, S), reps), "torch copy s": timed(lambda: dt_.copy_(St), reps),
           "numpy step s": timed(lambda: step(S, *(a[n] for n in names)), reps)}
    with torch.no_grad():
        row["torch step s"] = timed(lambda: step(St, *(ta[n] for n in names)), reps)
    row["numpy ratio"] = row["numpy step s"] / row["copy s"]
    row["torch ratio"] = row["torch step s"] / row["torch copy s"]
    call = getattr(scanweaver, op)
    row["call s"] = timed(lambda: call(*(full[n] for n in names), initial_state=S, output_final_state=True), reps)
    tfull = {n: torch.from_numpy(x) for n, x in full.items()}
    with torch.no_grad():  # a serving loop's tensors: NumPy views, no custom op
        row["torch call s"] = timed(lambda: call(*(tfull[n] for n in names), initial_state=St,
                                                 output_final_state=True), reps)
    row["kernel s"] = kernel_seconds(op, full, S, reps)
    row["call / kernel"] = row["call s"] / row["kernel s"]
    return row


def kernel_seconds(op: str, arrays: dict, S, repeats: int) -> float:
    """Median seconds of the kernel that the last call of ``op`` ran, alone: its direct call on the same arrays
    (:func:`scanweaver.calls.runner.plan_of`), outputs preallocated."""
    import scanweaver
    from scanweaver.calls import runner
    from scanweaver.ops.delta_rule import operands

    ops = operands("bench", op, **arrays, h0=S)
    plan = runner.plan_of(scanweaver.matrix.last, ops.features(), ops.sizes, None)
    out = {**ops.arrays(), "o": np.empty(ops.v.shape, ops.dtype), "hlast": np.empty(ops.state_shape, ops.state_dtype)}
    buffers = tuple(out.get(n) for n in plan.names)
    return timed(lambda: plan.invoke(buffers, *plan.sizes.values()), repeats)


def memory_child(family: str, shape: tuple, threads: int) -> dict:
    """In this (fresh) process: peak resident bytes of a forward and of a forward + backward beyond the inputs."""
    import torch

    torch.set_num_threads(threads)
    import scanweaver.torch as swt

    def status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise KeyError(key)

    op, names = PUBLIC[family]
    a = inputs(family, *shape)
    do = torch.from_numpy(np.random.default_rng(1).standard_normal(a["v"].shape).astype(np.float32))
    small = inputs(family, 1, 16, *shape[2:])
    fn = getattr(swt, op)
    warm = [torch.from_numpy(small[n]).requires_grad_() for n in names]
    fn(*warm, 1.0)[0].sum().backward()  # kernels compiled and loaded: not part of the peak
    leaves = [torch.from_numpy(a[n]).requires_grad_() for n in names]
    inputs_bytes = sum(a[n].nbytes for n in names) + do.numel() * 4
    out = {"family": family, "shape": shape, "inputs MiB": inputs_bytes / 2**20}
    for part in ("forward", "forward+backward"):
        for x in leaves:
            x.grad = None
        Path("/proc/self/clear_refs").write_text("5")
        base = status("VmRSS")
        o, h = fn(*leaves, 1.0, None, True)
        outputs = o.numel() * 4 + h.numel() * 4
        if part != "forward":
            (o * do).sum().backward()
            outputs += sum(x.grad.numel() * 4 for x in leaves)
        peak = status("VmHWM")
        out[part] = {"outputs MiB": outputs / 2**20, "peak extra MiB": (peak - base) / 2**20,
                     "ratio to inputs + outputs": (peak - base) / (inputs_bytes + outputs)}
        del o, h
    return out


def bench_memory(family: str, shape: tuple, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "python"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, "--memory-child", family, "--shape", ",".join(map(str, shape)),
                           "--threads", str(threads)], capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode:
        return {"family": family, "failed": proc.stderr[-400:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="write bench/results/delta_ops.json")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated families (deltanet, gated, kda, rwkv7)")
    ap.add_argument("--parts", default="train,decode,memory")
    ap.add_argument("--recurrent-upto", type=int, default=1024, help="fla's recurrent reference up to this T")
    ap.add_argument("--big-fla", default="deltanet,gated",
                    help="families whose fla references run at T > 1024 too (KDA's and RWKV-7's chunked references "
                         "took 37-38 s forward + backward at (1, 1024, 8, 64, 64), 280-420x ours)")
    ap.add_argument("--compiled", default="gated:256",
                    help="family:T pairs whose chunked fla reference is also torch.compile'd up to that T (compiling "
                         "Gated DeltaNet's unrolled chunk loop took 433 s at T = 128 on this 2-core machine)")
    ap.add_argument("--peers", default="", help="comma-separated parts of peer names: run only those peers")
    ap.add_argument("--memory-child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--shape", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(args.memory_child, tuple(map(int, args.shape.split(","))), args.threads)))
        return 0
    import torch

    torch.set_num_threads(args.threads)
    only = [f for f in FAMILIES if f in (set(filter(None, args.only.split(","))) or set(FAMILIES))]
    parts = set(args.parts.split(","))
    root = Path(__file__).resolve().parent
    path = root / "out" / "delta_ops_quick.json" if args.quick else root / "results" / "delta_ops.json"
    report: dict = {"threads": args.threads, "train": [], "decode": [], "memory": []}
    kept = json.loads(path.read_text()) if args.json and path.exists() else {}

    def save() -> None:  # after every row; rows of the last run that this one did not measure are kept
        if not args.json:
            return
        out = dict(report)
        for part, key in (("train", ("family", "shape")), ("decode", ("op", "state")), ("memory", ("family",))):
            rows = {tuple(json.dumps(r.get(k)) for k in key): r for r in kept.get(part, [])}  # tuples as lists
            for r in report[part]:
                k = tuple(json.dumps(r.get(k)) for k in key)
                old = rows.get(k, {})
                rows[k] = {**r, "peers": {**old.get("peers", {}), **r["peers"]}} if part == "train" else r
            out[part] = list(rows.values())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=float))
    if "decode" in parts:
        for family in only:
            for N, KV in itertools.product((1, 16), ((16, 16),) if args.quick else ((128, 128), (64, 64))):
                r = bench_decode(family, N, 2 if args.quick else 16, *KV, args.repeats)
                report["decode"].append(r)
                save()
                print(f"decode {r['op']} state {r['state']}: numpy {r['numpy step s'] * 1e6:.0f} us = "
                      f"{r['numpy ratio']:.1f}x a copy; torch {r['torch step s'] * 1e6:.0f} us = "
                      f"{r['torch ratio']:.1f}x; call at T = 1 {r['call s'] * 1e6:.0f} us = {r['call / kernel']:.2f}x "
                      f"its kernel ({r['kernel s'] * 1e6:.0f} us); torch call {r['torch call s'] * 1e6:.0f} us",
                      flush=True)
    if "memory" in parts:
        for family in only:
            r = bench_memory(family, (1, 256, 2, 16, 16) if args.quick else MEMORY_SHAPE, args.threads)
            report["memory"].append(r)
            save()
            print(f"memory {family}: {r}", flush=True)
    if "train" in parts:
        for shape in QUICK if args.quick else SHAPES:
            for family in only:
                r = bench_train(family, shape, args.repeats, args.threads, peers_for(family, shape[1], args))
                report["train"].append(r)
                save()
                print(f"train {family} {shape}: scanweaver.torch {r['scanweaver.torch fwd+bwd s'] * 1e3:.1f} ms; " +
                      "; ".join(f"{n} {p['ratio']:.1f}x" for n, p in r["peers"].items() if "ratio" in p), flush=True)
    if args.json:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
