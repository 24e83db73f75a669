"""GPU kernel text of the fused ``matrix_state`` backward (assembled by :mod:`.fused_gpu_matrix_state`).

No state is stored or recomputed from checkpoints.  With G_t = dL/dS_t, and
the tiling of :func:`~.fused_gpu_matrix_state.layout`:

* **keys**: one workgroup per (sequence, head, tile of ``RT`` state rows);
  work-item (rr, p) keeps values ``p, p + VS ...`` (``VP`` of them) of row
  ``i``.  A forward sweep carries the row of S and gives ``dq_t[i] = sum_j
  S[i, j] do_t[j]`` (bonus: S_{t-1}, plus ``u_i k_t[i] (v_t . do_t)``) and
  ``x_t[i] = q_t[i] dq'_t[i]`` (dq without the bonus term); at its end the row
  is hlast's, giving ``h_i = sum_j dhlast[i, j] hlast[i, j]``.  A reverse sweep
  carries the row of G and gives ``dk_t[i] = sum_j G[i, j] v_t[j]`` (bonus:
  plus ``u_i q_t[i] (v_t . do_t)``) and ``y_t[i] = k_t[i] dk'_t[i]``.  The
  value slices' parts of each sum meet in local memory once per time tile;
  the work-items that sum a row's parts write its dq / dk and keep its du.
  With the log decay entering S_t as ``exp(sum_{s<=t} g_s)``, ``dg_t[i] =
  sum_{s >= t} (x_s - y_s) + h_i`` (bonus: ``x_{s+1}`` in place of ``x_s``,
  since o_s reads S_{s-1}): the keys kernel leaves ``e_t[i]`` (x - y, and h_i
  at the last step) in dg (key decays) or in the scratch ``ws`` (a scalar
  decay, one row per key).
* **values**: the forward's column tiling, run in reverse: G's column j gives
  ``dv_t[j] = sum_i G[i, j] k_t[i]`` (bonus: plus ``(q_t . (u * k_t))
  do_t[j]``) and dh0.
* **decay**: the suffix sums over time of e (summed over the keys for a
  scalar decay), accumulated in double (float where an OpenCL device has no
  double), so the decay gradients of long sequences keep float32's relative
  precision instead of losing it in a float sum of T terms.

Steps run in the order of the forward (``SW_STEP``), so ``reverse`` changes
only which end of the sequence comes first.
"""

from __future__ import annotations

KEYS = r"""
/* where the initial and final states' adjoints come from, where dh0 goes, the scalar decay's per-row terms and
   whether several sequences add into du: the plain backward's (the chunked one defines its own) */
#ifndef SW_H0_AT
#define SW_H0_ON SW_HAS_H0
#define SW_H0_AT(x) h0[x]
#define SW_DHLAST_ON SW_HAS_DHLAST
#define SW_DHLAST_AT(x) dhlast[x]
#define SW_DH0_ON SW_HAS_H0
#define SW_ESCR ws
#define SW_MANY_SEQ (nseq > 1)
#endif
/* add v to *p: a plain store when this workgroup is the only writer */
#define SW_PUT(shared, p, v) do { if (shared) sw_atomic_add((p), (v)); else *(p) = (v); } while (0)
/* a row work-item: row rr of the workgroup's tile kt (state row i), value slice p */
#define SW_ROW_ITEM() \
  const int lid = SW_LID, rr = lid % SW_RT, p = lid / SW_RT; \
  const sw_index grp = SW_GROUP, kt = grp % SW_NKT, seq = grp / SW_NKT / H, h = grp / SW_NKT % H; \
  const sw_index i = kt * SW_RT + rr; \
  const int live = i < SW_K; \
  SW_SEGMENT(seq); \
  const sw_index st = ((seq * H + h) * SW_K + i) * SW_V /* row i of the state */
#define SW_VAL(m) (p + SW_VS * (m))
#define SW_VAL_OK(m) (SW_VS * SW_VP == SW_V || SW_VAL(m) < SW_V)
#define SW_RD_LEN (SW_DECAY == 2 ? SW_TT * SW_RT : SW_DECAY == 1 ? SW_TT : 1)
#define SW_RD(tt) (SW_DECAY == 2 ? rd[(tt) * SW_RT + rr] : SW_DECAY == 1 ? rd[tt] : (SW_T)1)
/* v and do of the n steps from s0, and q, k (exp(g)) of the workgroup's rows, into local memory */
#define SW_STAGE_ROWS(s0, n) do { \
  for (int e = lid; e < (n) * SW_V; e += SW_WG) { \
    const sw_index t_ = SW_STEP((s0) + e / SW_V); \
    sv[e] = v[SW_VO(t_) + e % SW_V]; \
    sdo[e] = do_[SW_VO(t_) + e % SW_V]; \
  } \
  for (int e = lid; e < (n) * SW_RT; e += SW_WG) { \
    const sw_index t_ = SW_STEP((s0) + e / SW_RT), ii_ = kt * SW_RT + e % SW_RT; \
    rq[e] = ii_ < SW_K ? q[SW_QK(t_) + ii_] : (SW_T)0; \
    rk[e] = ii_ < SW_K ? k[SW_QK(t_) + ii_] : (SW_T)0; \
    if (SW_DECAY == 2) rd[e] = ii_ < SW_K ? @EXP@(g[SW_GK(t_) + ii_]) : (SW_T)1; \
  } \
  if (SW_DECAY == 1) \
    for (int e = lid; e < (n); e += SW_WG) rd[e] = @EXP@(g[SW_GS(SW_STEP((s0) + e))]); \
} while (0)
/* the row's part of one step's sum, and (bonus) the slice's part of v_t . do_t, into local memory */
#define SW_ROW_PART(tt, acc, w) do { \
  SW_T sum_; \
  SW_ACC_SUM(sum_, acc, SW_NACC_V); \
  red[((tt) * SW_VS + p) * SW_RT + rr] = sum_; \
  if (SW_BONUS && rr == 0) rw[(tt) * SW_VS + p] = (w); \
} while (0)
/* the sums over value slices of a step's parts: the row's (x) and v_t . do_t (w) */
#define SW_ROW_SUMS(tt, x, w) do { \
  x = (SW_T)0; w = (SW_T)0; \
  for (int p_ = 0; p_ < SW_VS; ++p_) { \
    x += red[((tt) * SW_VS + p_) * SW_RT + rr]; \
    if (SW_BONUS) w += rw[(tt) * SW_VS + p_]; \
  } \
} while (0)

SW_KERNEL_TILED void sw_matrix_state_bwd_keys(@PARAMS@) {
  SW_LOCAL SW_T sv[SW_TT * SW_V];
  SW_LOCAL SW_T sdo[SW_TT * SW_V];
  SW_LOCAL SW_T rq[SW_TT * SW_RT];
  SW_LOCAL SW_T rk[SW_TT * SW_RT];
  SW_LOCAL SW_T rd[SW_RD_LEN];
  SW_LOCAL SW_T red[SW_TT * SW_VS * SW_RT];
  SW_LOCAL SW_T rw[SW_BONUS ? SW_TT * SW_VS : 1];
  SW_LOCAL SW_T sh[SW_RT];
  SW_ROW_ITEM();
  const SW_T ui = (SW_BONUS && live) ? u[h * SW_K + i] : (SW_T)0;
  const int shared_qk = H != Hq; /* the heads of a group add into the same dq, dk */
  SW_GLOBAL SW_T* e_ = SW_DECAY == 2 ? dg : SW_ESCR; /* e_t[i], in g's layout with one entry per key */
  SW_T S[SW_VP];
#pragma unroll
  for (int m = 0; m < SW_VP; ++m) S[m] = (SW_H0_ON && live && SW_VAL_OK(m)) ? SW_H0_AT(st + SW_VAL(m)) : (SW_T)0;
  SW_T du_acc = (SW_T)0;
  /* 1. forward: dq, and x (bonus: shifted one step back) into e */
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_ROWS(s0, n);
    SW_BARRIER();
    if (live)
      for (int tt = 0; tt < n; ++tt) {
        const SW_T ki = rk[tt * SW_RT + rr], di = SW_RD(tt);
        SW_T acc[SW_NACC_V];
#pragma unroll
        for (int a = 0; a < SW_NACC_V; ++a) acc[a] = (SW_T)0;
        SW_T w = (SW_T)0;
#pragma unroll
        for (int m = 0; m < SW_VP; ++m) {
          if (SW_VAL_OK(m)) {
            const SW_T vj = sv[tt * SW_V + SW_VAL(m)], dj = sdo[tt * SW_V + SW_VAL(m)];
            if (SW_BONUS) {
              acc[m % SW_NACC_V] += S[m] * dj;
              w += vj * dj;
            }
            S[m] = di * S[m] + ki * vj;
            if (!SW_BONUS) acc[m % SW_NACC_V] += S[m] * dj;
          }
        }
        SW_ROW_PART(tt, acc, w);
      }
    SW_BARRIER();
    if (live)
      for (int tt = p; tt < n; tt += SW_VS) {
        const sw_index s = s0 + tt, t = SW_STEP(s);
        const SW_T qi = rq[tt * SW_RT + rr], ki = rk[tt * SW_RT + rr];
        SW_T x, w;
        SW_ROW_SUMS(tt, x, w);
        SW_PUT(shared_qk, &dq[SW_QK(t) + i], x + ui * ki * w);
        du_acc += qi * ki * w;
        if (SW_DECAY != 0) {
          if (!SW_BONUS) {
            e_[SW_GK(t) + i] = qi * x;
          } else {
            if (s > 0) e_[SW_GK(SW_STEP(s - 1)) + i] = qi * x;
            if (s == len - 1) e_[SW_GK(t) + i] = (SW_T)0;
          }
        }
      }
  }
  /* h_i = dhlast[i] . hlast[i], summed over the value slices */
  SW_T hpart = (SW_T)0;
  if (SW_DHLAST_ON && live)
    for (int m = 0; m < SW_VP; ++m)
      if (SW_VAL_OK(m)) hpart += SW_DHLAST_AT(st + SW_VAL(m)) * S[m];
  SW_BARRIER();
  red[p * SW_RT + rr] = hpart;
  SW_BARRIER();
  if (p == 0) {
    SW_T hsum = (SW_T)0;
    for (int p_ = 0; p_ < SW_VS; ++p_) hsum += red[p_ * SW_RT + rr];
    sh[rr] = hsum;
  }
  SW_GLOBAL_BARRIER(); /* e written above is read by other work-items below */
  /* 2. reverse: G's row; dk; e = x - y (+ h at the last step) */
#pragma unroll
  for (int m = 0; m < SW_VP; ++m)
    S[m] = (SW_DHLAST_ON && live && SW_VAL_OK(m)) ? SW_DHLAST_AT(st + SW_VAL(m)) : (SW_T)0;
  for (sw_index cs = (len + SW_TT - 1) / SW_TT - 1; cs >= 0; --cs) {
    const sw_index s0 = cs * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_ROWS(s0, n);
    SW_BARRIER();
    if (live)
      for (int tt = n - 1; tt >= 0; --tt) {
        const SW_T qi = rq[tt * SW_RT + rr], di = SW_RD(tt);
        SW_T acc[SW_NACC_V];
#pragma unroll
        for (int a = 0; a < SW_NACC_V; ++a) acc[a] = (SW_T)0;
        SW_T w = (SW_T)0;
#pragma unroll
        for (int m = 0; m < SW_VP; ++m) {
          if (SW_VAL_OK(m)) {
            const SW_T vj = sv[tt * SW_V + SW_VAL(m)], dj = sdo[tt * SW_V + SW_VAL(m)];
            if (!SW_BONUS) S[m] += qi * dj;
            acc[m % SW_NACC_V] += S[m] * vj;
            if (SW_BONUS) {
              w += vj * dj;
              S[m] = di * S[m] + qi * dj;
            } else {
              S[m] *= di;
            }
          }
        }
        SW_ROW_PART(tt, acc, w);
      }
    SW_BARRIER();
    if (live)
      for (int tt = p; tt < n; tt += SW_VS) {
        const sw_index s = s0 + tt, t = SW_STEP(s);
        const SW_T qi = rq[tt * SW_RT + rr], ki = rk[tt * SW_RT + rr];
        SW_T y, w;
        SW_ROW_SUMS(tt, y, w);
        SW_PUT(shared_qk, &dk[SW_QK(t) + i], y + ui * qi * w);
        if (SW_DECAY != 0) e_[SW_GK(t) + i] += (s == len - 1 ? sh[rr] : (SW_T)0) - ki * y;
      }
  }
  if (SW_BONUS) {
    SW_BARRIER();
    red[p * SW_RT + rr] = du_acc;
    SW_BARRIER();
    if (p == 0 && live) {
      SW_T dsum = (SW_T)0;
      for (int p_ = 0; p_ < SW_VS; ++p_) dsum += red[p_ * SW_RT + rr];
      SW_PUT(SW_MANY_SEQ, &du[h * SW_K + i], dsum);
    }
  }
}
"""

VALUES = r"""
SW_KERNEL_TILED void sw_matrix_state_bwd_values(@PARAMS@) {
  SW_COLUMN_LOCALS();
  SW_COLUMN_ITEM();
  SW_T G[SW_KP];
#pragma unroll
  for (int m = 0; m < SW_KP; ++m)
    G[m] = (SW_DHLAST_ON && live && SW_KEY_OK(m)) ? SW_DHLAST_AT(st + SW_KEY(m) * SW_V) : (SW_T)0;
  if (SW_BONUS)
    for (int i = lid; i < SW_K; i += SW_WG) su[i] = u[h * SW_K + i];
  for (sw_index cs = (len + SW_TT - 1) / SW_TT - 1; cs >= 0; --cs) {
    const sw_index s0 = cs * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_QK(s0, n);
    SW_STAGE_COLUMNS(do_, s0, n);
    SW_BARRIER();
    if (live)
      for (int tt = n - 1; tt >= 0; --tt) {
        const SW_T dj = sx[tt * SW_CT + c];
        SW_T acc[SW_NACC];
#pragma unroll
        for (int a = 0; a < SW_NACC; ++a) acc[a] = (SW_T)0;
        SW_T bon = (SW_T)0;
#pragma unroll
        for (int m = 0; m < SW_KP; ++m) {
          if (SW_KEY_OK(m)) {
            const int i = SW_KEY(m);
            const SW_T qi = sq[tt * SW_K + i], ki = sk[tt * SW_K + i];
            if (SW_BONUS) {
              acc[m % SW_NACC] += G[m] * ki;
              bon += qi * su[i] * ki;
              G[m] = SW_DK(tt, i) * G[m] + qi * dj;
            } else {
              G[m] += qi * dj;
              acc[m % SW_NACC] += G[m] * ki;
              G[m] *= SW_DK(tt, i);
            }
          }
        }
        SW_T sum;
        SW_ACC_SUM(sum, acc, SW_NACC);
        red[(tt * SW_KS + r) * SW_CT + c] = sum + bon * dj;
      }
    SW_BARRIER();
    SW_REDUCE_COLUMNS(dv, s0, n);
  }
  if (SW_DH0_ON && live) {
#pragma unroll
    for (int m = 0; m < SW_KP; ++m)
      if (SW_KEY_OK(m)) dh0[st + SW_KEY(m) * SW_V] = G[m];
  }
}
"""

DECAY = r"""
SW_KERNEL_TILED void sw_matrix_state_bwd_decay(@PARAMS@) {
  SW_LOCAL SW_ACC part[SW_DECAY == 1 ? SW_WG : 1];
  const int lid = SW_LID;
  if (SW_DECAY == 2) {
    /* one work-item per (sequence, head, key): dg = the suffix sums of e over the sequence, in place */
    const sw_index nkd = (SW_K + SW_WG - 1) / SW_WG, grp = SW_GROUP;
    const sw_index seq = grp / nkd / H, h = grp / nkd % H, i = (grp % nkd) * SW_WG + lid;
    SW_SEGMENT(seq);
    (void)hq;
    if (i < SW_K) {
      SW_ACC run = (SW_ACC)0;
      for (sw_index s = len - 1; s >= 0; --s) {
        const sw_index at = SW_GK(SW_STEP(s)) + i;
        run += (SW_ACC)dg[at];
        dg[at] = (SW_T)run;
      }
    }
  } else if (SW_DECAY == 1) {
    /* one workgroup per (sequence, head): the keys' sum of e per step, then its suffix sums */
    const sw_index grp = SW_GROUP, seq = grp / H, h = grp % H;
    SW_SEGMENT(seq);
    (void)hq;
    SW_ACC run = (SW_ACC)0;
    for (sw_index s0 = ((len + SW_WG - 1) / SW_WG - 1) * SW_WG; s0 >= 0; s0 -= SW_WG) {
      const sw_index s = s0 + lid;
      SW_ACC x = (SW_ACC)0;
      if (s < len) {
        const sw_index at = SW_GK(SW_STEP(s));
        for (int i = 0; i < SW_K; ++i) x += (SW_ACC)SW_ESCR[at + i];
      }
      part[lid] = x;
      SW_BARRIER();
      if (lid == 0)
        for (int l = (int)(len - s0 < SW_WG ? len - s0 : SW_WG) - 1; l >= 0; --l) {
          run += part[l];
          dg[SW_GS(SW_STEP(s0 + l))] = (SW_T)run;
        }
      SW_BARRIER();
    }
  }
}
"""
