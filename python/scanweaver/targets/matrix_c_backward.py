"""C source of the fused recurrent matrix-state backward (assembled by :mod:`.fused_c_matrix`).

Two sweeps per (sequence, head), no state ever stored per step:

1. *forward sweep*: the states S_t run again from h0 (K x V in the thread's
   scratch) and give ``dq_t = S_t do_t`` (S_{t-1} and the bonus for RWKV-6)
   on the fly, and the first half of the decay gradient, ``a_t = q_t * dq_t``
   (per key; the state part only);
2. *reverse sweep*: the adjoint G_t (the contract's reverse recurrence on the
   transposed state) gives ``dk_t = G_t v_t``, ``dv_t = G_t^T k_t``, du and
   dh0, and with ``b_t = k_t * dk_t`` the decay gradient by the identity of
   flash-linear-attention's chunked kernels: g enters only through its
   cumulative sum, and q (k) meets it as ``q e^{G}`` (``k e^{-G}``), so
   ``dg_t = sum_{s >= t} (a_s - b_s) + [rows of dhlast * hlast]`` (summed over
   keys for a scalar decay; a_s of RWKV-6 is q_{s+1}'s, which reads S_s).

Groups (Hq < H): the heads of one q/k group are slices of one work item, so
their dq and dk sum into the caller's arrays without races; when there are
fewer (sequence, group) items than threads the group's heads are cut into
slices, each slice but the first summing into its own scratch copy of dq/dk,
added in order at the end (deterministic for a given ``threads``).

The gradients' arrays (``GRADS``) and the runner (``RUN``: threads, group slices, du) are shared with the chunked
backward (:mod:`.matrix_c_chunked_backward`), which brings its own workspace
and per-head function (``sw_bws``) when the unit is built with
``algorithm="chunked"``, and its own split (``sw_bws_split``): there, fewer
(sequence, group) items than threads cut each item's chunks into parts
instead of its heads (:mod:`.matrix_c_chunked_parts`), and the slices above
are left to the recurrent form.

Entry point (ABI order of :meth:`~scanweaver.fused.matrix_state.MatrixState.params`; ``do`` is ``dout``
in C, where ``do`` is a keyword)::

    int sw_matrix_state_backward(q, k, v, g, u, h0, cu_seqlens, dout, dhlast, dq, dk, dv, dg, du, dh0,
                                 long batch, long T, long H, long Hq, long nseq);
"""

from __future__ import annotations

GRADS = r"""
/* The gradients' arrays, and the runner's scratch for du. */
typedef struct {
  const SW_T *dout, *dhlast;
  SW_T *dq, *dk, *dv, *dg, *du, *dh0;
  SW_T* du_part; /* (nseq, H, K) */
} sw_bgrads;
"""

HEAD = r"""
#define SW_RGW (SW_DECAY == 2 ? SW_K : 1)
#define SW_NV (SW_VP / SW_W)

/* A thread's scratch (vector-aligned, on the heap: every piece scales with K or V, and at large K no thread's
 * stack holds them): the states S and G (K x VP each), the decays d (KP), the rows vb, ob, dv (VP each), then
 * the double sums du (K) and r (SW_RGW), then a (K). */
#define SW_BWD_ELEMS (2L * SW_K * SW_VP + SW_KP + 3L * SW_VP)
#define SW_BWD_BYTES (sizeof(SW_T) * (SW_BWD_ELEMS + SW_K) + sizeof(double) * (SW_K + SW_RGW))

/* The recurrent form's workspace of one thread: sw_bwd_head's scratch (SW_BWD_BYTES, below). */
#if !SW_CHUNKED
typedef struct { void* raw; SW_T* S; } sw_bws;
static int sw_bws_alloc(sw_bws* w, const sw_ms* m) {
  (void)m;
  w->S = (SW_T*)sw_alloc(SW_BWD_BYTES, &w->raw);
  return w->S ? SW_OK : SW_ENOMEM;
}
static void sw_bws_free(sw_bws* w) { free(w->raw); }
#define sw_bws_head(m, gr, row, b, start, stop, h, hq, qd, kd, w) \
  sw_bwd_head(m, gr, row, b, start, stop, h, hq, qd, kd, (w)->S)
/* Lanes are never cut into parts; nothing is shared by the heads of a unit (a q/k group's slice of heads). */
#define sw_bws_split(m, gr, status) 0
#define sw_bws_unit_begin(m, row, h0, h1, w) ((void)0)
#define sw_bws_unit_end(m, row, h0, h1, qd, kd, w) ((void)0)
#endif

/* Head h of sequence (row, b, [start, stop)): dq and dk summed into qd / kd (rows of the group hq); w the
 * thread's scratch (SW_BWD_BYTES). */
static void sw_bwd_head(const sw_ms* m, const sw_bgrads* gr, long row, long b, long start, long stop, long h,
                        long hq, SW_T* restrict qd, SW_T* restrict kd, SW_T* restrict w) {
  const long len = stop - start;
  SW_T* restrict S = w;
  SW_T* restrict G = S + (long)SW_K * SW_VP;
  SW_T* restrict d = G + (long)SW_K * SW_VP;
  SW_T* restrict vb = d + SW_KP;
  SW_T* restrict ob = vb + SW_VP;
  sw_v* restrict dv = (sw_v*)(ob + SW_VP);
  double* restrict du = (double*)(w + SW_BWD_ELEMS);
  double* restrict r = du + SW_K;
  SW_T* restrict a = (SW_T*)(r + SW_RGW);
  const SW_T* up = SW_BONUS ? m->u + h * SW_K : NULL;
  for (int k = 0; k < SW_K; ++k) du[k] = 0;
  (void)up;
  for (int k = 0; k < SW_K; ++k) {
    if (SW_HAS_H0) sw_copy_pad(S + (long)k * SW_VP, m->h0 + ((row * m->H + h) * SW_K + k) * SW_V, SW_V, SW_VP);
    else memset(S + (long)k * SW_VP, 0, sizeof(SW_T) * SW_VP);
  }
  /* 1: forward sweep */
  for (long s = 0; s < len; ++s) {
    const long t = SW_AT(start, stop, s);
    const SW_T *qt = m->q + SW_QK(m, b, t, hq), *kt = m->k + SW_QK(m, b, t, hq);
    sw_copy_pad(vb, m->v + SW_VO(m, b, t, h), SW_V, SW_VP);
    sw_copy_pad(ob, gr->dout + SW_VO(m, b, t, h), SW_V, SW_VP);
    if (SW_DECAY) sw_decays(m->g + SW_G(m, b, t, h), d);
    SW_T w = 0;
    for (int j = 0; j < SW_V; ++j) w += vb[j] * ob[j];
    SW_T* dqt = qd + SW_QK(m, b, t, hq);
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = SW_DECAY == 2 ? d[k] : SW_DECAY == 1 ? d[0] : (SW_T)1, kk = kt[k];
      sw_v* restrict r = (sw_v*)(S + (long)k * SW_VP);
      sw_v acc = sw_vzero;
      for (int j = 0; j < SW_NV; ++j) {
        const sw_v old = r[j], nw = dk * old + kk * sw_vload(vb + j * SW_W);
        r[j] = nw;
        acc += (SW_BONUS ? old : nw) * sw_vload(ob + j * SW_W);
      }
      const SW_T dqk = sw_vhsum(acc);
      a[k] = qt[k] * dqk;
      dqt[k] += SW_BONUS ? dqk + up[k] * kk * w : dqk;
    }
    if (gr->dg && SW_DECAY) {
      const long ts = SW_BONUS ? (s > 0 ? SW_AT(start, stop, s - 1) : -1) : t;
      if (ts >= 0) {
        SW_T* dg = gr->dg + SW_G(m, b, ts, h);
        if (SW_DECAY == 2) memcpy(dg, a, sizeof(SW_T) * SW_K);
        else { SW_T sum = 0; for (int k = 0; k < SW_K; ++k) sum += a[k]; dg[0] = sum; }
      }
    }
  }
  /* hlast's share of the decay gradient, then G from dhlast */
  for (int k = 0; k < SW_RGW; ++k) r[k] = 0;
  for (int k = 0; k < SW_K; ++k) {
    SW_T* gk = G + (long)k * SW_VP;
    if (SW_HAS_DHLAST && gr->dhlast) {
      const SW_T* src = gr->dhlast + ((row * m->H + h) * SW_K + k) * SW_V;
      sw_copy_pad(gk, src, SW_V, SW_VP);
      double c = 0;
      for (int j = 0; j < SW_V; ++j) c += (double)src[j] * S[(long)k * SW_VP + j];
      r[SW_DECAY == 2 ? k : 0] += c;
    } else {
      memset(gk, 0, sizeof(SW_T) * SW_VP);
    }
  }
  if (SW_BONUS && gr->dg && SW_DECAY && len > 0)
    memset(gr->dg + SW_G(m, b, SW_AT(start, stop, len - 1), h), 0, sizeof(SW_T) * SW_RGW);
  /* 2: reverse sweep */
  for (long s = len - 1; s >= 0; --s) {
    const long t = SW_AT(start, stop, s);
    const SW_T *qt = m->q + SW_QK(m, b, t, hq), *kt = m->k + SW_QK(m, b, t, hq);
    sw_copy_pad(vb, m->v + SW_VO(m, b, t, h), SW_V, SW_VP);
    sw_copy_pad(ob, gr->dout + SW_VO(m, b, t, h), SW_V, SW_VP);
    if (SW_DECAY) sw_decays(m->g + SW_G(m, b, t, h), d);
    SW_T w = 0, beta = 0;
    if (SW_BONUS)
      for (int j = 0; j < SW_V; ++j) w += vb[j] * ob[j];
    if (SW_BONUS)
      for (int k = 0; k < SW_K; ++k) beta += qt[k] * up[k] * kt[k];
    for (int j = 0; j < SW_NV; ++j) dv[j] = beta * sw_vload(ob + j * SW_W);
    SW_T* dkt = kd + SW_QK(m, b, t, hq);
    double bsum = 0;
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = SW_DECAY == 2 ? d[k] : SW_DECAY == 1 ? d[0] : (SW_T)1, kk = kt[k], qq = qt[k];
      sw_v* restrict gk = (sw_v*)(G + (long)k * SW_VP);
      sw_v acc = sw_vzero;
      for (int j = 0; j < SW_NV; ++j) {
        const sw_v o = sw_vload(ob + j * SW_W);
        const sw_v gv = SW_BONUS ? gk[j] : gk[j] + qq * o;
        acc += gv * sw_vload(vb + j * SW_W);
        dv[j] += kk * gv;
        gk[j] = SW_BONUS ? dk * gv + qq * o : dk * gv;
      }
      const SW_T dkk = sw_vhsum(acc);
      dkt[k] += SW_BONUS ? dkk + up[k] * qq * w : dkk;
      if (SW_BONUS) du[k] += (double)(qq * kk * w);
      if (SW_DECAY == 2) r[k] -= (double)(kk * dkk);
      else bsum += (double)(kk * dkk);
    }
    SW_T* dvt = gr->dv + SW_VO(m, b, t, h);
    for (int j = 0; j < SW_NV; ++j) sw_vstore(vb + j * SW_W, dv[j]);
    memcpy(dvt, vb, sizeof(SW_T) * SW_V);
    if (gr->dg && SW_DECAY) {
      SW_T* dg = gr->dg + SW_G(m, b, t, h);
      if (SW_DECAY == 2)
        for (int k = 0; k < SW_K; ++k) { r[k] += dg[k]; dg[k] = (SW_T)r[k]; }
      else { r[0] += dg[0] - bsum; dg[0] = (SW_T)r[0]; }
    }
  }
  if (gr->dh0)
    for (int k = 0; k < SW_K; ++k)
      memcpy(gr->dh0 + ((row * m->H + h) * SW_K + k) * SW_V, G + (long)k * SW_VP, sizeof(SW_T) * SW_V);
  if (SW_BONUS && gr->du_part)
    for (int k = 0; k < SW_K; ++k) gr->du_part[(row * m->H + h) * SW_K + k] = (SW_T)du[k];
}

"""

RUN = r"""
/* The units (sequence, q/k group), the group's heads cut into P slices when groups are fewer than the threads: each
 * slice but the first sums its dq and dk into its own scratch copy (batch * T * Hq * K each), added in order. */
static int sw_backward_slices(const sw_ms* m, sw_bgrads* gr) {
  const long grp = m->H / m->Hq, base = m->nseq * m->Hq;
  const int nth = sw_threads();
  const long P = SW_MIN(grp, SW_MIN((long)nth, (nth + base - 1) / base));
  const size_t qsize = (size_t)(m->batch * m->T * m->Hq * SW_K);
  void* raw_s = NULL;
  SW_T* slices = P > 1 ? (SW_T*)sw_alloc(sizeof(SW_T) * qsize * 2 * (size_t)(P - 1), &raw_s) : NULL;
  if (P > 1 && !slices) return SW_ENOMEM;
  int status = SW_OK;
  const int nt = (int)SW_MIN((long)nth, base * P);
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    sw_bws ws;
    const int ok = sw_bws_alloc(&ws, m) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long it = 0; it < base * P; ++it) {
      if (!ok) continue;
      const long p = it % P, hq = (it / P) % m->Hq, row = it / P / m->Hq;
      long b, start, stop;
      sw_seq(m, row, &b, &start, &stop);
      SW_T* qd = p == 0 ? gr->dq : slices + qsize * 2 * (size_t)(p - 1);
      SW_T* kd = p == 0 ? gr->dk : qd + qsize;
      for (long t = start; t < stop; ++t) {
        memset(qd + SW_QK(m, b, t, hq), 0, sizeof(SW_T) * SW_K);
        memset(kd + SW_QK(m, b, t, hq), 0, sizeof(SW_T) * SW_K);
      }
      const long h0 = hq * grp + p * grp / P, h1 = hq * grp + (p + 1) * grp / P;
      sw_bws_unit_begin(m, row, h0, h1, &ws);
      for (long h = h0; h < h1; ++h) sw_bws_head(m, gr, row, b, start, stop, h, hq, qd, kd, &ws);
      sw_bws_unit_end(m, row, h0, h1, qd, kd, &ws);
    }
    if (ok) sw_bws_free(&ws);
#pragma omp for schedule(static)
    for (long i = 0; i < (P > 1 ? (long)(qsize / SW_K) : 0); ++i)
      for (long p = 1; p < P; ++p) {
        const SW_T* sq = slices + qsize * 2 * (size_t)(p - 1);
        for (int k = 0; k < SW_K; ++k) {
          gr->dq[i * SW_K + k] += sq[i * SW_K + k];
          gr->dk[i * SW_K + k] += sq[qsize + i * SW_K + k];
        }
      }
  }
  free(raw_s);
  return status;
}

/* The backward: parts of groups' chunks (sw_bws_split) when it takes them, else slices of groups' heads; then du. */
static int sw_backward_run(const sw_ms* m, sw_bgrads* gr) {
  gr->du_part = SW_BONUS && gr->du ? (SW_T*)calloc((size_t)(m->nseq * m->H * SW_K), sizeof(SW_T)) : NULL;
  if (SW_BONUS && gr->du && !gr->du_part) return SW_ENOMEM;
  int status = SW_OK;
  if (!sw_bws_split(m, gr, &status)) status = sw_backward_slices(m, gr);
  if (gr->du) {
    for (long i = 0; i < m->H * SW_K; ++i) gr->du[i] = 0;
    if (gr->du_part)
      for (long row = 0; row < m->nseq; ++row)
        for (long i = 0; i < m->H * SW_K; ++i) gr->du[i] += gr->du_part[row * m->H * SW_K + i];
  }
  free(gr->du_part);
  return status;
}

int sw_matrix_state_backward(const SW_T* q, const SW_T* k, const SW_T* v, const SW_T* g, const SW_T* u,
                             const SW_T* h0, const int64_t* cu_seqlens, const SW_T* dout, const SW_T* dhlast,
                             SW_T* dq, SW_T* dk, SW_T* dv, SW_T* dg, SW_T* du, SW_T* dh0,
                             long batch, long T, long H, long Hq, long nseq) {
  const sw_ms m = {q, k, v, g, u, h0, cu_seqlens, batch, T, H, Hq, nseq};
  if (batch <= 0 || H <= 0 || nseq <= 0) return SW_OK;
  const int bad = sw_check(&m);
  if (bad) return bad;
  sw_bgrads gr = {dout, dhlast, dq, dk, dv, SW_DECAY ? dg : NULL, SW_BONUS ? du : NULL, dh0, NULL};
  return sw_backward_run(&m, &gr);
}
"""
