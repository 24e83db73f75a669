"""Per-device tuned configurations shipped with the package: defaults measured on a named GPU.

A device file is JSON in ``scanweaver/tuning/devices/`` (or in a directory
named by ``$SCANWEAVER_DEVICE_CONFIGS``), used when the backend's device
name contains the file's ``match`` string and the user's own tuned store
(:mod:`scanweaver.tuning.store`) has nothing for the problem: the user's
tuning always wins.  Its entries are per problem-size class and serve any
recurrence on that device (they were measured on the selective scan)::

    {"format": "scanweaver-device-configs", "version": 1,
     "backend": "cuda", "device": "NVIDIA H200", "match": "H200",
     "produced_by": "python bench/gpu_defaults.py", "measured": "<date, versions>",
     "entries": [{"dtype": "float32", "lanes": 12288, "L": 4096, "schedule": "hybrid",
                  "config": {"workgroup_size": 256, "items_per_thread": 4, "lanes_per_group": 1},
                  "time_ms": 0.2, "roofline_fraction": 0.95}]}

An entry serves problems within :data:`~scanweaver.tuning.store.MAX_BUCKET_DISTANCE`
log2 buckets of its ``lanes`` and ``L``; the nearest wins.  To add a device:
run ``python bench/gpu_defaults.py --out-dir python/scanweaver/tuning/devices`` on it (it
sweeps each schedule per size class, checks every configuration against a float64 reference,
keeps the fastest, and names the file and its match after the device: ``h200.json``, ``H200``)
and commit the file.

Example:
    >>> from scanweaver.tuning.devices import lookup
    >>> lookup(backend="cuda", device="no such GPU", dtype="float32", lanes=8, L=1024) is None
    True
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from .. import environment
from . import atomic

FORMAT = "scanweaver-device-configs"
VERSION = 1
ENV_DIR = "SCANWEAVER_DEVICE_CONFIGS"
SHIPPED = Path(__file__).parent / "devices"

log = logging.getLogger("scanweaver.tuning")


def directories() -> list[Path]:
    """Where device files are read from: ``$SCANWEAVER_DEVICE_CONFIGS`` first, then the shipped ones."""
    extra = environment.path(ENV_DIR)
    return ([extra] if extra is not None else []) + [SHIPPED]


@functools.lru_cache(maxsize=8)
def _load(dirs: tuple[str, ...]) -> tuple[dict, ...]:
    files = []
    for d in dirs:
        for path in sorted(Path(d).glob("*.json")):
            try:
                doc = json.loads(atomic.read_text(path))  # regular files only, bounded: never blocks
            except (OSError, ValueError) as exc:
                log.warning("scanweaver: device file %s unreadable: %s", path, exc)
                continue
            if doc.get("format") != FORMAT or doc.get("version") != VERSION:
                log.warning("scanweaver: %s is not a %s v%d file; ignored", path, FORMAT, VERSION)
                continue
            files.append(doc)
    return tuple(files)


def files() -> tuple[dict, ...]:
    """Every readable device file (cached per set of directories)."""
    return _load(tuple(str(d) for d in directories()))


def lookup(*, backend: str, device: str, dtype: str, lanes: int, L: int) -> tuple[str, dict] | None:
    """The shipped ``(schedule, config)`` for this device and problem size, or ``None``."""
    from ..passes.materialize_schedule import resolve_config
    from .store import MAX_BUCKET_DISTANCE, bucket

    lb, Lb = bucket(lanes), bucket(L)
    best = None
    for doc in files():
        if doc.get("backend") != backend or not doc.get("match") or doc["match"] not in device:
            continue
        for e in doc.get("entries", []):
            if e.get("dtype") != dtype:
                continue
            dl, dL = abs(bucket(e["lanes"]) - lb), abs(bucket(e["L"]) - Lb)
            if dl > MAX_BUCKET_DISTANCE or dL > MAX_BUCKET_DISTANCE:
                continue
            try:
                cfg = dict(e["config"])
                resolve_config(e["schedule"], cfg, "device file")
            except (KeyError, ValueError) as exc:
                log.info("ignoring device-file entry %s: %s", e, exc)
                continue
            rank = (dl + dL, dL)
            if best is None or rank < best[0]:
                best = (rank, (e["schedule"], cfg))
    return None if best is None else best[1]
