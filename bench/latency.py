"""Per-call latency from tiny to large problems: the public call against the bare kernel and the peers.

For each shape (B, D, L), float32, y = c*h, in one process and round-robin (every
entry timed in turn, many rounds, the median of each entry's per-call times):

* ``public``: ``scanweaver.selective_scan(a, b, x, c)`` (allocates ``y``);
* ``public out=``: the same into a reused output;
* ``plan``: an explicit ``scanweaver.plan(...)`` called with ``out=``;
* ``bare kernel``: the compiled C function the public call runs, called through
  ctypes with its arguments prepared once (the floor: no Python work per call
  beyond the ctypes call itself);
* ``JAX``: ``jax.jit`` of ``lax.associative_scan`` over (a, b*x) pairs, times c;
* ``torch.compile``: PyTorch's ``associative_scan`` under ``torch.compile`` (about a
  minute of compilation per shape on 2 cores, excluded; ``--no-compile`` skips it).

Every entry is checked against the float64 oracle before it is timed. The
overhead of the public call is ``public - bare kernel``, paired by round. Targets
(this CPU): overhead at most 10 us for every shape where the kernel's own spread
(interquartile range) is below 10 us, so that the difference can resolve it (on
larger shapes it is reported beside that spread), and ScanWeaver faster than JAX
and torch.compile at every shape.

Usage::

    python bench/latency.py [--json] [--no-compile] [--rounds 30] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import scanweaver
from scanweaver.api import SELECTIVE
from scanweaver.benchmarks.machine import host_cpu
from scanweaver.runtime import get_backend
from scanweaver.runtime.base import ScanArrays
from scanweaver.targets.reference import oracle

SHAPES = [(1, 1, 16), (1, 1, 64), (1, 1, 256), (1, 16, 1024), (8, 16, 256), (1, 256, 1024), (8, 64, 1024),
          (8, 512, 4096)]
OVERHEAD_TARGET_US = 10.0


def operands(shape, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
    return {"a": a, **{k: rng.standard_normal(shape).astype(np.float32) for k in ("b", "x", "c")}}


def answer(ops):
    lanes = int(np.prod(ops["a"].shape[:-1]))
    flat = {k: v.reshape(lanes, -1) for k, v in ops.items()}
    return oracle(SELECTIVE.stages.affine, flat)[0].reshape(ops["a"].shape)


def entries(ops, compile_torch: bool):
    """name -> (call, result getter) for every entry that can run here, or the reason it cannot."""
    a, b, x, c = (ops[k] for k in "abxc")
    out = np.empty_like(a)
    found, skipped = {}, {}
    found["public"] = (lambda: scanweaver.selective_scan(a, b, x, c), None)
    found["public out="] = (lambda: scanweaver.selective_scan(a, b, x, c, out=out), lambda: out)
    plan = scanweaver.plan(scanweaver.selective_scan, a.shape, np.float32)
    out2 = np.empty_like(a)
    found["plan"] = (lambda: plan(a, b, x, c, out=out2), lambda: out2)
    scanweaver.selective_scan(a, b, x, c)
    info = SELECTIVE.last
    if info.backend == "cpu":
        be = get_backend("cpu")
        lanes, L = int(np.prod(a.shape[:-1])), a.shape[-1]
        arrays = ScanArrays(inputs={k: v.reshape(lanes, L) for k, v in ops.items()}, h0=None, reset=None,
                            batch_shape=a.shape[:-1], dtype=np.dtype(np.float32))
        y3, h3 = np.empty((lanes, L), np.float32), np.empty(lanes, np.float32)
        found["bare kernel"] = (be.bind(info.stages, arrays, y3, h3), lambda: y3.reshape(a.shape))
    else:
        skipped["bare kernel"] = f"the default backend here is {info.backend!r}, not cpu"
    try:
        from scanweaver.benchmarks.peers.jax_peers import JaxAssociativeScan

        why = JaxAssociativeScan().availability()
        if why:
            skipped["JAX"] = why
        else:
            found["JAX"] = (JaxAssociativeScan().prepare(ops), None)
    except Exception as exc:  # a peer that breaks is reported, not fatal
        skipped["JAX"] = f"{type(exc).__name__}: {exc}"
    if compile_torch:
        try:
            from scanweaver.benchmarks.peers.torch_peers import TorchAssociativeScanCompiled

            why = TorchAssociativeScanCompiled().availability()
            if why:
                skipped["torch.compile"] = why
            else:
                found["torch.compile"] = (TorchAssociativeScanCompiled().prepare(ops), None)
        except Exception as exc:
            skipped["torch.compile"] = f"{type(exc).__name__}: {exc}"
    else:
        skipped["torch.compile"] = "--no-compile"
    return found, skipped


def check(name, fn, getter, want) -> str | None:
    got = fn()
    got = getter() if getter is not None else got
    got = np.asarray(got.numpy() if hasattr(got, "numpy") else got, np.float64)
    err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
    return None if err < 1e-4 else f"wrong result (relative error {err:.2e})"


def measure(found: dict, rounds: int) -> dict[str, list[float]]:
    """Per-call seconds of each entry in every round, timed round-robin in batches of about 2 ms."""
    inner = {}
    for name, (fn, _) in found.items():
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < 0.01:
            fn()
            n += 1
        inner[name] = max(1, int(n * 0.2))
    samples: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(rounds):
        for name, (fn, _) in found.items():
            k = inner[name]
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            samples[name].append((time.perf_counter() - t0) / k)
    return samples


def run(rounds: int, compile_torch: bool, shapes=SHAPES) -> dict:
    rows = []
    for shape in shapes:
        ops = operands(shape)
        want = answer(ops)
        found, skipped = entries(ops, compile_torch)
        for name in list(found):
            fn, getter = found[name]
            for _ in range(3):
                fn()  # warm-up: compiles, builds plans, fills caches
            why = check(name, fn, getter, want)
            if why:
                skipped[name] = why
                del found[name]
        samples = {name: np.asarray(v) * 1e6 for name, v in measure(found, rounds).items()}
        us = {name: float(np.median(v)) for name, v in samples.items()}
        row = {"shape": list(shape), "elements": int(np.prod(shape)), "us": us, "skipped": skipped,
               "config": SELECTIVE.last.config, "backend": SELECTIVE.last.backend,
               "iqr_us": {name: float(np.subtract(*np.percentile(v, [75, 25]))) for name, v in samples.items()}}
        if "bare kernel" in samples:
            # Paired by round (each round times every entry back to back), so slow drift cancels; the
            # kernel's own run-to-run spread (iqr_us) bounds what the difference can resolve.
            row["overhead_us"] = {k: float(np.median(samples[k] - samples["bare kernel"]))
                                  for k in ("public", "public out=", "plan") if k in samples}
        peers = [us[k] for k in ("JAX", "torch.compile") if k in us]
        if peers:
            row["fastest_peer_over_public"] = min(peers) / us["public"]
        rows.append(row)
        print(f"  {shape} done", file=sys.stderr)
    # The overhead is resolved where the kernel's own spread is below the target; on larger shapes the
    # public-minus-kernel difference is reported (and as a fraction of the kernel) but it is noise there.
    for r in rows:
        if "overhead_us" in r:
            r["overhead_resolved"] = r["iqr_us"]["bare kernel"] <= OVERHEAD_TARGET_US
            r["overhead_fraction"] = r["overhead_us"]["public"] / r["us"]["bare kernel"]
    over = [r["overhead_us"]["public"] for r in rows if r.get("overhead_resolved")]
    wins = [r["fastest_peer_over_public"] for r in rows if "fastest_peer_over_public" in r]
    return {
        "machine": host_cpu(), "scanweaver": scanweaver.__version__, "rounds": rounds, "rows": rows,
        "targets": {"max_overhead_us": max(over) if over else None, "overhead_target_us": OVERHEAD_TARGET_US,
                    "overhead_met": bool(over) and max(over) <= OVERHEAD_TARGET_US,
                    "unresolved_shapes": [r["shape"] for r in rows if "overhead_us" in r
                                          and not r["overhead_resolved"]],
                    "min_speedup_over_fastest_peer": min(wins) if wins else None,
                    "faster_than_peers_everywhere": bool(wins) and min(wins) > 1.0},
    }


def table(result: dict) -> str:
    names = ["public", "public out=", "plan", "bare kernel", "JAX", "torch.compile"]
    lines = [f"Per-call latency, float32, median of {result['rounds']} round-robin rounds ({result['machine']})",
             "| (B, D, L) | " + " | ".join(f"{n} (us)" for n in names) + " | overhead (us) | fastest peer / public |",
             "|---|" + "---|" * (len(names) + 2)]
    for r in result["rows"]:
        cells = [f"{r['us'][n]:.1f}" if n in r["us"] else "-" for n in names]
        over = r.get("overhead_us", {}).get("public")
        ratio = r.get("fastest_peer_over_public")
        shown = "-" if over is None else f"{over:.1f}" + ("" if r.get("overhead_resolved") else
                                                          f" (kernel IQR {r['iqr_us']['bare kernel']:.0f})")
        lines.append(f"| {tuple(r['shape'])} | " + " | ".join(cells)
                     + f" | {shown} | {'-' if ratio is None else f'{ratio:.1f}x'} |")
    t = result["targets"]
    lines.append(f"\nmax overhead {t['max_overhead_us']:.1f} us where the kernel's spread resolves it "
                 f"(target {t['overhead_target_us']:g}); "
                 f"slowest win over the fastest peer {t['min_speedup_over_fastest_peer'] or float('nan'):.2f}x")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["elements"] for r in result["rows"]]
    for name in ["public", "plan", "bare kernel", "JAX", "torch.compile"]:
        pts = [(x, r["us"][name]) for x, r in zip(xs, result["rows"], strict=True) if name in r["us"]]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="elements (B*D*L)", ylabel="us per call",
           title="ScanWeaver per-call latency vs the bare kernel and peers (float32)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the JSON record")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (about a minute per shape)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    result = run(args.rounds, not args.no_compile)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / "latency.png")
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
