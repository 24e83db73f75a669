"""C source of the delta-rule backward (assembled by :mod:`.fused_c_delta_rule`): checkpoints, no per-step states.

The recurrent backward of every form; under ``algorithm="chunked"`` the entry
calls the chunked backward of :mod:`.delta_c_chunked_backward` instead (the
``delta`` form), which runs a lane with growth by this module's
``sw_bwd_head`` and passes dq and dk back through ``sw_bwd_qk``.

One work item per (sequence, q/k head): its value heads one after another, each
in blocks of ``SW_CBB`` value columns (the columns of S and of G = dL/dS evolve
independently; what couples them, the key-side gradients, is summed over the
blocks).  Per block:

1. a forward sweep from h0 saving the state every ``SW_CHECKPOINT`` steps;
2. from the last chunk to the first: the chunk's states recomputed from its
   checkpoint into ``SW_CHECKPOINT + 1`` tiles (with the projections p_t), then
   the reverse steps of :mod:`scanweaver.fused.delta_rule`'s recurrences,
   two passes over the rows of G and S_{t-1} per step: the first adds
   q_t do_t^T to G and collects the column sums (du = G^T k, or dp = G^T b and
   dv = G^T k) and the row dots G.u (G.p, G.v), S_{t-1}.G and S_{t-1}.do; the
   second the row dots S_{t-1}.du (S_{t-1}.dp) while G becomes G_{t-1}.

Row dots are accumulated as one vector per row and reduced ``SW_W`` rows at a
time by a transpose.  ``dq_t = S_t do_t`` comes from S_{t-1}: ``D S_{t-1} do +
k (u . do)`` (dplr: ``+ b (p . do) + k (v . do)``).  The key-side gradients
(dq, dk per value head, dg, da, db, dbeta) are summed in the thread's float
scratch, one row per step of the sequence, and written once, dq and dk through
the L2 normalisation when it is on.  The block width is chosen (by the
rendering) so that a chunk's tiles stay in L2.

Entry point (ABI order of :meth:`~scanweaver.fused.delta_rule.DeltaRule.params`; ``do`` is ``dout``)::

    int sw_delta_rule_backward(q, k, v, g, beta, a, b, h0, cu_seqlens, dout, dhlast, dq, dk, dv, dg, dbeta, da,
                               db, dh0, long batch, long T, long H, long Hq, long nseq);
"""

from __future__ import annotations

BACKWARD = r"""
#define SW_NVB (SW_CBB / SW_W)
#define SW_TILEB ((long)SW_K * SW_CBB)
#define SW_CKPT SW_CHECKPOINT

typedef struct {
  const sw_s* dout;
  const SW_T* dhlast;
  sw_s *dq, *dk, *dv, *dg, *dbeta, *da, *db;
  SW_T* dh0;
} sw_bg;

/* A thread's scratch: packed steps, the chunk's states, checkpoints, G, row dots (5 x KP), and per step of the
 * longest sequence: dq, dk (per q/k head), dg (key), da, db (KP each, as used) and dbeta, dg (scalar). */
typedef struct {
  sw_pk P;
  SW_T *st, *ck, *G, *R, *dqh, *dkh, *dgk, *da, *db, *dsc;
  void* raw;
} sw_bw;

static int sw_bw_new(sw_bw* w, long L, long nck) {
  const size_t tiles = (size_t)(SW_CKPT + 2 + nck) * (size_t)SW_TILEB, rows = (size_t)L * SW_KP;
  const size_t nrows = 2 + (SW_GATE == 2) + 2 * SW_DPLR;
  w->P.raw = NULL;
  SW_T* base = (SW_T*)sw_alloc(sizeof(SW_T) * (tiles + 5 * SW_KP + nrows * rows + 2 * (size_t)L), &w->raw);
  if (!base || sw_pk_new(&w->P, SW_CKPT, SW_CBB) != SW_OK) return SW_ENOMEM;
  w->st = base, w->ck = w->st + (SW_CKPT + 1) * SW_TILEB, w->G = w->ck + nck * SW_TILEB, w->R = w->G + SW_TILEB;
  w->dqh = w->R + 5 * SW_KP, w->dkh = w->dqh + rows;
  SW_T* next = w->dkh + rows;
  w->dgk = SW_GATE == 2 ? next : NULL, next += SW_GATE == 2 ? rows : 0;
  w->da = SW_DPLR ? next : NULL, w->db = SW_DPLR ? next + rows : NULL, next += SW_DPLR ? 2 * rows : 0;
  w->dsc = next;
  return SW_OK;
}

/* Lane r of out: the sum of the lanes of r[r] (SW_W row accumulators, transposed and added). */
SW_INLINE void sw_rowsums(sw_v* r, SW_T* out) {
  sw_vtranspose(r);
  sw_v s = r[0];
  for (int c = 1; c < SW_W; ++c) s += r[c];
  sw_vstore(out, s);
}

/* The reverse step of packed step i: G (dL/dS_t less q_t's share) becomes dL/dS_{t-1}; prev = S_{t-1}; ti the
 * step's row in the sums; dvrow the block's columns of dv_t. */
static void sw_bwd_step(sw_bw* w, int i, const SW_T* restrict prev, long ti, sw_s* dvrow, int nv) {
  sw_pk* P = &w->P;
  SW_T* restrict G = w->G;
  const SW_T *q = P->q + i * SW_KP, *x = P->x + i * SW_KP, *y = P->y + i * SW_KP, *a = P->a + i * SW_KP;
  const SW_T* d = P->d + i * SW_KP;
  const SW_T ds = P->ds[i], beta = P->beta[i];
  sw_v dov[SW_NVB], wv[SW_NVB], vv[SW_NVB], c1[SW_NVB], c2[SW_NVB];
  sw_v sdo = sw_vzero, svdo = sw_vzero;
  for (int j = 0; j < SW_NVB; ++j) {
    dov[j] = sw_vload(P->dout + i * SW_CBB + j * SW_W);
    vv[j] = sw_vload(P->v + i * SW_CBB + j * SW_W);
    const sw_v pj = sw_vload(P->p + i * SW_CBB + j * SW_W);
    wv[j] = SW_DPLR ? pj : beta * (vv[j] - pj); /* delta: u; dplr: p */
    c1[j] = c2[j] = sw_vzero;
    sdo += wv[j] * dov[j];
    svdo += vv[j] * dov[j];
  }
  const SW_T wdo = sw_vhsum(sdo), vdo = sw_vhsum(svdo);
  SW_T *R1 = w->R, *R2 = R1 + SW_KP, *R3 = R2 + SW_KP, *R4 = R3 + SW_KP, *R5 = R4 + SW_KP;
  /* pass 1: G += q do^T; c1 = G^T x (du or dp), c2 = G^T k (dplr's dv); rows G.w, S.G, S.do, G.v */
  for (int k0 = 0; k0 < SW_KP; k0 += SW_W) {
    sw_v r1[SW_W], r2[SW_W], r3[SW_W], r5[SW_W];
    for (int r = 0; r < SW_W; ++r) {
      const int k = k0 + r;
      sw_v a1 = sw_vzero, a2 = sw_vzero, a3 = sw_vzero, a5 = sw_vzero;
      if (k < SW_K) {
        sw_v* restrict gk = (sw_v*)(G + (long)k * SW_CBB);
        const sw_v* pk = (const sw_v*)(prev + (long)k * SW_CBB);
        const SW_T qk = q[k], xk = x[k], yk = y[k];
        (void)yk;
        for (int j = 0; j < SW_NVB; ++j) {
          const sw_v g = gk[j] + qk * dov[j];
          gk[j] = g;
          c1[j] += xk * g;
#if SW_DPLR
          c2[j] += yk * g;
          a5 += g * vv[j];
#endif
          a1 += g * wv[j];
          a2 += pk[j] * g;
          a3 += pk[j] * dov[j];
        }
      }
      r1[r] = a1, r2[r] = a2, r3[r] = a3, r5[r] = a5;
    }
    sw_rowsums(r1, R1 + k0);
    sw_rowsums(r2, R2 + k0);
    sw_rowsums(r3, R3 + k0);
    if (SW_DPLR) sw_rowsums(r5, R5 + k0);
  }
  /* dv, and dbeta = du . (v - p) */
  SW_T* tmp = P->o + i * SW_CBB;
  sw_v sr = sw_vzero;
  for (int j = 0; j < SW_NVB; ++j) {
    sw_vstore(tmp + j * SW_W, SW_DPLR ? c2[j] : beta * c1[j]);
    sr += c1[j] * (vv[j] - sw_vload(P->p + i * SW_CBB + j * SW_W));
  }
  sw_store_row(dvrow, tmp, nv);
  /* pass 2: rows S.c1; G_{t-1} = D (G - beta k du^T) or D G + a dp^T */
  for (int k0 = 0; k0 < SW_KP; k0 += SW_W) {
    sw_v r4[SW_W];
    for (int r = 0; r < SW_W; ++r) {
      const int k = k0 + r;
      sw_v a4 = sw_vzero;
      if (k < SW_K) {
        sw_v* restrict gk = (sw_v*)(G + (long)k * SW_CBB);
        const sw_v* pk = (const sw_v*)(prev + (long)k * SW_CBB);
        const SW_T dk = SW_GATE == 2 ? d[k] : SW_GATE == 1 ? ds : (SW_T)1, bx = beta * x[k], ak = a[k];
        (void)dk, (void)bx, (void)ak;
        for (int j = 0; j < SW_NVB; ++j) {
          a4 += pk[j] * c1[j];
#if SW_DPLR
          gk[j] = SW_GATE ? dk * gk[j] + ak * c1[j] : gk[j] + ak * c1[j];
#else
          gk[j] = SW_GATE ? dk * (gk[j] - bx * c1[j]) : gk[j] - bx * c1[j];
#endif
        }
      }
      r4[r] = a4;
    }
    sw_rowsums(r4, R4 + k0);
  }
  /* the key-side sums */
  SW_T *dq = w->dqh + ti * SW_KP, *dkh = w->dkh + ti * SW_KP;
  SW_T gsum = 0;
  for (int k = 0; k < SW_K; ++k) {
    const SW_T dk = SW_GATE == 2 ? d[k] : SW_GATE == 1 ? ds : (SW_T)1;
#if SW_DPLR
    dkh[k] += R5[k];
    w->db[ti * SW_KP + k] += R1[k];
    w->da[ti * SW_KP + k] += R4[k];
    dq[k] += dk * R3[k] + x[k] * wdo + y[k] * vdo;
    const SW_T gk = dk * R2[k];
#else
    dkh[k] += R1[k] - beta * dk * R4[k];
    dq[k] += dk * R3[k] + x[k] * wdo;
    const SW_T gk = dk * (R2[k] - beta * x[k] * R4[k]);
#endif
    if (SW_GATE == 2) w->dgk[ti * SW_KP + k] += gk;
    gsum += gk;
  }
  (void)vdo;
  w->dsc[2 * ti] += sw_vhsum(sr);
  w->dsc[2 * ti + 1] += gsum;
}

/* Columns [c0, c0 + nv) of value head h over sequence (row, b, [start, stop)). */
static void sw_bwd_block(const sw_dr* m, const sw_bg* gr, sw_bw* w, long row, long b, long start, long stop, long h,
                         long hq, long c0, int nv) {
  const long nck = (stop - start + SW_CKPT - 1) / SW_CKPT;
  sw_pk* P = &w->P;
  sw_state_in(m, SW_HAS_H0 ? m->h0 : NULL, row, h, c0, nv, SW_CBB, w->st);
  for (long c = 0; c < nck; ++c) {
    const long t0 = start + c * SW_CKPT;
    const int n = (int)SW_MIN((long)SW_CKPT, stop - t0);
    memcpy(w->ck + c * SW_TILEB, w->st, sizeof(SW_T) * SW_TILEB);
    sw_pack(m, P, b, h, hq, t0, n, c0, nv, NULL, 0);
    sw_groups(P, n, w->st, 0, 0, 0);
  }
  sw_state_in(m, SW_HAS_DHLAST ? gr->dhlast : NULL, row, h, c0, nv, SW_CBB, w->G);
  for (long c = nck - 1; c >= 0; --c) {
    const long t0 = start + c * SW_CKPT;
    const int n = (int)SW_MIN((long)SW_CKPT, stop - t0);
    sw_pack(m, P, b, h, hq, t0, n, c0, nv, gr->dout, 0);
    memcpy(w->st, w->ck + c * SW_TILEB, sizeof(SW_T) * SW_TILEB);
    sw_groups(P, n, w->st, SW_TILEB, 0, 1);
    for (int i = n - 1; i >= 0; --i)
      sw_bwd_step(w, i, w->st + i * SW_TILEB, t0 + i - start, gr->dv + SW_VO(m, b, t0 + i, h) + c0, nv);
  }
  sw_state_out(m, gr->dh0, row, h, c0, nv, SW_CBB, w->G);
}

/* dx of one q or k row from the summed dy (in place), through the L2 normalisation when it is on. */
SW_INLINE void sw_unnorm(const sw_s* src, SW_T* dy, SW_T* tmp) {
#if SW_L2
  sw_load_row(tmp, src, SW_K, SW_K);
  const SW_T r = sw_l2(tmp);
  SW_T dot = 0;
  for (int k = 0; k < SW_K; ++k) dot += tmp[k] * dy[k];
  for (int k = 0; k < SW_K; ++k) dy[k] = r * (dy[k] - tmp[k] * dot);
#else
  (void)src, (void)dy, (void)tmp;
#endif
}

/* Value head h of sequence row (batch b, steps [start, stop)) by the recurrence: dv, dg, dbeta (da, db) written,
 * its dq and dk rows added into the thread's sums (dqh, dkh). */
static void sw_bwd_head(const sw_dr* m, const sw_bg* gr, sw_bw* w, long row, long b, long start, long stop, long h,
                        long hq) {
  const long len = stop - start;
  memset(w->dsc, 0, sizeof(SW_T) * (size_t)(2 * len));
  if (SW_GATE == 2) memset(w->dgk, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
  if (SW_DPLR) {
    memset(w->da, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
    memset(w->db, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
  }
  for (long c0 = 0; c0 < SW_V; c0 += SW_CBB)
    sw_bwd_block(m, gr, w, row, b, start, stop, h, hq, c0, (int)SW_MIN((long)SW_CBB, SW_V - c0));
  for (long t = start; t < stop; ++t) {
    const long ti = t - start;
#if SW_DPLR
    sw_store_row(gr->da + SW_HK(m, b, t, h), w->da + ti * SW_KP, SW_K);
    sw_store_row(gr->db + SW_HK(m, b, t, h), w->db + ti * SW_KP, SW_K);
#else
    gr->dbeta[SW_BT(m, b, t, h)] = sw_out(w->dsc[2 * ti]);
#endif
#if SW_GATE == 2
    sw_store_row(gr->dg + SW_HK(m, b, t, h), w->dgk + ti * SW_KP, SW_K);
#elif SW_GATE == 1
    gr->dg[SW_BT(m, b, t, h)] = sw_out(w->dsc[2 * ti + 1]);
#endif
  }
}

/* dq and dk of q/k head hq over steps [start, stop) of batch b from the thread's sums, through the L2
 * normalisation when it is on. */
static void sw_bwd_qk(const sw_dr* m, const sw_bg* gr, sw_bw* w, long b, long start, long stop, long hq) {
  for (long t = start; t < stop; ++t) {
    SW_T *dq = w->dqh + (t - start) * SW_KP, *dk = w->dkh + (t - start) * SW_KP;
    sw_unnorm(m->q + SW_QK(m, b, t, hq), dq, w->R);
    sw_unnorm(m->k + SW_QK(m, b, t, hq), dk, w->R);
    sw_store_row(gr->dq + SW_QK(m, b, t, hq), dq, SW_K);
    sw_store_row(gr->dk + SW_QK(m, b, t, hq), dk, SW_K);
  }
}

/* Sequence `row`, q/k head hq: its value heads, then dq and dk. */
static void sw_bwd_item(const sw_dr* m, const sw_bg* gr, sw_bw* w, long row, long hq) {
  long b, start, stop;
  sw_seq(m, row, &b, &start, &stop);
  const long len = stop - start, grp = m->H / m->Hq;
  memset(w->dqh, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
  memset(w->dkh, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
  for (long h = hq * grp; h < (hq + 1) * grp; ++h) sw_bwd_head(m, gr, w, row, b, start, stop, h, hq);
  sw_bwd_qk(m, gr, w, b, start, stop, hq);
}

#if SW_CHUNKED
static int sw_backward_chunked(const sw_dr* m, const sw_bg* gr);
#endif

static int sw_backward_run(const sw_dr* m, const sw_bg* gr) {
  const long items = m->nseq * m->Hq, L = sw_longest(m), nck = (L + SW_CKPT - 1) / SW_CKPT;
  const int nt = (int)SW_MIN((long)sw_threads(), items);
  int status = SW_OK;
#pragma omp parallel num_threads(nt)
  {
    sw_bw w;
    const int ok = sw_bw_new(&w, L, nck) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(dynamic, 1)
    for (long it = 0; it < items; ++it)
      if (ok) sw_bwd_item(m, gr, &w, it / m->Hq, it % m->Hq);
    free(w.raw);
    free(w.P.raw);
  }
  return status;
}

int sw_delta_rule_backward(const sw_s* q, const sw_s* k, const sw_s* v, const sw_s* g, const sw_s* beta,
                           const sw_s* a, const sw_s* b, const SW_T* h0, const int64_t* cu_seqlens, const sw_s* dout,
                           const SW_T* dhlast, sw_s* dq, sw_s* dk, sw_s* dv, sw_s* dg, sw_s* dbeta, sw_s* da,
                           sw_s* db, SW_T* dh0, long batch, long T, long H, long Hq, long nseq) {
  const sw_dr m = {q, k, v, g, beta, a, b, h0, cu_seqlens, batch, T, H, Hq, nseq};
  if (batch <= 0 || H <= 0 || nseq <= 0) return SW_OK;
  const int bad = sw_check(&m);
  if (bad) return bad;
  const sw_bg gr = {dout, dhlast, dq, dk, dv, dg, dbeta, da, db, dh0};
#if SW_CHUNKED
  return sw_backward_chunked(&m, &gr);
#endif
  return sw_backward_run(&m, &gr);
}
"""
