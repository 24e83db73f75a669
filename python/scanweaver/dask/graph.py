"""The task graph of a scan over Dask arrays: one scan per block, carries between the blocks of a lane.

Methods (``method=``):

* ``chain``: the blocks of a lane run one after another, each entered with
  the final state of the one before (one pass over the data; the rows of
  lane blocks run in parallel, the blocks of one row do not).  With a single
  row only one block runs at a time, so each takes every core of its host
  (the ``threads`` tunable on ``cpu``; Dask workers otherwise run one thread
  per task).
* ``rescan``: three steps.  Every block reduces to its aggregate ``(P, S)``
  in parallel (its scan from a zero state, ``y`` thrown away, and the product
  of its transitions); the aggregates of a row are combined by the exclusive
  scan of :func:`~.carry.plan` (small tasks, only pairs move); every block
  is scanned again entered with its carry.  Two passes, every block in parallel.
* ``correct``: like ``rescan``, but the first pass keeps ``y`` and the last
  one adds ``C_t * (prod of A up to t) * carry`` (scalar transitions only).
* ``auto``: ``chain`` unless the rows alone cannot fill the workers and the
  two passes of ``rescan`` spread over every block finish sooner
  (:func:`choose`); ``rescan`` and not ``correct``, because re-running the
  compiled scan is faster than NumPy's cumulative products
  (``bench/dask_scan.py`` measures both).

Every task is a pure function of its inputs (Dask recomputes lost results
after a worker dies), and the graph grows linearly with the number of blocks.
"""

from __future__ import annotations

import copy
import itertools
import operator
import sys
from dataclasses import dataclass

import numpy as np

from ..errors import ScanInputError
from .blocks import BlockContext, BlockKernel, host_cores
from .carry import Pairs, plan

METHODS = ("auto", "chain", "rescan", "correct")

Axes = tuple  # for each axis of an array: the output axis it follows, or None (one chunk)


@dataclass
class Layout:
    """The arrays of one scan and how their blocks line up with the output's.

    Attributes:
        operands: ``(dask array, axes)`` per operand, in the kernel's order.
        chunks: the output's chunks (the last axis is L).
        dtype: ``y``'s dtype.
        h0: ``(dask array, axes)`` of the initial state, or ``None``.
        state_chunks: chunks of the final-state array.
        state_axes: for each axis of the state, the output axis it follows (or None).
        state_dtype: the state's dtype.
    """

    operands: list[tuple[object, Axes]]
    chunks: tuple[tuple[int, ...], ...]
    dtype: np.dtype
    h0: tuple[object, Axes] | None
    state_chunks: tuple[tuple[int, ...], ...]
    state_axes: Axes
    state_dtype: np.dtype


def parallelism() -> int:
    """Threads the scheduler that ``compute()`` would use has now (a distributed client's, else local)."""
    import dask
    from dask.system import CPU_COUNT

    if "distributed" in sys.modules:
        try:
            from distributed import default_client

            return max(1, sum(default_client().nthreads().values()))
        except (ValueError, AttributeError, OSError):
            pass
    if dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded"):
        return 1
    return int(dask.config.get("num_workers", None) or CPU_COUNT)


def task_share(concurrent: int) -> int | None:
    """Cores one block task may take under the local scheduler ``compute()`` would use now: the host's cores
    over the tasks that run at once (at least one); ``None`` on a ``dask.distributed`` client, whose workers
    already run one OpenMP thread per task thread (``OMP_NUM_THREADS``, set by the nanny)."""
    import dask
    import dask.base
    from dask.system import CPU_COUNT

    sched = dask.base.get_scheduler()
    if "distributed" in sys.modules:
        from distributed import Client

        if isinstance(getattr(sched, "__self__", None), Client):
            return None
    sync = dask.config.get("scheduler", None) in ("sync", "synchronous", "single-threaded")
    workers = 1 if sync else int(dask.config.get("num_workers", None) or CPU_COUNT)
    return max(1, host_cores() // max(1, min(workers, concurrent)))


def choose(method: str, rows: int, blocks: int, workers: int, correctable: bool) -> str:
    """The method to run: ``method`` itself unless ``auto``.

    The cost model counts passes over the data: ``chain`` makes one, with at
    most ``rows`` blocks running at once; ``rescan`` makes two, with every
    block able to run at once.  ``rescan`` is chosen only when that is
    strictly faster: ``2 / min(workers, rows * blocks) < 1 / min(workers, rows)``.
    """
    if method not in METHODS:
        raise ScanInputError(f"scanweaver.dask: method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "correct" and not correctable:
        raise ScanInputError("scanweaver.dask: method='correct' is implemented for recurrences with scalar transitions "
                             "whose y is in the accumulation dtype (float32, float64, complex); use 'rescan' or "
                             "'chain'")
    if method != "auto":
        return method
    if blocks <= 1:
        return "chain"
    return "rescan" if 2 * min(workers, rows) < min(workers, rows * blocks) else "chain"


def _aggregate(kernel: BlockKernel, ctx: BlockContext, *blocks):
    return kernel.aggregate(ctx, *blocks)


def _local(kernel: BlockKernel, ctx: BlockContext, *blocks):
    return kernel.local(ctx, *blocks)


def _pair_of(local):
    return local[1], local[2]


def _scan(kernel: BlockKernel, ctx: BlockContext, h0, *blocks):
    return kernel.scan(ctx, h0, *blocks)


def _scan_all_cores(kernel: BlockKernel, ctx: BlockContext, h0, *blocks):
    return kernel.scan(ctx, h0, *blocks, threads=host_cores())


def _rescan(kernel: BlockKernel, ctx: BlockContext, h0, *blocks):
    return kernel.scan(ctx, h0, *blocks)[0]


def _correct(kernel: BlockKernel, ctx: BlockContext, local, carry, *blocks):
    return kernel.correct(ctx, local[0], carry, *blocks)


def _compose(alg: Pairs, later, earlier):
    return alg.compose(later, earlier)


def _apply(alg: Pairs, pair, h):
    return alg.apply(pair, h)


def build(kernel: BlockKernel, layout: Layout, *, name: str, token: str, method: str, reverse: bool,
          resets: np.ndarray | None = None, return_state: bool = False):
    """The lazy ``y`` (and final state) of the scan laid out by ``layout``.

    Args:
        kernel: what each block task runs.
        layout: the arrays and their block alignment.
        name: prefix of the output's name (the public function's).
        token: a deterministic hash of everything the result depends on.
        method: ``chain``, ``rescan`` or ``correct`` (resolved by :func:`choose`).
        reverse: blocks are visited from the last one.
        resets: absolute positions along L where packed sequences restart the state.
        return_state: also return the final state's array.

    Returns:
        ``y`` (a ``dask.array.Array``), or ``(y, h_last)``.
    """
    import dask.array as da
    from dask.highlevelgraph import HighLevelGraph
    from dask.task_spec import Alias, Task, TaskRef

    chunks = layout.chunks
    n = len(chunks[-1])
    offsets = np.concatenate([[0], np.cumsum(chunks[-1])]).astype(int)
    rows = list(itertools.product(*(range(len(c)) for c in chunks[:-1])))
    positions = np.asarray(resets if resets is not None else (), dtype=np.int64)
    alg = Pairs(dense=kernel.dense)
    yname, tag = f"{name}-{token}", f"{name}-{method}-{token}"
    dsk: dict = {}

    def key(arr, axes: Axes, idx: tuple):
        return (arr.name, *(idx[ax] if ax is not None else 0 for ax in axes))

    def blocks(idx: tuple) -> list:
        return [TaskRef(key(arr, axes, idx)) for arr, axes in layout.operands]

    starts = [np.concatenate([[0], np.cumsum(c)]).astype(int) for c in chunks[:-1]]

    def context(row: tuple, k: int, j: int) -> BlockContext:
        lo, hi = int(offsets[k]), int(offsets[k + 1])
        inside = positions[(positions >= lo) & (positions < hi)]
        return BlockContext(offset=lo, length=hi - lo, first=j == 0, resets=tuple(int(p) for p in inside),
                            origin=tuple(int(s[i]) for s, i in zip(starts, row, strict=True)))

    def h0_ref(row: tuple):
        if layout.h0 is None:
            return None
        arr, axes = layout.h0
        return TaskRef(key(arr, axes, (*row, 0)))

    def block_of(j: int) -> int:
        return n - 1 - j if reverse else j

    finals = {}
    # One row chained runs one block at a time on the whole cluster: its blocks take every core of their host.
    chain_task = _scan_all_cores if len(rows) == 1 else _scan
    # Otherwise the tasks that run at once share the host's cores (the threaded scheduler runs them as threads
    # of one process: each starting every core would run tasks x cores threads).
    kernel = copy.copy(kernel)
    kernel.share = task_share(len(rows) * (1 if method == "chain" else n))
    for row in rows:
        if method == "chain":
            state = h0_ref(row)
            for j in range(n):
                k = block_of(j)
                idx = (*row, k)
                skey = (f"sw-scan-{tag}", *idx)
                dsk[skey] = Task(skey, chain_task, kernel, context(row, k, j), state, *blocks(idx))
                dsk[(yname, *idx)] = Task((yname, *idx), operator.getitem, TaskRef(skey), 0)
                hkey = (f"sw-state-{tag}", *idx)
                dsk[hkey] = Task(hkey, operator.getitem, TaskRef(skey), 1)
                state = TaskRef(hkey)
            finals[row] = state
            continue
        pair_key = {}
        for j in range(n):
            k = block_of(j)
            idx = (*row, k)
            if method == "rescan":
                akey = (f"sw-aggregate-{tag}", *idx)
                dsk[akey] = Task(akey, _aggregate, kernel, context(row, k, j), *blocks(idx))
            else:
                lkey = (f"sw-local-{tag}", *idx)
                dsk[lkey] = Task(lkey, _local, kernel, context(row, k, j), *blocks(idx))
                akey = (f"sw-aggregate-{tag}", *idx)
                dsk[akey] = Task(akey, _pair_of, TaskRef(lkey))
            pair_key[(j, 1)] = akey
        nodes, carries = plan(n)
        for lo, size in sorted(nodes, key=lambda r: r[1]):
            later, earlier = nodes[(lo, size)]
            nkey = (f"sw-combine-{tag}", *row, lo, size)
            dsk[nkey] = Task(nkey, _compose, alg, TaskRef(pair_key[later]), TaskRef(pair_key[earlier]))
            pair_key[(lo, size)] = nkey
        carry = {0: h0_ref(row)}
        for j in range(1, n + 1):
            rng, prev = carries[j]
            ckey = (f"sw-carry-{tag}", *row, j)
            dsk[ckey] = Task(ckey, _apply, alg, TaskRef(pair_key[rng]), carry[prev])
            carry[j] = TaskRef(ckey)
        for j in range(n):
            k = block_of(j)
            idx = (*row, k)
            if method == "rescan":
                dsk[(yname, *idx)] = Task((yname, *idx), _rescan, kernel, context(row, k, j), carry[j], *blocks(idx))
            else:
                lkey = (f"sw-local-{tag}", *idx)
                dsk[(yname, *idx)] = Task((yname, *idx), _correct, kernel, context(row, k, j), TaskRef(lkey), carry[j],
                                          *blocks(idx))
        finals[row] = carry[n]
    deps = [arr for arr, _ in layout.operands] + ([layout.h0[0]] if layout.h0 is not None else [])
    graph = HighLevelGraph.from_collections(yname, dsk, dependencies=deps)
    meta = np.empty((0,) * len(chunks), layout.dtype)
    y = da.Array(graph, yname, chunks, meta=meta)
    if not return_state:
        return y
    hname = f"{name}-state-{token}"
    hdsk = {}
    for row, ref in finals.items():
        hkey = (hname, *(row[ax] if ax is not None else 0 for ax in layout.state_axes))
        hdsk[hkey] = Alias(hkey, ref.key)
    hgraph = HighLevelGraph.from_collections(hname, hdsk, dependencies=[y])
    hmeta = np.empty((0,) * len(layout.state_chunks), layout.state_dtype)
    return y, da.Array(hgraph, hname, layout.state_chunks, meta=hmeta)

