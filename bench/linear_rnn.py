"""Matrix-state recurrences (Mamba-2/SSD, GLA, RWKV-6, decode) on the CPU: the fused op against peers and bounds.

Ours is the fused ``matrix_state`` op called directly through the cpu backend's ``run_fused`` (the named
operations of ``scanweaver.matrix`` are thin elementwise layers over it: here the inputs are made in the op's
form beforehand, v = dt * x and g = dt * A for Mamba-2, so this bench does not depend on them).  Per shape,
float32, in one process, median of ``--repeats`` calls after a warm-up:

* ``ours fwd`` (the default algorithm for the shape), ``ours recurrent`` and ``ours chunked`` (both forced),
  ``ours fwd+bwd`` (forward, then the backward with every gradient);
* the peers of :mod:`linear_rnn_peers` (mamba-ssm ``ssd_minimal_discrete`` eager and ``torch.compile``;
  fla's naive recurrent / chunk PyTorch code; llama.cpp's ggml kernels; JAX), each checked against ours;
* the bounds: NumPy's single-precision matmul rate on a 2048^3 product (for the chunked form's FLOPs:
  2C(K+V) + 4KV per step and head), and the memory time of the inputs and outputs at the bandwidth of the
  roofline kernel (:mod:`scanweaver.runtime.roofline`; the recurrent form's traffic); for decode, the time
  of reading and writing the state once;
* ``peak extra``: the rise of the resident set's high-water mark during our first forward call, against the
  inputs plus outputs.

Usage::

    pip install fla-core ggml-python   # the peers (fla's naive files load without a GPU)
    python bench/linear_rnn.py [--json] [--quick] [--repeats N]

``--json`` writes bench/results/linear_rnn.json (``--quick``: bench/out/linear_rnn_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import linear_rnn_peers as peers  # noqa: E402
from mamba import peak_extra  # noqa: E402

from scanweaver.fused import REGISTRY as FUSED  # noqa: E402
from scanweaver.fused.matrix_state import MatrixStateFeatures  # noqa: E402
from scanweaver.runtime import get_backend  # noqa: E402
from scanweaver.runtime.roofline import bind_traffic  # noqa: E402

OP = FUSED.get("matrix_state")
#: (name, kind, batch, T, H, Hq, K, V): Mamba-2 (K = N, V = P, Hq = G), GLA, RWKV-6 (fla's test sizes).
SHAPES = (("mamba2 (2,2048,24,64,128) G=1", "ssd", 2, 2048, 24, 1, 128, 64),
          ("mamba2 (1,8192,24,64,128) G=1", "ssd", 1, 8192, 24, 1, 128, 64),
          ("gla (4,2048,16,64,64)", "gla", 4, 2048, 16, 16, 64, 64),
          ("gla (1,8192,8,128,128)", "gla", 1, 8192, 8, 8, 128, 128),
          ("rwkv6 (4,1024,4,64,64)", "rwkv6", 4, 1024, 4, 4, 64, 64))
DECODE = (("decode mamba2 b=1", "ssd", 1, 24, 1, 128, 64), ("decode mamba2 b=16", "ssd", 16, 24, 1, 128, 64),
          ("decode gla b=1", "gla", 1, 16, 16, 64, 64), ("decode gla b=16", "gla", 16, 16, 16, 64, 64))
QUICK = (("mamba2 quick", "ssd", 1, 256, 4, 1, 32, 16), ("gla quick", "gla", 1, 256, 2, 2, 16, 16),
         ("rwkv6 quick", "rwkv6", 1, 128, 2, 2, 16, 16))
QUICK_DECODE = (("decode quick", "gla", 2, 2, 2, 16, 16),)
FEATURES = {"ssd": ("scalar", "after"), "gla": ("key", "after"), "rwkv6": ("key", "bonus")}


def timed(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def inputs(kind: str, b: int, T: int, H: int, Hq: int, K: int, V: int, seed: int = 0) -> dict:
    """Operands in the op's form: Mamba-2's dt in (0.001, 0.1) and A = -(1..16) give g = dt*A, v = dt*x."""
    rng = np.random.default_rng(seed)
    f = np.float32
    a = {"q": rng.standard_normal((b, T, Hq, K), f), "k": rng.standard_normal((b, T, Hq, K), f) / np.sqrt(K),
         "v": rng.standard_normal((b, T, H, V), f)}
    if kind == "ssd":
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), (b, T, H))).astype(f)
        a["g"] = (dt * -(1 + 15 * rng.random(H, f))).astype(f)
        a["v"] *= dt[..., None]
    else:
        a["g"] = np.log(rng.uniform(0.9, 0.999, (b, T, H, K))).astype(f)
    if kind == "rwkv6":
        a["u"] = rng.standard_normal((H, K), f)
    return {n: np.ascontiguousarray(x, f) for n, x in a.items()}


class Ours:
    """Forward and backward of the fused op on prepared arrays (outputs allocated per call)."""

    def __init__(self, kind: str, a: dict, h0: bool = False, **tunables):
        self.be = get_backend("cpu")
        b, T, H, V = a["v"].shape
        K = a["q"].shape[-1]
        decay, readout = FEATURES[kind]
        self.f = MatrixStateFeatures("float32", K, V, decay, readout, has_h0=h0)
        self.a, self.sizes = a, {"batch": b, "T": T, "H": H, "Hq": a["q"].shape[2], "nseq": b}
        self.cfg = OP.resolve("c", tunables, self.be.fused_defaults(OP.name, self.f, self.sizes), "bench")
        self.fwd, self.bwd = OP.call("forward", self.f, self.cfg), OP.call("backward", self.f, self.cfg)
        self.do = np.random.default_rng(1).standard_normal(a["v"].shape).astype(np.float32)

    def forward(self):
        b, T, H, V = self.a["v"].shape
        out = {"o": np.empty((b, T, H, V), np.float32), "hlast": np.empty((b, H, self.f.K, V), np.float32)}
        self.be.run_fused(self.fwd, {**self.a, **out}, self.sizes)
        return out["o"], out["hlast"]

    def forward_backward(self):
        self.forward()
        got = {"dq": np.empty_like(self.a["q"]), "dk": np.empty_like(self.a["k"]), "dv": np.empty_like(self.a["v"]),
               "dg": np.empty_like(self.a["g"]), "du": np.empty_like(self.a["u"]) if "u" in self.a else None}
        self.be.run_fused(self.bwd, {**self.a, "do": self.do, **got}, self.sizes)
        return got


def peer_list(kind: str, a: dict, threads: int) -> dict:
    """name -> (run, close) of every peer of ``kind`` (a failing loader becomes a skip reason)."""
    makers = {"ssd": [("mamba-ssm ssd_minimal_discrete", lambda: peers.torch_ssd(a)),
                      ("mamba-ssm ssd_minimal_discrete (torch.compile)", lambda: peers.torch_ssd(a, compiled=True)),
                      ("ggml_ssm_scan", lambda: peers.ggml_peer(a, "ssd", threads)),
                      ("JAX chunked (jit)", lambda: peers.jax_peer(a, "ssd"))],
              "gla": [("fla naive_recurrent_gla", lambda: peers.torch_gla(a, "recurrent")),
                      ("ggml_gated_linear_attn", lambda: peers.ggml_peer(a, "gla", threads)),
                      ("JAX lax.scan (jit)", lambda: peers.jax_peer(a, "gla"))],
              "rwkv6": [("fla naive_recurrent_rwkv6", lambda: peers.torch_rwkv6(a)),
                        ("ggml_rwkv_wkv6", lambda: peers.ggml_peer(a, "rwkv6", threads)),
                        ("JAX lax.scan (jit)", lambda: peers.jax_peer(a, "rwkv6"))]}[kind]
    out = {}
    for name, make in makers:
        try:
            made = make()
            out[name] = made if isinstance(made, tuple) else (made, lambda: None)
        except Exception as exc:  # a missing or broken peer is reported, never fatal
            out[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out


def grad_peer_list(kind: str, a: dict, do: np.ndarray) -> dict:
    """name -> run() -> dv of every peer of ``kind`` with a backward (a failing loader becomes a skip reason)."""
    makers = {"ssd": [("mamba-ssm ssd_minimal_discrete", lambda: peers.torch_grad(a, "ssd", do)),
                      ("mamba-ssm ssd_minimal_discrete (torch.compile)",
                       lambda: peers.torch_grad(a, "ssd", do, compiled=True)),
                      ("JAX chunked (jit grad)", lambda: peers.jax_grad(a, "ssd", do))],
              "gla": [("fla naive_recurrent_gla", lambda: peers.torch_grad(a, "gla", do)),
                      ("JAX lax.scan (jit grad)", lambda: peers.jax_grad(a, "gla", do))],
              "rwkv6": [("fla naive_recurrent_rwkv6", lambda: peers.torch_grad(a, "rwkv6", do)),
                        ("JAX lax.scan (jit grad)", lambda: peers.jax_grad(a, "rwkv6", do))]}[kind]
    out: dict = {}
    for name, make in makers:
        try:
            out[name] = make()
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out


def bench_grad_peers(row: dict, kind: str, a: dict, ours: Ours, max_fwd_s: float) -> None:
    """Forward + backward of the peers that have a backward, into ``row["peers fwd+bwd"]``; one warm-up and one
    timed call each (their backward is a multiple of their forward).  A peer whose forward alone took more than
    ``max_fwd_s`` is skipped with the reason (it cannot be the fastest)."""
    got_dv = ours.forward_backward()["dv"]
    row["peers fwd+bwd"] = {}
    for pname, run in grad_peer_list(kind, a, ours.do).items():
        fwd = row["peers"].get(pname, {}).get("s")
        if isinstance(run, str):
            row["peers fwd+bwd"][pname] = {"skipped": run}
        elif fwd is not None and fwd > max_fwd_s:
            row["peers fwd+bwd"][pname] = {"skipped": f"its forward alone took {fwd:.1f} s (> {max_fwd_s} s)"}
        else:
            try:
                err = float(np.abs(run() - got_dv).max() / np.abs(got_dv).max())
                row["peers fwd+bwd"][pname] = {"s": timed(run, 1), "rel_err_dv_vs_ours": err}
            except Exception as exc:
                row["peers fwd+bwd"][pname] = {"failed": f"{type(exc).__name__}: {str(exc)[:160]}"}
    fastest = min((p["s"] for p in row["peers fwd+bwd"].values() if "s" in p), default=None)
    if fastest:
        row["fastest_peer_fwdbwd_s"] = fastest
        row["fwdbwd_speedup_vs_fastest"] = fastest / row["ours fwd+bwd"]


def bounds(repeats: int) -> dict:
    """The machine's sgemm rate (FLOP/s) and memory bandwidth (bytes/s, read + write) in this process."""
    x = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    t = timed(lambda: x @ x, repeats)
    n = 1 << 24
    call = bind_traffic(1, n, "float32", reads=4, writes=1)
    tm = timed(call, repeats)
    return {"sgemm_flops": 2 * 2048 ** 3 / t, "bandwidth_bytes_s": 5 * 4 * n / tm}


def bench_shape(name, kind, b, T, H, Hq, K, V, bnd: dict, repeats: int, threads: int, grad_peers: bool = True,
                max_fwd_s: float = 5.0) -> dict:
    a = inputs(kind, b, T, H, Hq, K, V)
    ours = Ours(kind, a)
    (o, _), extra = peak_extra(ours.forward)
    io = sum(x.nbytes for x in a.values()) + o.nbytes + b * H * K * V * 4
    row = {"shape": name, "algorithm": ours.cfg["algorithm"], "peak_extra_over_io": extra / io}
    row["ours fwd"] = timed(ours.forward, repeats)
    for alg in ("recurrent", "chunked"):
        row[f"ours {alg}"] = timed(Ours(kind, a, algorithm=alg).forward, repeats)
    row["ours fwd+bwd"] = timed(ours.forward_backward, max(1, repeats // 2))
    flops = b * H * T * (2 * 64 * (K + V) + 4 * K * V)
    row["chunked_matmul_fraction"] = flops / row["ours chunked"] / bnd["sgemm_flops"]
    row["memory_time_s"] = io / bnd["bandwidth_bytes_s"]
    row["peers"] = {}
    for pname, got in peer_list(kind, a, threads).items():
        if isinstance(got, str):
            row["peers"][pname] = {"skipped": got}
            continue
        run, close = got
        try:
            err = float(np.abs(run() - o).max() / np.abs(o).max())
            row["peers"][pname] = {"s": timed(run, max(1, repeats // 2)), "rel_err_vs_ours": err}
        except Exception as exc:
            row["peers"][pname] = {"failed": f"{type(exc).__name__}: {str(exc)[:160]}"}
        finally:
            close()
    fastest = min((p["s"] for p in row["peers"].values() if "s" in p), default=None)
    if fastest:
        row["fastest_peer_s"] = fastest
        row["fwd_speedup_vs_fastest"] = fastest / row["ours fwd"]
    if grad_peers:
        bench_grad_peers(row, kind, a, ours, max_fwd_s)
    return row


def bench_decode(name, kind, b, H, Hq, K, V, bnd: dict, repeats: int) -> dict:
    a = inputs(kind, b, 1, H, Hq, K, V)
    a["h0"] = np.random.default_rng(2).standard_normal((b, H, K, V)).astype(np.float32)
    ours = Ours(kind, a, h0=True)
    t = timed(ours.forward, repeats * 20)
    state = 2 * b * H * K * V * 4
    return {"shape": name, "s": t, "state_memory_s": state / bnd["bandwidth_bytes_s"],
            "ratio_to_memory_time": t / (state / bnd["bandwidth_bytes_s"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per entry (median)")
    ap.add_argument("--no-grad-peers", action="store_true", help="skip the peers' forward + backward")
    ap.add_argument("--max-peer-fwd", type=float, default=5.0,
                    help="skip the forward + backward of a peer whose forward took longer (seconds)")
    ap.add_argument("--only", default="", help="comma-separated kinds to run (ssd, gla, rwkv6, decode)")
    args = ap.parse_args(argv)
    threads = os.cpu_count() or 1
    root = Path(__file__).resolve().parent
    path = root / "out" / "linear_rnn_quick.json" if args.quick else root / "results" / "linear_rnn.json"
    bnd = bounds(args.repeats)
    report: dict = {"bounds": bnd, "shapes": [], "decode": [], "threads": threads}

    def save() -> None:  # after every entry, so that a long run leaves what it measured
        if args.json:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1, default=float))
    print(f"bounds: sgemm {bnd['sgemm_flops'] / 1e9:.1f} GFLOP/s, memory {bnd['bandwidth_bytes_s'] / 1e9:.1f} GB/s",
          flush=True)
    only = set(filter(None, args.only.split(",")))
    for s in QUICK_DECODE if args.quick else DECODE:
        if only and "decode" not in only:
            continue
        d = bench_decode(*s, bnd, args.repeats)
        report["decode"].append(d)
        save()
        print(f"{d['shape']}: {d['s'] * 1e6:.1f} us, {d['ratio_to_memory_time']:.2f}x the state's memory time",
              flush=True)
    for s in QUICK if args.quick else SHAPES:
        if only and s[1] not in only:
            continue
        r = bench_shape(*s, bnd, args.repeats, threads, not args.no_grad_peers, args.max_peer_fwd)
        report["shapes"].append(r)
        save()
        peers_txt = ", ".join(f"{n} {p['s'] * 1e3:.1f} ms" if "s" in p else f"{n}: {next(iter(p.values()))}"
                              for n, p in r["peers"].items())
        print(f"{r['shape']}: ours fwd {r['ours fwd'] * 1e3:.1f} ms ({r['algorithm']}), recurrent "
              f"{r['ours recurrent'] * 1e3:.1f}, chunked {r['ours chunked'] * 1e3:.1f}, fwd+bwd "
              f"{r['ours fwd+bwd'] * 1e3:.1f}; chunked/matmul {r['chunked_matmul_fraction']:.2f}; peak extra "
              f"{r['peak_extra_over_io']:.2f}x io; peers: {peers_txt}", flush=True)
        if "peers fwd+bwd" in r:
            print("  fwd+bwd peers: " + ", ".join(f"{n} {p['s'] * 1e3:.1f} ms" if "s" in p else
                                                f"{n}: {next(iter(p.values()))}"
                                                for n, p in r["peers fwd+bwd"].items()), flush=True)
    if args.json:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
