"""Files that many processes on many machines share: a writer lock, and atomic replacement.

:func:`locked` holds an exclusive POSIX record lock (``fcntl.lockf``) on
``<file>.lock``; NFSv3 with lockd and NFSv4 honour such locks across
machines (BSD ``flock`` is not guaranteed to).  POSIX locks belong to a
process, not to a thread, so a lock per file and process serialises the
threads of one process first.  The lock is polled with back-off and gives up
with :class:`LockError` after a timeout instead of hanging on a stuck holder.

:func:`replace_text` writes a temporary file in the same directory, flushes
it to disk and renames it over the target (``os.replace``, atomic on POSIX
file systems and on NFS), so a reader sees the old or the new file, never a
half-written one.

Example:
    >>> import tempfile, pathlib
    >>> from scanweaver.tuning import atomic
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "shared.json"
    >>> with atomic.locked(f):
    ...     atomic.replace_text(f, "{}")
    >>> f.read_text()
    '{}'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from pathlib import Path

from ..errors import ScanWeaverError


class LockError(ScanWeaverError):
    """A file's writer lock could not be taken (timed out, or the file system has no POSIX locks)."""


_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def _thread_lock(path: Path) -> threading.Lock:
    with _guard:
        return _thread_locks.setdefault(str(path.resolve()), threading.Lock())


@contextlib.contextmanager
def locked(path: Path, timeout: float = 120.0, what: str = "file", hint: str = ""):
    """Holds the exclusive writer lock of ``path`` for the block.

    Args:
        path: the shared file (the lock is ``<path>.lock`` beside it).
        timeout: seconds to wait for the lock.
        what: a name for ``path`` in error messages.
        hint: what to do when the file system refuses locks.

    Raises:
        LockError: not obtained within ``timeout``, or refused by the file system.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lockfile = path.with_name(path.name + ".lock")
    tlock = _thread_lock(path)
    if not tlock.acquire(timeout=timeout):
        raise LockError(f"{what}: another thread held the lock of {path} for over {timeout:.0f} s")
    try:
        with open(lockfile, "a") as fh:
            try:
                import fcntl
            except ImportError:  # no POSIX locks on this platform: only threads are serialised
                yield
                return
            _lockf(fcntl, fh, lockfile, timeout, what, hint)
            try:
                yield
            finally:
                fcntl.lockf(fh.fileno(), fcntl.LOCK_UN)
    finally:
        tlock.release()


def _lockf(fcntl, fh, lockfile: Path, timeout: float, what: str, hint: str) -> None:
    deadline = time.monotonic() + timeout
    wait = 0.002
    while True:
        try:
            fcntl.lockf(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except (BlockingIOError, PermissionError):
            if time.monotonic() > deadline:
                raise LockError(f"{what}: could not lock {lockfile} within {timeout:.0f} s (another process "
                                "holds it; delete the file if no writer is alive)") from None
            time.sleep(wait)
            wait = min(2 * wait, 0.05)
        except OSError as exc:
            raise LockError(f"{what}: the file system of {lockfile} refuses locks ({exc}); {hint or 'use another'}") \
                from None


def replace_text(path: Path, text: str) -> None:
    """Replaces ``path`` with ``text`` atomically (temporary file, fsync, rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
