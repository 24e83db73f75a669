"""Kernel text of the single-pass GPU schedules: ``sequential``, ``blelloch``, ``hybrid``.

Written once in the macros of :class:`~.gpu.GPURenderer` (``SW_KERNEL``,
``SW_BARRIER()``, ``SW_A(i)`` ...), so every GPU target shares it.
:func:`tile_loop` is the tile scan that ``hybrid``, ``reduce_then_scan`` and
``lookback`` share: items per work-item in registers, the workgroup scan of
their aggregates, a replay from each work-item's carry-in.
"""

from __future__ import annotations

from .gpu import SCHEDULES, GPUSchedule, Launch, Plan

#: Lanes per workgroup of the ``sequential`` schedule (one work-item per lane); ``workgroup_size`` overrides it.
SEQUENTIAL_WORKGROUP = 128


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)


def tile_load(end: str, idx: str, load: str) -> str:
    """Loads a work-item's ``SW_IPT`` items from position ``s0`` into ``e`` and scans the workgroup.

    Leaves ``e[]``, ``excl`` (the work-item's exclusive prefix within its
    lane's tile) and ``total`` (the tile's aggregate) in scope.  Needs
    ``lid``, ``active``, ``s0`` and ``sm`` (``SW_WORKGROUP_SIZE`` pairs of
    local memory).  ``idx``/``load`` are templates over ``{s}`` and ``{i}``.
    """
    return f"""    sw_pair e[SW_IPT];
    sw_pair agg = sw_identity();
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {{
      const sw_index s = s0 + k;
      if (active && s < ({end})) {{
        const sw_index i = {idx.format(s="s")};
        e[k] = {load.format(i="i")};
      }} else {{
        e[k] = sw_identity();
      }}
      agg = sw_compose(e[k], agg);
    }}
    sw_pair excl, total;
    sw_group_scan(agg, &excl, &total, sm, lid);"""


def tile_replay(end: str, idx: str, store: str) -> str:
    """Replays h = A*h + U over ``e[]`` from the carry-in ``h`` composed with ``excl``; ``store`` writes."""
    return f"""    SW_T hs = excl.a * h + excl.u;
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {{
      const sw_index s = s0 + k;
      if (active && s < ({end})) {{
        const sw_index i = {idx.format(s="s")};
        const SW_T hp = hs;
        hs = e[k].a * hs + e[k].u;
        {store.format(i="i", h="hs", hp="hp")};
        (void)hp;
      }}
    }}"""


def tile_loop(begin: str, end: str, idx: str, load: str, store: str | None, acc: str | None = None) -> str:
    """The tile scan over scan positions ``[begin, end)`` of one lane (uniform within the workgroup).

    Needs ``lid``, ``r`` (rank among the lane's work-items), ``active``, ``h``
    (carry-in state, updated to the state after ``end``) and ``sm`` in scope.
    ``store=None`` skips the replay; ``acc`` names a pair that accumulates
    the tile totals.
    """
    replay = "" if store is None else "\n" + tile_replay(end, idx, store)
    accumulate = f"\n    {acc} = sw_compose(total, {acc});" if acc else ""
    return f"""  for (sw_index t0 = ({begin}); t0 < ({end}); t0 += (sw_index)SW_TPL * SW_IPT) {{
    const sw_index s0 = t0 + (sw_index)r * SW_IPT;
{tile_load(end, idx, load)}{replay}
    h = total.a * h + total.u;{accumulate}
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
    return f"""SW_KERNEL void sw_blelloch({r.gpu_params(stages)}) {{
  SW_LOCAL sw_pair sm[2 * SW_WORKGROUP_SIZE];
  const int lid = SW_LID;
  const sw_index lane = SW_GROUP;
  const sw_index base = lane * L;
  SW_T h = SW_HAS_H0 ? h0[lane] : (SW_T)0;
  for (sw_index t0 = 0; t0 < L; t0 += 2 * SW_WORKGROUP_SIZE) {{
    const sw_index s0 = t0 + lid, s1 = s0 + SW_WORKGROUP_SIZE;
    const sw_index i0 = SW_IDX(base, s0), i1 = SW_IDX(base, s1);
    const sw_pair e0 = s0 < L ? sw_pair_make(SW_A(i0), SW_U(i0)) : sw_identity();
    const sw_pair e1 = s1 < L ? sw_pair_make(SW_A(i1), SW_U(i1)) : sw_identity();
    sm[lid] = e0;
    sm[lid + SW_WORKGROUP_SIZE] = e1;
    SW_BARRIER();
    int off = 1;
    for (int d = SW_WORKGROUP_SIZE; d > 0; d >>= 1) {{  /* blelloch.up */
      if (lid < d) {{
        const int ai = off * (2 * lid + 1) - 1, bi = ai + off;
        sm[bi] = sw_compose(sm[bi], sm[ai]);
      }}
      off <<= 1;
      SW_BARRIER();
    }}
    const sw_pair total = sm[2 * SW_WORKGROUP_SIZE - 1];  /* blelloch.root */
    SW_BARRIER();
    if (lid == 0) sm[2 * SW_WORKGROUP_SIZE - 1] = sw_identity();
    SW_BARRIER();
    for (int d = 1; d < 2 * SW_WORKGROUP_SIZE; d <<= 1) {{  /* blelloch.down */
      off >>= 1;
      if (lid < d) {{
        const int ai = off * (2 * lid + 1) - 1, bi = ai + off;
        const sw_pair t = sm[ai];
        sm[ai] = sm[bi];
        sm[bi] = sw_compose(t, sm[bi]);
      }}
      SW_BARRIER();
    }}
    if (s0 < L) {{  /* blelloch.apply */
      const sw_pair p = sm[lid];
      const SW_T hp = p.a * h + p.u, hn = e0.a * hp + e0.u;
      y[i0] = SW_Y(i0, hn, hp);
      (void)hp;
    }}
    if (s1 < L) {{
      const sw_pair p = sm[lid + SW_WORKGROUP_SIZE];
      const SW_T hp = p.a * h + p.u, hn = e1.a * hp + e1.u;
      y[i1] = SW_Y(i1, hn, hp);
      (void)hp;
    }}
    h = total.a * h + total.u;  /* blelloch.carry */
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
  const int lid = SW_LID, r = lid % SW_TPL;
  const sw_index lane = SW_GROUP * SW_LANES_PER_GROUP + lid / SW_TPL;
  const int active = lane < nlanes;
  const sw_index base = lane * L;
  SW_T h = {INIT_H};
{loop}
  if (SW_RETURN_STATE && active && r == 0) hlast[lane] = h;
}}"""


SCHEDULES.add("hybrid", GPUSchedule(
    defines=lambda cfg: ("#define SW_TPL (SW_WORKGROUP_SIZE / SW_LANES_PER_GROUP)\n"
                         "#define SW_IPT SW_ITEMS_PER_THREAD"),
    body=_hybrid_body,
    plan=lambda cfg, lanes, L: Plan((Launch("sw_hybrid", ceil_div(lanes, cfg["lanes_per_group"]),
                                            cfg["workgroup_size"]),)),
))

from . import gpu_multiblock  # noqa: E402,F401  (registers reduce_then_scan and lookback)
