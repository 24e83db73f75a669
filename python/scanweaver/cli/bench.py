"""``scanweaver bench``: ScanWeaver beside the paper and its peers (table, JSON, Markdown, PNG)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import command

#: Where results go when --out is not given (relative to the working directory).
DEFAULT_OUT = "bench-results"


def add_bench_arguments(p: argparse.ArgumentParser, suite: str = "all") -> None:
    """The flags shared by ``scanweaver bench`` and the ``bench/*.py`` scripts."""
    p.add_argument("--suite", choices=("paper", "peers", "all", "gpu"), default=suite,
                   help=f"paper (latency against L), peers (side by side), all, or gpu (the GPU scoreboard: "
                        f"operands made and checked on the GPU) (default {suite})")
    p.add_argument("--backend", default=None,
                   help="time ScanWeaver on this backend only (numpy, cpu, opencl, cuda, julia); default: all")
    p.add_argument("--quick", action="store_true", help="tiny shapes and few repeats: finishes in seconds")
    p.add_argument("--json", action="store_true", help="print the JSON record instead of the table")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT),
                   help=f"directory for <suite>.json, <suite>.md and PNG plots (default ./{DEFAULT_OUT})")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="operand dtype")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_bench(args: argparse.Namespace) -> int:
    """Runs the suite, prints the table (or JSON) and writes the files; 0 unless an entry errored."""
    from ..benchmarks import report, run_suite
    from ..benchmarks.harness import stderr_log

    if args.backend is not None:
        from ..runtime import REGISTRY

        if args.backend not in REGISTRY and args.backend != "auto":
            print(f"scanweaver bench: error: --backend must be one of {', '.join(sorted(REGISTRY))}, "
                  f"got {args.backend!r}", file=sys.stderr)
            return 2
    run = run_suite(args.suite, quick=args.quick, backend=args.backend, dtype=args.dtype,
                    progress=not args.no_progress, log=stderr_log)
    msgs = report.write(run, args.out, plots=not args.no_plots)
    if args.json:
        print(json.dumps(report.to_json(run), indent=2, default=str))
    else:
        print(report.markdown(run))
    for m in msgs:
        print(m, file=sys.stderr)
    errored = [r for r in run.results if r.status == "error" and r.kind == "ours"]
    for r in errored:
        print(f"scanweaver bench: {r.label} on {r.case} raised: {r.reason}", file=sys.stderr)
    return 1 if errored else 0


@command("bench", help="benchmark against the paper and peer libraries (table, JSON, Markdown, PNG)")
class Bench:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_bench_arguments(p)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        return run_bench(args)
