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
                        f"operands made and checked on the GPU, then the Mamba-1, Mamba-2 and GLA model scans beside "
                        f"mamba-ssm and flash-linear-attention) (default {suite})")
    p.add_argument("--backend", default=None,
                   help="time ScanWeaver on this backend only (numpy, cpu, opencl, cuda, julia); default: all")
    p.add_argument("--quick", action="store_true", help="tiny shapes and few repeats: finishes in seconds")
    p.add_argument("--json", action="store_true", help="print the JSON record instead of the table")
    p.add_argument("--out", type=Path, default=Path(DEFAULT_OUT),
                   help=f"directory for <suite>.json, <suite>.md and PNG plots (default ./{DEFAULT_OUT})")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="operand dtype")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--budget", type=float, default=float("inf"), metavar="SECONDS",
                   help="entries not started within this many seconds are skipped with that reason; the files are "
                        "written after every case, so a time limit keeps what ran (default: no limit)")
    p.add_argument("--models-budget", type=float, default=240.0, metavar="SECONDS",
                   help="gpu suite: seconds for the model scans (Mamba-1, Mamba-2, GLA); entries not started "
                        "by then are skipped with that reason; 0 skips them (default 240)")


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
    budget = getattr(args, "budget", float("inf"))
    partial = None if budget == float("inf") else (lambda so_far: report.write(so_far, args.out, plots=False))
    run = run_suite(args.suite, quick=args.quick, backend=args.backend, dtype=args.dtype,
                    progress=not args.no_progress, log=stderr_log, budget_s=budget, on_case=partial)
    msgs = report.write(run, args.out, plots=not args.no_plots)
    if args.json:
        print(json.dumps(report.to_json(run), indent=2, default=str))
    else:
        print(report.markdown(run))
    for m in msgs:
        print(m, file=sys.stderr)
    errored = [r for r in run.results if r.status in ("error", "failed") and r.kind == "ours"]
    for r in errored:
        print(f"scanweaver bench: {r.label} on {r.case} {'raised' if r.status == 'error' else 'failed'}: "
              f"{r.reason}", file=sys.stderr)
    if args.suite == "gpu":
        errored += _models(args, stderr_log)
    return 1 if errored else 0


def _models(args: argparse.Namespace, log) -> list:
    """The GPU suite's model scans (Mamba-1, Mamba-2, GLA): table printed, gpu_models.json/.md written;
    returns our entries that failed their check or raised."""
    from dataclasses import asdict

    from ..benchmarks import models

    results = models.run(quick=args.quick, log=log, budget_s=args.models_budget)
    text = models.markdown(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_models.md").write_text(text)
    (args.out / "gpu_models.json").write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
    print(text)
    bad = models.failed_ours(results)
    for r in bad:
        print(f"scanweaver bench: {r.label} ({r.model}) {r.status}: {r.reason}", file=sys.stderr)
    return bad


@command("bench", help="benchmark against the paper and peer libraries (table, JSON, Markdown, PNG)")
class Bench:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_bench_arguments(p)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        return run_bench(args)
