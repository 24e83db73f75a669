"""The ``peers`` benchmark suite: a thin script over :mod:`scanweaver.benchmarks`.

Usage::

    python bench/peers.py                 # full run: table on stdout, files in ./bench-results
    python bench/peers.py --quick         # tiny shapes, seconds
    python bench/peers.py --json --out bench/results

Same flags as ``scanweaver bench --suite peers``.
"""

from __future__ import annotations

import argparse
import sys

from scanweaver.cli.bench import add_bench_arguments, run_bench


def main(argv: list[str] | None = None) -> int:
    """Parses the flags and runs the suite."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_bench_arguments(parser, suite="peers")
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
