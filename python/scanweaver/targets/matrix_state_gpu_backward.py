"""GPU kernel text of the fused ``matrix_state`` backward (assembled by :mod:`.fused_gpu_matrix_state`).

No state is stored or recomputed from checkpoints.  With G_t = dL/dS_t:

* **keys** (one workgroup per (sequence, head), work-item i = state row i):
  a forward sweep carries row i of S and writes ``dq_t[i] = sum_j S[i, j]
  do_t[j]`` (bonus: S_{t-1}, plus ``u_i k_t[i] (v_t . do_t)``), accumulates
  du, and leaves ``x_t = q_t[i] dq'_t[i]`` (dq without the bonus term) in
  dg; at its end the row is hlast's, giving ``h_i = sum_j dhlast[i, j]
  hlast[i, j]``.  A reverse sweep carries row i of G and writes ``dk_t[i] =
  sum_j G[i, j] v_t[j]`` (bonus: plus ``u_i q_t[i] (v_t . do_t)``).  With
  the log decay entering S_t as ``exp(sum_{s<=t} g_s)``, ``dg_t[i] = sum_{s
  >= t} x_s - sum_{s >= t} k_s[i] dk'_s[i] + h_i`` (bonus: the x sum starts
  at s > t, since o_s reads S_{s-1}); a scalar decay sums that over i (a
  local-memory reduction per time tile).  v and do of ``time_tile`` steps are
  staged in local memory.
* **values** (the forward's grid, work-item j = state column j): a reverse
  sweep of G's column j writes ``dv_t[j] = sum_i G[i, j] k_t[i]`` (bonus:
  plus ``(q_t . (u * k_t)) do_t[j]``) and dh0.

Steps run in the order of the forward (``SW_STEP``), so ``reverse`` changes
only which end of the sequence comes first.
"""

from __future__ import annotations

KEYS = r"""
/* add v to *p: a plain store when this workgroup is the only writer */
#define SW_PUT(shared, p, v) do { if (shared) sw_atomic_add((p), (v)); else *(p) = (v); } while (0)

SW_KERNEL_ROWS void sw_matrix_state_bwd_keys(@PARAMS@) {
  SW_LOCAL SW_T sv[SW_TT * SW_V];
  SW_LOCAL SW_T sdo[SW_TT * SW_V];
  SW_LOCAL SW_T red[SW_DECAY == 1 ? SW_TT * SW_K : 1];
  const int i = SW_LID;
  const sw_index grp = SW_GROUP, seq = grp / H, h = grp % H;
  SW_SEGMENT(seq);
  const sw_index st = ((seq * H + h) * SW_K + i) * SW_V; /* row i of the state */
  const SW_T ui = SW_BONUS ? u[h * SW_K + i] : (SW_T)0;
  const int shared_qk = H != Hq; /* the heads of a group add into the same dq, dk */
  SW_T S[SW_V];
SW_UNROLL_V
  for (int j = 0; j < SW_V; ++j) S[j] = SW_HAS_H0 ? h0[st + j] : (SW_T)0;
  SW_T du_acc = (SW_T)0;
  /* 1. forward: dq; x = q * dq' into dg */
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    for (int e = i; e < n * SW_V; e += SW_K) {
      const sw_index t = SW_STEP(s0 + e / SW_V);
      sv[e] = v[SW_VO(t) + e % SW_V];
      sdo[e] = do_[SW_VO(t) + e % SW_V];
    }
    SW_BARRIER();
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = SW_STEP(s0 + tt);
      const SW_T qi = q[SW_QK(t) + i], ki = k[SW_QK(t) + i];
      const SW_T di = SW_DECAY == 2 ? @EXP@(g[SW_GK(t) + i]) : SW_DECAY == 1 ? @EXP@(g[SW_GS(t)]) : (SW_T)1;
      SW_T acc = (SW_T)0, w = (SW_T)0;
SW_UNROLL_V
      for (int j = 0; j < SW_V; ++j) {
        const SW_T vj = sv[tt * SW_V + j], dj = sdo[tt * SW_V + j];
        if (SW_BONUS) {
          acc += S[j] * dj;
          w += vj * dj;
        }
        S[j] = di * S[j] + ki * vj;
        if (!SW_BONUS) acc += S[j] * dj;
      }
      du_acc += qi * ki * w;
      SW_PUT(shared_qk, &dq[SW_QK(t) + i], acc + ui * ki * w);
      if (SW_DECAY == 2) dg[SW_GK(t) + i] = qi * acc;
      if (SW_DECAY == 1) red[tt * SW_K + i] = qi * acc;
    }
    if (SW_DECAY == 1) {
      SW_BARRIER();
      for (int tt = i; tt < n; tt += SW_K) {
        SW_T x = (SW_T)0;
        for (int r = 0; r < SW_K; ++r) x += red[tt * SW_K + r];
        dg[SW_GS(SW_STEP(s0 + tt))] = x;
      }
    }
  }
  SW_T hterm = (SW_T)0;
  if (SW_HAS_DHLAST)
    for (int j = 0; j < SW_V; ++j) hterm += dhlast[st + j] * S[j];
  /* 2. reverse: G's row i; dk; dg */
SW_UNROLL_V
  for (int j = 0; j < SW_V; ++j) S[j] = SW_HAS_DHLAST ? dhlast[st + j] : (SW_T)0;
  SW_T rq = (SW_T)0, rk = (SW_T)0;
  for (sw_index c = (len + SW_TT - 1) / SW_TT - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    for (int e = i; e < n * SW_V; e += SW_K) {
      const sw_index t = SW_STEP(s0 + e / SW_V);
      sv[e] = v[SW_VO(t) + e % SW_V];
      sdo[e] = do_[SW_VO(t) + e % SW_V];
    }
    SW_BARRIER();
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = SW_STEP(s0 + tt);
      const SW_T qi = q[SW_QK(t) + i], ki = k[SW_QK(t) + i];
      const SW_T di = SW_DECAY == 2 ? @EXP@(g[SW_GK(t) + i]) : SW_DECAY == 1 ? @EXP@(g[SW_GS(t)]) : (SW_T)1;
      SW_T acc = (SW_T)0, w = (SW_T)0;
SW_UNROLL_V
      for (int j = 0; j < SW_V; ++j) {
        const SW_T vj = sv[tt * SW_V + j], dj = sdo[tt * SW_V + j];
        if (!SW_BONUS) S[j] += qi * dj;
        acc += S[j] * vj;
        if (SW_BONUS) {
          w += vj * dj;
          S[j] = di * S[j] + qi * dj;
        } else {
          S[j] *= di;
        }
      }
      SW_PUT(shared_qk, &dk[SW_QK(t) + i], acc + ui * qi * w);
      rk += ki * acc;
      if (SW_DECAY == 2) {
        const SW_T x = dg[SW_GK(t) + i];
        if (!SW_BONUS) rq += x;
        dg[SW_GK(t) + i] = rq - rk + hterm;
        if (SW_BONUS) rq += x;
      }
      if (SW_DECAY == 1) red[tt * SW_K + i] = hterm - rk;
    }
    if (SW_DECAY == 1) {
      SW_BARRIER();
      if (i == 0)
        for (int tt = n - 1; tt >= 0; --tt) {
          const sw_index at = SW_GS(SW_STEP(s0 + tt));
          const SW_T x = dg[at];
          SW_T y = (SW_T)0;
          for (int r = 0; r < SW_K; ++r) y += red[tt * SW_K + r];
          if (!SW_BONUS) rq += x;
          dg[at] = rq + y;
          if (SW_BONUS) rq += x;
        }
    }
  }
  if (SW_BONUS) SW_PUT(nseq > 1, &du[h * SW_K + i], du_acc);
}
"""

VALUES = r"""
SW_KERNEL void sw_matrix_state_bwd_values(@PARAMS@) {
  SW_LOCAL SW_T sq[SW_TT * SW_K];
  SW_LOCAL SW_T sk[SW_TT * SW_K];
  SW_LOCAL SW_T sd[SW_SD_LEN];
  SW_LOCAL SW_T su[SW_SU_LEN];
  const int lid = SW_LID;
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, seq = grp / SW_NVT / H, h = grp / SW_NVT % H;
  const sw_index j = vt * SW_WG + lid;
  const int live = j < SW_V;
  SW_SEGMENT(seq);
  const sw_index st = (seq * H + h) * SW_K * SW_V + j;
  SW_T G[SW_K];
SW_UNROLL_K
  for (int i = 0; i < SW_K; ++i) G[i] = (SW_HAS_DHLAST && live) ? dhlast[st + i * SW_V] : (SW_T)0;
  if (SW_BONUS)
    for (int i = lid; i < SW_K; i += SW_WG) su[i] = u[h * SW_K + i];
  for (sw_index c = (len + SW_TT - 1) / SW_TT - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_QK(s0, n, lid, SW_WG);
    SW_BARRIER();
    if (!live) continue;
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = SW_STEP(s0 + tt);
      const SW_T dj = do_[SW_VO(t) + j];
      SW_T acc = (SW_T)0, bon = (SW_T)0;
SW_UNROLL_K
      for (int i = 0; i < SW_K; ++i) {
        const SW_T qi = sq[tt * SW_K + i], ki = sk[tt * SW_K + i];
        if (SW_BONUS) {
          acc += G[i] * ki;
          bon += qi * su[i] * ki;
          G[i] = SW_DK(tt, i) * G[i] + qi * dj;
        } else {
          G[i] += qi * dj;
          acc += G[i] * ki;
          G[i] *= SW_DK(tt, i);
        }
      }
      dv[SW_VO(t) + j] = acc + bon * dj;
    }
  }
  if (SW_HAS_H0 && live) {
SW_UNROLL_K
    for (int i = 0; i < SW_K; ++i) dh0[st + i * SW_V] = G[i];
  }
}
"""
