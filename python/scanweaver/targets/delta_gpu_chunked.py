"""The chunked (WY / UT transform) forward of the fused ``delta_rule`` on the GPU (OpenCL, CUDA), both forms.

Selected by the tunable ``algorithm="chunked"`` (``chunk`` steps per chunk, at
most :data:`MAX_CHUNK`); :mod:`.fused_gpu_delta_rule` renders it after its own
prelude.  For DeltaNet, Gated DeltaNet, KDA and RWKV-7 (gate ``none``, ``scalar``,
``key``; ``l2norm``, q/k heads shared by value heads, packed sequences).  With
G the cumulative log decay of a chunk (per key for KDA), S_0 the state at the
chunk's start and u_t the recurrence's new values ``beta_t (v_t - S'_t^T k_t)``::

    N = strict-lower((K o e^{G}) (K o e^{-G})^T)          T = (I + diag(beta) N)^{-1} diag(beta)
    U = T (V - (K o e^{G}) S_0)                            A = lower((Q o e^{G}) (K o e^{-G})^T)
    O = (Q o e^{G}) S_0 + A U                              S_end = e^{G_last} o S_0 + (K o e^{G_last - G})^T U

(the C kernels' form, :mod:`.delta_c_chunked`).  The ``dplr`` form (RWKV-7: S_t = D_t S_{t-1} + b_t w_t^T +
k_t v_t^T with the projections w_t = S_{t-1}^T a_t) solves for W the same way, the rows of a scaled by the decay
before their step (``A' = a o e^{G_prev}``) and B' = b o e^{-G}, K' = k o e^{-G}::

    L_ab = strict-lower(A' B'^T), L_ak = strict-lower(A' K'^T)      W = (I - L_ab)^{-1} (A' S_0 + L_ak V)
    O = (Q o e^{G}) S_0 + lower((Q o e^{G}) B'^T) W + lower((Q o e^{G}) K'^T) V
    S_end = e^{G_last} o S_0 + (b o e^{G_last - G})^T W + (K o e^{G_last - G})^T V

(the C kernels' forms, :mod:`.delta_c_chunked`).  Two kernels:

1. ``sw_delta_chunk_prep``: per (chunk, value head), parallel over chunks:
   the chunk's cumulative log decays (in ``SW_ACC``, double where the
   device has it), N and A over tiles of ``KT`` keys in local memory, T by
   forward substitution, and the scaled rows ``K o e^{G}``, ``Q o e^{G}``,
   ``K o e^{G_last - G}`` and ``e^{G_last}``, all into the scratch;
2. ``sw_delta_chunk_state``: per (sequence, value head, tile of ``CT`` value
   columns; columns are independent), the chunks in order with the state's
   tile in local memory: W = V - (K o e^{G}) S_0, U = T W, the outputs, the
   next state.

Exactness: the product form is used only on a *plain* chunk, where every log
decay is <= 0 (no growth, no NaN) and the chunk's total decay is within
``SW_PLAIN_RANGE`` (60 in float32, 600 in float64: e^{+-G} are normal numbers,
the rule of the matrix-state GPU kernels' plain tiles); any other chunk (a
growth, a reset of -inf, a NaN or a steep decay) runs the recurrence itself
on the tile's columns, step by step, as :mod:`.fused_gpu_delta_rule`'s
forward does.  The triangular products never read past the diagonal, so a
non-finite value in one step reaches only that step and later ones, as in the
recurrence.

Scratch per (chunk slot, value head): T and A (C x C each), the three scaled
key/query planes (C x K each), ``e^{G_last}`` (K, or 1) and the plain flag;
slots as :func:`~.matrix_gpu_chunked.slots`.

Example:
    >>> from scanweaver.fused.delta_rule import DeltaRuleFeatures
    >>> from scanweaver.targets.delta_gpu_chunked import layout
    >>> layout(DeltaRuleFeatures("float32", 128, 128, gate="scalar"), {"chunk": 64})
    DeltaChunkLayout(kt=16, ct=32)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fused.delta_rule import DeltaRuleFeatures
from ..fused.matrix_state import GPU_MAX_CHUNK as MAX_CHUNK
from .launch_limits import ITEMSIZE, SM90

__all__ = ["CHUNKED", "FORWARD_HOOKS", "MAX_CHUNK", "PREP_ITEMS", "STATE_ITEMS", "DeltaChunkLayout", "chunk_slots",
           "defines", "layout", "local_bytes", "plan_launches", "region", "scratch"]

#: Work-items of the prep kernel's workgroup (its scores: C x C / this per work-item, 16 at C = 64).
PREP_ITEMS = 256
#: Work-items of the state kernel's workgroup (``CT`` columns by ``STATE_ITEMS / CT`` row groups).
STATE_ITEMS = 256
#: Bytes of the decay-sum type (double).
ACC_BYTES = 8


@dataclass(frozen=True)
class DeltaChunkLayout:
    """Keys per tile of the prep kernel (``kt``) and value columns per workgroup of the state kernel (``ct``)."""

    kt: int
    ct: int


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _prep_bytes(f: DeltaRuleFeatures, C: int, kt: int) -> int:
    item, ktp = ITEMSIZE[f.state_dtype], kt + 1 - kt % 2
    decays = C * (kt if f.gate == "key" else 1) * ACC_BYTES
    tiles = 4 if f.form == "dplr" else 3
    return tiles * C * ktp * item + decays + 3 * C * item + C * (C + 1) * item + 8


def _state_bytes(f: DeltaRuleFeatures, C: int, ct: int) -> int:
    return (f.K * ct + (3 if f.form == "dplr" else 2) * C * ct) * ITEMSIZE[f.state_dtype]


def layout(f: DeltaRuleFeatures, config: dict) -> DeltaChunkLayout:
    """The widest key tile (16 down to 2) and column tile (32 down to 1) whose local memory fits a workgroup's.

    The key tile is at least 2 (at K = 1 its second row is 0): with a tile of 1 and chunks past 16 steps, PoCL (3.1,
    LLVM 15) built a prep kernel whose T and A were wrong (o off by O(1), or NaN); the text reads right, and a tile
    of 2 is exact."""
    C = int(config["chunk"])
    kt = min(16, max(2, _pow2_at_least(f.K)))
    while kt > 2 and _prep_bytes(f, C, kt) > SM90.shared_per_block:
        kt //= 2
    ct = min(32, _pow2_at_least(f.V))
    while ct > 1 and _state_bytes(f, C, ct) > SM90.shared_per_block:
        ct //= 2
    return DeltaChunkLayout(kt, ct)


def local_bytes(f: DeltaRuleFeatures, config: dict) -> int:
    """Static local memory of the larger of the two kernels (bytes)."""
    lay, C = layout(f, config), int(config["chunk"])
    return max(_prep_bytes(f, C, lay.kt), _state_bytes(f, C, lay.ct))


def region(f: DeltaRuleFeatures, C: int) -> int:
    """Scratch elements per (chunk slot, value head)."""
    dplr = f.form == "dplr"
    return (4 if dplr else 2) * C * C + (4 if dplr else 3) * C * f.K + (f.K if f.gate == "key" else 1) + 1


def chunk_slots(f: DeltaRuleFeatures, sizes: dict, C: int) -> int:
    if f.has_seqlens:
        return sizes["T"] // C + sizes["nseq"]
    return sizes["batch"] * -(-sizes["T"] // C)


def scratch(f: DeltaRuleFeatures, config: dict, sizes: dict) -> int:
    """Elements of the scratch ``ws``."""
    C = int(config["chunk"])
    return max(1, chunk_slots(f, sizes, C) * sizes["H"] * region(f, C))


def plan_launches(f: DeltaRuleFeatures, config: dict, sizes: dict) -> list[tuple[str, int, int]]:
    """``[(kernel, workgroups, work-items)]``: prep over chunk slots x value heads, state over sequences x value
    heads x column tiles."""
    C, H, lay = int(config["chunk"]), sizes["H"], layout(f, config)
    return [("sw_delta_chunk_prep", chunk_slots(f, sizes, C) * H, PREP_ITEMS),
            ("sw_delta_chunk_state", sizes["nseq"] * H * -(-f.V // lay.ct), STATE_ITEMS)]


def defines(f: DeltaRuleFeatures, config: dict) -> str:
    """``#define`` lines of the chunked kernels' sizes."""
    lay = layout(f, config)
    return "\n".join([f"#define SW_CHUNK {int(config['chunk'])}", f"#define SW_KT {lay.kt}",
                      f"#define SW_CT {lay.ct}", f"#define SW_WGP {PREP_ITEMS}", f"#define SW_WGS {STATE_ITEMS}",
                      f"#define SW_DOUBLE {int(f.state_dtype == 'float64')}"])


#: The forward's settings of the kernels' hooks (the backward's: :mod:`.delta_gpu_chunked_backward`): the scratch
#: from its start, the outputs written, nothing kept at a chunk's start.
FORWARD_HOOKS = r"""
#define SW_CK0 0
#define SW_CK_OUT 1
#define SW_PREP_UNUSED (void)a, (void)b, (void)h0, (void)o, (void)hlast, (void)v
#define SW_CHUNK_START(sl) ((void)0)
"""

#: The two kernels (after :mod:`.fused_gpu_delta_rule`'s prelude: SW_SEGMENT, SW_QK, SW_HK, SW_VO, SW_BT), with the
#: hooks SW_CK0 (where their scratch starts in ``ws``), SW_CK_OUT (write o and hlast), SW_PREP_UNUSED and
#: SW_CHUNK_START(sl) (the state kernel at a chunk's start, the state's tile in ``ss``).
CHUNKED = r"""
#if SW_DOUBLE || !defined(__OPENCL_VERSION__) || defined(cl_khr_fp64)
#if defined(__OPENCL_VERSION__) && !SW_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define SW_ACC double
#else
#define SW_ACC float
#endif
#if SW_DOUBLE
#define SW_PLAIN_RANGE 600.0
#else
#define SW_PLAIN_RANGE 60.0
#endif
#define SW_C SW_CHUNK
#define SW_NCH ((T + SW_C - 1) / SW_C)
/* the first chunk slot of sequence s */
#define SW_BASE(s) (SW_HAS_SEQLENS ? cu_seqlens[s] / SW_C + (s) : (s) * SW_NCH)
#define SW_KD (SW_GATE == 2 ? SW_K : 1)
/* scratch of one (slot, head): T, A, K o e^{G}, Q o e^{G}, K o e^{G_last - G}, e^{G_last}, the plain flag; the dplr
 * form: T, A (q k), L (a k, strict), B (q b), a o e^{G_prev} in K o e^{G}'s place, Q o e^{G}, K o e^{G_last - G},
 * b o e^{G_last - G}, e^{G_last}, the flag */
#define SW_NMAT (SW_DPLR ? 4 : 2)
#define SW_NPL (SW_DPLR ? 4 : 3)
#define SW_REGION (SW_NMAT * SW_C * SW_C + SW_NPL * SW_C * SW_K + SW_KD + 1)
#define SW_OT 0
#define SW_OA (SW_C * SW_C)
#define SW_OL (2 * SW_C * SW_C)
#define SW_OB (3 * SW_C * SW_C)
#define SW_OKG (SW_NMAT * SW_C * SW_C)
#define SW_OQG (SW_OKG + SW_C * SW_K)
#define SW_OKR (SW_OQG + SW_C * SW_K)
#define SW_OBR (SW_OKR + SW_C * SW_K)
#define SW_OEL (SW_OKR + (SW_NPL - 2) * SW_C * SW_K)
#define SW_OFL (SW_OEL + SW_KD)
/* staged key tiles: rows at an odd stride (a warp reading one column of consecutive rows hits distinct banks) */
#define SW_KTP (SW_KT + 1 - SW_KT % 2)
#define SW_GT (SW_GATE == 2 ? SW_KT : 1)
#define SW_NA ((SW_C * SW_C + SW_WGP - 1) / SW_WGP)
#define SW_NR (SW_WGS / SW_CT)
#define SW_NVT2 ((SW_V + SW_CT - 1) / SW_CT)
/* a work-item of a state kernel: column j (c of value tile vt) and row group r of (sequence seq, value head h);
 * element (i, j) of its state at st + i * SW_V */
#define SW_TILE_ITEM() \
  const int lid = SW_LID, c = lid % SW_CT, r = lid / SW_CT; \
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT2, h = grp / SW_NVT2 % H, seq = grp / SW_NVT2 / H; \
  const sw_index j = vt * SW_CT + c; \
  const int live = j < SW_V; \
  SW_SEGMENT(seq); \
  const sw_index st = (seq * H + h) * SW_K * SW_V + j
/* 1 / |q_t| and 1 / |k_t| (fla's epsilon) with the L2 norm, else 1 */
#define SW_CK_NORMS(t, nq, nk) \
  SW_T nq = (SW_T)1, nk = (SW_T)1; \
  if (SW_L2) { \
    SW_T q2_ = (SW_T)0, k2_ = (SW_T)0; \
    for (int d_ = 0; d_ < SW_K; ++d_) { \
      q2_ += q[SW_QK(t) + d_] * q[SW_QK(t) + d_]; \
      k2_ += k[SW_QK(t) + d_] * k[SW_QK(t) + d_]; \
    } \
    nq = (SW_T)1 / @SQRT@(q2_ + (SW_T)1e-6); \
    nk = (SW_T)1 / @SQRT@(k2_ + (SW_T)1e-6); \
  }

SW_KERNEL_P void sw_delta_chunk_prep(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T sk[SW_C * SW_KTP];
  SW_LOCAL SW_T skg[SW_C * SW_KTP];
  SW_LOCAL SW_T sqg[SW_C * SW_KTP];
#if SW_DPLR
  SW_LOCAL SW_T sbt[SW_C * SW_KTP];
#endif
#if SW_GATE
  SW_LOCAL SW_ACC sg[SW_C * SW_GT];
#endif
  SW_LOCAL SW_T snq[SW_C];
  SW_LOCAL SW_T snk[SW_C];
  SW_LOCAL SW_T sb[SW_C];
  SW_LOCAL SW_T sx[SW_C * (SW_C + 1)];
  SW_LOCAL int splain;
  const int lid = SW_LID;
  const sw_index grp = SW_GROUP, h = grp % H, sl = grp / H;
  /* the slot's sequence (by bisection on the packed offsets), its chunk's first step cs and length n */
  sw_index seq = 0;
  if (SW_HAS_SEQLENS) {
    sw_index lo_ = 0, hi_ = nseq - 1;
    while (lo_ < hi_) {
      const sw_index mid_ = (lo_ + hi_ + 1) / 2;
      if (SW_BASE(mid_) <= sl) lo_ = mid_; else hi_ = mid_ - 1;
    }
    seq = lo_;
  } else {
    seq = sl / SW_NCH;
  }
  SW_SEGMENT(seq);
  const sw_index cs = (sl - SW_BASE(seq)) * SW_C;
  const int n = cs < len ? (int)(len - cs < SW_C ? len - cs : SW_C) : 0;
  const sw_index wb = SW_CK0 + (sl * H + h) * SW_REGION;
  SW_PREP_UNUSED;
  if (n == 0) return;  /* an idle slot: the whole workgroup */
  if (lid == 0) splain = 1;
  for (int p = lid; p < SW_C; p += SW_WGP) {
    SW_T nq = (SW_T)1, nk = (SW_T)1, bt = (SW_T)0;
    if (p < n) {
      const sw_index t = start + cs + p;
#if SW_DPLR
      bt = (SW_T)-1;  /* the solve's I + diag(-1) L = I - L */
#else
      bt = beta[SW_BT(t)];
#endif
      if (SW_L2) {
        SW_T q2 = (SW_T)0, k2 = (SW_T)0;
        for (int i = 0; i < SW_K; ++i) {
          const SW_T x = q[SW_QK(t) + i], y = k[SW_QK(t) + i];
          q2 += x * x;
          k2 += y * y;
        }
        nq = (SW_T)1 / @SQRT@(q2 + (SW_T)1e-6);
        nk = (SW_T)1 / @SQRT@(k2 + (SW_T)1e-6);
      }
    }
    snq[p] = nq;
    snk[p] = nk;
    sb[p] = bt;
  }
  SW_BARRIER();
#if SW_GATE == 1
  if (lid == 0) {
    SW_ACC G = 0;
    int ok = 1;
    for (int p = 0; p < n; ++p) {
      const SW_ACC x = (SW_ACC)g[SW_BT(start + cs + p)];
      ok = ok && x <= 0;
      G += x;
      sg[p] = G;
    }
    if (!ok || !(G >= -SW_PLAIN_RANGE)) splain = 0;
  }
#endif
  SW_T nacc[SW_NA], aacc[SW_NA];
#if SW_DPLR
  SW_T lacc[SW_NA], bacc[SW_NA];
#endif
#pragma unroll
  for (int m = 0; m < SW_NA; ++m) {
    nacc[m] = (SW_T)0;
    aacc[m] = (SW_T)0;
#if SW_DPLR
    lacc[m] = (SW_T)0;
    bacc[m] = (SW_T)0;
#endif
  }
  for (int k0 = 0; k0 < SW_K; k0 += SW_KT) {
#if SW_GATE == 2
    for (int d = lid; d < SW_KT; d += SW_WGP) {
      SW_ACC G = 0;
      int ok = 1;
      for (int p = 0; p < n; ++p) {
        const SW_ACC x = k0 + d < SW_K ? (SW_ACC)g[SW_HK(start + cs + p) + k0 + d] : (SW_ACC)0;
        ok = ok && x <= 0;
        G += x;
        sg[p * SW_KT + d] = G;
      }
      if (!ok || !(G >= -SW_PLAIN_RANGE)) splain = 0;
    }
#endif
    for (int x = lid; x < SW_C * SW_KT; x += SW_WGP) {
      const int p = x / SW_KT, i = k0 + x % SW_KT, ok = p < n && i < SW_K, at = p * SW_KTP + x % SW_KT;
      const sw_index t = start + cs + (ok ? p : 0);
      sk[at] = ok ? k[SW_QK(t) + i] * snk[p] : (SW_T)0;
      sqg[at] = ok ? q[SW_QK(t) + i] * snq[p] : (SW_T)0;
#if SW_DPLR
      skg[at] = ok ? a[SW_HK(t) + i] : (SW_T)0;
      sbt[at] = ok ? b[SW_HK(t) + i] : (SW_T)0;
#endif
    }
    SW_BARRIER();
    /* k o e^{-G}, k o e^{G}, q o e^{G} in local memory; k o e^{G}, q o e^{G}, k o e^{G_last - G}, e^{G_last} into the
     * scratch (factors formed in SW_ACC; past the plain range they are not used) */
    for (int x = lid; x < SW_C * SW_KT; x += SW_WGP) {
      const int p = x / SW_KT, d = x % SW_KT, i = k0 + d, at = p * SW_KTP + d;
      const SW_T kv = sk[at], qv = sqg[at];
#if SW_DPLR
      const SW_T av = skg[at], bv = sbt[at];  /* a and b, staged with k and q */
#endif
      if (p < n && i < SW_K) {
#if SW_GATE
        const int gd = SW_GATE == 2 ? d : 0;
        const SW_ACC G = sg[p * SW_GT + gd], GL = sg[(n - 1) * SW_GT + gd];
#if SW_GATE == 2
        if (p == 0) ws[wb + SW_OEL + i] = (SW_T)exp(GL);
#else
        if (p == 0 && i == 0) ws[wb + SW_OEL] = (SW_T)exp(GL);
#endif
#else
        const SW_ACC G = 0, GL = 0;
#endif
#if SW_DPLR
        /* the dplr form: a o e^{G_prev} in k o e^{G}'s place (the projection reads the state before its step's
         * decay); b o e^{-G} in local memory, b o e^{G_last - G} into the scratch */
#if SW_GATE
        const SW_ACC GP = p > 0 ? sg[(p - 1) * SW_GT + gd] : (SW_ACC)0;
#else
        const SW_ACC GP = 0;
#endif
        const SW_T kg = (SW_T)((SW_ACC)av * exp(GP));
        sbt[at] = (SW_T)((SW_ACC)bv * exp(-G));
        ws[wb + SW_OBR + p * SW_K + i] = (SW_T)((SW_ACC)bv * exp(GL - G));
#else
        const SW_T kg = (SW_T)((SW_ACC)kv * exp(G));
#endif
        const SW_T qg = (SW_T)((SW_ACC)qv * exp(G));
        sk[at] = (SW_T)((SW_ACC)kv * exp(-G));
        ws[wb + SW_OKR + p * SW_K + i] = (SW_T)((SW_ACC)kv * exp(GL - G));
        skg[at] = kg;
        sqg[at] = qg;
        ws[wb + SW_OKG + p * SW_K + i] = kg;
        ws[wb + SW_OQG + p * SW_K + i] = qg;
      } else {
        skg[at] = (SW_T)0;
#if SW_DPLR
        sbt[at] = (SW_T)0;
#endif
      }
    }
    SW_BARRIER();
    /* this tile's part of N (j < i) and A (j <= i): only entries inside the triangle are formed */
#pragma unroll
    for (int m = 0; m < SW_NA; ++m) {
      const int x = lid + SW_WGP * m, pi = x / SW_C, pj = x % SW_C;
      if (x < SW_C * SW_C && pi < n && pj <= pi) {
        SW_T sn_ = (SW_T)0, sa_ = (SW_T)0;
#if SW_DPLR
        SW_T sl_ = (SW_T)0, sq_ = (SW_T)0;
        for (int kk = 0; kk < SW_KT; ++kk) {
          const SW_T kj = sk[pj * SW_KTP + kk], bj = sbt[pj * SW_KTP + kk];
          const SW_T ai = skg[pi * SW_KTP + kk], qi = sqg[pi * SW_KTP + kk];
          sn_ += ai * bj;
          sl_ += ai * kj;
          sa_ += qi * kj;
          sq_ += qi * bj;
        }
        if (pj < pi) lacc[m] += sl_;
        bacc[m] += sq_;
#else
        for (int kk = 0; kk < SW_KT; ++kk) {
          const SW_T kj = sk[pj * SW_KTP + kk];
          sn_ += skg[pi * SW_KTP + kk] * kj;
          sa_ += sqg[pi * SW_KTP + kk] * kj;
        }
#endif
        if (pj < pi) nacc[m] += sn_;
        aacc[m] += sa_;
      }
    }
    SW_BARRIER();
  }
  /* diag(beta) N (strictly lower) into sx, A into the scratch */
#pragma unroll
  for (int m = 0; m < SW_NA; ++m) {
    const int x = lid + SW_WGP * m, pi = x / SW_C, pj = x % SW_C;
    if (x < SW_C * SW_C) {
      sx[pi * (SW_C + 1) + pj] = pi < n && pj < pi ? sb[pi] * nacc[m] : (SW_T)0;
      ws[wb + SW_OA + x] = pi < n && pj <= pi ? aacc[m] : (SW_T)0;
#if SW_DPLR
      ws[wb + SW_OL + x] = pi < n && pj < pi ? lacc[m] : (SW_T)0;
      ws[wb + SW_OB + x] = pi < n && pj <= pi ? bacc[m] : (SW_T)0;
#endif
    }
  }
  SW_BARRIER();
  /* X = (I + diag(beta) N)^{-1} row by row in place (X_ii = 1 implied): X_ic = -sum_{c <= j < i} L_ij X_jc */
  for (int i = 1; i < n; ++i) {
    SW_T xv = (SW_T)0;
    if (lid < i) {
      xv = -sx[i * (SW_C + 1) + lid];
      for (int jj = lid + 1; jj < i; ++jj) xv -= sx[i * (SW_C + 1) + jj] * sx[jj * (SW_C + 1) + lid];
    }
    SW_BARRIER();
    if (lid < i) sx[i * (SW_C + 1) + lid] = xv;
    SW_BARRIER();
  }
  /* T = X diag(beta) (the dplr form: T = X = (I - L_ab)^{-1}) */
  for (int x = lid; x < SW_C * SW_C; x += SW_WGP) {
    const int pi = x / SW_C, pj = x % SW_C;
#if SW_DPLR
    ws[wb + SW_OT + x] = pi < n && pj <= pi ? (pj == pi ? (SW_T)1 : sx[pi * (SW_C + 1) + pj]) : (SW_T)0;
#else
    ws[wb + SW_OT + x] = pi < n && pj <= pi ? (pj == pi ? sb[pi] : sx[pi * (SW_C + 1) + pj] * sb[pj]) : (SW_T)0;
#endif
  }
  if (lid == 0) ws[wb + SW_OFL] = splain ? (SW_T)1 : (SW_T)0;
}

SW_KERNEL_S void sw_delta_chunk_state(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T ss[SW_K * SW_CT];
  SW_LOCAL SW_T sw[SW_C * SW_CT];
  SW_LOCAL SW_T su[SW_C * SW_CT];
#if SW_DPLR
  SW_LOCAL SW_T sv[SW_C * SW_CT];
#endif
  SW_TILE_ITEM();
  (void)a, (void)b;
  for (int i = r; i < SW_K; i += SW_NR) ss[i * SW_CT + c] = (SW_HAS_H0 && live) ? h0[st + i * SW_V] : (SW_T)0;
  sw_index sl = SW_BASE(seq);
  for (sw_index c0 = 0; c0 < len; c0 += SW_C, ++sl) {
    const int n = (int)(len - c0 < SW_C ? len - c0 : SW_C);
    const sw_index wb = SW_CK0 + (sl * H + h) * SW_REGION;
    const int plain = ws[wb + SW_OFL] != (SW_T)0;
    SW_BARRIER();
    SW_CHUNK_START(sl);
    if (plain) {
      /* delta: W = V - (K o e^{G}) S_0, U = T W, O = (Q o e^{G}) S_0 + A U, S_end = e^{G_last} o S_0 +
       * (K o e^{G_last - G})^T U; dplr: X = (a o e^{G_prev}) S_0 + L V, the projections U = T X, O = (Q o e^{G}) S_0
       * + B U + A V, S_end = e^{G_last} o S_0 + (b o e^{G_last - G})^T U + (K o e^{G_last - G})^T V */
#if SW_DPLR
      for (int i = r; i < n; i += SW_NR) sv[i * SW_CT + c] = live ? v[SW_VO(start + c0 + i) + j] : (SW_T)0;
      SW_BARRIER();
#endif
      for (int i = r; i < n; i += SW_NR) {
        SW_T acc = (SW_T)0;
#pragma unroll 8
        for (int d = 0; d < SW_K; ++d) acc += ws[wb + SW_OKG + i * SW_K + d] * ss[d * SW_CT + c];
#if SW_DPLR
        for (int jj = 0; jj < i; ++jj) acc += ws[wb + SW_OL + i * SW_C + jj] * sv[jj * SW_CT + c];
        sw[i * SW_CT + c] = acc;
#else
        sw[i * SW_CT + c] = (live ? v[SW_VO(start + c0 + i) + j] : (SW_T)0) - acc;
#endif
      }
      SW_BARRIER();
      for (int i = r; i < n; i += SW_NR) {
        SW_T acc = (SW_T)0;
        for (int jj = 0; jj <= i; ++jj) acc += ws[wb + SW_OT + i * SW_C + jj] * sw[jj * SW_CT + c];
        su[i * SW_CT + c] = acc;
      }
      SW_BARRIER();
#if SW_CK_OUT
      for (int i = r; i < n; i += SW_NR) {
        SW_T acc = (SW_T)0;
#pragma unroll 8
        for (int d = 0; d < SW_K; ++d) acc += ws[wb + SW_OQG + i * SW_K + d] * ss[d * SW_CT + c];
#if SW_DPLR
        for (int jj = 0; jj <= i; ++jj)
          acc += ws[wb + SW_OB + i * SW_C + jj] * su[jj * SW_CT + c] +
                 ws[wb + SW_OA + i * SW_C + jj] * sv[jj * SW_CT + c];
#else
        for (int jj = 0; jj <= i; ++jj) acc += ws[wb + SW_OA + i * SW_C + jj] * su[jj * SW_CT + c];
#endif
        if (live) o[SW_VO(start + c0 + i) + j] = acc;
      }
      SW_BARRIER();
#endif
      for (int d = r; d < SW_K; d += SW_NR) {
        SW_T acc = (SW_GATE ? ws[wb + SW_OEL + (SW_GATE == 2 ? d : 0)] : (SW_T)1) * ss[d * SW_CT + c];
#if SW_DPLR
        for (int jj = 0; jj < n; ++jj)
          acc += ws[wb + SW_OBR + jj * SW_K + d] * su[jj * SW_CT + c] +
                 ws[wb + SW_OKR + jj * SW_K + d] * sv[jj * SW_CT + c];
#else
        for (int jj = 0; jj < n; ++jj) acc += ws[wb + SW_OKR + jj * SW_K + d] * su[jj * SW_CT + c];
#endif
        ss[d * SW_CT + c] = acc;
      }
    } else if (r == 0) {
      /* the recurrence itself on the tile's columns (a chunk with growth, a reset, a NaN or a decay past the plain
       * range) */
      for (int p = 0; p < n; ++p) {
        const sw_index t = start + c0 + p;
        SW_CK_NORMS(t, nq, nk);
#if SW_DPLR
        /* S = D S + b (a^T S) + k v^T, o = S^T q */
        SW_T w = (SW_T)0, acc = (SW_T)0;
        for (int d = 0; d < SW_K; ++d) w += a[SW_HK(t) + d] * ss[d * SW_CT + c];
        const SW_T vj = live ? v[SW_VO(t) + j] : (SW_T)0;
        for (int d = 0; d < SW_K; ++d) {
          const SW_T dk = SW_GATE == 2 ? @EXP@(g[SW_HK(t) + d]) : SW_GATE == 1 ? @EXP@(g[SW_BT(t)]) : (SW_T)1;
          const SW_T s = dk * ss[d * SW_CT + c] + b[SW_HK(t) + d] * w + k[SW_QK(t) + d] * nk * vj;
          ss[d * SW_CT + c] = s;
          acc += q[SW_QK(t) + d] * nq * s;
        }
#else
        SW_T pr = (SW_T)0;
        for (int d = 0; d < SW_K; ++d) {
          const SW_T dk = SW_GATE == 2 ? @EXP@(g[SW_HK(t) + d]) : SW_GATE == 1 ? @EXP@(g[SW_BT(t)]) : (SW_T)1;
          const SW_T s = dk * ss[d * SW_CT + c];
          ss[d * SW_CT + c] = s;
          pr += k[SW_QK(t) + d] * nk * s;
        }
        const SW_T u = beta[SW_BT(t)] * ((live ? v[SW_VO(t) + j] : (SW_T)0) - pr);
        SW_T acc = (SW_T)0;
        for (int d = 0; d < SW_K; ++d) {
          const SW_T s = ss[d * SW_CT + c] + k[SW_QK(t) + d] * nk * u;
          ss[d * SW_CT + c] = s;
          acc += q[SW_QK(t) + d] * nq * s;
        }
#endif
#if SW_CK_OUT
        if (live) o[SW_VO(t) + j] = acc;
#else
        (void)acc;
#endif
      }
    }
  }
#if SW_CK_OUT
  SW_BARRIER();
  if (live)
    for (int i = r; i < SW_K; i += SW_NR) hlast[st + i * SW_V] = ss[i * SW_CT + c];
#endif
}
"""
