"""``scanweaver run``: the main job — build, run and check the paper's selective scan."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from . import command, parse_shape

#: Accepted max relative error (normwise: max |y - y_ref| / max |y_ref|) per dtype.
TOLERANCE = {"float32": 1e-4, "float64": 1e-10}


def random_problem(shape: tuple[int, ...], dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Bounded, non-uniform operands: a in (0.5, 1), b, x, c standard normal."""
    rng = np.random.default_rng(seed)
    return {
        "a": rng.uniform(0.5, 1.0, shape).astype(dtype),
        "b": rng.standard_normal(shape).astype(dtype),
        "x": rng.standard_normal(shape).astype(dtype),
        "c": rng.standard_normal(shape).astype(dtype),
    }


def errors(y: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Max absolute error and normwise relative error (max |err| / max |ref|)."""
    err = np.abs(y.astype(np.float64) - ref)
    abs_err = float(err.max()) if err.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    return abs_err, abs_err / scale if scale > 0 else abs_err


def roofline_call(lanes: int, L: int):
    """A call of the elementwise roofline kernel for this size, or None without a C compiler."""
    from ..runtime import roofline

    try:
        return roofline.bind(lanes, L, "float32")
    except Exception:  # no compiler: the fraction is reported as null
        return None


def interleaved(calls: dict, repeats: int, min_seconds: float = 0.2) -> dict:
    """Median seconds of each call, timed round-robin after one warm-up each, so that all of
    them see the same state of a shared machine."""
    for fn in calls.values():
        fn()
    times: dict = {name: [] for name in calls}
    start = time.perf_counter()
    while min(len(t) for t in times.values()) < repeats or (
            time.perf_counter() - start < min_seconds and len(times["scan"]) < 50):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


@command("run", help="build, run and check the selective scan on random data (the main job)")
class Run:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--backend", default="auto", help="auto, numpy, cpu, opencl, cuda or julia (default auto)")
        p.add_argument("--schedule", default="auto", help="schedule name or auto (default auto)")
        p.add_argument("--shape", type=parse_shape, default=(8, 512, 4096), help="B,D,L (default 8,512,4096)")
        p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
        p.add_argument("--repeats", type=int, default=5, help="timed repeats after warm-up (default 5)")
        p.add_argument("--json", action="store_true", help="print one JSON object")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        import scanweaver
        from ..api import SELECTIVE
        from ..targets.reference import oracle

        ops = random_problem(args.shape, args.dtype)
        call = lambda: scanweaver.selective_scan(**ops, backend=args.backend, schedule=args.schedule)  # noqa: E731
        y = call()
        info = SELECTIVE.last
        lanes, L = int(np.prod(args.shape[:-1], dtype=np.int64)), args.shape[-1]
        ref, _ = oracle(info.stages.affine, {k: v.reshape(lanes, L) for k, v in ops.items()})
        abs_err, rel_err = errors(y.reshape(lanes, L), ref)
        out = np.empty_like(y)  # the timed calls reuse one output, as a loop over batches would
        timed = {"scan": lambda: scanweaver.selective_scan(**ops, backend=args.backend, schedule=args.schedule,
                                                            out=out)}
        roof_fn = roofline_call(lanes, L) if args.dtype == "float32" else None
        if roof_fn is not None:
            timed["roofline"] = roof_fn
        med = interleaved(timed, args.repeats)
        seconds, roof = med["scan"], med.get("roofline")
        nbytes = 5 * lanes * L * np.dtype(args.dtype).itemsize
        result = {
            "backend": info.backend,
            "schedule": info.schedule,
            "config": info.config,
            "config_source": info.source,
            "shape": list(args.shape),
            "dtype": args.dtype,
            "time_ms": seconds * 1e3,
            "ns_per_element": seconds * 1e9 / max(lanes * L, 1),
            "gbps": nbytes / seconds / 1e9 if seconds > 0 else None,
            "roofline_ms": roof * 1e3 if roof else None,
            "roofline_fraction": roof / seconds if roof and seconds > 0 else None,
            "max_abs_err": abs_err,
            "max_rel_err": rel_err,
            "ok": bool(rel_err <= TOLERANCE[args.dtype]),
        }
        if args.json:
            print(json.dumps(result))
        else:
            print_table(result)
        return 0 if result["ok"] else 1


def _fmt(v: object) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(result: dict) -> None:
    """Two-column table of a run result."""
    keys = ["backend", "schedule", "config", "shape", "dtype", "time_ms", "ns_per_element", "gbps",
            "roofline_fraction", "max_abs_err", "max_rel_err", "ok"]
    width = max(len(k) for k in keys)
    for k in keys:
        print(f"{k:<{width}}  {_fmt(result[k])}")
