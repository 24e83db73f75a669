"""Facts about the machine a benchmark ran on, recorded beside every figure."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def cpu_threads() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_model() -> str:
    """A readable CPU name, e.g. ``AMD EPYC 7B13``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def host_cpu() -> str:
    """``<model> (<n> threads)``: the label of every host-CPU figure."""
    return f"{cpu_model()} ({cpu_threads()} threads)"


def describe() -> dict:
    """Machine, interpreter and library versions for the JSON record."""
    from .. import __version__

    return {
        "cpu": cpu_model(),
        "threads": cpu_threads(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "scanweaver": __version__,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
