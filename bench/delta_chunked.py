"""The delta-rule family's two CPU algorithms, measured in one run: the fused recurrence against the chunked WY form,
forward, forward + backward, and the backward alone.

For DeltaNet, Gated DeltaNet, KDA and RWKV-7 (float32, the operands of bench/delta_rule.py: unit keys, beta in
(0, 1), log decays in [-2, -0.01]; RWKV-7: a = -kappa, b = kappa * iclr), the median time of ``--repeats``
forward calls, of forward + backward calls, and of backward calls alone (``bwd_``: the backward recomputes what
it needs, so a recurrent forward with the chunked backward costs ``recurrent_s + chunked_<c>_bwd_s``), of the
fused ``delta_rule`` op through the cpu backend's ``run_fused`` with ``algorithm="recurrent"`` and with
``algorithm="chunked"`` at each chunk length (both parts, every family), on ``--threads`` threads; ``speedup``
is the recurrent time over the chunked one, ``rel_err`` the chunked output's (``fb_rel_err``: each gradient's,
the largest) largest difference from the recurrent one over the latter's largest magnitude.  ``default`` names
the algorithm of each part that the default rule (``DeltaRule.chunked_from``) picks at the shape, and
``default_fb_s`` times a training step so (the forward, then the backward), ``default_fb_speedup`` against both
recurrent.

Usage::

    python bench/delta_chunked.py [--json] [--quick] [--repeats N] [--threads 2] [--only gated,kda]
                                  [--shapes 1x2048x8x64x64,1x1024x4x128x128] [--chunks 16,32,64]

``--json`` writes bench/results/delta_chunked.json (``--quick``: bench/out/delta_chunked_quick.json; other
``--shapes`` or ``--chunks``: bench/out/delta_chunked_shapes.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from delta_rule import OP, Ours, inputs, timed  # noqa: E402

#: (B, T, H, K, V) measured, and the chunk lengths of the chunked form.
SHAPES = ((1, 4096, 8, 128, 128), (1, 4096, 16, 64, 64), (4, 1024, 8, 128, 128))
CHUNKS = (16, 32, 64, 128)
QUICK, QUICK_CHUNKS = ((1, 256, 2, 32, 32),), (32,)
FAMILIES = ("deltanet", "gated", "kda", "rwkv7")


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def backward_only(ours: Ours):
    """The backward call alone (it recomputes what it needs from the inputs; the forward's outputs unused)."""
    return lambda: ours.cpu.run_fused(ours.calls["backward"], {**ours.a, "do": ours.do, **ours.out["backward"]},
                                      ours.sizes)


def measure(family: str, shape: tuple, threads: int, repeats: int, chunks: tuple) -> dict:
    """One row: the recurrent forward's, forward + backward's and backward's seconds, each chunk length's, speedups
    and errors."""
    a = inputs(family, *shape)
    rec = Ours(family, a, threads, algorithm="recurrent")
    want = rec.forward().copy()
    grads = {n: g.astype(np.float64) for n, g in rec.forward_backward().items()}
    row = {"family": family, "shape": dict(zip("BTHKV", shape, strict=True)),
           "recurrent_s": timed(rec.forward, repeats), "recurrent_fb_s": timed(rec.forward_backward, repeats),
           "recurrent_bwd_s": timed(backward_only(rec), repeats)}
    default_chunk = next(t.default for t in OP.tunables_for("c") if t.name == "chunk")
    made = {}
    for c in chunks:
        ck = made[c] = Ours(family, a, threads, algorithm="chunked", chunk=c)
        got = ck.forward().copy()
        row[f"chunked_{c}_s"] = timed(ck.forward, repeats)
        row[f"speedup_{c}"] = row["recurrent_s"] / row[f"chunked_{c}_s"]
        row[f"rel_err_{c}"] = rel_err(got, want)
        row[f"fb_rel_err_{c}"] = max(rel_err(g, grads[n]) for n, g in ck.forward_backward().items())
        row[f"chunked_{c}_fb_s"] = timed(ck.forward_backward, repeats)
        row[f"fb_speedup_{c}"] = row["recurrent_fb_s"] / row[f"chunked_{c}_fb_s"]
        row[f"chunked_{c}_bwd_s"] = timed(backward_only(ck), repeats)
        row[f"bwd_speedup_{c}"] = row["recurrent_bwd_s"] / row[f"chunked_{c}_bwd_s"]
        row[f"bwd_rel_err_{c}"] = row[f"fb_rel_err_{c}"]
    # a training step as the default rule runs it (DeltaRule.chunked_from: each part's algorithm at this shape)
    parts = {p: OP.algorithm("c", p, rec.f, rec.sizes) for p in ("forward", "backward")}
    chunked = made.get(default_chunk) or Ours(family, a, threads, algorithm="chunked", chunk=default_chunk)
    fwd, bwd = (rec if parts[p] == "recurrent" else chunked for p in ("forward", "backward"))
    row["default"] = parts
    row["default_fb_s"] = timed(lambda: (fwd.forward(), backward_only(bwd)()), repeats)
    row["default_fb_speedup"] = row["recurrent_fb_s"] / row["default_fb_s"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=",".join(FAMILIES))
    ap.add_argument("--shapes", default="", help="B x T x H x K x V shapes, comma-separated (default: SHAPES)")
    ap.add_argument("--chunks", default="", help="chunk lengths, comma-separated (default: CHUNKS)")
    args = ap.parse_args(argv)
    shapes, chunks = (QUICK, QUICK_CHUNKS) if args.quick else (SHAPES, CHUNKS)
    if args.shapes:
        shapes = tuple(tuple(int(x) for x in s.split("x")) for s in args.shapes.split(","))
    if args.chunks:
        chunks = tuple(int(c) for c in args.chunks.split(","))
    rows = []
    for shape in shapes:
        for family in args.only.split(","):
            row = measure(family, shape, args.threads, args.repeats, chunks)
            rows.append(row)
            for pre, part in (("", "forward"), ("fb_", "fwd+bwd"), ("bwd_", "backward")):
                key = f"_{pre}s"
                best = max(chunks, key=lambda c: row[f"{pre}speedup_{c}"])
                print(f"{family:9s} {shape} {part:8s}: recurrent {row['recurrent' + key] * 1e3:8.1f} ms, " + ", ".join(
                    f"chunk {c} {row[f'chunked_{c}{key}'] * 1e3:8.1f} ms (x{row[f'{pre}speedup_{c}']:.2f})"
                    for c in chunks) + f"; best chunk {best}, rel err {row[f'{pre}rel_err_{best}']:.1e}", flush=True)
            print(f"{family:9s} {shape} default : forward {row['default']['forward']}, backward "
                  f"{row['default']['backward']}: a training step {row['default_fb_s'] * 1e3:8.1f} ms "
                  f"(x{row['default_fb_speedup']:.2f} both recurrent)", flush=True)
    if args.json:
        root = Path(__file__).resolve().parent
        path = root / ("out/delta_chunked_quick.json" if args.quick else "out/delta_chunked_shapes.json"
                       if args.shapes or args.chunks else "results/delta_chunked.json")
        path.parent.mkdir(exist_ok=True)
        meta = {"threads": args.threads, "repeats": args.repeats, "machine": platform.machine(),
                "processor": platform.processor(), "dtype": "float32"}
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
