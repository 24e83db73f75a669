"""Carries between the blocks of a lane: the pair algebra on whole blocks, and the exclusive scan plan.

A block's aggregate is the pair ``(P, S)``: P the product of its transitions
(later after earlier), S its final state from a zero start, so the state
after the block is ``P*h + S`` for any state ``h`` entering it.  Pairs
compose as ``(P2, S2) o (P1, S1) = (P2*P1, P2*S1 + S2)`` (:class:`Pairs`;
``@`` for dense k x k transitions), and the state entering block ``j`` (in
time order) is the exclusive scan of the aggregates applied to ``h0``.

:func:`plan` lays that scan out as a task graph whose size is linear in the
number of blocks and whose depth is logarithmic (a Fenwick tree): ``node(lo,
size)`` combines the aggregates of an aligned range of blocks, and the carry
into block ``j`` is ``node(j', j - j')`` applied to the carry into ``j'``,
where ``j' = j & (j - 1)`` clears ``j``'s lowest set bit.  The carry into
``j`` depends on the aggregates of blocks ``0 .. j-1`` only, so the last pass
over early blocks can start before late blocks are reduced.

Example:
    >>> import numpy as np
    >>> from scanweaver.dask.carry import Pairs, plan
    >>> alg = Pairs(dense=False)
    >>> aggs = [(np.array([0.5]), np.array([1.0])), (np.array([0.5]), np.array([2.0]))]
    >>> nodes, carries = plan(2)
    >>> carries
    {1: ((0, 1), 0), 2: ((0, 2), 0)}
    >>> alg.apply(alg.compose(aggs[1], aggs[0]), np.array([4.0]))  # 0.5*(0.5*4 + 1) + 2
    array([3.5])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Pair = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Pairs:
    """The affine pair algebra on arrays of lanes: scalar (``dense=False``) or k x k transitions."""

    dense: bool = False

    def compose(self, later: Pair, earlier: Pair) -> Pair:
        """``later o earlier``: the pair of the two blocks in sequence."""
        (p2, s2), (p1, s1) = later, earlier
        with np.errstate(all="ignore"):
            if self.dense:
                return p2 @ p1, (p2 @ s1[..., None])[..., 0] + s2
            return p2 * p1, p2 * s1 + s2

    def apply(self, pair: Pair, h: np.ndarray | None) -> np.ndarray:
        """The state after the blocks of ``pair`` when ``h`` enters them (``None``: a zero state)."""
        p, s = pair
        if h is None:
            return s
        h = np.asarray(h, dtype=s.dtype).reshape(s.shape)
        with np.errstate(all="ignore"):
            if self.dense:
                return (p @ h[..., None])[..., 0] + s
            return p * h + s


def plan(n: int) -> tuple[dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]],
                          dict[int, tuple[tuple[int, int], int]]]:
    """The exclusive scan of ``n`` aggregates as tasks.

    Returns:
        ``nodes``: ``(lo, size) -> (later half, earlier half)`` for every range
        of more than one block the carries need (a range of one block is that
        block's aggregate); ``carries``: ``j -> (range, j')`` for ``j = 1 .. n``:
        the carry into block ``j`` (``n``: the final state) is the range applied
        to the carry into ``j'`` (``j' = 0``: the initial state).
    """
    nodes: dict[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]] = {}

    def need(lo: int, size: int) -> None:
        if size == 1 or (lo, size) in nodes:
            return
        half = size // 2
        nodes[(lo, size)] = ((lo + half, half), (lo, half))
        need(lo + half, half)
        need(lo, half)

    carries = {}
    for j in range(1, n + 1):
        prev = j & (j - 1)
        need(prev, j - prev)
        carries[j] = ((prev, j - prev), prev)
    return nodes, carries


def segment_product(a: np.ndarray, segment: int = 4096) -> np.ndarray:
    """The product over the last axis of ``(lanes, L)`` scalar transitions, vectorised across segments.

    The rows are multiplied ``segment`` columns at a time (contiguous, SIMD
    friendly) instead of one element after another; the order of the factors
    changes, not the product.
    """
    lanes, L = a.shape
    q = L // segment
    with np.errstate(all="ignore"):
        out = np.multiply.reduce(a[:, q * segment:], axis=1)
        if q:
            out = out * np.multiply.reduce(np.multiply.reduce(a[:, : q * segment].reshape(lanes, q, segment),
                                                              axis=1), axis=1)
    return out


def matrix_chain(a: np.ndarray, segment: int = 4096) -> np.ndarray:
    """``A_{L-1} @ ... @ A_0`` of ``(lanes, L, k, k)`` transitions in time order, by pairwise products."""
    lanes, L, k, _ = a.shape
    total = np.broadcast_to(np.eye(k, dtype=a.dtype), (lanes, k, k)).copy()
    with np.errstate(all="ignore"):
        for start in range(0, L, segment):
            m = a[:, start:start + segment]
            while m.shape[1] > 1:
                odd = m[:, -1:] if m.shape[1] % 2 else None
                even = m[:, : m.shape[1] - (odd is not None)]
                m = even[:, 1::2] @ even[:, 0::2]
                if odd is not None:
                    m = np.concatenate([m, odd], axis=1)
            if m.shape[1]:
                total = m[:, 0] @ total
    return total
