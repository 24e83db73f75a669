"""C source of the fused recurrent matrix-state forward (assembled by :mod:`.fused_c_matrix`).

Per (sequence, head, block of ``block_v`` value columns) the ``K x block_v`` tile of
the state lives in the thread's scratch (L1 for the default blocks), a row of
``block_v / W`` vectors per key: a step reads q_t, k_t, g_t and the block of v_t
once, updates every row with one multiply-add per vector (``S[k] = d_k S[k] +
k_t[k] v_t``) and accumulates ``o_t += q_t[k] S[k]`` in registers, so the
outputs are written once and no horizontal sum is needed.  Value columns are
independent in the forward, so blocks of columns are threads' work as much as
heads are.  When (sequence, head, block) items are fewer than the threads,
each sequence is cut into parts in scan order: the parts but the last run
from a zero state to their aggregate (end state and summed log decays, a
scalar or a K-vector), the carries are chained ``C_{p+1} = exp(G_p) C_p + E_p``,
and every part reruns from its carry writing o.

Entry point (ABI order of :meth:`~scanweaver.fused.matrix_state.MatrixState.params`)::

    int sw_matrix_state_forward(q, k, v, g, u, h0, cu_seqlens, o, hlast,
                                long batch, long T, long H, long Hq, long nseq);

0 on success, 1 when scratch memory is short, 2 for inconsistent sizes or offsets.
"""

from __future__ import annotations

RECURRENT = r"""
/* Value columns per block: SW_BLOCK_V rounded up to whole vectors, at most V's padded width. */
#define SW_CB0 (((SW_BLOCK_V) + SW_W - 1) / SW_W * SW_W)
#define SW_CB (SW_CB0 < SW_VP ? SW_CB0 : SW_VP)
#define SW_NCB ((SW_V + SW_CB - 1) / SW_CB)
#define SW_NVEC (SW_CB / SW_W)
/* Fewest steps per part when a sequence is split over threads (the aggregate pass and the carries must stay
 * small beside the work). */
#define SW_MIN_PART 64

/* One (sequence, head, column block) of the recurrent form. */
typedef struct { long b, start, stop, h, c0; int nv; } sw_item;

static sw_item sw_item_at(const sw_ms* m, long it) {
  sw_item x;
  const long cb = it % SW_NCB, rest = it / SW_NCB;
  x.h = rest % m->H;
  sw_seq(m, rest / m->H, &x.b, &x.start, &x.stop);
  x.c0 = cb * SW_CB;
  x.nv = (int)SW_MIN((long)SW_CB, SW_V - x.c0);
  return x;
}

/* Scan positions [s0, s1) of item x from the state S (K rows of SW_CB, updated in place).  With o, writes o;
 * without, only the state runs and gsum (SW_KP, or [0] for "scalar") collects the summed log decays. */
static void sw_rec_range(const sw_ms* m, const sw_item* x, long s0, long s1, SW_T* restrict S, SW_T* restrict o,
                         double* restrict gsum) {
  const long hq = x->h / (m->H / m->Hq);
  SW_T d[SW_KP] __attribute__((aligned(64)));
  SW_T vb[SW_CB] __attribute__((aligned(64)));
  for (int j = 0; j < SW_CB; ++j) vb[j] = 0;
  for (long s = s0; s < s1; ++s) {
    const long t = SW_AT(x->start, x->stop, s);
    const SW_T* restrict qt = m->q + SW_QK(m, x->b, t, hq);
    const SW_T* restrict kt = m->k + SW_QK(m, x->b, t, hq);
    memcpy(vb, m->v + SW_VO(m, x->b, t, x->h) + x->c0, sizeof(SW_T) * (size_t)x->nv);
    sw_v vt[SW_NVEC], ov[SW_NVEC];
    for (int j = 0; j < SW_NVEC; ++j) vt[j] = sw_vload(vb + j * SW_W);
    if (SW_DECAY) {
      const SW_T* gp = m->g + SW_G(m, x->b, t, x->h);
      sw_decays(gp, d);
      if (!o)
        for (int k = 0; k < (SW_DECAY == 2 ? SW_K : 1); ++k) gsum[k] += gp[k];
    }
    if (!o) {
      for (int k = 0; k < SW_K; ++k) {
        const SW_T dk = SW_DECAY == 2 ? d[k] : SW_DECAY == 1 ? d[0] : (SW_T)1, kk = kt[k];
        sw_v* restrict row = (sw_v*)(S + (long)k * SW_CB);
        for (int j = 0; j < SW_NVEC; ++j) row[j] = dk * row[j] + kk * vt[j];
      }
      continue;
    }
    SW_T beta = 0;
    if (SW_BONUS) {
      const SW_T* up = m->u + x->h * SW_K;
      for (int k = 0; k < SW_K; ++k) beta += qt[k] * up[k] * kt[k];
    }
    for (int j = 0; j < SW_NVEC; ++j) ov[j] = beta * vt[j];
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = SW_DECAY == 2 ? d[k] : SW_DECAY == 1 ? d[0] : (SW_T)1, kk = kt[k], qq = qt[k];
      sw_v* restrict row = (sw_v*)(S + (long)k * SW_CB);
      for (int j = 0; j < SW_NVEC; ++j) {
        const sw_v old = row[j], nw = dk * old + kk * vt[j];
        row[j] = nw;
        ov[j] += qq * (SW_BONUS ? old : nw);
      }
    }
    for (int j = 0; j < SW_NVEC; ++j) sw_vstore(vb + j * SW_W, ov[j]);
    memcpy(o + SW_VO(m, x->b, t, x->h) + x->c0, vb, sizeof(SW_T) * (size_t)x->nv);
    for (int j = 0; j < SW_CB; ++j) vb[j] = 0;
  }
}

/* The item's block of a (nseq, H, K, V) state into / out of S. */
static void sw_state_in(const sw_ms* m, long row, const sw_item* x, const SW_T* src, SW_T* S) {
  for (int k = 0; k < SW_K; ++k) {
    SW_T* dst = S + (long)k * SW_CB;
    if (src) sw_copy_pad(dst, src + ((row * m->H + x->h) * SW_K + k) * SW_V + x->c0, x->nv, SW_CB);
    else memset(dst, 0, sizeof(SW_T) * SW_CB);
  }
}

static void sw_state_out(const sw_ms* m, long row, const sw_item* x, const SW_T* S, SW_T* dst) {
  if (dst)
    for (int k = 0; k < SW_K; ++k)
      memcpy(dst + ((row * m->H + x->h) * SW_K + k) * SW_V + x->c0, S + (long)k * SW_CB,
             sizeof(SW_T) * (size_t)x->nv);
}

#define SW_TILE ((long)SW_K * SW_CB)

/* Few items for the threads: each sequence cut into P parts (see the module notes). */
static int sw_rec_split(const sw_ms* m, SW_T* o, SW_T* hlast, long items, long P, int nth) {
  void* raw;
  SW_T* st = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)(2 * items * P * SW_TILE), &raw);
  double* gs = (double*)calloc((size_t)(items * P * SW_KP), sizeof(double));
  if (!st || !gs) {
    free(raw);
    free(gs);
    return SW_ENOMEM;
  }
  SW_T *agg = st, *carry = st + items * P * SW_TILE;
  (void)nth;
#pragma omp parallel num_threads(nth)
  {
#pragma omp for schedule(static)
    for (long w = 0; w < items * P; ++w) {
      const long it = w / P, p = w % P;
      const sw_item x = sw_item_at(m, it);
      const long len = x.stop - x.start;
      memset(agg + w * SW_TILE, 0, sizeof(SW_T) * SW_TILE);
      if (p + 1 < P) sw_rec_range(m, &x, p * len / P, (p + 1) * len / P, agg + w * SW_TILE, NULL, gs + w * SW_KP);
    }
#pragma omp for schedule(static)
    for (long it = 0; it < items; ++it) {
      const sw_item x = sw_item_at(m, it);
      SW_T* c = carry + it * P * SW_TILE;
      sw_state_in(m, it / SW_NCB / m->H, &x, SW_HAS_H0 ? m->h0 : NULL, c);
      for (long p = 0; p + 1 < P; ++p) {
        const double* gp = gs + (it * P + p) * SW_KP;
        const SW_T* e = agg + (it * P + p) * SW_TILE;
        SW_T* nx = c + (p + 1) * SW_TILE;
        for (int k = 0; k < SW_K; ++k) {
          const SW_T dk = SW_DECAY == 2 ? (SW_T)exp(gp[k]) : SW_DECAY == 1 ? (SW_T)exp(gp[0]) : (SW_T)1;
          for (int j = 0; j < SW_CB; ++j)
            nx[k * SW_CB + j] = dk * c[p * SW_TILE + k * SW_CB + j] + e[k * SW_CB + j];
        }
      }
    }
#pragma omp for schedule(static)
    for (long w = 0; w < items * P; ++w) {
      const long it = w / P, p = w % P;
      const sw_item x = sw_item_at(m, it);
      const long len = x.stop - x.start;
      sw_rec_range(m, &x, p * len / P, (p + 1) * len / P, carry + w * SW_TILE, o, NULL);
      if (p + 1 == P) sw_state_out(m, it / SW_NCB / m->H, &x, carry + w * SW_TILE, hlast);
    }
  }
  free(raw);
  free(gs);
  return SW_OK;
}

static int sw_forward_recurrent(const sw_ms* m, SW_T* o, SW_T* hlast) {
  const long items = m->nseq * m->H * SW_NCB;
  const int nth = sw_threads();
  long longest = 0;
  for (long i = 0; i < m->nseq; ++i) {
    long b, start, stop;
    sw_seq(m, i, &b, &start, &stop);
    longest = stop - start > longest ? stop - start : longest;
  }
  const long P = SW_MIN(nth / items, longest / SW_MIN_PART);
  if (P >= 2) return sw_rec_split(m, o, hlast, items, P, (int)SW_MIN((long)nth, items * P));
  int status = SW_OK;
  const int nt = (int)SW_MIN((long)nth, items);
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    void* raw;
    SW_T* S = (SW_T*)sw_alloc(sizeof(SW_T) * SW_TILE, &raw);
    if (!S) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long it = 0; it < items; ++it) {
      if (!S) continue;
      const sw_item x = sw_item_at(m, it);
      const long row = it / SW_NCB / m->H;
      sw_state_in(m, row, &x, SW_HAS_H0 ? m->h0 : NULL, S);
      sw_rec_range(m, &x, 0, x.stop - x.start, S, o, NULL);
      sw_state_out(m, row, &x, S, hlast);
    }
    free(raw);
  }
  return status;
}
"""
