"""Kernel text of the multi-block GPU schedules: ``reduce_then_scan`` and ``lookback``.

Both cut each lane into blocks (tiles) handled by separate workgroups, so a
single long sequence fills the device.  Scratch layout (see :class:`~.gpu.Plan`):

* ``reduce_then_scan``: ``ws[2g], ws[2g+1]`` = aggregate (A, U) of block
  ``g = lane * nblocks + b``; ``ws[2G + g]`` = its carry-in state (G blocks in all).
* ``lookback``: ``wsi[0]`` = ticket counter; from ``wsi + 2`` (8-byte
  aligned) one 64-bit status word per tile ``g``: status in the high half
  (0 none, 1 aggregate, 2 inclusive state) and, for float32, the state after
  the tile in the low half, so that the common case (a predecessor's state)
  is one read; ``ws[g]``, ``ws[G + g]`` = aggregate (A, U), written before
  status 1 behind a fence; ``ws[2G + g]`` = the state after tile ``g`` for
  wider dtypes (written before status 2 behind a fence).

The look-back inspects a window of :data:`LOOKBACK_WINDOW` predecessors at
once (a warp's ballot and shuffles on CUDA; the same steps emulated in local
memory by the workgroup on OpenCL), after Merrill & Garland (2016).
"""

from __future__ import annotations

from ..schedules.reduce_then_scan import block_elements
from .gpu import SCHEDULES, GPUSchedule, Launch, Plan
from .gpu_kernels import ELEMENT, OUTPUT, TILE_DEFINES, TILE_LOCALS, ceil_div, tile_load, tile_loop, tile_replay

BLOCK_DEFINES = "#define SW_TPL SW_WORKGROUP_SIZE\n#define SW_IPT SW_ITEMS_PER_THREAD\n" + TILE_DEFINES

#: Lookback status of a tile (the high 32 bits of its status word): not yet published, its aggregate
#: (A, U) is published, its inclusive state (the state after the tile) is published.
INVALID, AGGREGATE, PREFIX = 0, 1, 2
#: Predecessors one look-back step inspects at once: a warp's width on NVIDIA GPUs.
LOOKBACK_WINDOW = 32


def _rts_body(r, stages) -> str:
    params = r.gpu_params(stages)
    head = f"""  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
{TILE_LOCALS}
  const int lid = SW_LID, r = lid, tb = 0, active = 1;
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
    defines=lambda cfg: (BLOCK_DEFINES
                         + "\n#define SW_BLOCK ((sw_index)SW_WORKGROUP_SIZE * SW_IPT * SW_TILES_PER_BLOCK)"),
    body=_rts_body,
    plan=_rts_plan,
))


#: The look-back's subgroup operations emulated in local memory by the whole workgroup, for targets
#: without ballots and shuffles (every work-item calls them; only the first SW_WINDOW take part).
EMULATED_WINDOW_OPS = """SW_DEVICE unsigned sw_vote(const int pred, SW_LOCAL_PTR int* buf, const int lid) {
  if (lid < SW_WINDOW) buf[lid] = pred;
  SW_BARRIER();
  unsigned m = 0u;
  for (int k = 0; k < SW_WINDOW; ++k) m |= buf[k] ? (1u << k) : 0u;
  SW_BARRIER();
  return m;
}
SW_DEVICE SW_T sw_down(const SW_T v, const int d, SW_LOCAL_PTR SW_T* buf, const int lid) {
  if (lid < SW_WINDOW) buf[lid] = v;
  SW_BARRIER();
  const SW_T o = lid + d < SW_WINDOW ? buf[lid + d] : v;
  SW_BARRIER();
  return o;
}
SW_DEVICE int sw_ffs(const unsigned m) { return m ? (int)popcount((m & (0u - m)) - 1u) + 1 : 0; }"""


def _window_ops(r) -> tuple[str, str, str]:
    """(helpers, locals, macros) of the look-back's vote and shuffle: native, or emulated in local memory."""
    if r.ballot and r.shuffle_down:
        macros = "\n".join([
            f"#define SW_VOTE(pred) {r.ballot.format(p='(pred)')}",
            f"#define SW_DOWN(v, d) {r.shuffle_down.format(v='(v)', d='(d)')}",
            f"#define SW_FFS(m) {r.find_first_set.format(v='(m)')}",
            "#define SW_LB_ACTIVE (lid < SW_WINDOW)",
        ])
        return "", "", macros
    macros = "\n".join([
        "#define SW_VOTE(pred) sw_vote((pred), sw_vbuf, lid)",
        "#define SW_DOWN(v, d) sw_down((v), (d), sw_xbuf, lid)",
        "#define SW_FFS(m) sw_ffs(m)",
        "#define SW_LB_ACTIVE 1",
    ])
    return EMULATED_WINDOW_OPS, "  SW_LOCAL int sw_vbuf[SW_WINDOW];\n  SW_LOCAL SW_T sw_xbuf[SW_WINDOW];", macros


def _lookback_body(r, stages) -> str:
    idx = "SW_IDX(base, {s})"
    helpers, window_locals, macros = _window_ops(r)
    return f"""{r.group_scan()}
{macros}
#define SW_PACKED {int(stages.affine.dtype == "float32")}
#if SW_PACKED
/* float32: the inclusive state travels in the low half of the status word, published in one write */
#define SW_WORD(st, v) (((sw_u64)(st) << 32) | (sw_u64)SW_F2U(v))
#define SW_WORD_STATE(w, q) SW_U2F((unsigned)((w) & 0xffffffffu))
#else
/* wider states: the state is written first, then (after a fence) the status word */
#define SW_WORD(st, v) ((sw_u64)(st) << 32)
#define SW_WORD_STATE(w, q) after[q]
#endif
#define SW_STATUS(w) ((int)((w) >> 32))
#ifndef SW_LOOKBACK_WALK
#define SW_LOOKBACK_WALK 0  /* 1 (tests only): ignore published states but the lane's first, walk every window */
#endif
#define SW_IS_PREFIX(st, q) ((st) == {PREFIX} && (!SW_LOOKBACK_WALK || (q) <= first))
{helpers}

SW_KERNEL void sw_lookback({r.gpu_params(stages)}) {{
  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
{TILE_LOCALS}
{window_locals}
  SW_LOCAL int s_ticket;
  SW_LOCAL SW_T s_carry;
  const int lid = SW_LID, r = lid, tb = 0, active = 1;
  if (lid == 0) s_ticket = SW_TICKET(&wsi[0]);  /* tiles start in ticket order */
  SW_BARRIER();
  const sw_index nt = (L + SW_TILE - 1) / SW_TILE, G = nlanes * nt;
  const sw_index g = s_ticket, lane = g / nt, b = g % nt, base = lane * L;
  const sw_index end = b * SW_TILE + SW_TILE < L ? b * SW_TILE + SW_TILE : L;
  const sw_index t0 = b * SW_TILE;
  /* lookback.tile_reduce */
{tile_load("end", idx, ELEMENT)}
  /* lookback.look_back: status words after the ticket counter (8-byte aligned) */
  SW_GLOBAL volatile sw_u64* words = (SW_GLOBAL volatile sw_u64*)(wsi + 2);
  SW_GLOBAL volatile SW_T* agg_a = ws;
  SW_GLOBAL volatile SW_T* agg_u = ws + G;
#if !SW_PACKED
  SW_GLOBAL volatile SW_T* after = ws + 2 * G;
#endif
  const SW_T h_init = SW_HAS_H0 ? h0[lane] : (SW_T)0;
  if (lid == 0 && b > 0) {{
    agg_a[g] = total.a;
    agg_u[g] = total.u;
    SW_FENCE();
    SW_WORD_STORE(&words[g], SW_WORD({AGGREGATE}, (SW_T)0));
  }}
  SW_T carry = h_init;
  if (b > 0 && SW_LB_ACTIVE) {{
    /* a window of SW_WINDOW predecessors at once: work-item l inspects tile j - l; a published state (or
       the lane's start, with h0) acts as the pair (0, state), which ends the chain */
    const sw_index first = lane * nt;
    const int mine = lid < SW_WINDOW;
    sw_pair acc = sw_identity();
    sw_index j = g - 1;
    for (;;) {{
      const sw_index q = j - lid;
      const int own = mine && q >= first;
      sw_u64 w = 0;
      int st = {PREFIX};  /* before the lane's first tile: h0 */
      if (own) {{
        w = SW_WORD_LOAD(&words[q]);
        st = SW_STATUS(w);
      }}
      unsigned pm;
      for (;;) {{  /* wait until every tile before the nearest published state has published something */
        pm = SW_VOTE(mine && SW_IS_PREFIX(st, q));
        const unsigned zm = SW_VOTE(mine && st == {INVALID});
        if (!(zm & (pm ? (pm & (0u - pm)) - 1u : 0xffffffffu))) break;
        if (own && st == {INVALID}) {{
          w = SW_WORD_LOAD(&words[q]);
          st = SW_STATUS(w);
        }}
      }}
      SW_FENCE();
      const int pf = pm ? SW_FFS(pm) - 1 : SW_WINDOW;
      sw_pair p = sw_identity();
      if (mine && lid < pf) p = sw_pair_make(agg_a[q], agg_u[q]);
      else if (mine && lid == pf) p = sw_pair_make((SW_T)0, q >= first ? SW_WORD_STATE(w, q) : h_init);
      for (int d = 1; d < SW_WINDOW; d <<= 1) {{  /* later tiles sit at lower work-items */
        const SW_T oa = SW_DOWN(p.a, d), ou = SW_DOWN(p.u, d);
        if (lid + d < SW_WINDOW) p = sw_compose(p, sw_pair_make(oa, ou));
      }}
      acc = sw_compose(acc, p);
      if (pm) break;
      j -= SW_WINDOW;
    }}
    carry = acc.u;
  }}
  if (lid == 0) {{
    const SW_T incl = sw_carry(total.a, total.u, carry);
#if !SW_PACKED
    after[g] = incl;
    SW_FENCE();
#endif
    SW_WORD_STORE(&words[g], SW_WORD({PREFIX}, incl));
    s_carry = carry;
    if (SW_RETURN_STATE && b == nt - 1) hlast[lane] = incl;
  }}
  SW_BARRIER();
  const SW_T h = s_carry;  /* lookback.replay */
{tile_replay("end", idx, OUTPUT)}
}}"""


def _lookback_plan(cfg, lanes, L) -> Plan:
    nt = ceil_div(L, cfg["workgroup_size"] * cfg["items_per_thread"])
    G = lanes * nt
    return Plan((Launch("sw_lookback", G, cfg["workgroup_size"]),), ws=3 * G, wsi=2 + 2 * G, zero_wsi=True)


def _lookback_defines(cfg) -> str:
    return "\n".join([BLOCK_DEFINES, "#define SW_TILE ((sw_index)SW_WORKGROUP_SIZE * SW_IPT)",
                      f"#define SW_WINDOW {LOOKBACK_WINDOW}"])


SCHEDULES.add("lookback", GPUSchedule(
    defines=_lookback_defines,
    body=_lookback_body,
    plan=_lookback_plan,
))
