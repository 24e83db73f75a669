"""A cache of host arrays for the results handed to frameworks (``y`` and gradients of training steps).

A training loop asks for the same shapes every step, and the arrays of the
last step die before the next begins (``zero_grad`` drops the gradients,
the loss drops ``y``).  Fresh large arrays cost page faults on first touch,
measured here as much as the backward kernel itself (four 64 MiB gradients
of an (8, 512, 4096) step); so :meth:`HostPool.empty` hands back an array
of the same shape and dtype that nothing refers to any more, and allocates
otherwise.  An array is reused only when nothing else refers to it: a
PyTorch tensor over it (``torch.from_numpy``), a NumPy view and a JAX
callback's argument all keep it in use (see :class:`HostPool` for how that
is tracked).

The pool keeps at most ``SCANWEAVER_POOL_MB`` MiB (default 1024) of arrays,
in use or idle; beyond that requests get plain fresh arrays.  :meth:`clear`
drops the idle ones.

Example:
    >>> import numpy as np
    >>> pool = HostPool(max_bytes=1 << 20)
    >>> a = pool.empty((4, 8), np.float32); address = a.ctypes.data
    >>> del a
    >>> pool.empty((4, 8), np.float32).ctypes.data == address
    True
"""

from __future__ import annotations

import collections
import heapq
import math
import os
import threading
import weakref

import numpy as np

from .. import environment

#: Default cap of the pool, in MiB (``SCANWEAVER_POOL_MB`` overrides it; 0 disables the pool).
DEFAULT_MB = 1024
#: Outputs are placed this many bytes past their first input's position within a 4 KiB page. Large NumPy
#: arrays all start at the same offset in a page, and a load and a store that lie a multiple of 4 KiB apart
#: compete in the L1 cache (4K aliasing): a (8, 64, 1024) float32 scan on one thread took 261 us writing
#: an output at the inputs' offset and 186 us at 512 to 3072 bytes past it.
SKEW = 2048
PAGE = 4096
#: Below this many bytes an output is a plain ``np.empty``: there is no stream to skew.
SKEW_MIN_BYTES = 1 << 16
#: Outputs from this size on come from :data:`POOL` on repeated calls (:func:`host_output`): the arrays of
#: earlier calls that nothing refers to any more are reused, instead of fresh pages that the kernel would fault
#: in (3.5 ms of 13 for a 64 MiB scan output, 2 of 12.4 ms for a GLA forward's 32 MiB ``o``, measured); smaller
#: ones are plain ``np.empty``.
POOL_MIN_BYTES = 1 << 18


def skewed(buffer: np.ndarray, shape: tuple[int, ...], dtype, near: int) -> np.ndarray:
    """A ``shape``/``dtype`` view into ``buffer`` (bytes, at least ``nbytes + PAGE`` long) that starts
    :data:`SKEW` bytes past address ``near`` modulo a page."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    start = (near + SKEW - buffer.ctypes.data) % PAGE
    start -= start % dtype.itemsize
    return buffer[start:start + nbytes].view(dtype).reshape(shape)


def output(shape: tuple[int, ...], dtype, near: int | None = None, pool: HostPool | None = None) -> np.ndarray:
    """An uninitialised C-contiguous output, skewed against the input at address ``near`` (see :data:`SKEW`),
    from ``pool`` when one is given (its arrays are reused once nothing else refers to them)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if near is None or nbytes < SKEW_MIN_BYTES:
        return pool.empty(shape, dtype) if pool is not None else np.empty(shape, dtype)
    raw = pool.empty((nbytes + PAGE,), np.uint8) if pool is not None else np.empty(nbytes + PAGE, np.uint8)
    return skewed(raw, shape, dtype, near)


def host_output(shape: tuple[int, ...], dtype, near: np.ndarray | None = None, zero: bool = False) -> np.ndarray:
    """A kernel's output on the host: from :data:`POOL` from :data:`POOL_MIN_BYTES` on (skewed against the input
    array ``near``, see :data:`SKEW`), else a plain ``np.empty``; filled with zeros when ``zero``."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    pooled = math.prod(shape) * dtype.itemsize >= POOL_MIN_BYTES
    at = near.ctypes.data if pooled and near is not None and near.size else None
    out = output(shape, dtype, at, POOL if pooled else None)
    if zero:
        out.fill(0)
    return out


class HostPool:
    """Arrays by (shape, dtype), reused once nothing refers to them any more.

    Liveness is tracked without reference-count arithmetic (whose counts differ
    between Python versions): each array handed out is made by
    :func:`numpy.frombuffer` over a :class:`memoryview` of a pool buffer, so
    every view, slice or tensor made from it keeps that array alive (NumPy
    stops collapsing ``base`` chains at the memoryview), and a weak reference
    to it returns the buffer to the pool when the last of them is gone.

    Args:
        max_bytes: the most bytes the pool holds (in use or idle).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        #: per key, a heap of (serial, buffer): the oldest free buffer is handed out first, so a loop that
        #: asks for the same arrays in the same order gets the same buffers back each time
        self._idle: dict[tuple, list[tuple[int, np.ndarray]]] = {}
        self._serial = 0
        #: buffers whose last user died, as ``(key, buffer)``; appended by finalizers (from any thread, at any
        #: point of the interpreter), so it is a deque that needs no lock, drained under the lock
        self._returned: collections.deque[tuple[tuple, tuple[int, np.ndarray]]] = collections.deque()
        #: id of the weak reference -> (the reference, key, (serial, buffer)) of every array in use
        self._leases: dict[int, tuple[weakref.ref, tuple, tuple[int, np.ndarray]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype`` (reused or new)."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        key = (shape, dtype.str)
        with self._lock:
            self._drain()
            idle = self._idle.get(key)
            if idle:
                item = heapq.heappop(idle)
            elif self._bytes + nbytes <= self.max_bytes:
                item = (self._serial, np.empty(nbytes, np.uint8))
                self._serial += 1
                self._bytes += nbytes
            else:
                return np.empty(shape, dtype)
        lease = np.frombuffer(memoryview(item[1]), dtype)
        ref = weakref.ref(lease, self._release)
        self._leases[id(ref)] = (ref, key, item)
        return lease.reshape(shape)

    def _release(self, ref: weakref.ref) -> None:
        """The weak reference's callback: the last user of a buffer is gone (atomic dict and deque steps)."""
        _, key, item = self._leases.pop(id(ref))
        self._returned.append((key, item))

    def _drain(self) -> None:
        """Moves returned buffers to the idle lists (the caller holds the lock)."""
        while self._returned:
            key, item = self._returned.popleft()
            heapq.heappush(self._idle.setdefault(key, []), item)

    def clear(self) -> None:
        """Forgets every idle array (arrays in use stay with their users)."""
        with self._lock:
            self._drain()
            for items in self._idle.values():
                self._bytes -= sum(raw.nbytes for _, raw in items)
            self._idle.clear()

    @property
    def nbytes(self) -> int:
        """Bytes the pool holds."""
        return self._bytes


def _cap_bytes() -> int:
    """``SCANWEAVER_POOL_MB`` in bytes (the default, with a warning naming it, when it is not a finite number >= 0)."""
    return int(environment.number("SCANWEAVER_POOL_MB", DEFAULT_MB) * (1 << 20))


#: The process's pool for results handed to frameworks.
POOL = HostPool(_cap_bytes())


def _new_lock_in_child() -> None:
    """A forked child takes a new lock for the pool: one another thread of the parent held at the fork would stay
    held in the child for ever, and its first pooled output would hang."""
    POOL._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)
