"""The chunked (matmul) form of the fused ``matrix_state`` forward on the GPU (OpenCL, CUDA), in the C-family macros.

Selected by the tunable ``algorithm="chunked"`` (with ``chunk`` steps per
chunk, at most :data:`MAX_CHUNK`); :mod:`.fused_gpu_matrix_state` renders it
after its own prelude.  Per (sequence, head) the scan positions are cut into
chunks of C steps; within a chunk, with G the cumulative log decay (per key
or per head) *since the chunk's start or its last reset*, N the count of
resets so far, Gq the q-side prefix (``G_i`` for the readout after the
update, ``G_{i-1}`` for RWKV-6's bonus readout of the previous state)::

    E      = sum_j (k_j o e^{G_last - G_j}) v_j^T            (0 where a reset lies after j)
    S_end  = e^{G_last} o S_start + E                        (S_end = E after a reset)
    o_i    = (q_i o e^{Gq_i}) S_start + sum_{j <= i} A_ij v_j,   A_ij = sum_k q_ik k_jk e^{Gq_ik - G_jk}
             (j < i and A_ii = q_i . (u o k_i) for the bonus readout)

Four kernels (three without a decay), each a plain loop nest on local memory:

1. ``sw_matrix_state_chunk_prefix``: per (chunk, head, key), G and N of every
   position, summed in ``SW_ACC`` (double where the device has it) and kept
   in the scratch as two storage numbers (hi + lo) beside N;
2. ``sw_matrix_state_chunk_local``: per (chunk, head, tile of value columns),
   E, the state tiled over work-items as in the recurrent kernels;
3. ``sw_matrix_state_chunk_carry``: per (sequence, head, state element), the
   chunks in order: it replaces each chunk's E by its start state and writes
   the final state into ``hlast``;
4. ``sw_matrix_state_chunk_output``: per (chunk, head), A (C x C, in local
   memory) from the keys in tiles of ``KT``, once; then, a tile of ``CT3``
   value columns at a time, the start state's part (the key tiles again, in
   alternate directions so that the tile staged last is reused) and A's.

The chunked backward (:mod:`.matrix_gpu_chunked_backward`) runs kernels 1-3
(:data:`STATES`; its carry writes no final state) for the chunks' start
states.

Exactness: a log decay whose exponential is 0 in the storage type (below
-104 in float32, -746 in float64, ``-inf`` included) is a reset: the sum
restarts at 0, factors across it are 0 (by the counts, never by
exponentiating ``-inf - -inf``), and no huge term swamps later tiny ones.
Every factor is the exponential of one difference of two sums computed in
``SW_ACC``, entry by entry (never a product ``e^{G_i} e^{-G_j}`` of two
factors), so positive log decays grow as the recurrence grows them, but in a
*plain* key tile of the output kernel's scores (a decay per key; none of the
tile's keys has a reset, a growth or a NaN in the chunk, and none decays by
more than ``SW_PLAIN_RANGE``, 60 in float32 and 600 in float64, as the C
kernels' ``SW_RANGE``) or a plain chunk of a decay per head, where both
``e^{Gq}`` and ``e^{-Gk}`` are normal numbers and a score is a plain sum of
``(q o e^{Gq}) (k o e^{-Gk})`` (per head: ``q . k`` times ``e^{Gq_i}
e^{-Gk_j}``): one exponential per key and step instead of one per score; the
products ``x e^{d}`` are formed in ``SW_ACC`` and a zero ``x`` (or a zero
start state) contributes 0 even where ``e^{d}`` overflows.  A chunk differs
from the recurrence in overflow only where a weight ``k_j e^{G_i - G_j}``,
``q_i e^{Gq_i}`` or ``A_ij`` itself leaves the storage type's range (with
float32 storage that needs a growth of about e^88 inside one chunk), or, in
float64, where a growth inside one chunk passes e^709 (double's range) on a
tiny state the recurrence would keep finite.

Scratch: the chunk-start states (``slots * H * K * V`` elements, the
quantity the carry kernel needs) and the prefix planes (``3 * slots * H * C``
times K for a decay per key, 1 per head).

Packed sequences: sequence s owns the chunk slots ``cu_seqlens[s] // C + s``
onwards (enough for its chunks; the slot of a workgroup finds its sequence
by bisection on ``cu_seqlens``), so the grids are ``T // C + nseq`` slots
(``batch * ceil(T / C)`` unpacked) and idle slots return at once.

Example:
    >>> from scanweaver.fused.matrix_state import MatrixStateFeatures
    >>> from scanweaver.targets.matrix_gpu_chunked import chunk_layout
    >>> chunk_layout(MatrixStateFeatures("float32", 128, 128, "key"), {"workgroup_size": 128, "chunk": 64})
    ChunkLayout(wg3=256, ct3=32, kt=16)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fused.matrix_state import GPU_MAX_CHUNK as MAX_CHUNK
from ..fused.matrix_state import MatrixStateFeatures
from .launch_limits import ITEMSIZE, SM90

__all__ = ["CHUNKED", "MAX_CHUNK", "OUTPUT", "STATES", "ChunkLayout", "chunk_layout", "defines", "local_bytes",
           "plan_launches", "slots"]
#: Entries of A per work-item of the output kernel at most (registers): its workgroup is C * C / this, or more.
SCORES_PER_ITEM = 16
#: Value columns per workgroup of the output kernel at most.
OUTPUT_COLUMNS = 32
#: Bytes of the decay-sum type (double: every device the kernels are compiled for here has it).
ACC_BYTES = 8


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class ChunkLayout:
    """The output kernel's tiling: ``wg3`` work-items, ``ct3`` value columns, keys staged ``kt`` at a time."""

    wg3: int
    ct3: int
    kt: int


def _output_bytes(f: MatrixStateFeatures, C: int, kt: int) -> int:
    item, ktp = ITEMSIZE[f.dtype], kt + 1 - kt % 2  # rows padded to an odd stride (SW_KTP)
    kdt = ktp if f.decay == "key" else 1
    decays = (C + 1) * kdt * ACC_BYTES + -(-(C + 1) * kdt * 4 // 8) * 8 if f.decay != "none" else 0
    # q, q o e^{Gq}, k; k o e^{-Gk} for a plain tile of a decay per key, e^{G} and e^{-G} of a plain chunk of a decay
    # per head (one element without a decay); the plain flag
    plain = {"key": C * ktp * item, "scalar": 2 * (C + 1) * item}.get(f.decay, 8)
    tiles = 3 * C * ktp * item + plain + 8
    return tiles + decays + C * C * item


def chunk_layout(f: MatrixStateFeatures, config: dict) -> ChunkLayout:
    """The output kernel's tiling for ``config``'s ``chunk``: C * C / :data:`SCORES_PER_ITEM` work-items (64 to
    256: up to 255 registers each, what its scores' exponentials need without spilling),
    :data:`OUTPUT_COLUMNS` columns at most, and the widest key tile (16 down to 1) whose local memory fits a
    workgroup's."""
    C = int(config["chunk"])
    wg3 = max(64, _pow2_at_least(-(-C * C // SCORES_PER_ITEM)))
    ct3 = min(_pow2_at_least(f.V), OUTPUT_COLUMNS, wg3)
    kt = min(16, _pow2_at_least(f.K))
    while kt > 1 and _output_bytes(f, C, kt) > SM90.shared_per_block:
        kt //= 2
    return ChunkLayout(wg3, ct3, kt)


def local_bytes(f: MatrixStateFeatures, config: dict, ct: int) -> int:
    """Static local memory of the largest chunked kernel (bytes); ``ct``: the local kernel's columns per
    workgroup (the recurrent layout's)."""
    C, tt, item = int(config["chunk"]), int(config["time_tile"]), ITEMSIZE[f.dtype]
    return max((tt * f.K + tt * ct) * item, _output_bytes(f, C, chunk_layout(f, config).kt))


def slots(f: MatrixStateFeatures, sizes: dict, C: int) -> int:
    """Chunk slots per head: ``T // C + nseq`` packed, ``batch * ceil(T / C)`` otherwise."""
    if f.has_seqlens:
        return sizes["T"] // C + sizes["nseq"]
    return sizes["batch"] * -(-sizes["T"] // C)


def plan_launches(f: MatrixStateFeatures, config: dict, sizes: dict, wg: int, ct: int) -> tuple[list, int]:
    """``([(kernel, groups, work-items)], scratch elements)`` of the chunked forward (``wg``, ``ct``: the
    recurrent layout's workgroup and columns per workgroup, used by the prefix, local and carry kernels)."""
    C, H = int(config["chunk"]), sizes["H"]
    n, lay = slots(f, sizes, C), chunk_layout(f, config)
    kd = f.K if f.decay == "key" else 1
    launches = []
    if f.decay != "none":
        launches.append(("sw_matrix_state_chunk_prefix", n * H * -(-kd // wg), wg))
    launches += [("sw_matrix_state_chunk_local", n * H * -(-f.V // ct), wg),
                 ("sw_matrix_state_chunk_carry", sizes["nseq"] * H * -(-(f.K * f.V) // wg), wg),
                 ("sw_matrix_state_chunk_output", n * H, lay.wg3)]
    ws = n * H * f.K * f.V + (3 * n * H * C * kd if f.decay != "none" else 0)
    return launches, max(ws, 1)


def defines(f: MatrixStateFeatures, config: dict) -> str:
    """``#define`` lines of the chunked kernels' sizes."""
    lay = chunk_layout(f, config)
    return "\n".join([f"#define SW_CHUNK {int(config['chunk'])}", f"#define SW_WG3 {lay.wg3}",
                      f"#define SW_CT3 {lay.ct3}", f"#define SW_KT {lay.kt}"])


#: The macros and the kernels of the chunk-start states (prefix, local, carry): the forward's and the chunked
#: backward's (:mod:`.matrix_gpu_chunked_backward`) first kernels.
STATES = r"""
#define SW_C SW_CHUNK
#define SW_KD (SW_DECAY == 2 ? SW_K : 1)
#define SW_NCH ((T + SW_C - 1) / SW_C)
#define SW_NSLOTS (SW_HAS_SEQLENS ? T / SW_C + nseq : batch * SW_NCH)
/* the first chunk slot of sequence s */
#define SW_BASE(s) (SW_HAS_SEQLENS ? cu_seqlens[s] / SW_C + (s) : (s) * SW_NCH)
/* a log decay below this is a reset: its exponential is 0 in SW_T */
#if SW_DOUBLE
#define SW_RESET_BELOW (-746.0)
#else
#define SW_RESET_BELOW (-104.0)
#endif
/* scratch: E (then the start state) of slot sl, head h, element (i, j); then the prefix planes (hi, lo, N) */
#define SW_EIDX(sl, i, j) ((((sl) * H + h) * SW_K + (i)) * SW_V + (j))
#define SW_PSZ ((sw_index)SW_NSLOTS * H * SW_C * SW_KD)
#define SW_PIDX(sl, p, d) ((sw_index)SW_NSLOTS * H * SW_K * SW_V + (((sl) * H + h) * SW_C + (p)) * SW_KD + (d))
#if SW_DECAY
#define SW_PG(sl, p, d) ((SW_ACC)ws[SW_PIDX(sl, p, d)] + (SW_ACC)ws[SW_PIDX(sl, p, d) + SW_PSZ])
#define SW_PN(sl, p, d) ((int)ws[SW_PIDX(sl, p, d) + 2 * SW_PSZ])
#else
#define SW_PG(sl, p, d) ((SW_ACC)0)
#define SW_PN(sl, p, d) 0
#endif
/* x e^{d} rounded to SW_T, formed in SW_ACC; 0 for x = 0 whatever e^{d} is */
#define SW_SCALE(x, d) ((x) == (SW_T)0 ? (SW_T)0 : (SW_T)((SW_ACC)(x) * exp((SW_ACC)(d))))
#define SW_ROWS(p) ((int)(len - (p) < SW_C ? len - (p) : SW_C))
/* the carry's final state: into hlast (the forward), nowhere (the backward) */
#ifndef SW_HLAST_PUT
#define SW_HLAST_PUT(at, x) hlast[at] = (x)
#endif
/* the sequence of slot sl, its segment, the chunk's first scan position cs and length n (0: an idle slot) */
#define SW_SLOT(sl) \
  sw_index seq = 0; \
  if (SW_HAS_SEQLENS) { \
    sw_index lo_ = 0, hi_ = nseq - 1; \
    while (lo_ < hi_) { \
      const sw_index mid_ = (lo_ + hi_ + 1) / 2; \
      if (SW_BASE(mid_) <= (sl)) lo_ = mid_; else hi_ = mid_ - 1; \
    } \
    seq = lo_; \
  } else { \
    seq = (sl) / SW_NCH; \
  } \
  SW_SEGMENT(seq); \
  const sw_index cs = ((sl) - SW_BASE(seq)) * SW_C; \
  const int n = cs < len ? SW_ROWS(cs) : 0

#if SW_DECAY
SW_KERNEL_TILED void sw_matrix_state_chunk_prefix(@PARAMS@) {
  const int lid = SW_LID;
  const sw_index nd = (SW_KD + SW_WG - 1) / SW_WG, grp = SW_GROUP;
  const sw_index d = grp % nd * SW_WG + lid, h = grp / nd % H, sl = grp / nd / H;
  SW_SLOT(sl);
  (void)hq;
  if (d >= SW_KD) return;
  SW_ACC G = 0;
  int N = 0;
  for (int p = 0; p < n; ++p) {
    const sw_index t = SW_STEP(cs + p);
    const SW_ACC x = (SW_ACC)g[SW_DECAY == 2 ? SW_GK(t) + d : SW_GS(t)];
    if (x < SW_RESET_BELOW) {
      G = 0;
      ++N;
    } else {
      G += x;
    }
    const SW_T hi = (SW_T)G;
    const sw_index at = SW_PIDX(sl, p, d);
    ws[at] = hi;
    ws[at + SW_PSZ] = hi - hi == (SW_T)0 ? (SW_T)(G - (SW_ACC)hi) : (SW_T)0;
    ws[at + 2 * SW_PSZ] = (SW_T)N;
  }
}
#endif

SW_KERNEL_TILED void sw_matrix_state_chunk_local(@PARAMS@) {
  SW_LOCAL SW_T sw[SW_TT * SW_K];
  SW_LOCAL SW_T sx[SW_TT * SW_CT];
  const int lid = SW_LID, c = lid % SW_CT, r = lid / SW_CT;
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, h = grp / SW_NVT % H, sl = grp / SW_NVT / H;
  const sw_index j = vt * SW_CT + c;
  const int live = j < SW_V;
  SW_SLOT(sl);
  SW_T e[SW_KP];
#pragma unroll
  for (int m = 0; m < SW_KP; ++m) e[m] = (SW_T)0;
  for (int p0 = 0; p0 < n; p0 += SW_TT) {
    const int nn = n - p0 < SW_TT ? n - p0 : SW_TT;
    SW_BARRIER();
    for (int x = lid; x < nn * SW_K; x += SW_WG) {
      const int tt = x / SW_K, i = x % SW_K, dd = SW_DECAY == 2 ? i : 0;
      const SW_T kv = k[SW_QK(SW_STEP(cs + p0 + tt)) + i];
      (void)dd;
      sw[x] = !SW_DECAY ? kv : SW_PN(sl, n - 1, dd) == SW_PN(sl, p0 + tt, dd)
                                ? SW_SCALE(kv, SW_PG(sl, n - 1, dd) - SW_PG(sl, p0 + tt, dd)) : (SW_T)0;
    }
    for (int x = lid; x < nn * SW_CT; x += SW_WG) {
      const sw_index jj = vt * SW_CT + x % SW_CT;
      sx[x] = jj < SW_V ? v[SW_VO(SW_STEP(cs + p0 + x / SW_CT)) + jj] : (SW_T)0;
    }
    SW_BARRIER();
    if (live)
      for (int tt = 0; tt < nn; ++tt) {
        const SW_T vj = sx[tt * SW_CT + c];
#pragma unroll
        for (int m = 0; m < SW_KP; ++m)
          if (SW_KEY_OK(m)) e[m] += sw[tt * SW_K + SW_KEY(m)] * vj;
      }
  }
  if (live) {
#pragma unroll
    for (int m = 0; m < SW_KP; ++m)
      if (SW_KEY_OK(m)) ws[SW_EIDX(sl, SW_KEY(m), j)] = e[m];
  }
}

SW_KERNEL_TILED void sw_matrix_state_chunk_carry(@PARAMS@) {
  const int lid = SW_LID;
  const sw_index ne = ((sw_index)SW_K * SW_V + SW_WG - 1) / SW_WG, grp = SW_GROUP;
  const sw_index x = grp % ne * SW_WG + lid, h = grp / ne % H, seq = grp / ne / H;
  if (x >= (sw_index)SW_K * SW_V) return;
  const sw_index i = x / SW_V, j = x % SW_V, st = (seq * H + h) * SW_K * SW_V + x;
  const int dd = SW_DECAY == 2 ? (int)i : 0;
  SW_SEGMENT(seq);
  (void)b;
  (void)hq;
  SW_T s = SW_HAS_H0 ? h0[st] : (SW_T)0;
  sw_index sl = SW_BASE(seq);
  for (sw_index c0 = 0; c0 < len; c0 += SW_C, ++sl) {
    const int n = SW_ROWS(c0);
    const SW_T e = ws[SW_EIDX(sl, i, j)];
    (void)n;
    (void)dd;
    ws[SW_EIDX(sl, i, j)] = s;
    if (!SW_DECAY)
      s += e;
    else if (s == (SW_T)0 || SW_PN(sl, n - 1, dd) != 0)
      s = e;
    else
      s = (SW_T)((SW_ACC)s * exp(SW_PG(sl, n - 1, dd)) + (SW_ACC)e);
  }
  SW_HLAST_PUT(st, s);
}
"""

#: The output kernel of the chunked forward.
OUTPUT = r"""
#define SW_NG3 (SW_WG3 / SW_CT3)
#define SW_NO ((SW_C + SW_NG3 - 1) / SW_NG3)
#define SW_NA ((SW_C * SW_C + SW_WG3 - 1) / SW_WG3)
#define SW_NVT3 ((SW_V + SW_CT3 - 1) / SW_CT3)
/* staged decay values per position: a key tile's, or the head's one */
#define SW_KDT (SW_DECAY == 2 ? SW_KT : 1)
/* the row strides of the staged key tiles and decay rows in local memory: odd, so that the work-items of a warp
 * reading one column of consecutive rows (the scores' k side) hit distinct banks */
#define SW_KTP (SW_KT + 1 - SW_KT % 2)
#define SW_KDTP (SW_DECAY == 2 ? SW_KTP : 1)
#define SW_GLEN (SW_DECAY ? (SW_C + 1) * SW_KDTP : 1)
/* the staged prefix row of position p (row 0: the chunk's start) on the q side and on the k side */
#define SW_QROW(p) (SW_BONUS ? (p) : (p) + 1)
#define SW_KROW(p) ((p) + 1)
/* Widest total log decay of a plain key tile: e^{+-SW_PLAIN_RANGE} are normal numbers of SW_T (as the C kernels'
 * SW_RANGE) */
#if SW_DOUBLE
#define SW_PLAIN_RANGE 600.0
#else
#define SW_PLAIN_RANGE 60.0
#endif

/* Stages key tile k0 of q (and of k, with_k) into sq (sk), and its decay rows into sg, sn (every tile for a decay
 * per key, the first for one per head) */
#define SW_STAGE_TILE(k0, with_k) \
  for (int x = lid; x < SW_C * SW_KT; x += SW_WG3) { \
    const int p = x / SW_KT, i = (k0) + x % SW_KT, ok = p < n && i < SW_K, at = p * SW_KTP + x % SW_KT; \
    const sw_index t = SW_STEP(cs + (ok ? p : 0)); \
    sq[at] = ok ? q[SW_QK(t) + i] : (SW_T)0; \
    if (with_k) sk[at] = ok ? k[SW_QK(t) + i] : (SW_T)0; \
  } \
  if (SW_DECAY && (SW_DECAY == 2 || (k0) == 0)) \
    for (int x = lid; x < SW_GLEN; x += SW_WG3) { \
      const int p = x / SW_KDTP - 1, d = SW_DECAY == 2 ? (k0) + x % SW_KDTP : 0; \
      const int ok = p >= 0 && p < n && d < SW_KD && (SW_DECAY != 2 || x % SW_KDTP < SW_KT); \
      sg[x] = ok ? SW_PG(sl, p, d) : (SW_ACC)0; \
      sn[x] = ok ? SW_PN(sl, p, d) : 0; \
    }
/* q o e^{Gq} of the staged tile into sqf (after a barrier past SW_STAGE_TILE) */
#define SW_SCALE_Q() \
  for (int x = lid; x < SW_C * SW_KT; x += SW_WG3) { \
    const int row = SW_QROW(x / SW_KT) * SW_KDTP + (SW_DECAY == 2 ? x % SW_KT : 0); \
    const int at = x / SW_KT * SW_KTP + x % SW_KT; \
    sqf[at] = !SW_DECAY ? sq[at] : sn[row] == 0 ? SW_SCALE(sq[at], sg[row]) : (SW_T)0; \
  }

SW_KERNEL_WG3 void sw_matrix_state_chunk_output(@PARAMS@) {
  SW_LOCAL SW_T sq[SW_C * SW_KTP];
  SW_LOCAL SW_T sqf[SW_C * SW_KTP];
  SW_LOCAL SW_T sk[SW_C * SW_KTP];
  SW_LOCAL SW_T skf[SW_DECAY == 2 ? SW_C * SW_KTP : SW_DECAY == 1 ? 2 * (SW_C + 1) : 1];
  SW_LOCAL int splain;
  SW_LOCAL SW_ACC sg[SW_GLEN];
  SW_LOCAL int sn[SW_GLEN];
  SW_LOCAL SW_T sa[SW_C * SW_C];
  const int lid = SW_LID, c = lid % SW_CT3, ig = lid / SW_CT3;
  const sw_index grp = SW_GROUP, h = grp % H, sl = grp / H;
  SW_SLOT(sl);
  SW_T a[SW_NA];
#pragma unroll
  for (int m = 0; m < SW_NA; ++m) a[m] = (SW_T)0;
  /* the scores, once for every tile of value columns */
  for (int k0 = 0; k0 < SW_K; k0 += SW_KT) {
    SW_BARRIER();
    SW_STAGE_TILE(k0, 1);
#if SW_DECAY
    if (lid == 0 && (SW_DECAY == 2 || k0 == 0)) splain = 1;
#endif
    SW_BARRIER();
    SW_SCALE_Q();
#if SW_DECAY
    /* a plain tile of keys, or a plain chunk of a decay per head (no reset, no growth, no NaN and a total decay
     * within SW_PLAIN_RANGE): e^{Gq} and e^{-Gk} are normal numbers, and a score is a sum of (q o e^{Gq}) (k o
     * e^{-Gk}) (per key), or q . k times e^{Gq_i} e^{-Gk_j} (per head), without an exponential per score */
    if (SW_DECAY == 2 || k0 == 0)
      for (int x = lid; x < n * SW_KDT; x += SW_WG3) {
        const int r = (x / SW_KDT + 1) * SW_KDTP + x % SW_KDT;
        if (sn[r] != 0 || !(sg[r] <= sg[r - SW_KDTP]) || sg[r] < -SW_PLAIN_RANGE) splain = 0;
      }
    SW_BARRIER();
    if (splain && SW_DECAY == 2)
      for (int x = lid; x < SW_C * SW_KT; x += SW_WG3) {
        const int at = x / SW_KT * SW_KTP + x % SW_KT;
        skf[at] = SW_SCALE(sk[at], -sg[SW_KROW(x / SW_KT) * SW_KDTP + x % SW_KT]);
      }
    if (splain && SW_DECAY == 1 && k0 == 0)
      for (int x = lid; x <= SW_C; x += SW_WG3) {
        skf[x] = (SW_T)exp(sg[x]);
        skf[SW_C + 1 + x] = (SW_T)exp(-sg[x]);
      }
#endif
    SW_BARRIER();
#pragma unroll
    for (int m = 0; m < SW_NA; ++m) {
      const int x = lid + SW_WG3 * m, pi = x / SW_C, pj = x % SW_C;
      if (x < SW_C * SW_C && pi < n && pj <= pi) {
        if (SW_BONUS && pj == pi) {
          for (int kk = 0; kk < SW_KT && k0 + kk < SW_K; ++kk)
            a[m] += sq[pi * SW_KTP + kk] * u[h * SW_K + k0 + kk] * sk[pj * SW_KTP + kk];
        } else if (SW_DECAY == 2 && splain) {
          for (int kk = 0; kk < SW_KT; ++kk) a[m] += sqf[pi * SW_KTP + kk] * skf[pj * SW_KTP + kk];
        } else if (SW_DECAY == 2) {
#pragma unroll 1
          for (int kk = 0; kk < SW_KT; ++kk) {
            const int rq = SW_QROW(pi) * SW_KTP + kk, rk = SW_KROW(pj) * SW_KTP + kk;
            if (sn[rq] == sn[rk]) a[m] += SW_SCALE(sq[pi * SW_KTP + kk] * sk[pj * SW_KTP + kk], sg[rq] - sg[rk]);
          }
        } else {
          for (int kk = 0; kk < SW_KT; ++kk) a[m] += sq[pi * SW_KTP + kk] * sk[pj * SW_KTP + kk];
        }
      }
    }
  }
  /* a decay per head: each score's factor; then the scores into local memory, 0 above the diagonal */
#pragma unroll
  for (int m = 0; m < SW_NA; ++m) {
    const int x = lid + SW_WG3 * m, pi = x / SW_C, pj = x % SW_C;
    if (SW_DECAY == 1 && x < SW_C * SW_C && pi < n && pj <= pi && !(SW_BONUS && pj == pi))
      a[m] = splain ? a[m] * skf[SW_QROW(pi)] * skf[SW_C + 1 + SW_KROW(pj)]
           : sn[SW_QROW(pi)] == sn[SW_KROW(pj)] ? SW_SCALE(a[m], sg[SW_QROW(pi)] - sg[SW_KROW(pj)]) : (SW_T)0;
  }
#pragma unroll
  for (int m = 0; m < SW_NA; ++m) {
    const int x = lid + SW_WG3 * m;
    if (x < SW_C * SW_C) sa[x] = (x / SW_C < n && x % SW_C <= x / SW_C) ? a[m] : (SW_T)0;
  }
  SW_BARRIER();
  /* the outputs, a tile of CT3 value columns at a time: the start state's part over the key tiles (walked in
   * alternate directions, so that the tile staged last is not staged again), then the scores' */
  int staged = (SW_K - 1) / SW_KT * SW_KT;
  for (int vt = 0; vt < SW_NVT3; ++vt) {
    const sw_index j = vt * SW_CT3 + c;
    const int live = j < SW_V;
    SW_T out[SW_NO];
#pragma unroll
    for (int m = 0; m < SW_NO; ++m) out[m] = (SW_T)0;
    for (int t0 = 0; t0 < SW_K; t0 += SW_KT) {
      const int k0 = vt % 2 == 0 ? (SW_K - 1) / SW_KT * SW_KT - t0 : t0;
      if (k0 != staged) {
        SW_BARRIER();
        SW_STAGE_TILE(k0, 0);
        SW_BARRIER();
        SW_SCALE_Q();
        SW_BARRIER();
        staged = k0;
      }
      /* a zero state element adds 0, whatever its factor */
      if (live)
        for (int kk = 0; kk < SW_KT && k0 + kk < SW_K; ++kk) {
          const SW_T s = ws[SW_EIDX(sl, k0 + kk, j)];
          if (s == (SW_T)0) continue;
#pragma unroll
          for (int m = 0; m < SW_NO; ++m)
            if (ig + SW_NG3 * m < SW_C) out[m] += sqf[(ig + SW_NG3 * m) * SW_KTP + kk] * s;
        }
    }
    if (live) {
#pragma unroll
      for (int m = 0; m < SW_NO; ++m) {
        const int pi = ig + SW_NG3 * m;
        if (pi < n) {
          SW_T acc = out[m];
          for (int pj = 0; pj <= pi; ++pj) acc += sa[pi * SW_C + pj] * v[SW_VO(SW_STEP(cs + pj)) + j];
          o[SW_VO(SW_STEP(cs + pi)) + j] = acc;
        }
      }
    }
  }
}
"""

#: The chunked forward's kernels.
CHUNKED = STATES + OUTPUT
