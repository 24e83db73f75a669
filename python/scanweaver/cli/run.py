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


#: One line per figure of the table: what it means.
EXPLAIN = {
    "backend": "where it ran (--backend auto picks the fastest available)",
    "schedule": "how the scan was split into parallel work",
    "config": "the schedule's tunables: 'tuned' from `scanweaver tune`, else the built-in defaults",
    "shape": "B, D, L: B*D independent sequences of length L",
    "dtype": "element type",
    "time_ms": "median of the timed scans (output preallocated, warm-up excluded)",
    "ns_per_element": "time_ms per element of B*D*L",
    "gbps": "bytes moved (a, b, x, c read, y written) per second",
    "roofline_fraction": "roofline time / scan time: 1 = as fast as an elementwise kernel moving the same "
                         "bytes on the same threads (a memory-bound scan's ceiling)",
    "quiet": "whether the timings can be trusted: no = the machine was busy while they ran",
    "max_abs_err": "largest |y - y_ref| against a float64 sequential loop",
    "max_rel_err": "max_abs_err / max |y_ref|",
    "ok": "max_rel_err within the dtype's tolerance",
}


@command("run", help="build, run and check the selective scan on random data (the main job)")
class Run:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--backend", default="auto", help="auto, numpy, cpu, opencl, cuda or julia (default auto)")
        p.add_argument("--schedule", default="auto", help="schedule name or auto (default auto)")
        p.add_argument("--shape", type=parse_shape, default=(8, 512, 4096), help="B,D,L (default 8,512,4096)")
        p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
        p.add_argument("--repeats", type=int, default=5, help="timed repeats after warm-up (default 5)")
        p.add_argument("--json", action="store_true",
                       help="print one JSON object (quiet=false when the machine was busy; roofline_fraction is "
                            "then null if it came out impossible)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        import sys

        import scanweaver
        from ..api import SELECTIVE
        from ..runtime import get_backend
        from ..runtime.roofline import compare, scan_threads
        from ..targets.reference import oracle

        ops = random_problem(args.shape, args.dtype)
        call = lambda: scanweaver.selective_scan(**ops, backend=args.backend, schedule=args.schedule)  # noqa: E731
        print(f"scanweaver run: building the {args.backend} scan and checking it against a float64 loop "
              "(a first build compiles its kernel: seconds; later runs reuse it) ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        y = call()
        info = SELECTIVE.last
        print(f"scanweaver run: built and ran {info.backend}/{info.schedule} in {time.perf_counter() - t0:.1f} s; "
              "timing it beside the roofline ...", file=sys.stderr, flush=True)
        lanes, L = int(np.prod(args.shape[:-1], dtype=np.int64)), args.shape[-1]
        ref, _ = oracle(info.stages.affine, {k: v.reshape(lanes, L) for k, v in ops.items()})
        abs_err, rel_err = errors(y.reshape(lanes, L), ref)
        out = np.empty_like(y)  # the timed calls reuse one output, as a loop over batches would
        timed = lambda: scanweaver.selective_scan(**ops, backend=args.backend, schedule=args.schedule,  # noqa: E731
                                                  out=out)
        threads = scan_threads(info.backend, info.config, get_backend(info.backend).availability().device)
        cmp = compare(timed, lanes, L, args.dtype, threads, args.repeats)
        seconds = cmp.seconds
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
            "roofline_ms": cmp.roofline_s * 1e3 if cmp.roofline_s is not None else None,
            "roofline_threads": cmp.threads,
            "roofline_fraction": cmp.fraction,
            "quiet": cmp.quiet,
            "note": cmp.reason,
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
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(result: dict) -> None:
    """The run's figures, one line each with what it means, then what makes them uncertain."""
    shown = dict(result)
    cfg = " ".join(f"{k}={v}" for k, v in sorted(result["config"].items()))
    shown["config"] = f"{cfg or '-'} ({result['config_source']})"
    if result["roofline_fraction"] is None:
        shown["roofline_fraction"] = "n/a (see the note below)" if result["note"] else None
    elif result["roofline_threads"] is not None:
        threads = result["roofline_threads"]
        on = "the free cores" if threads == 0 else f"{threads} thread{'s' if threads != 1 else ''}"
        shown["roofline_fraction"] = f"{result['roofline_fraction']:.3g} (both on {on})"
    values = {k: _fmt(shown[k]) for k in EXPLAIN}
    width = max(len(k) for k in EXPLAIN)
    vwidth = max(len(v) for v in values.values())
    for k, v in values.items():
        print(f"{k:<{width}}  {v:<{vwidth}}  {EXPLAIN[k]}")
    if result["note"]:
        print(f"note: {result['note']}" + ("; the times above are uncertain: run again on a quiet machine"
                                           if not result["quiet"] else ""))
