"""GPU text of the delta-rule backward, both forms (every gate, ``l2norm``, q/k heads shared by value heads),
for :mod:`.fused_gpu_delta_rule`.

Four kernels (the recurrences of :mod:`scanweaver.fused.delta_rule`, with S'_t = D_t S_{t-1}, q and k the
normalised ones) and the plan's scratch ``ws``: r and du ``(batch, T, H, V)``, then per value head the
partial dq, dk (and, gate ``scalar``, the per-row dg; with a gate, the per-row terms c_t below)
``(batch, T, H, K)``.

*deltas* (the forward's sweep) writes ``r_t = v_t - S'^T_t k_t``.  *values* (the forward's workgroups:
column j of G = dL/dS, its K rows split over ``key_split`` work-items joined by a local sum) runs in reverse
``G += q_t do_t[j]``, ``du_t[j] = G . k_t``, ``G <- D_t (G - beta_t k_t du_t[j])``, writing dv, du and dh0.
*keys* (one workgroup per (sequence, value head), work-item = row i and one of ``key_split`` slices of the
columns, rows summed in local memory; fewer slices where K x key_split would pass
:data:`~.fused_gpu_delta_rule.ROW_ITEMS`) runs forward from h0, rebuilding S's row i with ``u = beta r`` and
writing ``dq_t[i] = S_t[i] . do_t`` and ``A_t[i] = S'_t[i] . du_t``, then in reverse carries G's row i (G_t
with q_t do_t^T added) for ``B_t[i] = G_t[i] . u_t``: ``dk_t[i] = B - beta A`` and

    dg_t[i] = rows(G'_t o S'_t)[i] = X_{t+1}[i] + q_t[i] dq_t[i] - k_t[i] B - beta_t k_t[i] A

since S_t = S'_t + k_t u_t^T and G'_t = G_t - beta_t k_t du_t^T, with ``X_{t+1}[i] = rows(D_{t+1} G'_{t+1} o
S_t)[i] = dg_{t+1}[i]`` (``dhlast[i] . S_last[i]`` at the end): no state is ever run backwards, so a decay of 0
(g = -inf, or an exponent that underflows) is exact, and its dg is 0 as written.  That sum from the end would
carry a non-finite term c_t = ``q_t[i] dq_t[i] - k_t[i] B - beta_t k_t[i] A`` of one step to every earlier step,
where rows(G'_t o S'_t) is finite: a row with a non-finite dg_t sums its terms again from the start,
``dg_t = dg_{t-1} - c_{t-1}`` from ``dg_0[i] = (D_0 G'_0)[i] . h0[i]``, for those steps alone.  *qk* (one work-item per
(step, q/k head)) sums the group's dq and dk, passes them back through the L2 normalisation (``dx = (dy - y
(y . dy)) / sqrt(|x|^2 + 1e-6)``) and writes dbeta (``du . r``) and the scalar gate's dg (the sum of the
rows).  Every output element has one writer: no atomics.  A work-item keeps K / key_split rows (values) or V /
(its slices) columns (keys) in registers.

The ``dplr`` form (RWKV-7, ``S_t = D_t S_{t-1} + b_t p_t^T + k_t v_t^T`` with ``p_t = S_{t-1}^T a_t``) runs the
same four kernels: *deltas* writes ``p_t``; *values* runs ``G += q_t do_t[j]``, ``dv_t[j] = G . k_t``, ``dp_t[j]
= G . b_t``, ``G <- D_t G + a_t dp_t[j]``, writing dp to du's plane; *keys* rebuilds S's row i with
``S_t[i] = d_i S_{t-1}[i] + b_t[i] p_t + k_t[i] v_t``, writing ``dq_t[i]`` and ``da_t[i] = S_{t-1}[i] . dp_t``,
then in reverse ``db_t[i] = G_t[i] . p_t``, ``dk_t[i] = G_t[i] . v_t`` and, with ``Z_t = rows(G'_t o S_t)``
(``Z_{T-1}`` = ``dhlast[i] . S_last[i]``), ``dg_t[i] = Z_t + q_t[i] dq_t[i] - b_t[i] db_t[i] - k_t[i] dk_t[i]``
and ``Z_{t-1} = dg_t[i] + a_t[i] da_t[i]``; from the start, ``dg_t = dg_{t-1} - c_{t-1} - a_t[i] da_t[i]``.
The rank-one term couples the rows, so a non-finite g, a or b of one key at step t leaves both sums non-finite
for the other keys at steps t - 1 to t + 1, where the definition's dg may be finite (the one exception, with
KDA's at step t, to the rule that no gradient is non-finite where the definition's is finite).
"""

from __future__ import annotations

#: Macros of the backward's kernels (after the forward's prelude).
MACROS = r"""
#define SW_VC ((SW_V + SW_CS - 1) / SW_CS)
#define SW_RITEMS (SW_K * SW_CS)
#define SW_BD_LEN (SW_GATE == 2 ? SW_TT * SW_K : SW_TT)
#define SW_BTHV (batch * T * H * SW_V)
#define SW_BTHK (batch * T * H * SW_K)
/* 1 / |x| (fla's epsilon) of the NI = K q or k values at x, as the forward stages them */
#define SW_RNORM(x, out) do { \
  SW_T n_ = (SW_T)0; \
  for (int i_ = 0; i_ < SW_K; ++i_) n_ += (x)[i_] * (x)[i_]; \
  (out) = (SW_T)1 / @SQRT@(n_ + (SW_T)1e-6); \
} while (0)
/* beta and the q and k norms of the n steps from s0 (work-items lid of NI) */
#define SW_STAGE_B(s0, n, NI) do { \
  for (int e = lid; e < (n); e += (NI)) { \
    const sw_index t_ = start + (s0) + e; \
    sb[e] = SW_DPLR ? (SW_T)0 : beta[SW_BT(t_)]; \
    if (SW_L2) { SW_RNORM(q + SW_QK(t_), sn[2 * e]); SW_RNORM(k + SW_QK(t_), sn[2 * e + 1]); } \
  } \
} while (0)
/* q, k (normalised), the decays and beta of the n steps from s0 */
#define SW_STAGE_QK(s0, n, NI) do { \
  SW_STAGE_B(s0, n, NI); \
  if (SW_GATE == 1) for (int e = lid; e < (n); e += (NI)) sd[e] = @EXP@(g[SW_BT(start + (s0) + e)]); \
  SW_BARRIER(); \
  for (int e = lid; e < (n) * SW_K; e += (NI)) { \
    const sw_index t_ = start + (s0) + e / SW_K; \
    const int i_ = e % SW_K; \
    sq[e] = q[SW_QK(t_) + i_]; \
    sk[e] = k[SW_QK(t_) + i_]; \
    if (SW_L2) { sq[e] *= sn[2 * (e / SW_K)]; sk[e] *= sn[2 * (e / SW_K) + 1]; } \
    if (SW_GATE == 2) sd[e] = @EXP@(g[SW_HK(t_) + i_]); \
    if (SW_DPLR) { sA[e] = a[SW_HK(t_) + i_]; sB[e] = b[SW_HK(t_) + i_]; } \
  } \
} while (0)
/* sums over the SW_CS work-items of row i (SW_SUM2_OVER of the forward's prelude) */
#if SW_CS > 1
#define SW_RSUM2(x, y) SW_SUM2_OVER(x, y, SW_CS, SW_RITEMS, SW_K, i)
#else
#define SW_RSUM2(x, y) ((void)0)
#endif
/* the keys kernel's tile: u = beta r, do and du of the n steps from s0, beta and the norms */
#define SW_STAGE_ROWS(s0, n) do { \
  SW_STAGE_B(s0, n, SW_RITEMS); \
  for (int e = lid; e < (n) * SW_V; e += SW_RITEMS) { \
    const sw_index t_ = start + (s0) + e / SW_V; \
    su[e] = SW_DPLR ? wr[SW_VO(t_) + e % SW_V] : beta[SW_BT(t_)] * wr[SW_VO(t_) + e % SW_V]; \
    if (SW_DPLR) sv[e] = v[SW_VO(t_) + e % SW_V]; \
    sdo[e] = do_[SW_VO(t_) + e % SW_V]; \
    sdu[e] = wdu[SW_VO(t_) + e % SW_V]; \
  } \
} while (0)
/* x neither NaN nor +-inf (inf - inf and NaN - NaN are NaN) */
#define SW_FINITE(x) ((x) - (x) == (SW_T)0)
/* dplr: a_t[i] da_t[i] (Z_{t-1} = dg_t + a_t[i] da_t[i], with Z_t = rows(G'_t o S_t)); 0 for delta */
#define SW_A_DA(t) (SW_DPLR ? a[SW_HK(t) + i] * da[SW_HK(t) + i] : (SW_T)0)
/* the decay of row i at step t */
#define SW_ROW_DECAY(t) (SW_GATE == 2 ? @EXP@(g[SW_HK(t) + i]) : SW_GATE == 1 ? @EXP@(g[SW_BT(t)]) : (SW_T)1)
/* q_t[i], k_t[i] (normalised) and the decay of row i at step t, staged step tt */
#define SW_ROW_STEP(t, tt) \
  const SW_T qi = q[SW_QK(t) + i] * (SW_L2 ? sn[2 * (tt)] : (SW_T)1); \
  const SW_T ki = k[SW_QK(t) + i] * (SW_L2 ? sn[2 * (tt) + 1] : (SW_T)1); \
  const SW_T di = SW_ROW_DECAY(t); \
  const SW_T bt = sb[tt]; \
  const SW_T ar = SW_DPLR ? a[SW_HK(t) + i] : (SW_T)0, br = SW_DPLR ? b[SW_HK(t) + i] : (SW_T)0
/* local arrays of the dplr form only (one element otherwise) */
#define SW_DPLR_TK (SW_DPLR ? SW_TT * SW_K : 1)
#define SW_DPLR_TV (SW_DPLR ? SW_TT * SW_V : 1)
"""

BACKWARD = r"""
SW_KERNEL_DR void sw_delta_rule_bwd_values(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T sq[SW_TT * SW_K];
  SW_LOCAL SW_T sk[SW_TT * SW_K];
  SW_LOCAL SW_T sd[SW_BD_LEN];
  SW_LOCAL SW_T sb[SW_TT];
  SW_LOCAL SW_T sn[2 * SW_TT];
  SW_LOCAL SW_T red[2 * SW_ITEMS];
  SW_LOCAL SW_T sA[SW_DPLR_TK];
  SW_LOCAL SW_T sB[SW_DPLR_TK];
  SW_COLUMN_ITEM(); /* element (i, j) of G at st + i * SW_V */
  SW_GLOBAL SW_T* wdu = ws + SW_BTHV;
  SW_T G[SW_KR];
#pragma unroll
  for (int ii = 0; ii < SW_KR; ++ii) {
    const int i = r * SW_KR + ii;
    G[ii] = (SW_DHLAST_ON && live && i < SW_K) ? SW_DHLAST_AT(st + i * SW_V) : (SW_T)0;
  }
  (void)red, (void)sn, (void)sd, (void)sA, (void)sB;
  for (sw_index ct = (len + SW_TT - 1) / SW_TT - 1; ct >= 0; --ct) {
    const sw_index s0 = ct * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_QK(s0, n, SW_ITEMS);
    SW_BARRIER();
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = start + s0 + tt;
      const SW_T dj = live ? do_[SW_VO(t) + j] : (SW_T)0, bt = sb[tt];
      SW_T du = (SW_T)0, z = (SW_T)0;
#pragma unroll
      for (int ii = 0; ii < SW_KR; ++ii) {
        const int i = r * SW_KR + ii;
        if (i < SW_K) {
          G[ii] += sq[tt * SW_K + i] * dj;
          du += G[ii] * sk[tt * SW_K + i];
          if (SW_DPLR) z += G[ii] * sB[tt * SW_K + i];
        }
      }
      SW_SUM2(du, z);
#pragma unroll
      for (int ii = 0; ii < SW_KR; ++ii) {
        const int i = r * SW_KR + ii;
        if (i < SW_K) G[ii] = SW_DPLR ? SW_DK(tt, i) * G[ii] + sA[tt * SW_K + i] * z
                                     : SW_DK(tt, i) * (G[ii] - bt * sk[tt * SW_K + i] * du);
      }
      if (r == 0 && live) {
        dv[SW_VO(t) + j] = SW_DPLR ? du : bt * du;
        wdu[SW_VO(t) + j] = SW_DPLR ? z : du;
      }
    }
  }
  if (SW_DH0_ON && live) {
#pragma unroll
    for (int ii = 0; ii < SW_KR; ++ii) {
      const int i = r * SW_KR + ii;
      if (i < SW_K) dh0[st + i * SW_V] = G[ii];
    }
  }
}

SW_KERNEL_ROWS void sw_delta_rule_bwd_keys(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T su[SW_TT * SW_V];
  SW_LOCAL SW_T sdo[SW_TT * SW_V];
  SW_LOCAL SW_T sdu[SW_TT * SW_V];
  SW_LOCAL SW_T sv[SW_DPLR_TV];
  SW_LOCAL SW_T sb[SW_TT];
  SW_LOCAL SW_T sn[2 * SW_TT];
  SW_LOCAL SW_T red[2 * SW_RITEMS];
  const int lid = SW_LID, i = lid % SW_K, cs = lid / SW_K;
  const sw_index grp = SW_GROUP, seq = grp / H, h = grp % H;
  SW_SEGMENT(seq);
  SW_GLOBAL const SW_T* wr = ws;
  SW_GLOBAL const SW_T* wdu = ws + SW_BTHV;
  SW_GLOBAL SW_T* wq = ws + 2 * SW_BTHV;
  SW_GLOBAL SW_T* wk = wq + SW_BTHK;
  SW_GLOBAL SW_T* wg = wk + SW_BTHK;
  SW_GLOBAL SW_T* wc = wg + (SW_GATE == 1 ? SW_BTHK : 0);
  SW_GLOBAL SW_T* dgr = SW_GATE == 2 ? dg : wg;
  const sw_index st = ((seq * H + h) * SW_K + i) * SW_V + cs * SW_VC; /* row i, this work-item's columns */
  const int nc = SW_V - cs * SW_VC;
  SW_T S[SW_VC];
#pragma unroll
  for (int jj = 0; jj < SW_VC; ++jj) S[jj] = (SW_H0_ON && jj < nc) ? SW_H0_AT(st + jj) : (SW_T)0;
  (void)red, (void)sn, (void)wg, (void)wc, (void)dgr, (void)sv;
  /* 1. forward: S_t's row i; dq_t[i] = S_t[i] . do_t, A_t[i] = S'_t[i] . du_t */
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_ROWS(s0, n);
    SW_BARRIER();
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = start + s0 + tt;
      SW_ROW_STEP(t, tt);
      const int o = tt * SW_V + cs * SW_VC;
      SW_T dqi = (SW_T)0, ai = (SW_T)0;
      (void)qi, (void)bt, (void)ar;
#pragma unroll
      for (int jj = 0; jj < SW_VC; ++jj) {
        if (jj < nc) {
          if (SW_DPLR) {  /* da_t[i] = S_{t-1}[i] . dp_t; S_t = D S_{t-1} + b p^T + k v^T */
            ai += S[jj] * sdu[o + jj];
            S[jj] = di * S[jj] + br * su[o + jj] + ki * sv[o + jj];
          } else {
            const SW_T sp = di * S[jj];
            ai += sp * sdu[o + jj];
            S[jj] = sp + ki * su[o + jj];
          }
          dqi += S[jj] * sdo[o + jj];
        }
      }
      SW_RSUM2(dqi, ai);
      if (cs == 0) {
        wq[SW_HK(t) + i] = dqi;
        if (SW_DPLR) da[SW_HK(t) + i] = ai;
        else wk[SW_HK(t) + i] = ai;
      }
    }
  }
  /* X = rows(dhlast o S_last), then G's row i in reverse: dk_t[i] = B - beta A, dg_t[i] */
  SW_T X = (SW_T)0, z = (SW_T)0;
#pragma unroll
  for (int jj = 0; jj < SW_VC; ++jj) {
    const SW_T gl = (SW_DHLAST_ON && jj < nc) ? SW_DHLAST_AT(st + jj) : (SW_T)0;
    X += gl * S[jj];
    S[jj] = gl;
  }
  SW_RSUM2(X, z);
  int spread = 0; /* a non-finite dg_t of row i (then its terms are summed again from the start) */
  for (sw_index ct = (len + SW_TT - 1) / SW_TT - 1; ct >= 0; --ct) {
    const sw_index s0 = ct * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_ROWS(s0, n);
    SW_BARRIER();
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = start + s0 + tt;
      SW_ROW_STEP(t, tt);
      const int o = tt * SW_V + cs * SW_VC;
      SW_T B = (SW_T)0, z2 = (SW_T)0;
#pragma unroll
      for (int jj = 0; jj < SW_VC; ++jj) {
        if (jj < nc) {
          const SW_T gv = S[jj] + qi * sdo[o + jj];
          B += gv * su[o + jj];
          if (SW_DPLR) {  /* db_t[i] = G_t[i] . p_t, dk_t[i] = G_t[i] . v_t; G_{t-1} = D G_t + a dp^T */
            z2 += gv * sv[o + jj];
            S[jj] = di * gv + ar * sdu[o + jj];
          } else {
            S[jj] = di * (gv - bt * ki * sdu[o + jj]);
          }
        }
      }
      SW_RSUM2(B, z2);
      if (cs == 0) {
        const SW_T A = SW_DPLR ? da[SW_HK(t) + i] : wk[SW_HK(t) + i];
        if (SW_DPLR) db[SW_HK(t) + i] = B;
        wk[SW_HK(t) + i] = SW_DPLR ? z2 : B - bt * A;
        if (SW_GATE) {
          const SW_T c = qi * wq[SW_HK(t) + i] - (SW_DPLR ? br * B + ki * z2 : ki * B + bt * ki * A);
          const SW_T dgi = di == (SW_T)0 ? (SW_T)0 : X + c;
          X = SW_DPLR ? dgi + ar * A : dgi;
          dgr[SW_HK(t) + i] = dgi;
          wc[SW_HK(t) + i] = c;
          spread |= !SW_FINITE(dgi);
        }
      }
    }
  }
  if (SW_GATE) {
    /* dg_0[i] = rows(G'_0 o S'_0)[i] = S[i] . h0[i] (S holds D_0 G'_0 now); where the sum from the end is
     * non-finite, dg_t = dg_{t-1} - c_{t-1} from that start (0 at a decay of 0): a non-finite term of step s
     * reaches dg_t only for t > s, as in rows(G'_t o S'_t), instead of every earlier step */
    SW_T d0 = (SW_T)0, z3 = (SW_T)0;
#pragma unroll
    for (int jj = 0; jj < SW_VC; ++jj) d0 += (SW_H0_ON && jj < nc) ? S[jj] * SW_H0_AT(st + jj) : (SW_T)0;
    SW_RSUM2(d0, z3);
    if (cs == 0 && spread && len > 0) {
      SW_T F = SW_ROW_DECAY(start) == (SW_T)0 ? (SW_T)0 : d0 - SW_A_DA(start);
      for (sw_index t = start; t < start + len; ++t) {
        if (t > start) F = SW_ROW_DECAY(t) == (SW_T)0 ? (SW_T)0 : F - wc[SW_HK(t - 1) + i] - SW_A_DA(t);
        if (!SW_FINITE(dgr[SW_HK(t) + i])) dgr[SW_HK(t) + i] = F;
      }
    }
  }
}

SW_KERNEL void sw_delta_rule_bwd_qk(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  const sw_index item = SW_GROUP * SW_WG + SW_LID;
  if (item >= batch * T * Hq) return;
  const sw_index tok = item / Hq, hq = item % Hq, grp = H / Hq;
  SW_GLOBAL const SW_T* wr = ws;
  SW_GLOBAL const SW_T* wdu = ws + SW_BTHV;
  SW_GLOBAL const SW_T* wq = ws + 2 * SW_BTHV;
  SW_GLOBAL const SW_T* wk = wq + SW_BTHK;
  SW_GLOBAL const SW_T* wg = wk + SW_BTHK;
  const sw_index xo = (tok * Hq + hq) * SW_K;
  (void)wg;
  /* dq (w = 0) and dk (w = 1): the group's sum, back through the normalisation */
  for (int w = 0; w < 2; ++w) {
    SW_GLOBAL const SW_T* x = (w ? k : q) + xo;
    SW_GLOBAL const SW_T* part = (w ? wk : wq) + tok * H * SW_K;
    SW_GLOBAL SW_T* out = (w ? dk : dq) + xo;
    SW_T rn = (SW_T)1, dot = (SW_T)0;
    if (SW_L2) {
      SW_RNORM(x, rn);
      for (int i = 0; i < SW_K; ++i) {
        SW_T dy = (SW_T)0;
        for (sw_index h = hq * grp; h < (hq + 1) * grp; ++h) dy += part[h * SW_K + i];
        dot += x[i] * rn * dy;
      }
    }
    for (int i = 0; i < SW_K; ++i) {
      SW_T dy = (SW_T)0;
      for (sw_index h = hq * grp; h < (hq + 1) * grp; ++h) dy += part[h * SW_K + i];
      out[i] = SW_L2 ? rn * (dy - x[i] * rn * dot) : dy;
    }
  }
  /* dbeta = du . r and the scalar gate's dg of the group's value heads */
  for (sw_index h = hq * grp; h < (hq + 1) * grp; ++h) {
    const sw_index bt = tok * H + h;
    if (!SW_DPLR) {
      SW_T dbt = (SW_T)0;
      for (int j = 0; j < SW_V; ++j) dbt += wdu[bt * SW_V + j] * wr[bt * SW_V + j];
      dbeta[bt] = dbt;
    }
    if (SW_GATE == 1) {
      SW_T s = (SW_T)0;
      for (int i = 0; i < SW_K; ++i) s += wg[bt * SW_K + i];
      dg[bt] = s;
    }
  }
}
"""
