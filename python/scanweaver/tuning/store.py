"""The tuned-configuration store: the best configuration found per device and problem.

Every scan call asks :func:`lookup` for a tuned ``(schedule, config)``, so
this module imports nothing heavy and answers from an in-process copy of the
store file that is re-read only when the file's mtime changes.

The store is one JSON file, ``tuned.json``, in the cache directory
(:func:`cache_dir`: ``$SCANWEAVER_CACHE_DIR`` when set, else
``platformdirs.user_cache_dir("scanweaver")``); Kernel Tuner's own cache
files live beside it under ``kernel_tuner/``.  An entry is keyed by backend,
device name, recurrence signature (:meth:`Recurrence.signature`), dtype and
problem-size bucket (``round(log2(lanes))``, ``round(log2(L))``).  A lookup
takes the entry of the nearest bucket for that device and recurrence; with
none, the caller's documented defaults apply.

Writers take an exclusive ``fcntl`` lock on ``tuned.json.lock``, re-read the
file, merge their entry and atomically replace the file, so concurrent tunes
lose nothing.  A file that is not valid JSON or not a ScanWeaver store is
reported with a :class:`RuntimeWarning` and renamed aside
(``tuned.json.bad-<time>``); scans then run with defaults.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

log = logging.getLogger("scanweaver.tuning")

FORMAT = "scanweaver-tuned-configs"
VERSION = 1
STORE_NAME = "tuned.json"
#: key fields of an entry, in order
KEY = ("backend", "device", "signature", "dtype", "lanes_bucket", "L_bucket")


def cache_dir() -> Path:
    """The directory of the store and of Kernel Tuner's cache files.

    ``$SCANWEAVER_CACHE_DIR`` when set, else the per-user cache directory.

    Example:
        >>> from scanweaver.tuning import store
        >>> store.cache_dir().name != ""
        True
    """
    return _cache_dir(os.environ.get("SCANWEAVER_CACHE_DIR"))


@functools.lru_cache(maxsize=8)
def _cache_dir(env: str | None) -> Path:
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("scanweaver"))


def store_path() -> Path:
    """Path of the tuned-configuration store file."""
    return cache_dir() / STORE_NAME


def bucket(n: int) -> int:
    """The size bucket of ``n`` elements: ``round(log2(n))`` (0 for n <= 1)."""
    return 0 if n <= 1 else int(round(math.log2(n)))


@dataclass
class Entry:
    """One tuned configuration.

    Attributes:
        backend, device, signature, dtype: what it was tuned for.
        lanes, L: the problem size tuned (buckets derive from them).
        schedule: the schedule to run.
        config: the tunables, keywords the runtime accepts.
        time_ms: measured time of ``config``.
        default_ms: measured time of the default configuration (or ``None``).
        strategy: Kernel Tuner strategy that found it.
        kt_cache: Kernel Tuner cache file of the tune, relative to the cache dir.
        created: Unix time of the tune.
    """

    backend: str
    device: str
    signature: str
    dtype: str
    lanes: int
    L: int
    schedule: str
    config: dict
    time_ms: float
    default_ms: float | None = None
    strategy: str = ""
    kt_cache: str = ""
    created: float = field(default_factory=time.time)

    @property
    def lanes_bucket(self) -> int:
        return bucket(self.lanes)

    @property
    def L_bucket(self) -> int:
        return bucket(self.L)

    def key(self) -> tuple:
        """The store key (backend, device, signature, dtype, lanes bucket, L bucket)."""
        return tuple(getattr(self, k) for k in KEY)

    def to_json(self) -> dict:
        return {**asdict(self), "lanes_bucket": self.lanes_bucket, "L_bucket": self.L_bucket}

    @classmethod
    def from_json(cls, d: dict) -> Entry:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


class StoreFormatError(ValueError):
    """The store file is not a ScanWeaver store (corrupt or foreign)."""


def parse(text: str) -> list[Entry]:
    """Parses store file text; :class:`StoreFormatError` when it is not a store."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreFormatError(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StoreFormatError(f"not a ScanWeaver store (no \"format\": {FORMAT!r})")
    if data.get("version") != VERSION:
        raise StoreFormatError(f"store version {data.get('version')!r}, this ScanWeaver reads {VERSION}")
    try:
        return [Entry.from_json(e) for e in data["entries"]]
    except (KeyError, TypeError) as exc:
        raise StoreFormatError(f"malformed entry ({type(exc).__name__}: {exc})") from None


def dump(entries: list[Entry]) -> str:
    """Store file text for ``entries``."""
    body = {"format": FORMAT, "version": VERSION, "entries": [e.to_json() for e in entries]}
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def set_aside(path: Path, why: str) -> Path | None:
    """Renames a corrupt or foreign store file out of the way, with a warning."""
    dest = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, dest)
    except FileNotFoundError:
        return None  # another process set it aside first
    msg = f"scanweaver: tuned-config store {path} is unusable ({why}); moved it to {dest}, using defaults"
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return dest


_parsed: dict[str, tuple[tuple[int, int], list[Entry]]] = {}


def load(path: Path | None = None, fresh: bool = False) -> list[Entry]:
    """Every entry in the store (cached in-process until the file changes).

    A missing file is an empty store; a corrupt or foreign one is set aside.
    ``fresh`` re-reads the file even when its mtime and size look unchanged
    (writers do, under the lock: two replacements can share a timestamp).
    """
    path = Path(path) if path else store_path()
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return []
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _parsed.get(str(path))
    if hit is not None and hit[0] == stamp and not fresh:
        return hit[1]
    try:
        entries = parse(path.read_text())
    except StoreFormatError as exc:
        set_aside(path, str(exc))
        return []
    except (OSError, UnicodeDecodeError) as exc:
        set_aside(path, f"{type(exc).__name__}: {exc}")
        return []
    _parsed[str(path)] = (stamp, entries)
    return entries


def _valid(entry: Entry) -> bool:
    """True when the entry's schedule and tunables are ones this ScanWeaver accepts."""
    from ..passes.materialize_schedule import resolve_config
    from ..runtime.base import REGISTRY

    backend = REGISTRY.get(entry.backend, None)
    extra = backend.extra_tunables if backend is not None else ()
    if backend is not None and entry.schedule not in backend.schedules:
        return False
    try:
        resolve_config(entry.schedule, entry.config, "tuned store", extra)
    except ValueError as exc:
        log.info("ignoring stored config %s/%s: %s", entry.schedule, entry.config, exc)
        return False
    return True


#: A tuned entry serves problems within this many log2 buckets of its lanes and of its L; a
#: configuration tuned for thousands of short lanes says nothing about one long lane.
MAX_BUCKET_DISTANCE = 2


def lookup(*, backend: str, device: str, signature: str, dtype: str, lanes: int, L: int,
           path: Path | None = None) -> tuple[str, dict] | None:
    """The tuned ``(schedule, config)`` nearest to this problem size, or ``None``.

    Only entries for the same backend, device, recurrence signature and dtype
    count, and only those within :data:`MAX_BUCKET_DISTANCE` log2 buckets of
    the problem in lanes and in L; among them the one whose size buckets are
    nearest (sum of the log2 distances, L first on ties, newest last) wins.
    Never raises on a bad store file.

    Example:
        >>> from scanweaver.tuning import store
        >>> store.lookup(backend="cpu", device="no such device", signature="0", dtype="float32",
        ...              lanes=8, L=1024) is None
        True
    """
    try:
        entries = load(path)
    except Exception as exc:  # a store problem must never break a scan
        log.warning("scanweaver: tuned-config store unreadable: %s", exc)
        return None
    want = (backend, device, signature, dtype)
    mine = [e for e in entries if (e.backend, e.device, e.signature, e.dtype) == want]
    if not mine:
        return None
    lb, Lb = bucket(lanes), bucket(L)
    mine = [e for e in mine if abs(e.lanes_bucket - lb) <= MAX_BUCKET_DISTANCE
            and abs(e.L_bucket - Lb) <= MAX_BUCKET_DISTANCE]
    mine.sort(key=lambda e: (abs(e.lanes_bucket - lb) + abs(e.L_bucket - Lb), abs(e.L_bucket - Lb), -e.created))
    for e in mine:
        if _valid(e):
            return e.schedule, dict(e.config)
    return None


@contextlib.contextmanager
def locked(path: Path | None = None):
    """Holds the store's exclusive writer lock (``fcntl.flock``; no lock where fcntl is absent)."""
    path = Path(path) if path else store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write(path: Path, entries: list[Entry]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(dump(entries))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def record(entry: Entry, path: Path | None = None) -> Path:
    """Adds ``entry``, replacing the one with the same key; safe across processes.

    Returns:
        the store path.
    """
    path = Path(path) if path else store_path()
    with locked(path):
        current = [e for e in load(path, fresh=True) if e.key() != entry.key()]
        _write(path, [*current, entry])
    return path


def remove(*, backend: str | None = None, device: str | None = None, signature: str | None = None,
           path: Path | None = None) -> int:
    """Deletes the entries matching every given field; returns how many went."""
    path = Path(path) if path else store_path()
    want = {k: v for k, v in (("backend", backend), ("device", device), ("signature", signature)) if v is not None}
    with locked(path):
        entries = load(path, fresh=True)
        keep = [e for e in entries if not all(getattr(e, k) == v for k, v in want.items())]
        if len(keep) != len(entries):
            _write(path, keep)
    return len(entries) - len(keep)
