"""Benchmarks: ScanWeaver beside its peers and the paper, every figure a ratio from one run.

``scanweaver bench`` and the scripts in ``bench/`` call :func:`main_run`.
Nothing heavy is imported here: peers import their library when they run.

Example:
    >>> from scanweaver.benchmarks import run_suite
    >>> run = run_suite("paper", quick=True, progress=False)
    >>> run.suite
    'paper'
"""

from __future__ import annotations

from .cases import Case, Settings
from .harness import Result, Run, run
from .suites import SUITES, get


def run_suite(suite: str = "all", *, quick: bool = False, backend: str | None = None, dtype: str = "float32",
              progress: bool = True, log=None, budget_s: float = float("inf"), on_case=None) -> Run:
    """Runs suite ``paper``, ``peers`` or ``all`` and returns every result.

    Args:
        suite: suite name.
        quick: tiny shapes and few repeats (seconds).
        backend: restrict ScanWeaver entries to one backend.
        dtype: ``float32`` or ``float64``.
        progress: show a progress bar on stderr.
        log: called with one line per entry when no bar is shown.
        budget_s: entries not started within this many seconds are skipped, with that reason.
        on_case: called with the run so far after every case.
    """
    return run(get(suite, quick, dtype), Settings.for_mode(quick), backend=backend, progress=progress, log=log,
               budget_s=budget_s, on_case=on_case)


__all__ = ["SUITES", "Case", "Result", "Run", "Settings", "get", "run", "run_suite"]
