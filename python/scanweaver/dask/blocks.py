"""What one Dask task does to one block: scan it, reduce it to its aggregate, correct it by a carry.

A :class:`BlockKernel` is the plug-in the graph builder (:mod:`.graph`) is
written against; :class:`RecurrenceBlocks` serves every ``@recurrence``
(``selective_scan`` included) and :class:`scanweaver.dask.mamba.MambaBlocks`
the Mamba scan.  Kernels are pickled into the tasks and run on the workers:
the scan itself is the in-memory API call, so each block runs on the worker's
best backend with the worker's tuned configurations.

Example:
    >>> import numpy as np
    >>> from scanweaver.api import SELECTIVE_NO_C
    >>> from scanweaver.dask.blocks import BlockContext, RecurrenceBlocks
    >>> k = RecurrenceBlocks(SELECTIVE_NO_C, dtype="float64", call={"backend": "numpy"})
    >>> a, b, x = np.full((1, 3), 0.5), np.ones((1, 3)), np.ones((1, 3))
    >>> ctx = BlockContext(offset=0, length=3, first=True)
    >>> p, s = k.aggregate(ctx, a, b, x)
    >>> float(p[0]), float(s[0])
    (0.125, 1.75)
"""

from __future__ import annotations

import math
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from ..core.dispatch import pick_backend, resolve
from ..errors import ScanInputError, ScanWeaverError
from ..ir.expr import is_const
from ..ir.stages import Features
from ..passes import lower
from ..targets.reference import eval_operand
from .carry import matrix_chain, segment_product


@dataclass(frozen=True)
class BlockContext:
    """Where a block sits along L.

    Attributes:
        offset: index of its first element along L.
        length: its length along L.
        first: it is the first block in time order (the last one for a reverse scan).
        resets: positions along L (absolute) where a packed sequence restarts the state.
        origin: index of its first element along each axis before L.
    """

    offset: int
    length: int
    first: bool
    resets: tuple[int, ...] = ()
    origin: tuple[int, ...] = ()

    def reset_mask(self) -> np.ndarray | None:
        """The ``(length,)`` mask of the positions in :attr:`resets` inside this block, or ``None``."""
        pos = [p - self.offset for p in self.resets if self.offset <= p < self.offset + self.length]
        if not pos:
            return None
        mask = np.zeros(self.length, dtype=bool)
        mask[pos] = True
        return mask


class BlockKernel(ABC):
    """The work of one block, for one kind of scan.

    Class attributes:
        dense: the state's transitions are k x k matrices (pairs compose with ``@``).
        correctable: :meth:`correct` is exact for this scan (scalar transitions,
            ``y`` kept in the accumulation dtype).
    """

    dense: bool = False
    correctable: bool = False
    #: Cores a block task takes when its call leaves ``threads`` alone (``None``: the backend's default, every
    #: core).  The graph builder sets it to the host's cores shared by the tasks that run at once, so the
    #: local scheduler's worker threads do not each start every core (tasks x cores threads).
    share: int | None = None

    @abstractmethod
    def scan(self, ctx: BlockContext, h0: np.ndarray | None, *blocks: np.ndarray,
             threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(y, h_last)`` of the block entered with state ``h0`` (``None``: zero).

        ``threads``: cores the block may use (see :func:`with_threads`); ``None``: the worker's default.
        """

    @abstractmethod
    def product(self, ctx: BlockContext, *blocks: np.ndarray) -> np.ndarray:
        """P: the product of the block's transitions, later after earlier."""

    def aggregate(self, ctx: BlockContext, *blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(P, S)``: the block's transition product and its final state from a zero start."""
        _, s = self.scan(ctx, None, *blocks)
        return self.product(ctx, *blocks), s

    def local(self, ctx: BlockContext, *blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(y, P, S)`` from a zero start: the first pass of :meth:`correct`."""
        y, s = self.scan(ctx, None, *blocks)
        return y, self.product(ctx, *blocks), s

    def correct(self, ctx: BlockContext, y: np.ndarray, carry: np.ndarray | None, *blocks: np.ndarray) -> np.ndarray:
        """``y`` of the block entered with ``carry`` instead of zero, from its zero-start ``y``."""
        raise ScanInputError(f"{type(self).__name__}: method='correct' is not exact here; use 'rescan' or 'chain'")


def host_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


_scratch = threading.local()


def scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A reused output buffer of this thread (the first pass throws its ``y`` away)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.shape != shape or buf.dtype != dtype:
        buf = _scratch.buf = np.empty(shape, dtype)
    return buf


@dataclass
class RecurrenceBlocks(BlockKernel):
    """Blocks of a :class:`~scanweaver.Recurrence` call.

    Attributes:
        rec: the recurrence.
        dtype: accumulation dtype name.
        out_dtype: dtype ``y`` comes back in (half types: not the accumulation dtype).
        reverse: the scan runs from the end.
        has_reset: a reset block follows the operand blocks.
        call: keywords of every block's call: ``backend``, ``schedule``, ``config`` and tunables.
    """

    rec: object
    dtype: str
    out_dtype: str = ""
    reverse: bool = False
    has_reset: bool = False
    call: dict = field(default_factory=dict)

    def __post_init__(self):
        self.dense = self.rec.state_size > 1
        self.correctable = not self.dense and (self.out_dtype or self.dtype) == self.dtype

    def _split(self, ctx: BlockContext, blocks: tuple) -> tuple[tuple, np.ndarray | None]:
        """Operand blocks, and the reset mask (the user's reset block or'ed with the packed-sequence starts)."""
        ops, reset = (blocks[:-1], blocks[-1]) if self.has_reset else (blocks, None)
        packed = ctx.reset_mask()
        if packed is not None:
            shape = np.broadcast_shapes(*(np.shape(b) for b in ops))
            reset = packed if reset is None else np.asarray(reset, bool) | packed
            reset = np.broadcast_to(reset, shape)
        return ops, reset

    def scan(self, ctx, h0, *blocks, threads=None):
        ops, reset = self._split(ctx, blocks)
        threads = self.share if threads is None else threads
        call = self.call if threads is None else self._with_threads(ops, threads)
        return self.rec(*ops, h0=h0, reset=reset, reverse=self.reverse, return_state=True, **call)

    def _with_threads(self, ops: tuple, threads: int) -> dict:
        """The block's call resolved here, as the in-memory call would (the tuned store's choice kept), with
        ``threads`` cores where the backend has that tunable (``cpu``) and the caller left ``threads`` alone.

        Dask workers run with ``OMP_NUM_THREADS=1`` (one task per worker
        thread), right while every worker thread has a task; the chain of a
        single row runs one block at a time, so its blocks take the host's cores.
        """
        call = self.call
        if "threads" in call:
            return call
        try:
            be = pick_backend(call.get("backend", "auto"), self.dtype, "dense" if self.dense else "diagonal")
            if not any(t.name == "threads" for t in be.extra_tunables):
                return call
            shape = np.broadcast_shapes(*(np.shape(b) for b in ops))
            tunables = {k: v for k, v in call.items() if k not in ("backend", "schedule", "config")}
            schedule, cfg, _ = resolve(self.rec, be, call.get("schedule", "auto"), call.get("config", "auto"),
                                       tunables, self.dtype, math.prod(shape[:-1]), shape[-1])
        except ScanWeaverError:  # the call itself reports it
            return call
        return {"backend": be.name, "schedule": schedule, "config": {**cfg, "threads": int(threads)}}

    def aggregate(self, ctx, *blocks):
        ops, reset = self._split(ctx, blocks)
        shape = np.broadcast_shapes(*(np.shape(b) for b in ops))
        out = scratch(shape, np.dtype(self.out_dtype or self.dtype))
        call = self.call if self.share is None else self._with_threads(ops, self.share)
        _, s = self.rec(*ops, reset=reset, reverse=self.reverse, return_state=True, out=out, **call)
        return self.product(ctx, *blocks), s

    def _affine(self):
        return lower(self.rec.scan_ir(self.dtype, Features(reverse=self.reverse))).affine

    def _transitions(self, ops: tuple, shape: tuple) -> np.ndarray:
        """A_t of every element: ``(lanes, L)``, or ``(lanes, L, k, k)`` in time order for dense states."""
        ir = self._affine()
        inputs = dict(zip(self.rec.inputs, ops, strict=True))
        lanes, L = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
        if not self.dense:
            return np.asarray(eval_operand(ir.A, inputs, self.dtype, shape)).reshape(lanes, L)
        k = self.rec.state_size
        a = np.stack([eval_operand(e, inputs, self.dtype, shape).reshape(lanes, L) for e in ir.A], axis=-1)
        a = a.reshape(lanes, L, k, k)
        return a[:, ::-1] if self.reverse else a

    def product(self, ctx, *blocks):
        ops, reset = self._split(ctx, blocks)
        shape = np.broadcast_shapes(*(np.shape(b) for b in ops))
        batch = shape[:-1]
        a = self._transitions(ops, shape)
        p = matrix_chain(a) if self.dense else segment_product(a)
        if reset is not None:
            p[np.asarray(reset, bool).reshape(p.shape[0], -1).any(axis=1)] = 0
        return p.reshape((*batch, self.rec.state_size, self.rec.state_size) if self.dense else batch)

    def correct(self, ctx, y, carry, *blocks):
        """``y`` plus ``C_t * (prod of A up to t) * carry`` (and the output's ``h_{t-1}`` term), as a new array.

        Exact for scalar transitions with ``y`` in the accumulation dtype; it
        runs as NumPy over the block (cumulative products), segment by segment.
        """
        if not self.correctable:
            return super().correct(ctx, y, carry, *blocks)
        y = np.array(y)  # a task never changes its inputs (Dask may still hold them)
        if carry is None:
            return y
        ops, reset = self._split(ctx, blocks)
        shape = y.shape
        lanes, L = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
        ir = self._affine()
        inputs = dict(zip(self.rec.inputs, ops, strict=True))
        out = ir.output
        new = None if is_const(out.new, 0.0) else out.new
        old = None if is_const(out.old, 0.0) else out.old
        yv = y.reshape(lanes, L)
        rv = None if reset is None else np.asarray(reset, bool).reshape(lanes, L)
        phi = np.asarray(carry, self.dtype).reshape(lanes).copy()
        step = 8192
        order = range(L - step, -step, -step) if self.reverse else range(0, L, step)
        with np.errstate(all="ignore"):
            for start in order:
                lo, hi = max(start, 0), min(start + step, L)
                seg = {n: v[..., lo:hi] for n, v in inputs.items()}
                sshape = (*shape[:-1], hi - lo)
                a = np.array(eval_operand(ir.A, seg, self.dtype, sshape)).reshape(lanes, hi - lo)
                if rv is not None:
                    a[rv[:, lo:hi]] = 0
                if self.reverse:
                    a = a[:, ::-1]
                cum = np.cumprod(a, axis=1) * phi[:, None]     # prod of A up to t, times the carry
                prev = np.concatenate([phi[:, None], cum[:, :-1]], axis=1)
                phi = cum[:, -1].copy()
                if self.reverse:
                    cum, prev = cum[:, ::-1], prev[:, ::-1]
                if new is not None:
                    yv[:, lo:hi] += np.asarray(eval_operand(new, seg, self.dtype, sshape)).reshape(lanes, -1) * cum
                if old is not None:
                    yv[:, lo:hi] += np.asarray(eval_operand(old, seg, self.dtype, sshape)).reshape(lanes, -1) * prev
        return y
