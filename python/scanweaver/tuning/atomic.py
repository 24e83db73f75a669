"""Files that many processes on many machines share: a writer lock, and atomic replacement.

:func:`locked` (from :mod:`scanweaver.runtime.filelock`, which the kernel
cache shares) holds an exclusive POSIX record lock on ``<file>.lock`` and a
lock per file and process for its threads; it gives up with
:class:`LockError` after a timeout instead of hanging on a stuck holder.

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
from pathlib import Path

from ..runtime.filelock import LockError, locked

__all__ = ["LockError", "locked", "replace_text"]


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
