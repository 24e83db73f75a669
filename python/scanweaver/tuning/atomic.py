"""Files that many processes on many machines share: a writer lock, atomic replacement, a bounded read.

:func:`locked` (from :mod:`scanweaver.runtime.filelock`, which the kernel
cache shares) holds an exclusive POSIX record lock on ``<file>.lock`` and a
lock per file and process for its threads; it gives up with
:class:`LockError` after a timeout instead of hanging on a stuck holder.

:func:`replace_text` writes a temporary file in the same directory, flushes
it to disk and renames it over the target (``os.replace``, atomic on POSIX
file systems and on NFS), so a reader sees the old or the new file, never a
half-written one.

:func:`read_text` reads a file whose name comes from the environment or the
command line: only a regular file (a FIFO would block, a device such as
``/dev/zero`` never ends), opened without blocking, at most
:data:`MAX_READ_BYTES`; anything else is an :class:`UnreadableFileError`
that names the reason.

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
import stat
import tempfile
from pathlib import Path

from ..runtime.filelock import LockError, locked

__all__ = ["MAX_READ_BYTES", "LockError", "UnreadableFileError", "locked", "read_text", "replace_text"]

#: Largest file :func:`read_text` reads: a store of this size holds hundreds of thousands of entries.
MAX_READ_BYTES = 64 << 20


#: What a path that is not a regular file is, for the message.
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


class UnreadableFileError(OSError):
    """The file is not a regular file, or larger than :data:`MAX_READ_BYTES`."""


def read_text(path: Path, limit: int = MAX_READ_BYTES) -> str:
    """The UTF-8 text of the regular file ``path``, opened without blocking, at most ``limit`` bytes.

    Raises:
        FileNotFoundError: no such file.
        UnreadableFileError: not a regular file (FIFO, device, directory, socket), or over ``limit`` bytes.
        OSError, UnicodeDecodeError: it cannot be read or decoded.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)  # non-blocking: opening a FIFO without a writer would wait forever
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "a special file")
            raise UnreadableFileError(f"{path} is {kind}, not a regular file")
        if st.st_size > limit:
            raise UnreadableFileError(f"{path} is {st.st_size} bytes, over the {limit >> 20} MiB limit")
        chunks, size = [], 0
        while size <= limit:  # files that report no size (/proc) are bounded by what is read
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnreadableFileError(f"{path} holds more than {limit >> 20} MiB, the limit")
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


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
