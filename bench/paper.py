"""The ``paper`` benchmark suite: a thin script over :mod:`scanweaver.benchmarks`.

Usage::

    python bench/paper.py                 # full run: table on stdout, files in ./bench-results
    python bench/paper.py --quick         # tiny shapes, seconds
    python bench/paper.py --json --out bench/results

Same flags as ``scanweaver bench --suite paper``.
"""

from __future__ import annotations

import argparse
import sys

from scanweaver.cli.bench import add_bench_arguments, run_bench


def main(argv: list[str] | None = None) -> int:
    """Parses the flags and runs the suite."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_arguments(parser, suite="paper")
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
