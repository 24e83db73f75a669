"""The ``SCANWEAVER_*`` environment variables, read in one place.

Every variable the package reads is listed in :data:`VARIABLES` and read through
:func:`text`, :func:`path`, :func:`number` or :func:`choice`.  A value that does
not fit (not a number, NaN, infinite, out of range, not one of the choices) never
breaks an import or a call: it is ignored with one :class:`RuntimeWarning` that
names the variable, the value and what it needs, and the default applies.
Values are read at each call (tests and long-lived processes change them).

Example:
    >>> import os
    >>> from scanweaver import environment
    >>> os.environ["SCANWEAVER_POOL_MB"] = "64"
    >>> environment.number("SCANWEAVER_POOL_MB", 256.0)
    64.0
    >>> del os.environ["SCANWEAVER_POOL_MB"]
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

#: Every variable the package reads, and what it sets.
VARIABLES = {
    "SCANWEAVER_CACHE_DIR": "directory of compiled kernels, the tuned store and calibrations",
    "SCANWEAVER_TUNED": "shared tuned-configuration stores (paths separated by os.pathsep)",
    "SCANWEAVER_DEVICE_CONFIGS": "a directory of device files read before the shipped ones",
    "SCANWEAVER_POOL_MB": "MiB of host arrays kept for reuse (a number >= 0)",
    "SCANWEAVER_THREADS_CUTOFF": "elements from which the cpu backend's default uses every core (an integer >= 1)",
    "SCANWEAVER_OPENCL_DEVICE": "the OpenCL device: 'platform:device' indices or part of its name",
    "SCANWEAVER_JULIA_DEVICE": "the Julia device to tune",
    "SCANWEAVER_TRACEBACK": "'full' shows ScanWeaver's internal frames in tracebacks",
    "SCANWEAVER_IREE_CUDA_TARGET": "the CUDA architecture IREE compiles for",
    "SCANWEAVER_IREE_ROCM_TARGET": "the ROCm architecture IREE compiles for",
    "SCANWEAVER_IREE_VULKAN_TARGET": "the Vulkan target IREE compiles for",
}

_warned: set[tuple[str, str]] = set()


def _known(name: str) -> None:
    if name not in VARIABLES:
        raise KeyError(f"environment: {name} is not one of the variables ScanWeaver reads (VARIABLES)")


def ignored(name: str, value: str, need: str, instead: str) -> None:
    """Warns once per (variable, value) that ``value`` is ignored because it is not ``need``; ``instead`` says
    what happens instead."""
    if (name, value) in _warned:
        return
    _warned.add((name, value))
    warnings.warn(f"scanweaver: {name}={value!r} is ignored: it must be {need}; {instead}", RuntimeWarning,
                  stacklevel=4)


def text(name: str, default: str = "") -> str:
    """The variable's value without surrounding blanks, or ``default`` when unset or blank."""
    _known(name)
    return os.environ.get(name, "").strip() or default


def path(name: str) -> Path | None:
    """The variable as a path (``~`` expanded), or None when unset or blank."""
    value = text(name)
    return Path(value).expanduser() if value else None


def number(name: str, default: float, *, minimum: float = 0.0, integer: bool = False, instead: str = "") -> float:
    """The variable as a finite number >= ``minimum`` (an integer with ``integer``), or ``default`` (with one
    warning naming the variable when it is set to anything else; ``instead`` words what then happens)."""
    value = text(name)
    if not value:
        return default
    need = f"{'an integer' if integer else 'a finite number'} >= {minimum:g}"
    try:
        got: float = int(value) if integer else float(value)
    except (ValueError, OverflowError):
        got = math.nan
    if not math.isfinite(got) or got < minimum:
        ignored(name, value, need, instead or f"using {default!r}")
        return default
    return got


def choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """The variable, lower-cased, when it is one of ``choices``; else ``default`` (with one warning when set)."""
    value = text(name)
    if not value:
        return default
    if value.lower() not in choices:
        ignored(name, value, f"one of {', '.join(choices)}", f"using {default!r}")
        return default
    return value.lower()
