"""The delta-rule family (DeltaNet, Gated DeltaNet, KDA, RWKV-7) on the CPU: the fused C kernels against peers.

Ours is the fused ``delta_rule`` op called through the cpu backend's ``run_fused`` (the recurrent form, float32),
forward and forward + backward (every gradient, dh0 included).  Peers, in the same process, each checked
against ours:

* flash-linear-attention 0.6's naive PyTorch references (``pip install fla-core==0.6.0``; the files load
  without Triton): the recurrent ones (``delta_rule_recurrence``, ``naive_recurrent_gated_delta_rule``,
  ``naive_recurrent_kda``, ``dplr_recurrence``) and the chunked ones (``delta_rule_chunkwise``,
  ``naive_chunk_gated_delta_rule``, ``naive_chunk_kda``, ``dplr_chunkwise``), forward under ``no_grad`` and
  forward + backward under autograd (the gradient of ``sum(o * do)`` with respect to every input);
* llama.cpp's kernels (``pip install ggml-python==0.0.45``, which bundles them): ``ggml_gated_delta_net``
  (Gated DeltaNet; KDA through its per-key gate) and ``ggml_rwkv_wkv7``, forward only (their graph compute,
  on inputs copied into ggml tensors beforehand).

Every figure is the median of ``--repeats`` calls after a warm-up (the slow peers: one call), with
``--threads`` threads for everyone (OpenMP, ``torch.set_num_threads``, ggml's pool); the ratios are the peer's
time over ours, measured in one run.

Usage::

    python bench/delta_rule.py [--json] [--quick] [--repeats N] [--threads 2] [--only gated,rwkv7]
    python bench/delta_rule.py --public [the options of bench/delta_ops.py]

``--json`` writes bench/results/delta_rule.json (``--quick``: bench/out/delta_rule_quick.json).  ``--public``
runs bench/delta_ops.py instead: the public operations through ``scanweaver.torch`` and ``scanweaver.jax``
against fla's references under autograd (eager and compiled) and a JAX version, the decode steps, and the
peak memory of a long call.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures
from scanweaver.runtime import get_backend

OP = FUSED.get("delta_rule")
FAMILIES = {"deltanet": ("none", "delta"), "gated": ("scalar", "delta"), "kda": ("key", "delta"),
            "rwkv7": ("key", "dplr")}
#: (B, T, H, K, V) of the fla comparisons, and (family, shape) of the llama.cpp ones.
SHAPES = ((1, 1024, 8, 64, 64), (1, 4096, 16, 128, 128))
GGML = (("gated", (1, 4096, 16, 128, 128)), ("kda", (1, 4096, 16, 128, 128)), ("rwkv7", (1, 4096, 32, 64, 64)))
QUICK = ((1, 128, 2, 16, 16),)
QUICK_GGML = (("gated", (1, 64, 2, 64, 64)), ("rwkv7", (1, 64, 2, 64, 64)))


def inputs(family: str, B: int, T: int, H: int, K: int, V: int) -> dict:
    """float32 operands in the op's layouts: unit keys, beta in (0, 1), log decays in [-2, -0.01] (RWKV-7: -kappa
    and kappa * iclr for a and b, kappa a unit vector)."""
    rng = np.random.default_rng(0)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    a = {"q": rng.standard_normal((B, T, H, K)), "k": unit(rng.standard_normal((B, T, H, K))),
         "v": rng.standard_normal((B, T, H, V))}
    gate, form = FAMILIES[family]
    if gate != "none":
        a["g"] = -np.exp(rng.uniform(np.log(0.01), np.log(2.0), (B, T, H, K) if gate == "key" else (B, T, H)))
    if form == "delta":
        a["beta"] = rng.uniform(0.05, 0.95, (B, T, H))
    else:
        kappa = unit(rng.standard_normal((B, T, H, K)))
        a["a"], a["b"] = -kappa, kappa * rng.uniform(0.1, 0.9, (B, T, H, K))
    return {n: np.ascontiguousarray(x, np.float32) for n, x in a.items()}


class Ours:
    """The fused op on the cpu backend: forward, and forward + backward, on preallocated outputs."""

    def __init__(self, family: str, a: dict, threads: int):
        B, T, H, K = a["q"].shape
        gate, form = FAMILIES[family]
        self.f = DeltaRuleFeatures("float32", K, a["v"].shape[-1], gate=gate, form=form)
        self.sizes = {"batch": B, "T": T, "H": H, "Hq": H, "nseq": B}
        self.cpu, self.a = get_backend("cpu"), a
        self.do = np.random.default_rng(1).standard_normal(a["v"].shape).astype(np.float32)
        self.out = {p: {n: np.empty(s, np.float32) for n, s in OP.shapes(p, self.f, self.sizes).items()
                        if n.startswith(("o", "hlast", "d")) and n != "do" and OP.enabled(n, self.f)}
                    for p in ("forward", "backward")}
        self.calls = {p: OP.call(p, self.f, OP.resolve("c", {"threads": threads},
                                                       self.cpu.fused_defaults(OP.name, self.f, self.sizes), "bench"))
                      for p in ("forward", "backward")}

    def forward(self) -> np.ndarray:
        self.cpu.run_fused(self.calls["forward"], {**self.a, **self.out["forward"]}, self.sizes)
        return self.out["forward"]["o"]

    def forward_backward(self) -> dict:
        self.forward()
        self.cpu.run_fused(self.calls["backward"], {**self.a, "do": self.do, **self.out["backward"]}, self.sizes)
        return self.out["backward"]


def fla(rel: str):
    """fla's ``ops/<rel>.py`` loaded by path (its package imports Triton), or None."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "ops" / f"{rel}.py"
    name = f"_fla_{rel.replace('/', '_')}"
    if name in sys.modules:
        return sys.modules[name]
    mod_spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = mod  # torch.compile traces its functions by module name
    mod_spec.loader.exec_module(mod)
    return mod


def fla_peer(family: str, chunked: bool):
    """``run(tensors) -> o`` of fla's naive reference in the op's layouts, unscaled (o = S^T q)."""
    def bht(x):
        return x.transpose(1, 2)
    if family == "deltanet":
        mod = fla("delta_rule/naive")
        fn = mod.delta_rule_chunkwise if chunked else mod.delta_rule_recurrence

        def run(t):
            o = fn(bht(t["q"]), bht(t["k"]), bht(t["v"]), bht(t["beta"]))
            return bht(o[0]) * t["q"].shape[-1] ** 0.5
    elif family == "gated":
        mod = fla("gated_delta_rule/naive")

        def run(t):
            if chunked:
                return mod.naive_chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=1.0)[0]
            return mod.naive_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], t["beta"], t["g"], scale=1.0)[0]
    elif family == "kda":
        mod = fla("kda/naive")
        fn = mod.naive_chunk_kda if chunked else mod.naive_recurrent_kda

        def run(t):
            return fn(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=1.0)[0]
    else:
        mod = fla("generalized_delta_rule/dplr/naive")
        fn = mod.dplr_chunkwise if chunked else mod.dplr_recurrence

        def run(t):
            o = fn(*(bht(t[n]) for n in ("q", "k", "v", "a", "b", "g")))
            return bht(o[0]) * t["q"].shape[-1] ** 0.5
    return run


def ggml_peer(family: str, a: dict, threads: int):
    """llama.cpp's kernel on ggml tensors: ``(run, close)``; run() computes the graph and returns o."""
    import ggml

    B, T, H, K = a["q"].shape
    V = a["v"].shape[-1]
    mem = 4 * sum(x.size for x in a.values()) * 3 + 8 * B * H * K * V * 4 + (64 << 20)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None))

    def tensor(data):
        data = np.ascontiguousarray(data, np.float32)
        shape = tuple(reversed(data.shape))
        make = {1: ggml.ggml_new_tensor_1d, 2: ggml.ggml_new_tensor_2d, 3: ggml.ggml_new_tensor_3d,
                4: ggml.ggml_new_tensor_4d}[len(shape)]
        t = make(ctx, ggml.GGML_TYPE_F32, *shape)
        ctypes.memmove(ggml.ggml_get_data(t), data.ctypes.data, data.nbytes)
        return t

    if family == "rwkv7":  # r, w (a decay factor), k, v, a, b {S, H, T}; state {S*S*H, seqs}, rows = values
        flat = (B * T, H, K)
        out = ggml.ggml_rwkv_wkv7(ctx, tensor(a["q"].reshape(flat)), tensor(np.exp(a["g"]).reshape(flat)),
                                  tensor(a["k"].reshape(flat)), tensor(a["v"].reshape(flat)),
                                  tensor(a["a"].reshape(flat)), tensor(a["b"].reshape(flat)),
                                  tensor(np.zeros((B, H * K * V), np.float32)))
        scale = 1.0
    else:  # q, k {S_k, H, T, seqs}, v {S_v, H, T, seqs}, g {1 or S_k, H, T, seqs}, beta {1, H, T, seqs};
        # state {S_v, S_v, H, seqs} (K == V); o = S^T q / sqrt(K); K = 1: keep the final state only
        g = a["g"][..., None] if a["g"].ndim == 3 else a["g"]
        out = ggml.ggml_gated_delta_net(ctx, tensor(a["q"]), tensor(a["k"]), tensor(a["v"]), tensor(g),
                                        tensor(a["beta"][..., None]), tensor(np.zeros((B, H, V, K), np.float32)), 1)
        scale = K ** 0.5
    graph = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(graph, out)
    n = B * T * H * V
    view = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)), (n,))

    def run():
        ggml.ggml_graph_compute_with_ctx(ctx, graph, threads)
        return view.reshape(B, T, H, V) * scale
    return run, lambda: ggml.ggml_free(ctx)


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` after one warm-up."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def rel_err(got, want) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def bench_fla(family: str, shape: tuple, threads: int, repeats: int, recurrent_upto: int) -> dict:
    import torch

    a = inputs(family, *shape)
    ours = Ours(family, a, threads)
    o = ours.forward().copy()
    row: dict = {"family": family, "shape": shape, "ours fwd": timed(ours.forward, repeats),
                 "ours fwd+bwd": timed(ours.forward_backward, repeats), "peers": {}}
    dv = ours.forward_backward()["dv"].copy()
    for form in ("recurrent", "chunk"):
        if form == "recurrent" and shape[1] > recurrent_upto:
            row["peers"]["fla naive recurrent"] = {"skipped": f"T > {recurrent_upto} (--recurrent-upto)"}
            continue
        run = fla_peer(family, form == "chunk")
        leaves = {n: torch.from_numpy(x.copy()).requires_grad_() for n, x in a.items()}
        dout = torch.from_numpy(ours.do)
        name = f"fla naive {form}"
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                got = run(leaves)
                fwd = time.perf_counter() - t0

            def both(run=run, leaves=leaves, dout=dout):
                for x in leaves.values():
                    x.grad = None
                run(leaves).backward(dout)
            t0 = time.perf_counter()
            both()
            fb = time.perf_counter() - t0
            row["peers"][name] = {"fwd s": fwd, "fwd+bwd s": fb, "fwd ratio": fwd / row["ours fwd"],
                                  "fwd+bwd ratio": fb / row["ours fwd+bwd"],
                                  "o rel err": rel_err(got.detach().numpy(), o),
                                  "dv rel err": rel_err(leaves["v"].grad.numpy(), dv)}
        except Exception as exc:  # a reference that does not take this shape is reported, not fatal
            row["peers"][name] = {"failed": f"{type(exc).__name__}: {str(exc)[:160]}"}
    return row


def bench_ggml(family: str, shape: tuple, threads: int, repeats: int) -> dict:
    a = inputs(family, *shape)
    ours = Ours(family, a, threads)
    o = ours.forward().copy()
    row = {"family": family, "shape": shape, "ours fwd": timed(ours.forward, repeats)}
    try:
        run, close = ggml_peer(family, a, threads)
    except Exception as exc:
        return {**row, "ggml": {"failed": f"{type(exc).__name__}: {str(exc)[:160]}"}}
    try:
        err = rel_err(run(), o)
        t = timed(run, repeats)
        row["ggml"] = {"fwd s": t, "fwd ratio": t / row["ours fwd"], "o rel err": err}
    finally:
        close()
    return row


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--public" in argv:
        import delta_ops

        return delta_ops.main([a for a in argv if a != "--public"])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls of ours and ggml per entry (median)")
    ap.add_argument("--threads", type=int, default=2, help="threads for every contender")
    ap.add_argument("--only", default="", help="comma-separated families (deltanet, gated, kda, rwkv7)")
    ap.add_argument("--no-fla", action="store_true", help="skip fla's references (the slow part)")
    ap.add_argument("--recurrent-upto", type=int, default=1024,
                    help="run fla's recurrent references only up to this T (at (1, 1024, 8, 64, 64) they took "
                         "13 s forward and 60-90 s forward + backward, 3-23x their chunked forms)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    root = Path(__file__).resolve().parent
    path = root / "out" / "delta_rule_quick.json" if args.quick else root / "results" / "delta_rule.json"
    only = set(filter(None, args.only.split(","))) or set(FAMILIES)
    report: dict = {"threads": args.threads, "ggml": [], "fla": []}

    def save() -> None:  # after every entry, so that a long run leaves what it measured
        if args.json:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1, default=float))
    for family, shape in QUICK_GGML if args.quick else GGML:
        if family in only:
            r = bench_ggml(family, shape, args.threads, args.repeats)
            report["ggml"].append(r)
            save()
            g = r["ggml"]
            print(f"{family} {shape}: ours fwd {r['ours fwd'] * 1e3:.1f} ms; ggml " +
                  (f"{g['fwd s'] * 1e3:.1f} ms = {g['fwd ratio']:.2f}x ours (o rel err {g['o rel err']:.1e})"
                   if "fwd s" in g else g["failed"]), flush=True)
    for shape in () if args.no_fla else QUICK if args.quick else SHAPES:
        for family in FAMILIES:
            if family not in only:
                continue
            r = bench_fla(family, shape, args.threads, args.repeats, args.recurrent_upto)
            report["fla"].append(r)
            save()
            peers = "; ".join(f"{n}: fwd {p['fwd s'] * 1e3:.0f} ms ({p['fwd ratio']:.1f}x), fwd+bwd "
                              f"{p['fwd+bwd s'] * 1e3:.0f} ms ({p['fwd+bwd ratio']:.1f}x), o err "
                              f"{p['o rel err']:.1e}, dv err {p['dv rel err']:.1e}" if "fwd s" in p else
                              f"{n}: {next(iter(p.values()))}" for n, p in r["peers"].items())
            print(f"{family} {shape}: ours fwd {r['ours fwd'] * 1e3:.1f} ms, fwd+bwd {r['ours fwd+bwd'] * 1e3:.1f} "
                  f"ms; {peers}", flush=True)
    if args.json:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
