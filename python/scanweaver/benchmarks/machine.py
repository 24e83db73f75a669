"""Facts about the machine a benchmark ran on, recorded beside every figure."""

from __future__ import annotations

import platform
import sys
import time

import numpy as np

from ..runtime.cpu_backend import cpu_model, cpu_threads


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
