"""Kernel text of the multi-block GPU schedules: ``reduce_then_scan`` and ``lookback``.

Both cut each lane into blocks (tiles) handled by separate workgroups, so a
single long sequence fills the device.  Scratch layout (see :class:`~.gpu.Plan`):

* ``reduce_then_scan``: ``ws[2g], ws[2g+1]`` = aggregate (A, U) of block
  ``g = lane * nblocks + b``; ``ws[2G + g]`` = its carry-in state (G blocks in all).
* ``lookback``: ``wsi[0]`` = ticket counter, ``wsi[1 + g]`` = status of tile
  ``g`` (0 none, 1 aggregate, 2 inclusive prefix); ``ws[g]``, ``ws[G + g]`` =
  aggregate (A, U); ``ws[2G + g]`` = the state after tile ``g``.
"""

from __future__ import annotations

from ..schedules.reduce_then_scan import block_elements
from .gpu import SCHEDULES, GPUSchedule, Launch, Plan
from .gpu_kernels import ELEMENT, OUTPUT, ceil_div, tile_load, tile_loop, tile_replay

TILE_DEFINES = "#define SW_TPL SW_WORKGROUP_SIZE\n#define SW_IPT SW_ITEMS_PER_THREAD"

#: Lookback status flags.
AGGREGATE, PREFIX = 1, 2


def _rts_body(r, stages) -> str:
    params = r.gpu_params(stages)
    head = """  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
  const int lid = SW_LID, r = lid, active = 1;
  const sw_index nb = (L + SW_BLOCK - 1) / SW_BLOCK;"""
    block = """  const sw_index g = SW_GROUP, lane = g / nb, b = g % nb, base = lane * L;
  const sw_index begin = b * SW_BLOCK, end = begin + SW_BLOCK < L ? begin + SW_BLOCK : L;"""
    reduce = tile_loop("begin", "end", "SW_IDX(base, {s})", ELEMENT, None, acc="blk")
    carry = tile_loop("0", "nb", "base + {s}", "sw_pair_make(ws[2 * {i}], ws[2 * {i} + 1])",
                      "ws[2 * nlanes * nb + {i}] = {hp}")
    scan = tile_loop("begin", "end", "SW_IDX(base, {s})", ELEMENT, OUTPUT)
    return f"""{r.group_scan()}

SW_KERNEL void sw_rts_reduce({params}) {{
{head}
{block}
  SW_T h = (SW_T)0;
  sw_pair blk = sw_identity();
{reduce}
  if (lid == 0) {{
    ws[2 * g] = blk.a;
    ws[2 * g + 1] = blk.u;
  }}
}}

SW_KERNEL void sw_rts_carry({params}) {{
{head}
  const sw_index lane = SW_GROUP, base = lane * nb;
  SW_T h = SW_HAS_H0 ? h0[lane] : (SW_T)0;
{carry}
  if (SW_RETURN_STATE && lid == 0) hlast[lane] = h;
}}

SW_KERNEL void sw_rts_scan({params}) {{
{head}
{block}
  SW_T h = ws[2 * nlanes * nb + g];
{scan}
}}"""


def _rts_plan(cfg, lanes, L) -> Plan:
    wg, nb = cfg["workgroup_size"], ceil_div(L, block_elements(cfg))
    return Plan((Launch("sw_rts_reduce", lanes * nb, wg), Launch("sw_rts_carry", lanes, wg),
                 Launch("sw_rts_scan", lanes * nb, wg)), ws=3 * lanes * nb, wsi=1)


SCHEDULES.add("reduce_then_scan", GPUSchedule(
    defines=lambda cfg: TILE_DEFINES + "\n#define SW_BLOCK ((sw_index)SW_WORKGROUP_SIZE * SW_IPT * SW_TILES_PER_BLOCK)",
    body=_rts_body,
    plan=_rts_plan,
))


def _lookback_body(r, stages) -> str:
    idx = "SW_IDX(base, {s})"
    return f"""{r.group_scan()}

SW_KERNEL void sw_lookback({r.gpu_params(stages)}) {{
  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
  SW_LOCAL int s_ticket;
  SW_LOCAL SW_T s_carry;
  const int lid = SW_LID, active = 1;
  if (lid == 0) s_ticket = SW_TICKET(&wsi[0]);  /* tiles start in ticket order */
  SW_BARRIER();
  const sw_index nt = (L + SW_TILE - 1) / SW_TILE, G = nlanes * nt;
  const sw_index g = s_ticket, lane = g / nt, b = g % nt, base = lane * L;
  const sw_index end = b * SW_TILE + SW_TILE < L ? b * SW_TILE + SW_TILE : L;
  const sw_index s0 = b * SW_TILE + (sw_index)lid * SW_IPT;
  /* lookback.tile_reduce */
{tile_load("end", idx, ELEMENT)}
  if (lid == 0) {{  /* lookback.look_back */
    SW_GLOBAL volatile int* flags = wsi + 1;
    SW_GLOBAL volatile SW_T* agg_a = ws;
    SW_GLOBAL volatile SW_T* agg_u = ws + G;
    SW_GLOBAL volatile SW_T* after = ws + 2 * G;
    SW_T carry = SW_HAS_H0 ? h0[lane] : (SW_T)0;
    if (b > 0) {{
      agg_a[g] = total.a;
      agg_u[g] = total.u;
      SW_FENCE();
      SW_FLAG_STORE(&flags[g], {AGGREGATE});
      sw_pair acc = sw_identity();
      sw_index j = g - 1;
      for (;;) {{
        const int f = SW_FLAG_LOAD(&flags[j]);
        if (f == 0) continue;
        SW_FENCE();
        if (f == {PREFIX}) {{
          carry = acc.a * after[j] + acc.u;
          break;
        }}
        acc = sw_compose(acc, sw_pair_make(agg_a[j], agg_u[j]));
        --j;
      }}
    }}
    after[g] = total.a * carry + total.u;
    SW_FENCE();
    SW_FLAG_STORE(&flags[g], {PREFIX});
    s_carry = carry;
    if (SW_RETURN_STATE && b == nt - 1) hlast[lane] = total.a * carry + total.u;
  }}
  SW_BARRIER();
  const SW_T h = s_carry;  /* lookback.replay */
{tile_replay("end", idx, OUTPUT)}
}}"""


def _lookback_plan(cfg, lanes, L) -> Plan:
    nt = ceil_div(L, cfg["workgroup_size"] * cfg["items_per_thread"])
    G = lanes * nt
    return Plan((Launch("sw_lookback", G, cfg["workgroup_size"]),), ws=3 * G, wsi=1 + G, zero_wsi=True)


SCHEDULES.add("lookback", GPUSchedule(
    defines=lambda cfg: TILE_DEFINES + "\n#define SW_TILE ((sw_index)SW_WORKGROUP_SIZE * SW_IPT)",
    body=_lookback_body,
    plan=_lookback_plan,
))
