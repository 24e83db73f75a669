"""Interpreter handlers for the GPU schedule ops (``hybrid``, ``reduce_then_scan``, ``lookback``).

Registered into :data:`scanweaver.targets.reference.OPS` (found by its name, ``reference_*``); like the rest of
the interpreter they define what each op means.  Pairs compose later after
earlier: ``(A2, U2) o (A1, U1) = (A2*A1, A2*U1 + U2)``.
"""

from __future__ import annotations

import numpy as np

from .reference import OPS, Diagonal, _blocks, op

_PAIRS = Diagonal()


def _compose(later, earlier):
    return _PAIRS.compose(*later, *earlier)


def _apply(pair, h):
    """An aggregate pair applied to the carry h (a zero carry gives its U: :meth:`Diagonal.carry`)."""
    return _PAIRS.carry(*pair, h)


def _chain(ta, tu, h0):
    """Carry-in state of each of ``ta.shape[1]`` consecutive aggregates, starting from ``h0``."""
    carry = np.empty_like(ta)
    h = h0.copy()
    for b in range(ta.shape[1]):
        carry[:, b] = h
        h = _PAIRS.carry(ta[:, b], tu[:, b], h)
    return carry


def _replay(ctx, ea, eu, start):
    """h over ``ea/eu[..., k]`` from ``start`` (shape ``ea.shape[:-1]``), written to ``ctx['h']``."""
    hs = start.copy()
    out = np.empty_like(ea)
    for k in range(ea.shape[-1]):
        hs = ea[..., k] * hs + eu[..., k]
        out[..., k] = hs
    L = ctx["A"].shape[1]
    ctx["h"][:] = out.reshape(out.shape[0], -1)[:, :L]


# ---- hybrid ---------------------------------------------------------------------------------------

@op("hybrid.thread_reduce")
def _hybrid_thread_reduce(ctx, attrs):
    ipt, tpl = attrs["items_per_thread"], attrs["threads_per_lane"]
    Ab, Ub = _blocks(ctx, ipt * tpl)
    ea, eu = (x.reshape(*x.shape[:2], tpl, ipt) for x in (Ab, Ub))
    agg = (np.ones(ea.shape[:3], ea.dtype), np.zeros(ea.shape[:3], ea.dtype))
    for k in range(ipt):
        agg = _compose((ea[..., k], eu[..., k]), agg)
    ctx["hybrid"] = {"elem": (ea, eu), "agg": agg}


@op("hybrid.subgroup_scan")
def _hybrid_subgroup_scan(ctx, attrs):
    w = attrs["width"]
    st = ctx["hybrid"]
    a, u = (x.reshape(*x.shape[:2], -1, w).copy() for x in st["agg"])
    d = 1
    while d < w:
        na, nu = _compose((a[..., d:], u[..., d:]), (a[..., :-d], u[..., :-d]))
        a[..., d:], u[..., d:] = na, nu
        d *= 2
    st["incl"] = (a, u)


@op("hybrid.group_scan")
def _hybrid_group_scan(ctx, attrs):
    st = ctx["hybrid"]
    a, u = st["incl"]
    ex_a = np.concatenate([np.ones_like(a[..., :1]), a[..., :-1]], axis=-1)
    ex_u = np.concatenate([np.zeros_like(u[..., :1]), u[..., :-1]], axis=-1)
    pa, pu = np.ones(a.shape[:2], a.dtype), np.zeros(a.shape[:2], a.dtype)
    pre_a, pre_u = np.empty(a.shape[:3], a.dtype), np.empty(a.shape[:3], a.dtype)
    for j in range(a.shape[2]):
        pre_a[..., j], pre_u[..., j] = pa, pu
        pa, pu = _compose((a[..., j, -1], u[..., j, -1]), (pa, pu))
    xa, xu = _compose((ex_a, ex_u), (pre_a[..., None], pre_u[..., None]))
    st["excl"] = (xa.reshape(*xa.shape[:2], -1), xu.reshape(*xu.shape[:2], -1))
    st["total"] = (pa, pu)


@op("hybrid.tile_carry")
def _hybrid_tile_carry(ctx, attrs):
    st = ctx["hybrid"]
    st["carry"] = _chain(*st["total"], ctx["h0"])


@op("hybrid.replay")
def _hybrid_replay(ctx, attrs):
    st = ctx["hybrid"]
    start = _apply(st["excl"], st["carry"][..., None])
    _replay(ctx, *st["elem"], start)


# ---- reduce_then_scan: the chunked ops with a chunk of one block ----------------------------------

@op("reduce_then_scan.reduce")
def _rts_reduce(ctx, attrs):
    OPS["chunked.reduce"](ctx, {"chunk": attrs["block"]})


@op("reduce_then_scan.scan_aggregates")
def _rts_scan_aggregates(ctx, attrs):
    OPS["chunked.scan"](ctx, {})


@op("reduce_then_scan.scan")
def _rts_scan(ctx, attrs):
    OPS["chunked.propagate"](ctx, {"chunk": attrs["block"]})


# ---- lookback -------------------------------------------------------------------------------------

@op("lookback.tile_reduce")
def _lookback_tile_reduce(ctx, attrs):
    Ab, Ub = _blocks(ctx, attrs["tile"])
    agg = (np.ones(Ab.shape[:2], Ab.dtype), np.zeros(Ab.shape[:2], Ab.dtype))
    for k in range(Ab.shape[2]):
        agg = _compose((Ab[..., k], Ub[..., k]), agg)
    ctx["lookback"] = {"elem": (Ab, Ub), "agg": agg}


@op("lookback.look_back")
def _lookback_look_back(ctx, attrs):
    """Tile b composes the aggregates of tiles b-1 .. b-lag, then applies the nearest published state."""
    lag = attrs["lag"]
    st = ctx["lookback"]
    ga, gu = st["agg"]
    nt = ga.shape[1]
    carry, incl = np.empty_like(ga), np.empty_like(ga)
    for b in range(nt):
        acc = (np.ones_like(ga[:, 0]), np.zeros_like(gu[:, 0]))
        j = b - 1
        while j >= 0 and j >= b - lag:
            acc = _compose(acc, (ga[:, j], gu[:, j]))
            j -= 1
        carry[:, b] = _apply(acc, incl[:, j] if j >= 0 else ctx["h0"])
        incl[:, b] = _apply((ga[:, b], gu[:, b]), carry[:, b])
    st["carry"] = carry


@op("lookback.replay")
def _lookback_replay(ctx, attrs):
    st = ctx["lookback"]
    _replay(ctx, *st["elem"], st["carry"])
