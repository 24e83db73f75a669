"""The tuned-configuration store: the best configuration found per device and problem.

Every scan call asks :func:`lookup` for a tuned ``(schedule, config)``, so
this module imports nothing heavy and answers from an in-process copy of
each store file that is re-read only when the file's mtime or size changes.

A store is one JSON file (:data:`FORMAT`, :data:`VERSION`).  A process reads
every source :func:`sources` names, in order:

* the paths in ``$SCANWEAVER_TUNED`` (separated by ``os.pathsep``; a
  directory means ``<dir>/tuned.json``), typically one file on a network
  file system shared by every node and colleague;
* the per-user store ``tuned.json`` in the cache directory (:func:`cache_dir`:
  ``$SCANWEAVER_CACHE_DIR`` when set, else ``platformdirs.user_cache_dir("scanweaver")``),
  where Kernel Tuner's own cache files live too, under ``kernel_tuner/``.

Tunes and imports write to :func:`store_path`: the first shared path when
``$SCANWEAVER_TUNED`` is set, else the per-user store.  An entry is keyed
by backend, device name, recurrence signature (:meth:`Recurrence.signature`),
dtype and problem-size bucket (``round(log2(lanes))``, ``round(log2(L))``),
and records who measured it, on which host, when, and with which versions.
A lookup takes, over every source, the entry of the nearest bucket for that
device and recurrence (the newest on ties); with none, the per-device file
shipped for that GPU model (:mod:`scanweaver.tuning.devices`), and then the
caller's documented defaults apply.

Writers hold an exclusive POSIX lock (``fcntl.lockf``, which NFSv3 with
lockd and NFSv4 honour across machines) on ``<store>.lock`` plus a lock per
process for its threads, re-read the file, merge their entries and replace
the file atomically (a temporary file in the same directory, ``fsync``, then
``os.replace``), so concurrent writers on many nodes lose nothing and a
reader sees either the old or the new file, never a half-written one.  A lock
not obtained within :data:`LOCK_TIMEOUT_S` raises :class:`StoreLockError`
instead of hanging.

Nothing read from a store is trusted (:mod:`.store_check`): an entry with a
field of the wrong type or range is skipped, and a file that cannot be read,
is not valid JSON, is not a ScanWeaver store or was written by another store
version contributes nothing; each is reported once with a
:class:`RuntimeWarning`, and scans run with defaults.  Readers never rename a
file.  A writer (tune, import), under the lock, sets aside
(``tuned.json.bad-<time>``) only the per-user store and only when it is not
valid JSON; it refuses (:class:`StoreFormatError`) to replace a shared store
that is not valid JSON, or any store of another version or format, so that no
one else's entries are lost.  Skipped entries are written back unchanged.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import environment
from ..errors import ScanWeaverError
from . import atomic
from .store_check import entry_problem

log = logging.getLogger("scanweaver.tuning")

FORMAT = "scanweaver-tuned-configs"
VERSION = 1
STORE_NAME = "tuned.json"
#: environment variable naming shared stores (files or directories, separated by ``os.pathsep``)
SHARED_ENV = "SCANWEAVER_TUNED"
#: seconds a writer waits for the store's lock before :class:`StoreLockError`
LOCK_TIMEOUT_S = 120.0
LOCK_HINT = f"point {SHARED_ENV} at a file system with POSIX locks (NFSv4, NFSv3 with lockd)"
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
    return _cache_dir(environment.text("SCANWEAVER_CACHE_DIR"))


@functools.lru_cache(maxsize=8)
def _cache_dir(env: str | None) -> Path:
    """The directory for the raw value ``env`` of the variable (the cache key), read through the one reader."""
    given = environment.path("SCANWEAVER_CACHE_DIR")
    if given is not None:
        return given
    import platformdirs

    return Path(platformdirs.user_cache_dir("scanweaver"))


def user_store_path() -> Path:
    """The per-user store file, ``<cache_dir>/tuned.json``."""
    return cache_dir() / STORE_NAME


def shared_paths() -> list[Path]:
    """The store files named by ``$SCANWEAVER_TUNED`` (empty when unset)."""
    return list(_shared_paths(environment.text(SHARED_ENV)))


@functools.lru_cache(maxsize=8)
def _shared_paths(env: str) -> tuple[Path, ...]:
    out = []
    for part in env.split(os.pathsep):
        if not part.strip():
            continue
        p = Path(part.strip()).expanduser()
        out.append(p / STORE_NAME if p.is_dir() or part.strip().endswith(("/", os.sep)) else p)
    return tuple(out)


def sources() -> list[Path]:
    """Every store file this process reads, in order: shared stores first, then the per-user store.

    Example:
        >>> from scanweaver.tuning import store
        >>> store.sources()[-1] == store.user_store_path()
        True
    """
    seen: list[Path] = []
    for p in [*shared_paths(), user_store_path()]:
        if p not in seen:
            seen.append(p)
    return seen


def store_path() -> Path:
    """The store tunes and imports write to: the first ``$SCANWEAVER_TUNED`` path, else the per-user store."""
    shared = shared_paths()
    return shared[0] if shared else user_store_path()


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
        host, user: who measured it, and where (:func:`~.exchange.provenance`).
        versions: package name -> version of the measuring process.
        partial: ``""`` when the tune measured every valid configuration of its space, else how
            much it measured (a budget, a time limit or a lost shard ended it early).
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
    host: str = ""
    user: str = ""
    versions: dict = field(default_factory=dict)
    partial: str = ""

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


class StoreFormatError(ScanWeaverError, ValueError):
    """The store file is not a ScanWeaver store (corrupt or foreign)."""


#: the writer lock could not be taken (timed out, or the file system has no POSIX locks)
StoreLockError = atomic.LockError


class StoreDecodeError(StoreFormatError):
    """The store file is not valid JSON (half-written by a crashed writer, or damaged)."""


def parse(text: str) -> list[Entry]:
    """Parses store file text, skipping invalid entries; :class:`StoreFormatError` when it is not a store."""
    return parse_checked(text)[0]


def parse_checked(text: str) -> tuple[list[Entry], list[tuple[object, str]]]:
    """``(entries, skipped)`` of store file text: ``skipped`` holds each invalid entry with why.

    Raises:
        StoreDecodeError: not valid JSON.
        StoreFormatError: valid JSON but not a ScanWeaver store of this version.
    """
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise StoreDecodeError(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StoreFormatError(f"not a ScanWeaver store (no \"format\": {FORMAT!r})")
    if data.get("version") != VERSION:
        raise StoreFormatError(f"store version {data.get('version')!r}, this ScanWeaver reads {VERSION}")
    raw = data.get("entries")
    if not isinstance(raw, list):
        raise StoreFormatError(f"\"entries\" is {type(raw).__name__}, not a list")
    entries, skipped = [], []
    for d in raw:
        why = entry_problem(d)
        if why is None:
            entries.append(Entry.from_json(d))  # type: ignore[arg-type]
        else:
            skipped.append((d, why))
    return entries, skipped


def dump(entries: list[Entry], skipped: list | tuple = ()) -> str:
    """Store file text for ``entries`` (and, unchanged, the invalid entries ``skipped`` that were read)."""
    body = {"format": FORMAT, "version": VERSION, "entries": [e.to_json() for e in entries] + list(skipped)}
    return json.dumps(body, indent=1, sort_keys=True) + "\n"


def set_aside(path: Path, why: str) -> Path | None:
    """Renames an undecodable per-user store file out of the way, with a warning (call under its lock)."""
    dest = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        os.replace(path, dest)
    except FileNotFoundError:
        return None
    _stamps.clear()
    _warn(f"scanweaver: tuned-config store {path} is unusable ({why}); moved it to {dest}")
    return dest


_warned: set[tuple] = set()


def _warn(msg: str, once: tuple | None = None) -> None:
    """Logs and warns ``msg`` (once per ``once`` key when given)."""
    if once is not None:
        if once in _warned:
            return
        _warned.add(once)
    log.warning(msg)
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


#: Seconds a scan call may rely on the last look at the store files: a store written by another
#: process is seen by the calls made from then on (a ``stat`` per call costs more than a small scan).
RECHECK_S = 0.05


def stamp() -> tuple:
    """A token that changes whenever any store file this process reads is written, replaced or removed.

    Scan calls compare it to decide whether a cached call plan is still current.
    It is re-read at most every :data:`RECHECK_S` seconds, and at once after
    this process writes a store.
    """
    key = _env_key()
    now = time.monotonic()
    hit = _stamps.get(key)
    if hit is not None and now - hit[0] < RECHECK_S:
        return hit[1]
    value = tuple(_stat_token(str(p)) for p in sources())
    _stamps[key] = (now, value)
    return value


# On POSIX ``os.environ`` keeps its (encoded) contents in ``_data``, updated by every assignment; reading it
# directly costs a tenth of ``os.environ.get`` and still sees a changed cache or shared-store variable at once.
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _env_key() -> tuple:
    if _ENV_DATA is not None:
        return _ENV_DATA.get(b"SCANWEAVER_CACHE_DIR"), _ENV_DATA.get(SHARED_ENV.encode())
    return os.environ.get("SCANWEAVER_CACHE_DIR"), os.environ.get(SHARED_ENV)


def _stat_token(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


_stamps: dict[tuple, tuple[float, tuple]] = {}
_parsed: dict[str, tuple[tuple[int, int], list[Entry], list]] = {}


def load(path: Path | None = None, fresh: bool = False) -> list[Entry]:
    """Every valid entry in the store (cached in-process until the file changes).

    A missing file is an empty store.  A file that cannot be read or parsed,
    or is not a store of this version, is an empty store too, reported once
    with a warning; invalid entries are skipped, reported once per file
    version.  Nothing is renamed (see :func:`merge` for what writers do).
    ``fresh`` re-reads the file even when its mtime and size look unchanged
    (writers do, under the lock: two replacements can share a timestamp).
    """
    return _load(Path(path) if path else store_path(), fresh)[0]


def _load(path: Path, fresh: bool = False) -> tuple[list[Entry], list]:
    """``(entries, skipped raw entries)`` of ``path``, warning once about problems (never raises)."""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    except OSError as exc:
        _warn(f"scanweaver: tuned-config store {path} cannot be read ({exc}); using defaults", ("stat", str(path)))
        return [], []
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _parsed.get(str(path))
    if hit is not None and hit[0] == stamp and not fresh:
        return hit[1], hit[2]
    try:
        entries, skipped = parse_checked(atomic.read_text(path))
    except (StoreFormatError, OSError, UnicodeDecodeError) as exc:
        _warn(f"scanweaver: tuned-config store {path} is unusable ({exc}); ignoring it, scans use defaults",
              (str(path), stamp))
        return [], []
    if skipped:
        _warn(f"scanweaver: tuned-config store {path}: skipped {len(skipped)} invalid entr"
              f"{'y' if len(skipped) == 1 else 'ies'} (first: {skipped[0][1]})", (str(path), stamp, "entries"))
    _parsed[str(path)] = (stamp, entries, skipped)
    return entries, skipped


def _load_for_write(path: Path) -> tuple[list[Entry], list]:
    """``(entries, skipped)`` of ``path`` for a writer holding its lock.

    Raises:
        StoreFormatError: the file is another version's or format's store, or a shared store
            that is not valid JSON: replacing it would lose entries that are not ours.
    """
    try:
        text = atomic.read_text(path)
    except FileNotFoundError:
        return [], []
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreFormatError(f"tuned store: cannot read {path} ({exc}); not writing it") from None
    try:
        entries, skipped = parse_checked(text)
    except StoreDecodeError as exc:
        if path.resolve() != user_store_path().resolve():
            raise StoreFormatError(f"tuned store: the shared store {path} is {exc}; not replacing it (repair or "
                                   "move it, then write again)") from None
        set_aside(path, str(exc))
        return [], []
    except StoreFormatError as exc:
        raise StoreFormatError(f"tuned store: {path} is {exc}; not replacing it (it may belong to another "
                               "ScanWeaver version: use another store path, or move it)") from None
    return entries, [d for d, _ in skipped]


def _valid(entry: Entry) -> bool:
    """True when the entry's schedule and tunables are ones this ScanWeaver accepts."""
    from ..passes.materialize_schedule import resolve_config
    from ..runtime.base import REGISTRY

    backend = REGISTRY.get(entry.backend, None)
    if entry.schedule.startswith(FUSED_PREFIX):
        return _valid_fused(entry, backend)
    extra = backend.extra_tunables if backend is not None else ()
    if backend is not None and entry.schedule not in backend.schedules:
        return False
    try:
        resolve_config(entry.schedule, entry.config, "tuned store", extra)
    except (ValueError, TypeError) as exc:
        log.info("ignoring stored config %s/%s: %s", entry.schedule, entry.config, exc)
        return False
    return True


#: The ``schedule`` of an entry for a fused operation's kernel: ``fused:<op>`` (:mod:`.fused`).
FUSED_PREFIX = "fused:"


def _valid_fused(entry: Entry, backend) -> bool:
    """True when the fused operation exists, renders on the backend, and accepts the stored tunables."""
    from ..fused import REGISTRY as FUSED
    from ..targets.fused import family_of

    op = FUSED.get(entry.schedule[len(FUSED_PREFIX):], None)
    if op is None or backend is None or not op.runs_on(backend.target):
        return False
    try:
        op.resolve(family_of(backend.target), entry.config, {}, "tuned store")
    except (ValueError, TypeError) as exc:
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
    ``path`` reads that one file instead of every source.  Never raises on a
    bad store file.

    Example:
        >>> from scanweaver.tuning import store
        >>> store.lookup(backend="cpu", device="no such device", signature="0", dtype="float32",
        ...              lanes=8, L=1024) is None
        True
    """
    try:
        entries = load(path) if path is not None else [e for _, es in load_sources() for e in es]
    except Exception as exc:  # a store problem must never break a scan
        _warn(f"scanweaver: tuned-config store unreadable ({type(exc).__name__}: {exc}); scans use defaults",
              ("lookup", type(exc).__name__, str(exc)))
        entries = []
    want = (backend, device, signature, dtype)
    mine = [e for e in entries if (e.backend, e.device, e.signature, e.dtype) == want]
    if not mine:
        return _shipped(backend, device, dtype, lanes, L)
    lb, Lb = bucket(lanes), bucket(L)
    mine = [e for e in mine if abs(e.lanes_bucket - lb) <= MAX_BUCKET_DISTANCE
            and abs(e.L_bucket - Lb) <= MAX_BUCKET_DISTANCE]
    mine.sort(key=lambda e: (abs(e.lanes_bucket - lb) + abs(e.L_bucket - Lb), abs(e.L_bucket - Lb), -e.created))
    for e in mine:
        if _valid(e):
            return e.schedule, dict(e.config)
    return _shipped(backend, device, dtype, lanes, L)


def _shipped(backend: str, device: str, dtype: str, lanes: int, L: int) -> tuple[str, dict] | None:
    """The device file's configuration (:mod:`scanweaver.tuning.devices`) when no store has one."""
    try:
        from .devices import lookup as device_lookup

        hit = device_lookup(backend=backend, device=device, dtype=dtype, lanes=lanes, L=L)
    except Exception as exc:  # a bad device file must never break a scan
        log.warning("scanweaver: device configuration files unreadable: %s", exc)
        return None
    if hit is None:
        return None
    from ..runtime.base import REGISTRY

    cls = REGISTRY.get(backend, None)
    return hit if cls is None or hit[0] in cls.schedules else None


def locked(path: Path | None = None):
    """Holds the writer lock of the store at ``path`` (default :func:`store_path`); see :mod:`.atomic`.

    Raises:
        StoreLockError: not obtained within :data:`LOCK_TIMEOUT_S`, or refused by the file system.
    """
    return atomic.locked(Path(path) if path else store_path(), LOCK_TIMEOUT_S, what="tuned store", hint=LOCK_HINT)


def _write(path: Path, entries: list[Entry], skipped: list | tuple = ()) -> None:
    atomic.replace_text(path, dump(entries, skipped))
    _stamps.clear()  # this process's next scan call looks at the stores again


def record(entry: Entry, path: Path | None = None) -> Path:
    """Adds ``entry``, replacing the one with the same key; safe across processes and machines.

    Returns:
        the store path.
    """
    path = Path(path) if path else store_path()
    merge([entry], path, keep_newer=False)
    return path


def merge(entries: list[Entry], path: Path | None = None, keep_newer: bool = True) -> dict[str, int]:
    """Adds ``entries`` to the store at ``path`` (default :func:`store_path`) under its lock.

    Args:
        entries: entries to add.
        path: the store file.
        keep_newer: on a key already stored, keep whichever entry was measured
            last (``created``); with ``False`` the given entry always replaces it.

    Returns:
        counts ``{"added", "replaced", "kept"}`` (kept: a stored entry was newer).
    """
    path = Path(path) if path else store_path()
    counts = {"added": 0, "replaced": 0, "kept": 0}
    with locked(path):
        found, skipped = _load_for_write(path)
        current = {e.key(): e for e in found}
        for e in entries:
            old = current.get(e.key())
            if old is None:
                counts["added"] += 1
            elif keep_newer and old.created > e.created:
                counts["kept"] += 1
                continue
            else:
                counts["replaced"] += 1
            current[e.key()] = e
        if counts["added"] or counts["replaced"]:
            _write(path, list(current.values()), skipped)
    return counts


def load_sources() -> list[tuple[Path, list[Entry]]]:
    """``(path, entries)`` of every source (:func:`sources`); missing files have no entries."""
    return [(p, load(p)) for p in sources()]


def remove(*, backend: str | None = None, device: str | None = None, signature: str | None = None,
           path: Path | None = None) -> int:
    """Deletes the entries matching every given field; returns how many went."""
    path = Path(path) if path else store_path()
    want = {k: v for k, v in (("backend", backend), ("device", device), ("signature", signature)) if v is not None}
    with locked(path):
        entries, skipped = _load_for_write(path)
        keep = [e for e in entries if not all(getattr(e, k) == v for k, v in want.items())]
        if len(keep) != len(entries):
            _write(path, keep, skipped)
    return len(entries) - len(keep)
