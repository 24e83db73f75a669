"""Machine measurements the ``cpu`` backend's defaults come from, taken once per machine and cached.

:func:`threads_cutoff`: the problem size (lanes x L) from which running the
``chunked`` kernel on every core beats one thread.  Starting and joining an
OpenMP team costs microseconds (far more when another process holds a core),
so small problems run faster on one thread; where the cut-off lies depends on
the machine, its compiler's OpenMP runtime and the core count, so it is
measured, not guessed: both variants are timed alternately on a ladder of
sizes (16 lanes, L from 64 to 8192, float32) and the cut-off is the smallest
size from which every core is at least 10% faster on this and every larger
rung.  The result is stored in ``calibration.json`` in the cache directory,
keyed by the device and the compiler, so a machine measures once (about a
second, most of it compiling the two kernels).

``SCANWEAVER_THREADS_CUTOFF=<elements>`` sets the cut-off without measuring.

Example:
    >>> from scanweaver.runtime import calibrate
    >>> calibrate.threads_cutoff() >= 1  # doctest: +SKIP
    True
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from .. import environment

log = logging.getLogger("scanweaver")

ENV = "SCANWEAVER_THREADS_CUTOFF"
#: Below this every problem runs on one thread (no team can pay off), at or above it on every core
#: unless calibration says otherwise; the calibration ladder spans the sizes between.
LOW, HIGH = 1 << 10, 1 << 17
#: Every core must beat one thread by this factor to count as faster.
MARGIN = 0.9
LANES = 16
ROUNDS = 15

_lock = threading.Lock()
_cutoff: dict[str, int] = {}


def _cache_file() -> Path:
    from .toolchain import cache_dir

    return cache_dir() / "calibration.json"


def _key() -> str:
    from .cpu_backend import CpuBackend
    from .toolchain import find_toolchain

    tc = find_toolchain()
    return f"{CpuBackend.availability().device} | {tc.identity.splitlines()[0]} | {' '.join(tc.flags)}"


def _from_environment() -> int | None:
    """``SCANWEAVER_THREADS_CUTOFF`` (at least 1), or None when unset or not an integer >= 0 (then measured)."""
    got = environment.number(ENV, -1, integer=True, instead="the cut-off is measured")
    return None if got < 0 else max(1, int(got))


def threads_cutoff() -> int:
    """Elements (lanes x L) from which the ``cpu`` backend's default uses every core (see the module doc)."""
    env = _from_environment()
    if env is not None:
        return env
    key = _key()
    hit = _cutoff.get(key)
    if hit is not None:
        return hit
    with _lock:
        if key in _cutoff:
            return _cutoff[key]
        stored = _stored(key)
        if stored is not None:
            _cutoff[key] = stored
        else:
            _cutoff[key] = HIGH  # what lowering the calibration's own kernels sees (their threads are explicit)
            _cutoff[key] = _measure_and_store(key)
        return _cutoff[key]


def one_thread(elements: int) -> bool:
    """True when a problem of ``elements`` runs faster on one thread on this machine."""
    return elements < LOW or (elements < HIGH and elements < threads_cutoff())


def stored_cutoff() -> int | None:
    """The cut-off already measured (or set by the environment) for this machine, without measuring."""
    env = _from_environment()
    if env is not None:
        return env
    try:
        key = _key()
    except Exception:
        return None
    hit = _cutoff.get(key)
    return hit if hit is not None else _stored(key)


#: Largest cut-off a calibration file may hold (measured values lie between :data:`LOW` and :data:`HIGH`).
MAX_CUTOFF = 1 << 40


def _stored(key: str) -> int | None:
    """The valid cut-off stored for ``key``, or ``None`` (missing, or of a wrong type or range: then it is
    measured again, with a warning, and the file's entry replaced)."""
    entry = _read().get(key)
    if entry is None:
        return None
    value = entry.get("threads_cutoff") if isinstance(entry, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CUTOFF:
        return value
    import warnings

    msg = (f"scanweaver: {_cache_file()} holds an invalid threads_cutoff {value!r:.40} for this machine; "
           "measuring it again")
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return None


def _read() -> dict:
    try:
        data = json.loads(_cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _measure_and_store(key: str) -> int:
    from .host import cpu_threads

    if cpu_threads() < 2:
        value, ladder = HIGH, []
    else:
        try:
            value, ladder = measure()
        except Exception as exc:  # a failed measurement must not break a scan: keep the old rule
            log.warning("scanweaver: threads calibration failed (%s: %s); using %d", type(exc).__name__, exc, HIGH)
            return HIGH
    data = _read()
    data[key] = {"threads_cutoff": value, "ladder": ladder, "measured": time.time()}
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.info("scanweaver: could not store the calibration (%s); it is kept for this process", exc)
    log.info("scanweaver: cpu threads cut-off measured at %d elements", value)
    return value


def measure() -> tuple[int, list[dict]]:
    """Times one thread against every core on the ladder; returns the cut-off and the ladder's figures."""
    from ..frontend import RECURRENCES
    from .base import ScanArrays
    from .cpu_backend import SPLIT_CHUNK, CpuBackend

    be = CpuBackend()
    selective = RECURRENCES.get("selective_scan")
    rng = np.random.default_rng(0)
    ladder = []
    n = LOW
    while n <= HIGH:
        L = n // LANES
        ops = {k: rng.uniform(0.5, 1.0, (LANES, L)).astype(np.float32) for k in ("a", "b", "x", "c")}
        arrays = ScanArrays(inputs=ops, h0=None, reset=None, batch_shape=(LANES,), dtype=np.dtype(np.float32))
        y, h = np.empty((LANES, L), np.float32), np.empty(LANES, np.float32)
        calls = {t: be.bind(selective.lower(backend="cpu", schedule="chunked", lanes=LANES, L=L, threads=t,
                                            chunk=SPLIT_CHUNK), arrays, y, h) for t in (1, 0)}
        times: dict[int, list[float]] = {1: [], 0: []}
        reps = max(1, (1 << 15) // n)
        for call in calls.values():
            call()
        for _ in range(ROUNDS):
            for t, call in calls.items():
                t0 = time.perf_counter()
                for _ in range(reps):
                    call()
                times[t].append((time.perf_counter() - t0) / reps)
        one, every = float(np.median(times[1])), float(np.median(times[0]))
        ladder.append({"elements": n, "one_thread_us": one * 1e6, "every_core_us": every * 1e6})
        n *= 2
    return cutoff_of(ladder), ladder


def cutoff_of(ladder: list[dict]) -> int:
    """The smallest rung from which every core wins by :data:`MARGIN` on it and every larger rung."""
    cutoff = HIGH
    for row in reversed(ladder):
        if row["every_core_us"] > MARGIN * row["one_thread_us"]:
            break
        cutoff = row["elements"]
    return cutoff
