"""A writer lock between threads and processes, with a deadline: :func:`locked`.

:func:`locked` holds an exclusive POSIX record lock (``fcntl.lockf``) on
``<file>.lock``; NFSv3 with lockd and NFSv4 honour such locks across
machines (BSD ``flock`` is not guaranteed to).  POSIX locks belong to a
process, not to a thread, so a lock per file and process serialises the
threads of one process first.  Both are waited for with back-off and give up
with :class:`LockError` after a timeout instead of hanging on a stuck (for
example stopped) holder.  The lock file is opened without following a
symbolic link.

Example:
    >>> import tempfile, pathlib
    >>> from scanweaver.runtime.filelock import locked
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "shared.json"
    >>> with locked(f, timeout=5):
    ...     _ = f.write_text("{}")
    >>> f.read_text()
    '{}'
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from ..errors import ScanWeaverError


class LockError(ScanWeaverError):
    """A file's writer lock could not be taken (timed out, or the file system has no POSIX locks)."""


_thread_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()

#: ``os.open`` flags of a lock file: create it, and never follow a symbolic link planted in its place.
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _thread_lock(path: Path) -> threading.Lock:
    with _guard:
        return _thread_locks.setdefault(str(path.resolve()), threading.Lock())


def _fresh_in_child() -> None:
    """A forked child has none of its parent's other threads: the thread locks they held (a compile in progress
    holds its cache file's for seconds) would stay held in the child, whose next lock of that file would wait out
    its whole timeout and fail.  The child starts with none (its POSIX record locks start free anyway)."""
    global _guard
    _guard = threading.Lock()
    _thread_locks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)


@contextlib.contextmanager
def locked(path: Path, timeout: float = 120.0, what: str = "file", hint: str = ""):
    """Holds the exclusive writer lock of ``path`` for the block.

    Args:
        path: the shared file (the lock is ``<path>.lock`` beside it).
        timeout: seconds to wait for the lock (threads of this process, then other processes).
        what: a name for ``path`` in error messages.
        hint: what to do when the file system refuses locks.

    Raises:
        LockError: not obtained within ``timeout``, or refused by the file system.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lockfile = path.with_name(path.name + ".lock")
    deadline = time.monotonic() + timeout
    tlock = _thread_lock(path)
    if not tlock.acquire(timeout=max(timeout, 0.0)):
        raise LockError(f"{what}: another thread held the lock of {path} for over {timeout:.0f} s")
    try:
        try:
            fd = os.open(lockfile, OPEN_FLAGS, 0o600)
        except OSError as exc:
            raise LockError(f"{what}: cannot open the lock file {lockfile} ({exc}); {hint or 'use another'}") \
                from None
        try:
            try:
                import fcntl
            except ImportError:  # no POSIX locks on this platform: only threads are serialised
                yield
                return
            _lockf(fcntl, fd, lockfile, deadline, timeout, what, hint)
            try:
                yield
            finally:
                fcntl.lockf(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        tlock.release()


def _lockf(fcntl, fd: int, lockfile: Path, deadline: float, timeout: float, what: str, hint: str) -> None:
    wait = 0.002
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
