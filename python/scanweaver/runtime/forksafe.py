"""Fork safety of the compiled kernels: a child forked after kernels were loaded runs them on one thread.

GNU libgomp's thread pool does not survive ``fork``: the child inherits the pool's bookkeeping but not its
threads, so the child's next parallel region waits forever for workers that do not exist in it (this is
what ``multiprocessing`` with ``fork``, PyTorch DataLoader workers, ``gunicorn --preload`` and Dask's process
scheduler do).  The OpenMP runtime cannot be re-initialised, so an :func:`os.register_at_fork` handler sets
``sw_thread_cap = 1`` in every kernel library of the child (each C unit defines that variable; its
``sw_threads()`` never exceeds a positive cap), and in any library the child loads later, and warns once.
A child whose parent never loaded a kernel is left alone: its OpenMP starts fresh.

Example:
    >>> from scanweaver.runtime import forksafe
    >>> forksafe.capped()
    False
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import warnings

#: Every kernel library this process loaded (kept alive by the loader's cache anyway).
_libs: list[ctypes.CDLL] = []
#: Set in a child forked after kernels were loaded: every kernel runs on one thread.
_capped = False


def track(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Registers a loaded kernel library (capped at once in a forked child); returns it."""
    _libs.append(lib)  # no lock: a lock held by another thread at fork time would be held forever in the child
    if _capped:
        _cap(lib)
    return lib


def capped() -> bool:
    """True in a process forked after kernels were loaded (its kernels run on one thread)."""
    return _capped


def _cap(lib: ctypes.CDLL) -> None:
    with contextlib.suppress(ValueError):  # a unit without the variable (not a kernel): nothing to cap
        ctypes.c_int.in_dll(lib, "sw_thread_cap").value = 1


def _after_fork_in_child() -> None:
    global _capped
    if not _libs or _capped:
        return
    _capped = True
    for lib in _libs:
        _cap(lib)
    warnings.warn(f"scanweaver: process {os.getpid()} was forked after compiled kernels ran; the OpenMP thread "
                  "pool does not survive fork, so this process runs its kernels on one thread (start worker "
                  "processes with the 'spawn' or 'forkserver' method to keep every core)", RuntimeWarning,
                  stacklevel=2)


if hasattr(os, "register_at_fork") and sys.platform != "win32":
    os.register_at_fork(after_in_child=_after_fork_in_child)
