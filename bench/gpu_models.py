"""The model scans on the GPU: Mamba-1, Mamba-2 and GLA, ours beside mamba-ssm and flash-linear-attention.

Every entry is checked (output and every gradient) against a float64 host
reference before it is timed (:mod:`scanweaver.benchmarks.models`); entries
that cannot run here are listed as skipped with the reason.  The same table is
part of ``scanweaver bench --suite gpu``.

Usage (on the GPU, with ``.deps/site`` from ``bench/gpu_deps.sh`` on PYTHONPATH)::

    python bench/gpu_models.py [--out DIR] [--budget SECONDS] [--quick] [--only gated_delta,gla]

Writes ``gpu_models.json`` and ``gpu_models.md`` under ``--out``.  Exit codes: 0 ran (entries may be
skipped); 1 one of our entries failed its check or raised.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from scanweaver.benchmarks import models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--budget", type=float, default=240.0, help="entries not started by then are skipped")
    ap.add_argument("--quick", action="store_true", help="small timed shapes")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated models (mamba1, mamba2, gla, gated_delta): only "
                                               "their entries run")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    def write(results: list) -> None:  # after every entry: a time limit keeps what was measured
        (args.out / "gpu_models.md").write_text(models.markdown(results))
        (args.out / "gpu_models.json").write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))

    results = models.run(quick=args.quick, repeats=args.repeats, budget_s=args.budget, on_result=write,
                         log=lambda line: print(line, file=sys.stderr, flush=True),
                         only=tuple(m for m in args.only.split(",") if m))
    print(models.markdown(results))
    return 1 if models.failed_ours(results) else 0


if __name__ == "__main__":
    sys.exit(main())
