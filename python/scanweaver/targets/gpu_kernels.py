"""Kernel text of the single-pass GPU schedules: ``sequential``, ``blelloch``, ``hybrid``.

Written once in the macros of :class:`~.gpu.GPURenderer` (``SW_KERNEL``,
``SW_BARRIER()``, ``SW_A(i)`` ...), so every GPU target shares it.
:func:`tile_loop` is the tile scan that ``hybrid``, ``reduce_then_scan`` and
``lookback`` share: coalesced (striped) loads transposed through local
memory into items per work-item in registers, the workgroup scan of their
aggregates, a replay from each work-item's carry-in, and coalesced stores
transposed back.  Fused kernels reuse :func:`tile_load` and
:func:`tile_replay` with their own element and output templates.
"""

from __future__ import annotations

from .gpu import SCHEDULES, GPUSchedule, Launch, Plan

#: Lanes per workgroup of the ``sequential`` schedule (one work-item per lane); ``workgroup_size`` overrides it.
SEQUENTIAL_WORKGROUP = 128


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


#: Local-memory declarations of the tile transpose (``SW_TSMEM`` words of each half of a pair).
TILE_LOCALS = "  SW_LOCAL SW_T sw_ta[SW_TSMEM], sw_tu[SW_TSMEM];"
#: Defines every tiled schedule adds after ``SW_TPL`` and ``SW_IPT``.
TILE_DEFINES = "#define SW_TSMEM SW_PAD(SW_WORKGROUP_SIZE * SW_IPT)"


def tile_load(end: str, idx: str, load: str) -> str:
    """Loads one tile coalesced, hands each work-item ``SW_IPT`` consecutive elements, scans the workgroup.

    Global reads are striped (work-item ``r`` of the lane reads positions
    ``t0 + k*SW_TPL + r``, so a warp reads consecutive addresses) into local
    memory; each work-item then takes its blocked run ``r*SW_IPT + k`` from
    there (padded with ``SW_PAD``, free of bank conflicts).  Leaves ``e[]``,
    ``excl`` (the work-item's exclusive prefix within its lane's tile) and
    ``total`` (the tile's aggregate) in scope.  Needs ``lid``, ``r``,
    ``active``, ``t0``, ``tb`` (the lane's offset in the transpose buffer),
    ``sw_ta``/``sw_tu`` (:data:`TILE_LOCALS`) and ``sm`` (``SW_WORKGROUP_SIZE``
    pairs).  ``idx``/``load`` are templates over ``{s}`` and ``{i}``.
    """
    return f"""    sw_pair e[SW_IPT];
    sw_pair agg = sw_identity();
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {{  /* striped, coalesced reads */
      const sw_index s = t0 + (sw_index)k * SW_TPL + r;
      const int j = SW_PAD(tb + k * SW_TPL + r);
      sw_pair v = sw_identity();
      if (active && s < ({end})) {{
        const sw_index i = {idx.format(s="s")};
        v = {load.format(i="i")};
      }}
      sw_ta[j] = v.a;
      sw_tu[j] = v.u;
    }}
    SW_BARRIER();
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {{  /* each work-item's SW_IPT consecutive elements */
      const int j = SW_PAD(tb + r * SW_IPT + k);
      e[k] = sw_pair_make(sw_ta[j], sw_tu[j]);
      agg = sw_compose(e[k], agg);
    }}
    SW_BARRIER();
    sw_pair excl, total;
    sw_group_scan(agg, &excl, &total, sm, lid);"""


def tile_replay(end: str, idx: str, store: str) -> str:
    """Replays h = A*h + U over ``e[]`` from the carry-in ``h`` composed with ``excl``; ``store`` writes.

    States go back through local memory so that ``store`` runs striped
    (coalesced) with ``{h}`` = h_t and ``{hp}`` = h_{t-1} at index ``{i}``.
    """
    return f"""    SW_T hs = sw_carry(excl.a, excl.u, h);
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {{
      hs = e[k].a * hs + e[k].u;
      sw_ta[SW_PAD(tb + r * SW_IPT + k)] = hs;
    }}
    SW_BARRIER();
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {{  /* striped, coalesced writes */
      const sw_index s = t0 + (sw_index)k * SW_TPL + r;
      const int q = k * SW_TPL + r;
      if (active && s < ({end})) {{
        const sw_index i = {idx.format(s="s")};
        const SW_T hn = sw_ta[SW_PAD(tb + q)];
        const SW_T hp = q > 0 ? sw_ta[SW_PAD(tb + q - 1)] : h;
        {store.format(i="i", h="hn", hp="hp")};
        (void)hn;
        (void)hp;
      }}
    }}
    SW_BARRIER();"""


def tile_loop(begin: str, end: str, idx: str, load: str, store: str | None, acc: str | None = None) -> str:
    """The tile scan over scan positions ``[begin, end)`` of one lane (uniform within the workgroup).

    Needs ``lid``, ``r`` (rank among the lane's work-items), ``tb``,
    ``active``, ``h`` (carry-in state, updated to the state after ``end``),
    ``sw_ta``/``sw_tu`` and ``sm`` in scope.  ``store=None`` skips the
    replay; ``acc`` names a pair that accumulates the tile totals.
    """
    replay = "" if store is None else "\n" + tile_replay(end, idx, store)
    accumulate = f"\n    {acc} = sw_compose(total, {acc});" if acc else ""
    return f"""  for (sw_index t0 = ({begin}); t0 < ({end}); t0 += (sw_index)SW_TPL * SW_IPT) {{
{tile_load(end, idx, load)}{replay}
    h = sw_carry(total.a, total.u, h);{accumulate}
  }}"""


ELEMENT = "sw_pair_make(SW_A({i}), SW_U({i}))"
OUTPUT = "y[{i}] = SW_Y({i}, {h}, {hp})"
INIT_H = "(SW_HAS_H0 && active) ? h0[lane] : (SW_T)0"


def _sequential_body(r, stages) -> str:
    return f"""SW_KERNEL void sw_sequential({r.gpu_params(stages)}) {{
  const sw_index lane = SW_GROUP * SW_WORKGROUP_SIZE + SW_LID;
  if (lane >= nlanes) return;
  const sw_index base = lane * L;
  SW_T h = SW_HAS_H0 ? h0[lane] : (SW_T)0;
  for (sw_index s = 0; s < L; ++s) {{
    const sw_index i = SW_IDX(base, s);
    const SW_T hp = h;
    h = SW_A(i) * h + SW_U(i);
    y[i] = SW_Y(i, h, hp);
    (void)hp;
  }}
  if (SW_RETURN_STATE) hlast[lane] = h;
}}"""


def _sequential_plan(cfg, lanes, L) -> Plan:
    wg = cfg.get("workgroup_size", SEQUENTIAL_WORKGROUP)
    return Plan((Launch("sw_sequential", ceil_div(lanes, wg), wg),))


SCHEDULES.add("sequential", GPUSchedule(
    defines=lambda cfg: (f"#ifndef workgroup_size\n#define workgroup_size {SEQUENTIAL_WORKGROUP}\n#endif\n"
                         "#define SW_WORKGROUP_SIZE (workgroup_size)"),
    body=_sequential_body,
    plan=_sequential_plan,
))


def _blelloch_body(r, stages) -> str:
    return f"""#define SW_BL(j) sw_pair_make(sw_ba[SW_PAD(j)], sw_bu[SW_PAD(j)])
#define SW_BL_SET(j, p) \\
  do {{ const sw_pair sw_v = (p); sw_ba[SW_PAD(j)] = sw_v.a; sw_bu[SW_PAD(j)] = sw_v.u; }} while (0)

SW_KERNEL void sw_blelloch({r.gpu_params(stages)}) {{
  /* the tree in two padded arrays: ai = off*(2*lid+1)-1 strides by powers of two without bank conflicts */
  SW_LOCAL SW_T sw_ba[SW_PAD(2 * SW_WORKGROUP_SIZE)], sw_bu[SW_PAD(2 * SW_WORKGROUP_SIZE)];
  const int lid = SW_LID;
  const sw_index lane = SW_GROUP;
  const sw_index base = lane * L;
  SW_T h = SW_HAS_H0 ? h0[lane] : (SW_T)0;
  for (sw_index t0 = 0; t0 < L; t0 += 2 * SW_WORKGROUP_SIZE) {{
    const sw_index s0 = t0 + lid, s1 = s0 + SW_WORKGROUP_SIZE;
    const sw_index i0 = SW_IDX(base, s0), i1 = SW_IDX(base, s1);
    const sw_pair e0 = s0 < L ? sw_pair_make(SW_A(i0), SW_U(i0)) : sw_identity();
    const sw_pair e1 = s1 < L ? sw_pair_make(SW_A(i1), SW_U(i1)) : sw_identity();
    SW_BL_SET(lid, e0);
    SW_BL_SET(lid + SW_WORKGROUP_SIZE, e1);
    SW_BARRIER();
    int off = 1;
    for (int d = SW_WORKGROUP_SIZE; d > 0; d >>= 1) {{  /* blelloch.up */
      if (lid < d) {{
        const int ai = off * (2 * lid + 1) - 1, bi = ai + off;
        SW_BL_SET(bi, sw_compose(SW_BL(bi), SW_BL(ai)));
      }}
      off <<= 1;
      SW_BARRIER();
    }}
    const sw_pair total = SW_BL(2 * SW_WORKGROUP_SIZE - 1);  /* blelloch.root */
    SW_BARRIER();
    if (lid == 0) SW_BL_SET(2 * SW_WORKGROUP_SIZE - 1, sw_identity());
    SW_BARRIER();
    for (int d = 1; d < 2 * SW_WORKGROUP_SIZE; d <<= 1) {{  /* blelloch.down */
      off >>= 1;
      if (lid < d) {{
        const int ai = off * (2 * lid + 1) - 1, bi = ai + off;
        const sw_pair t = SW_BL(ai), b = SW_BL(bi);
        SW_BL_SET(ai, b);
        SW_BL_SET(bi, sw_compose(t, b));
      }}
      SW_BARRIER();
    }}
    if (s0 < L) {{  /* blelloch.apply */
      const sw_pair p = SW_BL(lid);
      const SW_T hp = sw_carry(p.a, p.u, h), hn = e0.a * hp + e0.u;
      y[i0] = SW_Y(i0, hn, hp);
      (void)hp;
    }}
    if (s1 < L) {{
      const sw_pair p = SW_BL(lid + SW_WORKGROUP_SIZE);
      const SW_T hp = sw_carry(p.a, p.u, h), hn = e1.a * hp + e1.u;
      y[i1] = SW_Y(i1, hn, hp);
      (void)hp;
    }}
    h = sw_carry(total.a, total.u, h);  /* blelloch.carry */
    SW_BARRIER();
  }}
  if (SW_RETURN_STATE && lid == 0) hlast[lane] = h;
}}"""


SCHEDULES.add("blelloch", GPUSchedule(
    defines=lambda cfg: "",
    body=_blelloch_body,
    plan=lambda cfg, lanes, L: Plan((Launch("sw_blelloch", lanes, cfg["workgroup_size"]),)),
))


def _hybrid_body(r, stages) -> str:
    loop = tile_loop("0", "L", "SW_IDX(base, {s})", ELEMENT, OUTPUT)
    return f"""{r.group_scan()}

SW_KERNEL void sw_hybrid({r.gpu_params(stages)}) {{
  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
{TILE_LOCALS}
  const int lid = SW_LID, r = lid % SW_TPL, tb = (lid / SW_TPL) * SW_TPL * SW_IPT;
  const sw_index lane = SW_GROUP * SW_LANES_PER_GROUP + lid / SW_TPL;
  const int active = lane < nlanes;
  const sw_index base = lane * L;
  SW_T h = {INIT_H};
{loop}
  if (SW_RETURN_STATE && active && r == 0) hlast[lane] = h;
}}"""


SCHEDULES.add("hybrid", GPUSchedule(
    defines=lambda cfg: ("#define SW_TPL (SW_WORKGROUP_SIZE / SW_LANES_PER_GROUP)\n"
                         "#define SW_IPT SW_ITEMS_PER_THREAD\n" + TILE_DEFINES),
    body=_hybrid_body,
    plan=lambda cfg, lanes, L: Plan((Launch("sw_hybrid", ceil_div(lanes, cfg["lanes_per_group"]),
                                            cfg["workgroup_size"]),)),
))

from . import gpu_multiblock  # noqa: E402,F401  (registers reduce_then_scan and lookback)
