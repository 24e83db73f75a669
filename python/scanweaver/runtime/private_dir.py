"""Directories that code is loaded from: created private, refused when others could write to them.

A compiled kernel is loaded into the process, so whoever can write to the
kernel cache can run code inside every process that uses it.
:func:`private_directory` creates missing directories with mode ``0700``
and accepts an existing one only when it is owned by the current user and
not writable by its group or others; otherwise it warns once and falls back
to a fresh private directory for this process (kernels then build again, but
nothing planted is ever loaded).  :func:`regular_file` tells whether a path
is a regular file of ours (never a symbolic link), and :func:`read_bytes` /
:func:`write_text` open files without following a symbolic link.

Example:
    >>> import tempfile, pathlib
    >>> from scanweaver.runtime.private_dir import private_directory
    >>> d = private_directory(pathlib.Path(tempfile.mkdtemp()) / "c")
    >>> oct(d.stat().st_mode & 0o777)
    '0o700'
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
import threading
import warnings
from pathlib import Path

log = logging.getLogger("scanweaver")

#: ``os.open`` flags that refuse a symbolic link in the file's place (``O_NOFOLLOW`` where the OS has it).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_POSIX = os.name == "posix" and hasattr(os, "getuid")

_fallbacks: dict[str, Path] = {}
_lock = threading.Lock()


def unsafe_reason(path: Path) -> str | None:
    """Why code must not be loaded from directory ``path``, or ``None`` when it is private to this user."""
    if not _POSIX:
        return None
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot be read ({exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by its group or by others (mode {oct(st.st_mode & 0o777)})"
    return None


def _make(path: Path) -> None:
    """Creates ``path`` and its missing parents with mode 0700."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(p, 0o700)


def private_directory(path: Path, what: str = "kernel cache") -> Path:
    """``path``, created private when missing; a private fallback (with one warning) when it is unsafe.

    Args:
        path: the directory wanted.
        what: its name in the warning.

    Returns:
        ``path``, or a fresh ``0700`` directory of this process when ``path`` is owned by another
        user or writable by others (see :func:`unsafe_reason`).
    """
    path = Path(path)
    with contextlib.suppress(OSError):  # reported below as unusable
        _make(path)
    why = unsafe_reason(path)
    if why is None:
        return path
    with _lock:
        fallback = _fallbacks.get(str(path))
        if fallback is None or not fallback.is_dir():
            fallback = Path(tempfile.mkdtemp(prefix="scanweaver-private-"))
            _fallbacks[str(path)] = fallback
            msg = (f"scanweaver: the {what} {path} {why}, so code loaded from it could be someone else's; "
                   f"using the private directory {fallback} for this process instead (make {path} yours with "
                   f"mode 0700, or set SCANWEAVER_CACHE_DIR to a private directory)")
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return fallback


def regular_file(path: Path) -> bool:
    """True when ``path`` is a regular file (not a symbolic link) owned by this user."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and (not _POSIX or st.st_uid == os.getuid())


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, refusing a symbolic link (``OSError``)."""
    fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def write_text(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` (created ``0600``), refusing a symbolic link (``OSError``)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
