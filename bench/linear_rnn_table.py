"""The algorithm table of ``bench/linear_rnn.py --table``: which matrix-state algorithm is faster, per shape.

Over a sweep of shapes (the decay per head with one q/k group of Mamba-2, a decay per key of GLA, RWKV-6's bonus
readout; T from 64 to 4096; K, V from 32 to 128; 4 or 32 lanes of batch x heads), the recurrent and the chunked
forward and backward of the fused ``matrix_state`` op on every core, float32, timed round-robin (median of
``repeats``).  Each entry names the faster algorithm of each part and both times, so that ``auto`` can pick from
measurements (the lead's runner reads ``bench/results/linear_rnn_algorithms.json``).

Example:
    >>> from linear_rnn_table import sweep
    >>> len(sweep(quick=True)) > 0
    True
"""

from __future__ import annotations

import os
import platform

#: Shapes per kind: (K, V) pairs; T values; lanes (batch, heads) pairs; a kind's heads share one q/k group for
#: ``ssd`` (Mamba-2) and have their own for ``gla`` and ``rwkv6``.
SIZES = {"ssd": ((64, 64), (128, 64)), "gla": ((32, 32), (64, 64), (128, 128)), "rwkv6": ((64, 64),)}
LENGTHS = (64, 256, 1024, 4096)
LANES = ((1, 4), (2, 16))
QUICK = (("gla", 1, 128, 2, 16, 16), ("ssd", 1, 128, 2, 16, 16))


def sweep(quick: bool = False) -> list[tuple]:
    """``(kind, batch, T, H, K, V)`` of every entry."""
    if quick:
        return list(QUICK)
    return [(kind, b, T, H, K, V) for kind, sizes in SIZES.items() for K, V in sizes for T in LENGTHS
            for b, H in LANES]


def algorithm_table(ours, inputs, round_robin, repeats: int, quick: bool = False) -> dict:
    """The table: ``ours(kind, a, algorithm=...)`` runs one algorithm (``forward``/``backward`` methods),
    ``inputs(kind, b, T, H, Hq, K, V)`` makes the operands, ``round_robin(fns, repeats)`` times them."""
    from linear_rnn import FEATURES

    rows = []
    for kind, b, T, H, K, V in sweep(quick):
        Hq = 1 if kind == "ssd" else H
        a = inputs(kind, b, T, H, Hq, K, V)
        run = {alg: ours(kind, a, algorithm=alg) for alg in ("recurrent", "chunked")}
        t = round_robin({f"{alg} {part}": getattr(run[alg], part) for alg in run for part in ("forward", "backward")},
                        repeats)
        decay, readout = FEATURES[kind]
        entry = {"shape": f"{kind} (b={b}, T={T}, H={H}, Hq={Hq}, K={K}, V={V})", "kind": kind, "decay": decay,
                 "readout": readout, "batch": b, "T": T, "H": H, "Hq": Hq, "K": K, "V": V}
        for part in ("forward", "backward"):
            rec, chk = t[f"recurrent {part}"], t[f"chunked {part}"]
            entry[part] = {"recurrent_s": rec, "chunked_s": chk, "chunked_speedup": rec / chk,
                           "faster": "chunked" if chk < rec else "recurrent"}
        rows.append(entry)
    return {"machine": {"processor": platform.processor() or platform.machine(), "threads": os.cpu_count()},
            "dtype": "float32", "repeats": repeats, "chunk": 64,
            "note": "median seconds per call of each algorithm on every core, timed round-robin in one process",
            "shapes": rows}
