"""Numerical characterisation of float32 scans against a float64 oracle.

Sweeps the sequence length L and the gate parameterisation, runs every
schedule of every available backend (plus the log-space front end for
positive gates) in float32, and reports

    error = max over lanes of  max_t |h_t - h*_t| / max_t |h*_t|

where h* is a float64 sequential scan of the *same* float32 operands (so the
error is the scan's, not the inputs' rounding).  Gate families:

* ``bounded``:   a ~ U(0.5, 0.999), given as the gate a.
* ``exp``:       a = exp(delta*A), delta = softplus(N(-2, 1)), A = -U(1, 16)
                 (Mamba-like); the kernel computes exp of the float32 log gate.
* ``near1``:     a = exp(delta*A) with delta*A log-uniform in [-1e-5, -1e-7].
* ``growing``:   a = exp(g), g ~ U(0, 1e-3): the state grows (stress mode).

Usage::

    python bench/stability.py                      # full sweep, L up to 65536
    python bench/stability.py --quick              # L up to 4096
    python bench/stability.py --out bench/results  # JSON + PNG there

Writes ``stability.json`` and, when matplotlib is installed, ``stability.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import numpy as np

import scanweaver
from scanweaver import log_scan
from scanweaver.runtime import REGISTRY


@scanweaver.recurrence(name="gate_scan")
def gate_scan(h, a, x):
    return a * h + x


@scanweaver.recurrence(name="exp_gate_scan")
def exp_gate_scan(h, log_a, x):
    return np.exp(log_a) * h + x


@dataclass(frozen=True)
class Gate:
    """A gate family: ``make(rng, lanes, L)`` returns float32 (gate operand, x) and how to read the operand."""

    name: str
    make: Callable
    is_log: bool
    doc: str


def _bounded(rng, lanes, L):
    return rng.uniform(0.5, 0.999, (lanes, L)).astype(np.float32)


def _exp(rng, lanes, L):
    delta = np.logaddexp(0.0, rng.normal(-2.0, 1.0, (lanes, L)))
    A = -rng.uniform(1.0, 16.0, (lanes, 1))
    return (delta * A).astype(np.float32)


def _near1(rng, lanes, L):
    return (-np.exp(rng.uniform(np.log(1e-7), np.log(1e-5), (lanes, L)))).astype(np.float32)


def _growing(rng, lanes, L):
    return rng.uniform(0.0, 1e-3, (lanes, L)).astype(np.float32)


GATES = {g.name: g for g in (
    Gate("bounded", _bounded, False, "a ~ U(0.5, 0.999)"),
    Gate("exp", _exp, True, "a = exp(delta*A), Mamba-like"),
    Gate("near1", _near1, True, "log a ~ -logU(1e-7, 1e-5)"),
    Gate("growing", _growing, True, "log a ~ U(0, 1e-3), growing state"),
)}


def oracle(gate_op: np.ndarray, x: np.ndarray, is_log: bool) -> np.ndarray:
    """float64 sequential scan of the float32 operands."""
    a = np.exp(gate_op.astype(np.float64)) if is_log else gate_op.astype(np.float64)
    x64 = x.astype(np.float64)
    h = np.zeros(a.shape[0])
    out = np.empty(a.shape)
    for t in range(a.shape[1]):
        h = a[:, t] * h + x64[:, t]
        out[:, t] = h
    return out


def rel_error(h: np.ndarray, ref: np.ndarray) -> float:
    """max over lanes of max_t |h - ref| / max_t |ref|."""
    scale = np.maximum(np.abs(ref).max(axis=1), np.finfo(np.float64).tiny)
    err = np.abs(np.asarray(h, np.float64) - ref).max(axis=1) / scale
    return float(np.nan_to_num(err, nan=np.inf).max())


def variants(backends: list[str]):
    """(label, runner(gate_op, x, is_log) -> h) for every backend/schedule and the log-space front end."""
    out = []
    for name in backends:
        be = REGISTRY[name]
        for sched in be.schedules:
            def run(op, x, is_log, name=name, sched=sched):
                rec = exp_gate_scan if is_log else gate_scan
                return rec(op, x, backend=name, schedule=sched)
            out.append((f"{name}/{sched}", run))

    def run_log(op, x, is_log):
        return log_scan(op if is_log else np.log(op), x)

    out.append(("logspace", run_log))
    return out


def sweep(lengths: list[int], lanes: int, backends: list[str], seed: int = 0) -> list[dict]:
    """Runs every variant on every gate family and length; one record per run."""
    rows = []
    for gate in GATES.values():
        for L in lengths:
            rng = np.random.default_rng(seed)
            op = gate.make(rng, lanes, L)
            x = rng.standard_normal((lanes, L)).astype(np.float32)
            ref = oracle(op, x, gate.is_log)
            for label, run in variants(backends):
                t0 = time.perf_counter()
                try:
                    err, note = rel_error(run(op, x, gate.is_log), ref), ""
                except Exception as exc:  # a broken backend is reported, not fatal to the sweep
                    err, note = float("nan"), f"{type(exc).__name__}: {exc}"
                rows.append({"gate": gate.name, "L": L, "variant": label, "rel_error": err,
                             "seconds": time.perf_counter() - t0, "note": note})
                print(f"{gate.name:8s} L={L:6d} {label:28s} {err:9.2e} {note[:60]}", flush=True)
    return rows


def plot(rows: list[dict], path: Path) -> bool:
    """One log-log panel per gate family; returns False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(GATES), figsize=(5 * len(GATES), 4), sharey=True)
    for ax, gate in zip(axes, GATES.values(), strict=True):
        mine = [r for r in rows if r["gate"] == gate.name and np.isfinite(r["rel_error"])]
        for label in dict.fromkeys(r["variant"] for r in mine):
            pts = sorted((r["L"], max(r["rel_error"], 1e-9)) for r in mine if r["variant"] == label)
            style = {"linewidth": 2.5, "color": "black"} if label == "logspace" else {"alpha": 0.7}
            ax.plot(*zip(*pts, strict=True), marker="o", markersize=3, label=label, **style)
        ax.set(xscale="log", yscale="log", title=f"{gate.name}: {gate.doc}", xlabel="L")
    axes[0].set_ylabel("max relative error vs float64 oracle (float32 runs)")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def table(rows: list[dict]) -> str:
    """Markdown table: error per variant (rows) and gate at the largest L (columns)."""
    Lmax = max(r["L"] for r in rows)
    labels = list(dict.fromkeys(r["variant"] for r in rows))
    head = "| variant | " + " | ".join(f"{g} (L={Lmax})" for g in GATES) + " |"
    lines = [head, "|" + "---|" * (len(GATES) + 1)]
    for label in labels:
        cells = [next((f"{r['rel_error']:.1e}" for r in rows
                       if r["variant"] == label and r["gate"] == g and r["L"] == Lmax), "-") for g in GATES]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024, 4096, 16384, 65536])
    p.add_argument("--quick", action="store_true", help="L up to 4096")
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--backends", nargs="+", default=None, help="default: every available backend")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args(argv)
    backends = args.backends or [n for n, c in REGISTRY.items() if c.availability().ok]
    lengths = [L for L in args.lengths if L <= 4096] if args.quick else args.lengths
    rows = sweep(lengths, args.lanes, backends)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.processor() or platform.machine(), "python": sys.version.split()[0],
            "numpy": np.__version__, "lanes": args.lanes, "dtype": "float32"}
    (args.out / "stability.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(table(rows))
    if plot(rows, args.out / "stability.png"):
        print(f"wrote {args.out / 'stability.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
