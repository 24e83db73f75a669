"""Matrix-state recurrences (Mamba-2/SSD, GLA, RWKV-6, decode) on the CPU: both algorithms against peers and bounds.

Ours is the fused ``matrix_state`` op called directly through the cpu backend's ``run_fused`` (the named
operations of ``scanweaver.matrix`` are thin elementwise layers over it: here the inputs are made in the op's
form beforehand, v = dt * x and g = dt * A for Mamba-2, so this bench does not depend on them).  Per shape,
float32, in one process, the median of ``--repeats`` calls after a warm-up, every variant of a shape timed
round-robin (a loaded machine slows them alike):

* ``ours recurrent`` / ``ours chunked``: the forward of each algorithm; ``... backward``: the backward alone
  (every gradient; it recomputes the states); ``... fwd+bwd``: both;
* ``chunked_sgemm_fraction``: the chunked forward's rate against NumPy's single-precision matmul rate measured
  in this process on every core, counting the chunked form's nominal work, 2*64*(K+V) + 4KV flops per step and
  head (chunk 64, the masked half of the intra-chunk products included, the sharing of Q K^T by a group's heads
  not credited: a faster kernel is a larger fraction, whatever it skips);
* the peers of :mod:`linear_rnn_peers` (mamba-ssm ``ssd_minimal_discrete`` and fla's naive chunk code, eager and
  ``torch.compile`` d; fla's naive recurrent code; llama.cpp's ggml kernels; JAX), each checked against ours,
  forward and forward + backward;
* ``scaling``: long prompts with few heads (T = 32768, batch x heads = 4), the chunked forward and backward on
  every core against one thread;
* the algorithm table (``--table``): which algorithm is faster, forward and backward, over a sweep of shapes
  (T, K = V, heads, a decay per head with groups or per key, batch), written to
  ``bench/results/linear_rnn_algorithms.json``, from which the default algorithm rule is read
  (``MatrixState.chunked_from``).

Usage::

    pip install fla-core ggml-python==0.0.45   # the peers (fla's naive files load without a GPU)
    python bench/linear_rnn.py [--json] [--quick] [--table] [--repeats N] [--only ssd,gla] [--peers ggml]

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
from linear_rnn_table import algorithm_table  # noqa: E402
from mamba import peak_extra  # noqa: E402

from scanweaver.fused import REGISTRY as FUSED  # noqa: E402
from scanweaver.fused.matrix_state import MatrixStateFeatures  # noqa: E402
from scanweaver.runtime import get_backend  # noqa: E402
from scanweaver.runtime.host_pool import host_output  # noqa: E402
from scanweaver.runtime.roofline import bind_traffic  # noqa: E402

OP = FUSED.get("matrix_state")
ALGORITHMS = ("recurrent", "chunked")
#: (name, kind, batch, T, H, Hq, K, V): Mamba-2 (K = N, V = P, Hq = G), GLA, RWKV-6 (fla's test sizes).
SHAPES = (("mamba2 (2,2048,24,64,128) G=1", "ssd", 2, 2048, 24, 1, 128, 64),
          ("mamba2 (1,8192,24,64,128) G=1", "ssd", 1, 8192, 24, 1, 128, 64),
          ("gla (4,2048,16,64,64)", "gla", 4, 2048, 16, 16, 64, 64),
          ("gla (1,8192,8,128,128)", "gla", 1, 8192, 8, 8, 128, 128),
          ("rwkv6 (4,1024,4,64,64)", "rwkv6", 4, 1024, 4, 4, 64, 64))
#: Long prompts with few heads: batch x heads = 4.
SCALING = (("gla (1,32768,4,64,64)", "gla", 1, 32768, 4, 4, 64, 64),
           ("mamba2 (1,32768,4,64,128) G=1", "ssd", 1, 32768, 4, 1, 128, 64))
DECODE = (("decode mamba2 b=1", "ssd", 1, 24, 1, 128, 64), ("decode mamba2 b=16", "ssd", 16, 24, 1, 128, 64),
          ("decode gla b=1", "gla", 1, 16, 16, 64, 64), ("decode gla b=16", "gla", 16, 16, 16, 64, 64))
QUICK = (("mamba2 quick", "ssd", 1, 256, 4, 1, 32, 16), ("gla quick", "gla", 1, 256, 2, 2, 16, 16),
         ("rwkv6 quick", "rwkv6", 1, 128, 2, 2, 16, 16))
QUICK_SCALING = (("gla quick scaling", "gla", 1, 2048, 1, 1, 16, 16),)
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


def round_robin(fns: dict, repeats: int) -> dict:
    """name -> median seconds of ``repeats`` calls of each function, one call of each in turn (after a warm-up)."""
    for fn in fns.values():
        fn()
    ts: dict = {n: [] for n in fns}
    for _ in range(repeats):
        for n, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            ts[n].append(time.perf_counter() - t0)
    return {n: statistics.median(v) for n, v in ts.items()}


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
    """Forward and backward of the fused op on prepared arrays, the outputs from the host pool as the public
    calls take them (:func:`scanweaver.runtime.host_pool.host_output`: the arrays of the last call, dropped, are
    reused; the gradients zeroed first)."""

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
        out = {"o": host_output((b, T, H, V), np.float32, self.a["v"]),
               "hlast": host_output((b, H, self.f.K, V), np.float32)}
        self.be.run_fused(self.fwd, {**self.a, **out}, self.sizes)
        return out["o"], out["hlast"]

    def backward(self):
        def zeros(name):
            x = self.a.get(name)
            return None if x is None else host_output(x.shape, x.dtype, x, zero=True)
        got = {"d" + n: zeros(n) for n in ("q", "k", "v", "g", "u")}
        self.be.run_fused(self.bwd, {**self.a, "do": self.do, **got}, self.sizes)
        return got

    def forward_backward(self):
        self.forward()
        return self.backward()


def nominal_flops(b: int, T: int, H: int, K: int, V: int) -> float:
    """The chunked form's nominal work (see the module notes)."""
    return b * H * T * (2 * 64 * (K + V) + 4 * K * V)


def picked(name: str, pick: tuple[str, ...]) -> bool:
    """Whether the peer ``name`` runs: every peer without ``--peers``, else those whose name contains one of them."""
    return not pick or any(p in name for p in pick)


def peer_list(kind: str, a: dict, threads: int, pick: tuple[str, ...] = ()) -> dict:
    """name -> (run, close) of every peer of ``kind`` picked by ``pick`` (a failing loader becomes a skip reason)."""
    makers = {"ssd": [("mamba-ssm ssd_minimal_discrete", lambda: peers.torch_ssd(a)),
                      ("mamba-ssm ssd_minimal_discrete (torch.compile)", lambda: peers.torch_ssd(a, compiled=True)),
                      ("fla naive_chunk_simple_gla", lambda: peers.torch_chunk_simple_gla(a)),
                      ("fla naive_chunk_simple_gla (torch.compile)",
                       lambda: peers.torch_chunk_simple_gla(a, compiled=True)),
                      ("ggml_ssm_scan", lambda: peers.ggml_peer(a, "ssd", threads)),
                      ("JAX chunked (jit)", lambda: peers.jax_peer(a, "ssd"))],
              "gla": [("fla naive_recurrent_gla", lambda: peers.torch_gla(a)),
                      ("ggml_gated_linear_attn", lambda: peers.ggml_peer(a, "gla", threads)),
                      ("JAX lax.scan (jit)", lambda: peers.jax_peer(a, "gla"))],
              "rwkv6": [("fla naive_recurrent_rwkv6", lambda: peers.torch_rwkv6(a)),
                        ("ggml_rwkv_wkv6", lambda: peers.ggml_peer(a, "rwkv6", threads)),
                        ("JAX lax.scan (jit)", lambda: peers.jax_peer(a, "rwkv6"))]}[kind]
    out = {}
    for name, make in makers:
        if not picked(name, pick):
            continue
        try:
            made = make()
            out[name] = made if isinstance(made, tuple) else (made, lambda: None)
        except Exception as exc:  # a missing or broken peer is reported, never fatal
            out[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out


def grad_peer_list(kind: str, a: dict, do: np.ndarray, pick: tuple[str, ...] = ()) -> dict:
    """name -> run() -> dv of every peer of ``kind`` with a backward picked by ``pick`` (a failing loader becomes a
    skip reason)."""
    makers = {"ssd": [("mamba-ssm ssd_minimal_discrete", lambda: peers.torch_grad(a, "ssd", do)),
                      ("mamba-ssm ssd_minimal_discrete (torch.compile)",
                       lambda: peers.torch_grad(a, "ssd", do, compiled=True)),
                      ("fla naive_chunk_simple_gla", lambda: peers.torch_grad(a, "simple_gla_chunk", do)),
                      ("fla naive_chunk_simple_gla (torch.compile)",
                       lambda: peers.torch_grad(a, "simple_gla_chunk", do, compiled=True)),
                      ("JAX chunked (jit grad)", lambda: peers.jax_grad(a, "ssd", do))],
              "gla": [("fla naive_recurrent_gla", lambda: peers.torch_grad(a, "gla", do)),
                      ("fla naive_recurrent_gla (torch.compile)", lambda: compiled_loop(a, do)),
                      ("JAX lax.scan (jit grad)", lambda: peers.jax_grad(a, "gla", do))],
              "rwkv6": [("fla naive_recurrent_rwkv6", lambda: peers.torch_grad(a, "rwkv6", do)),
                        ("JAX lax.scan (jit grad)", lambda: peers.jax_grad(a, "rwkv6", do))]}[kind]
    out: dict = {}
    for name, make in makers:
        if not picked(name, pick):
            continue
        try:
            out[name] = make()
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    return out


#: The most steps of fla's naive recurrent GLA that ``torch.compile`` is given: it unrolls the Python loop over
#: T, and at 2048 steps its compile of the forward and backward ran for over 40 minutes on 2 cores.
MAX_COMPILED_LOOP = 512


def compiled_loop(a: dict, do: np.ndarray):
    """fla's naive recurrent GLA under ``torch.compile`` with autograd, or the reason it is skipped."""
    T = a["v"].shape[1]
    if T > MAX_COMPILED_LOOP:
        return f"torch.compile unrolls its loop over T = {T} steps (compiled only up to {MAX_COMPILED_LOOP})"
    return peers.torch_grad(a, "gla", do, compiled=True)


def bench_peers(row: dict, made: dict, check: np.ndarray, key: str, repeats: int, max_s: float, fwd: dict) -> None:
    """Times the peers of ``made`` (name -> run or (run, close) or a skip reason) into ``row[key]``, each checked
    against ``check`` first; skips a peer whose forward alone (``fwd``) took more than ``max_s``."""
    row[key] = {}
    for pname, got in made.items():
        if isinstance(got, str):
            row[key][pname] = {"skipped": got}
            continue
        run, close = got if isinstance(got, tuple) else (got, lambda: None)
        if fwd.get(pname, {}).get("s", 0) > max_s:
            row[key][pname] = {"skipped": f"its forward alone took {fwd[pname]['s']:.1f} s (> {max_s} s)"}
            continue
        try:
            err = float(np.abs(run() - check).max() / np.abs(check).max())
            row[key][pname] = {"s": timed(run, repeats), "rel_err_vs_ours": err}
        except Exception as exc:
            row[key][pname] = {"failed": f"{type(exc).__name__}: {str(exc)[:160]}"}
        finally:
            close()


def bounds(repeats: int) -> dict:
    """The machine's sgemm rate (FLOP/s, every core) and memory bandwidth (bytes/s, read + write) in this process."""
    x = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    t = timed(lambda: x @ x, repeats)
    n = 1 << 24
    call = bind_traffic(1, n, "float32", reads=4, writes=1)
    tm = timed(call, repeats)
    return {"sgemm_flops": 2 * 2048 ** 3 / t, "bandwidth_bytes_s": 5 * 4 * n / tm}


def bench_shape(name, kind, b, T, H, Hq, K, V, bnd: dict, repeats: int, threads: int, with_peers: bool = True,
                max_peer_s: float = 5.0, pick: tuple[str, ...] = ()) -> dict:
    a = inputs(kind, b, T, H, Hq, K, V)
    ours = {alg: Ours(kind, a, algorithm=alg) for alg in ALGORITHMS}
    (o, _), extra = peak_extra(ours["chunked"].forward)
    io = sum(x.nbytes for x in a.values()) + o.nbytes + b * H * K * V * 4
    row: dict = {"shape": name, "kind": kind, "peak_extra_over_io": extra / io}
    fns = {f"ours {alg}": ours[alg].forward for alg in ALGORITHMS}
    fns.update({f"ours {alg} backward": ours[alg].backward for alg in ALGORITHMS})
    row.update(round_robin(fns, repeats))
    for alg in ALGORITHMS:
        row[f"ours {alg} fwd+bwd"] = row[f"ours {alg}"] + row[f"ours {alg} backward"]
    row["chunked_speedup_fwd"] = row["ours recurrent"] / row["ours chunked"]
    row["chunked_speedup_bwd"] = row["ours recurrent backward"] / row["ours chunked backward"]
    row["faster fwd"] = min(ALGORITHMS, key=lambda alg: row[f"ours {alg}"])
    row["faster bwd"] = min(ALGORITHMS, key=lambda alg: row[f"ours {alg} backward"])
    best_fwd, best_fb = row[f"ours {row['faster fwd']}"], min(row[f"ours {alg} fwd+bwd"] for alg in ALGORITHMS)
    row["chunked_sgemm_fraction"] = nominal_flops(b, T, H, K, V) / row["ours chunked"] / bnd["sgemm_flops"]
    row["memory_time_s"] = io / bnd["bandwidth_bytes_s"]
    rec = ours["recurrent"].forward()[0]
    row["chunked_vs_recurrent_rel_err"] = float(np.abs(o - rec).max() / np.abs(rec).max())
    if not with_peers:
        return row
    bench_peers(row, peer_list(kind, a, threads, pick), o, "peers", max(1, repeats // 2), float("inf"), {})
    fastest = min((p["s"] for p in row["peers"].values() if "s" in p), default=None)
    if fastest:
        row["fastest_peer_s"], row["fwd_speedup_vs_fastest"] = fastest, fastest / best_fwd
    dv = ours["chunked"].backward()["dv"]
    bench_peers(row, grad_peer_list(kind, a, ours["chunked"].do, pick), dv, "peers fwd+bwd", 1, max_peer_s,
                row["peers"])
    fastest = min((p["s"] for p in row["peers fwd+bwd"].values() if "s" in p), default=None)
    if fastest:
        row["fastest_peer_fwdbwd_s"], row["fwdbwd_speedup_vs_fastest"] = fastest, fastest / best_fb
    return row


def bench_scaling(name, kind, b, T, H, Hq, K, V, repeats: int, threads: int) -> dict:
    """The chunked form on every core against one thread, forward and backward."""
    a = inputs(kind, b, T, H, Hq, K, V)
    one, every = Ours(kind, a, algorithm="chunked", threads=1), Ours(kind, a, algorithm="chunked", threads=threads)
    t = round_robin({"fwd 1 thread": one.forward, f"fwd {threads} threads": every.forward,
                     "bwd 1 thread": one.backward, f"bwd {threads} threads": every.backward}, repeats)
    return {"shape": name, "threads": threads, **t,
            "fwd_speedup": t["fwd 1 thread"] / t[f"fwd {threads} threads"],
            "bwd_speedup": t["bwd 1 thread"] / t[f"bwd {threads} threads"]}


def bench_decode(name, kind, b, H, Hq, K, V, bnd: dict, repeats: int) -> dict:
    a = inputs(kind, b, 1, H, Hq, K, V)
    a["h0"] = np.random.default_rng(2).standard_normal((b, H, K, V)).astype(np.float32)
    ours = Ours(kind, a, h0=True)
    t = timed(ours.forward, repeats * 20)
    state = 2 * b * H * K * V * 4
    return {"shape": name, "s": t, "state_memory_s": state / bnd["bandwidth_bytes_s"],
            "ratio_to_memory_time": t / (state / bnd["bandwidth_bytes_s"])}


def _ratio(row: dict, key: str) -> str:
    """A speedup as printed: ``n/a`` where no peer ran (``--no-peers``, or ``--peers`` naming none with a
    backward)."""
    return f"{row[key]:.2f}x" if key in row else "n/a (no peer ran)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run)")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per entry (median)")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers")
    ap.add_argument("--max-peer-fwd", type=float, default=5.0,
                    help="skip the forward + backward of a peer whose forward took longer (seconds)")
    ap.add_argument("--only", default="", help="comma-separated parts to run (ssd, gla, rwkv6, decode, scaling)")
    ap.add_argument("--peers", default="",
                    help="comma-separated parts of peer names to run (e.g. ggml,JAX); every peer without it")
    ap.add_argument("--table", action="store_true", help="also sweep shapes for the algorithm table")
    args = ap.parse_args(argv)
    threads = os.cpu_count() or 1
    root = Path(__file__).resolve().parent
    out = root / "out" if args.quick else root / "results"
    path = out / ("linear_rnn_quick.json" if args.quick else "linear_rnn.json")
    bnd = bounds(args.repeats)
    report: dict = {"bounds": bnd, "shapes": [], "scaling": [], "decode": [], "threads": threads}
    only = set(filter(None, args.only.split(",")))
    kept = json.loads(path.read_text()) if only and args.json and path.exists() else {}

    def save() -> None:  # after every entry, so that a long run leaves what it measured
        if args.json:  # with --only, the rows of the file's last contents that this run did not measure stay
            merged = {**report}
            for part in ("shapes", "scaling", "decode"):
                seen = {r["shape"] for r in report[part]}
                merged[part] = [r for r in kept.get(part, []) if r["shape"] not in seen] + report[part]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(merged, indent=1, default=float))
    print(f"bounds: sgemm {bnd['sgemm_flops'] / 1e9:.1f} GFLOP/s, memory {bnd['bandwidth_bytes_s'] / 1e9:.1f} GB/s",
          flush=True)
    for s in (QUICK_DECODE if args.quick else DECODE) if not only or "decode" in only else ():
        report["decode"].append(bench_decode(*s, bnd, args.repeats))
        save()
        print(f"{s[0]}: {report['decode'][-1]['s'] * 1e6:.1f} us", flush=True)
    for s in QUICK if args.quick else SHAPES:
        if only and s[1] not in only:
            continue
        r = bench_shape(*s, bnd, args.repeats, threads, not args.no_peers, args.max_peer_fwd,
                        tuple(filter(None, args.peers.split(","))))
        report["shapes"].append(r)
        save()
        print(f"{r['shape']}: fwd recurrent {r['ours recurrent'] * 1e3:.1f} ms, chunked {r['ours chunked'] * 1e3:.1f} "
              f"({r['chunked_speedup_fwd']:.2f}x); bwd recurrent {r['ours recurrent backward'] * 1e3:.1f}, chunked "
              f"{r['ours chunked backward'] * 1e3:.1f} ({r['chunked_speedup_bwd']:.2f}x); chunked/sgemm "
              f"{r['chunked_sgemm_fraction']:.2f}; vs fastest peer fwd {_ratio(r, 'fwd_speedup_vs_fastest')}, "
              f"fwd+bwd {_ratio(r, 'fwdbwd_speedup_vs_fastest')}", flush=True)
    for s in (QUICK_SCALING if args.quick else SCALING) if not only or "scaling" in only else ():
        r = bench_scaling(*s, args.repeats, threads)
        report["scaling"].append(r)
        save()
        print(f"{r['shape']}: {threads} threads / 1: fwd {r['fwd_speedup']:.2f}x, bwd {r['bwd_speedup']:.2f}x",
              flush=True)
    if args.table:
        table = algorithm_table(Ours, inputs, round_robin, args.repeats, quick=args.quick)
        (out / f"linear_rnn_algorithms{'_quick' if args.quick else ''}.json").write_text(json.dumps(table, indent=1))
        for e in table["shapes"]:
            print(f"{e['shape']}: forward {e['forward']['faster']}, backward {e['backward']['faster']}", flush=True)
    if args.json:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
