"""GPU text of the DeltaNet backward (gate none, form delta, q/k heads = value heads), for :mod:`.fused_gpu_delta_rule`.

Three kernels and ``2 * batch * T * H * V`` values of scratch ``ws`` (the plan's):
*deltas* (the forward's sweep) writes ``r_t = v_t - S_{t-1}^T k_t``; *values*
(one work-item per state column, in reverse) carries G's column j through
``G <- G + q_t do_t[j]``, ``du_t[j] = G . k_t``, ``G <- G - beta_t k_t
du_t[j]``, writing dv, du (to ``ws``) and dh0; *keys* (one workgroup per
(sequence, head), work-item i = row i) rebuilds row i of S from the stored
deltas (``S[i] += k_t[i] u_t``, forward for dq, then subtracted in reverse: no
checkpoints, a rounding error that grows linearly in T, never exponentially),
carries row i of G, and writes ``dq_t[i] = S_t[i] . do_t``, ``dk_t[i] = G'_t[i]
. u_t - beta_t S_{t-1}[i] . du_t`` and (work-item 0) ``dbeta_t = du_t . r_t``.
Every output element has one writer: no atomics.  The values and keys kernels
keep a column (K values) or two rows (2 V values) per work-item in registers.
"""

from __future__ import annotations

#: Macros of the column and row work-items of the backward (after the forward's prelude).
MACROS = r"""
/* the column work-item: its sequence, head and state column j (element (i, j) at st + i * SW_V) */
#define SW_COLUMN() \
  const int lid = SW_LID; \
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, seq = grp / SW_NVT / H, h = grp / SW_NVT % H; \
  const sw_index j = vt * SW_WG + lid; \
  const int live = j < SW_V; \
  SW_SEGMENT(seq); \
  const sw_index st = (seq * H + h) * SW_K * SW_V + j
/* q, k and beta of the n steps from s0 into local memory */
#define SW_STAGE(s0, n) do { \
  for (int e = lid; e < (n) * SW_K; e += SW_WG) { \
    const sw_index t_ = start + (s0) + e / SW_K; \
    sq[e] = q[SW_QK(t_) + e % SW_K]; \
    sk[e] = k[SW_QK(t_) + e % SW_K]; \
  } \
  for (int e = lid; e < (n); e += SW_WG) sb[e] = beta[SW_BT(start + (s0) + e)]; \
} while (0)
"""

BACKWARD = r"""
SW_KERNEL void sw_delta_rule_bwd_values(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T sq[SW_TT * SW_K];
  SW_LOCAL SW_T sk[SW_TT * SW_K];
  SW_LOCAL SW_T sb[SW_TT];
  SW_COLUMN();
  SW_GLOBAL SW_T* wdu = ws + batch * T * H * SW_V;
  SW_T G[SW_K];
#pragma unroll
  for (int i = 0; i < SW_K; ++i) G[i] = (SW_HAS_DHLAST && live) ? dhlast[st + i * SW_V] : (SW_T)0;
  for (sw_index c = (len + SW_TT - 1) / SW_TT - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE(s0, n);
    SW_BARRIER();
    if (!live) continue;
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = start + s0 + tt;
      const SW_T dj = do_[SW_VO(t) + j];
      SW_T du = (SW_T)0;
#pragma unroll
      for (int i = 0; i < SW_K; ++i) {
        G[i] += sq[tt * SW_K + i] * dj;
        du += G[i] * sk[tt * SW_K + i];
      }
#pragma unroll
      for (int i = 0; i < SW_K; ++i) G[i] -= sb[tt] * sk[tt * SW_K + i] * du;
      dv[SW_VO(t) + j] = sb[tt] * du;
      wdu[SW_VO(t) + j] = du;
    }
  }
  if (SW_HAS_H0 && live) {
#pragma unroll
    for (int i = 0; i < SW_K; ++i) dh0[st + i * SW_V] = G[i];
  }
}

SW_KERNEL_ROWS void sw_delta_rule_bwd_keys(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T su[SW_TT * SW_V];
  SW_LOCAL SW_T sdo[SW_TT * SW_V];
  SW_LOCAL SW_T sdu[SW_TT * SW_V];
  SW_LOCAL SW_T sr[SW_TT * SW_V];
  const int i = SW_LID;
  const sw_index grp = SW_GROUP, seq = grp / H, h = grp % H;
  SW_SEGMENT(seq);
  SW_GLOBAL const SW_T* wr = ws;
  SW_GLOBAL const SW_T* wdu = ws + batch * T * H * SW_V;
  const sw_index st = ((seq * H + h) * SW_K + i) * SW_V;
  SW_T S[SW_V], G[SW_V];
#pragma unroll
  for (int j = 0; j < SW_V; ++j) S[j] = SW_HAS_H0 ? h0[st + j] : (SW_T)0;
  /* 1. forward: S_t's row i from the deltas; dq */
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    for (int e = i; e < n * SW_V; e += SW_K) {
      const sw_index t = start + s0 + e / SW_V;
      su[e] = beta[SW_BT(t)] * wr[SW_VO(t) + e % SW_V];
      sdo[e] = do_[SW_VO(t) + e % SW_V];
    }
    SW_BARRIER();
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = start + s0 + tt;
      const SW_T ki = k[SW_QK(t) + i];
      SW_T acc = (SW_T)0;
#pragma unroll
      for (int j = 0; j < SW_V; ++j) {
        S[j] += ki * su[tt * SW_V + j];
        acc += S[j] * sdo[tt * SW_V + j];
      }
      dq[SW_QK(t) + i] = acc;
    }
  }
  /* 2. reverse: S_{t-1} = S_t - k_t u_t^T; G's row i; dk, dbeta */
#pragma unroll
  for (int j = 0; j < SW_V; ++j) G[j] = SW_HAS_DHLAST ? dhlast[st + j] : (SW_T)0;
  for (sw_index c = (len + SW_TT - 1) / SW_TT - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    for (int e = i; e < n * SW_V; e += SW_K) {
      const sw_index t = start + s0 + e / SW_V;
      sr[e] = wr[SW_VO(t) + e % SW_V];
      su[e] = beta[SW_BT(t)] * sr[e];
      sdo[e] = do_[SW_VO(t) + e % SW_V];
      sdu[e] = wdu[SW_VO(t) + e % SW_V];
    }
    SW_BARRIER();
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = start + s0 + tt;
      const SW_T qi = q[SW_QK(t) + i], ki = k[SW_QK(t) + i], bt = beta[SW_BT(t)];
      SW_T gu = (SW_T)0, sdu_ = (SW_T)0;
#pragma unroll
      for (int j = 0; j < SW_V; ++j) {
        const SW_T uj = su[tt * SW_V + j], duj = sdu[tt * SW_V + j];
        G[j] += qi * sdo[tt * SW_V + j];
        gu += G[j] * uj;
        S[j] -= ki * uj;
        sdu_ += S[j] * duj;
        G[j] -= bt * ki * duj;
      }
      dk[SW_QK(t) + i] = gu - bt * sdu_;
      if (i == 0) {
        SW_T db = (SW_T)0;
        for (int j = 0; j < SW_V; ++j) db += sdu[tt * SW_V + j] * sr[tt * SW_V + j];
        dbeta[SW_BT(t)] = db;
      }
    }
  }
}
"""
