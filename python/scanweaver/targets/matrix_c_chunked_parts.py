"""C source of the chunk-parallel carries of the chunked matrix-state form ("parts"), forward and backward.

When a call has fewer lanes (sequence, head) than threads, each lane's chunks
are cut into P parts of whole chunks, and the affine map of a part carries
what crosses it, as the chunk engine's carry does between chunks:

* forward: the parts but the last run from a zero state to their end state
  E_p and summed log decays G_p; the carries are chained
  ``S_{p+1} = e^{G_p} o S_p + E_p`` (``sw_ck_carry``: in double, and E_p where
  S_p is 0), and every part reruns from its carry writing o;
* backward (lanes without groups: each owns its rows of dq and dk): every part
  runs to its local end state E_p and, in reverse, to its local adjoint F_p
  (the adjoint at its start for a zero adjoint at its end:
  ``dS <- e^{G_last} o dS + Qs^T dO`` per chunk, or the recurrence on a chunk
  that grows); the states at the parts' starts are chained forward as above and
  the adjoints at their ends in reverse, ``dS_{p-1} = e^{G_p} o dS_p + F_p``
  (from dhlast); each part then runs the chunked backward from its two carries,
  its decay gradient a running sum from its own end; last, each part's steps
  of dg take the offset ``c + sum_{q > p} (a - b summed over part q)`` (c the
  rows of dhlast o hlast), and du sums the parts'.

Text assembled by :mod:`.matrix_c_chunked` (``FORWARD_PARTS``) and
:mod:`.matrix_c_chunked_backward` (``BACKWARD_PARTS``).
"""

from __future__ import annotations

FORWARD_PARTS = r"""
/* Few lanes for the threads, forward: each lane cut into P parts of whole chunks (see the module notes). */
static int sw_ck_forward_split(const sw_ms* m, SW_T* o, SW_T* hlast, long lanes, long P, int nth) {
  void *raw_st, *raw_gs;
  SW_T* st = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)(2 * lanes * P * SW_STATE), &raw_st);
  double* gs = (double*)sw_alloc(sizeof(double) * (size_t)(lanes * P * SW_GW), &raw_gs);
  if (!st || !gs) {
    free(raw_st);
    free(raw_gs);
    return SW_ENOMEM;
  }
  memset(gs, 0, sizeof(double) * (size_t)(lanes * P * SW_GW));
  SW_T *agg = st, *carry = st + lanes * P * SW_STATE;
  int status = SW_OK;
  (void)nth;
#pragma omp parallel num_threads(nth)
  {
    void* raw;
    sw_ck_tiles c;
    const int ok = sw_ck_alloc(&c, &raw, 0, NULL) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long w = 0; w < lanes * P; ++w) {
      const long it = w / P, p = w % P;
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long nc = SW_NCHUNKS(&x);
      memset(agg + w * SW_STATE, 0, sizeof(SW_T) * SW_STATE);
      if (ok && p + 1 < P)
        sw_ck_unit_forward(m, x.row, x.h, x.h + 1, p * nc / P, (p + 1) * nc / P, &c, agg + w * SW_STATE, NULL,
                           gs + w * SW_GW);
    }
#pragma omp for schedule(static)
    for (long it = 0; it < lanes; ++it) {
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      SW_T* cw = carry + it * P * SW_STATE;
      sw_ck_state_in(m, &x, SW_HAS_H0 ? m->h0 : NULL, cw);
      for (long p = 0; p + 1 < P; ++p) {
        double* d = gs + (it * P + p) * SW_GW;
        for (int k = 0; k < SW_GW; ++k) d[k] = exp(d[k]);
        memcpy(cw + (p + 1) * SW_STATE, cw + p * SW_STATE, sizeof(SW_T) * SW_STATE);
        sw_ck_carry(cw + (p + 1) * SW_STATE, agg + (it * P + p) * SW_STATE, d, SW_KEYDECAY, SW_VP, SW_VP);
      }
    }
#pragma omp for schedule(static)
    for (long w = 0; w < lanes * P; ++w) {
      const long it = w / P, p = w % P;
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long nc = SW_NCHUNKS(&x);
      if (ok) sw_ck_unit_forward(m, x.row, x.h, x.h + 1, p * nc / P, (p + 1) * nc / P, &c, carry + w * SW_STATE, o,
                                 NULL);
      if (p + 1 == P) sw_ck_state_out(m, &x, carry + w * SW_STATE, hlast);
    }
    if (ok) free(raw);
  }
  free(raw_st);
  free(raw_gs);
  return status;
}

"""

BACKWARD_PARTS = r"""
/* The adjoint of the state through chunks [c0, c1) of lane x in reverse: dS from the adjoint at c1's end to the one
 * at c0's start, with the outputs' adjoints flowing in (a part's local adjoint from a zero dS). */
static void sw_ck_lane_adjoint(const sw_ms* m, const sw_lane* x, long c0, long c1, sw_ck_tiles* c, SW_T* dS,
                               const SW_T* dout) {
  const long len = x->stop - x->start;
  for (long ci = c1 - 1; ci >= c0; --ci) {
    const long s0 = ci * SW_C;
    const int n = (int)SW_MIN((long)SW_C, len - s0);
    sw_ck_load(m, x, s0, n, c, dout, 1, -SW_C, ci > c0 ? SW_C : 0);
    sw_ck_prefix(&c->d, c->G, n);
    if (!c->d.grow) {
      sw_ck_last(c);
      sw_ck_qs(c);
      sw_ck_decay_state(c, dS);
      sw_gemm(SW_K, SW_VP, n, c->Qs, 1, SW_KP, c->DO, SW_VP, dS, SW_VP, 1);
      continue;
    }
    for (int i = n - 1; i >= 0; --i) {  /* the recurrence: G = q do^T + d G (after), d G + q do^T (bonus) */
      sw_ck_step_decay(c, i, c->s.tmp);
      const SW_T *qi = c->Q + (long)i * SW_KP, *oi = c->DO + (long)i * SW_VP;
      for (int k = 0; k < SW_K; ++k) {
        const SW_T dk = c->s.tmp[SW_KEYDECAY ? k : 0], qq = qi[k];
        SW_T* row = dS + (long)k * SW_VP;
        for (int j = 0; j < SW_VP; j += SW_W) {
          const sw_v o = sw_vload(oi + j), g = sw_vload(row + j);
          sw_vstore(row + j, SW_BONUS ? dk * g + qq * o : dk * (g + qq * o));
        }
      }
    }
  }
}

/* Few lanes (no groups) for the threads, backward: each lane cut into P parts (see the module notes).  Returns the
 * status; the caller reduces du_part. */
static int sw_ck_backward_split(const sw_ms* m, sw_bgrads* gr, long lanes, long P, int nth) {
  const long np = lanes * P;
  void *raw_st, *raw_d;
  SW_T* st = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)(4 * np * SW_STATE), &raw_st);
  double* dd = (double*)sw_alloc(sizeof(double) * (size_t)(np * (2 * SW_GW + SW_K) + lanes * SW_GW), &raw_d);
  if (!st || !dd) {
    free(raw_st);
    free(raw_d);
    return SW_ENOMEM;
  }
  SW_T *E = st, *F = E + np * SW_STATE, *Sin = F + np * SW_STATE, *dSo = Sin + np * SW_STATE;
  double *gs = dd, *tot = gs + np * SW_GW, *dup = tot + np * SW_GW, *cterm = dup + np * SW_K;
  memset(dd, 0, sizeof(double) * (size_t)(np * (2 * SW_GW + SW_K) + lanes * SW_GW));
  int status = SW_OK;
  (void)nth;
#pragma omp parallel num_threads(nth)
  {
    sw_bws ws;
    const int ok = sw_bws_alloc(&ws, m) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long w = 0; w < np; ++w) {  /* each part's local end state, summed decays and local adjoint */
      const long it = w / P, p = w % P;
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long nc = SW_NCHUNKS(&x), a = p * nc / P, b = (p + 1) * nc / P;
      memset(E + w * SW_STATE, 0, sizeof(SW_T) * SW_STATE);
      memset(F + w * SW_STATE, 0, sizeof(SW_T) * SW_STATE);
      if (!ok) continue;
      for (long s = a * SW_C; s < SW_MIN(b * SW_C, x.stop - x.start); ++s) {
        const long t = SW_AT(x.start, x.stop, s);
        memset(gr->dq + SW_QK(m, x.b, t, x.hq), 0, sizeof(SW_T) * SW_K);
        memset(gr->dk + SW_QK(m, x.b, t, x.hq), 0, sizeof(SW_T) * SW_K);
      }
      sw_ck_unit_forward(m, x.row, x.h, x.h + 1, a, b, &ws.c, E + w * SW_STATE, NULL, gs + w * SW_GW);
      if (p > 0) sw_ck_lane_adjoint(m, &x, a, b, &ws.c, F + w * SW_STATE, gr->dout);
    }
#pragma omp for schedule(static)
    for (long it = 0; it < lanes; ++it) {  /* the carries: states forward, adjoints in reverse */
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      SW_T *si = Sin + it * P * SW_STATE, *so = dSo + it * P * SW_STATE;
      double* g = gs + it * P * SW_GW;
      for (long p = 0; p < P; ++p)
        for (int k = 0; k < SW_GW; ++k) g[p * SW_GW + k] = exp(g[p * SW_GW + k]);
      sw_ck_state_in(m, &x, SW_HAS_H0 ? m->h0 : NULL, si);
      for (long p = 0; p + 1 < P; ++p) {
        memcpy(si + (p + 1) * SW_STATE, si + p * SW_STATE, sizeof(SW_T) * SW_STATE);
        sw_ck_carry(si + (p + 1) * SW_STATE, E + (it * P + p) * SW_STATE, g + p * SW_GW, SW_KEYDECAY, SW_VP, SW_VP);
      }
      if (ok && SW_HAS_DHLAST && gr->dhlast) {  /* hlast: the last part's carry through it; c: rows of dhlast o hlast */
        memcpy(ws.S, si + (P - 1) * SW_STATE, sizeof(SW_T) * SW_STATE);
        sw_ck_carry(ws.S, E + (it * P + P - 1) * SW_STATE, g + (P - 1) * SW_GW, SW_KEYDECAY, SW_VP, SW_VP);
        for (int k = 0; k < SW_K; ++k) {
          const SW_T* src = gr->dhlast + ((x.row * m->H + x.h) * SW_K + k) * SW_V;
          double sum = 0;
          for (int j = 0; j < SW_V; ++j) sum += (double)src[j] * ws.S[(long)k * SW_VP + j];
          cterm[it * SW_GW + (SW_KEYDECAY ? k : 0)] += sum;
        }
      }
      sw_ck_adj_in(m, &x, gr->dhlast, so + (P - 1) * SW_STATE);
      for (long p = P - 1; p > 0; --p) {
        memcpy(so + (p - 1) * SW_STATE, so + p * SW_STATE, sizeof(SW_T) * SW_STATE);
        sw_ck_carry(so + (p - 1) * SW_STATE, F + (it * P + p) * SW_STATE, g + p * SW_GW, SW_KEYDECAY, SW_VP, SW_VP);
      }
    }
#pragma omp for schedule(static)
    for (long w = 0; w < np; ++w) {  /* each part's backward from its carries */
      if (!ok) continue;
      const long it = w / P, p = w % P;
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long nc = SW_NCHUNKS(&x);
      for (int k = 0; k < SW_GW; ++k) ws.r[k] = 0;
      for (int k = 0; k < SW_K; ++k) ws.du[k] = 0;
      memcpy(ws.dS, dSo + w * SW_STATE, sizeof(SW_T) * SW_STATE);
      sw_ck_bwd_range(m, gr, &x, p * nc / P, (p + 1) * nc / P, Sin + w * SW_STATE, 0, gr->dq, gr->dk, &ws);
      memcpy(tot + w * SW_GW, ws.r, sizeof(double) * SW_GW);
      memcpy(dup + w * SW_K, ws.du, sizeof(double) * SW_K);
      if (p == 0) sw_ck_state_out(m, &x, ws.dS, gr->dh0);
    }
#pragma omp for schedule(static)
    for (long w = 0; w < np; ++w) {  /* dg: each part's offset from the parts after it */
      const long it = w / P, p = w % P;
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long nc = SW_NCHUNKS(&x);
      if (gr->dg && SW_DECAY) {
        double* off = ws.r;
        for (int k = 0; k < SW_GW; ++k) {
          off[k] = cterm[it * SW_GW + k];
          for (long q = p + 1; q < P; ++q) off[k] += tot[(it * P + q) * SW_GW + k];
        }
        for (long s = p * nc / P * SW_C; s < SW_MIN((p + 1) * nc / P * SW_C, x.stop - x.start); ++s) {
          SW_T* dg = gr->dg + SW_G(m, x.b, SW_AT(x.start, x.stop, s), x.h);
          for (int k = 0; k < (SW_KEYDECAY ? SW_K : 1); ++k) dg[k] = (SW_T)((double)dg[k] + off[k]);
        }
      }
      if (SW_BONUS && gr->du_part && p == 0)
        for (int k = 0; k < SW_K; ++k) {
          double sum = 0;
          for (long q = 0; q < P; ++q) sum += dup[(it * P + q) * SW_K + k];
          gr->du_part[(x.row * m->H + x.h) * SW_K + k] = (SW_T)sum;
        }
    }
    if (ok) sw_bws_free(&ws);
  }
  free(raw_st);
  free(raw_d);
  return status;
}

/* The runner's choice: parts of lanes when lanes (without groups) are fewer than the threads and long enough;
 * returns 1 with *status set when it ran the backward. */
static int sw_bws_split(const sw_ms* m, sw_bgrads* gr, int* status) {
  const long lanes = m->nseq * m->H;
  const int nth = sw_threads();
  long longest = 0;
  for (long i = 0; i < m->nseq; ++i) {
    long b, start, stop;
    sw_seq(m, i, &b, &start, &stop);
    longest = SW_MAX(longest, stop - start);
  }
  const long P = SW_MIN(nth / lanes, (longest + SW_C - 1) / SW_C / 2);
  if (m->H != m->Hq || P < 2) return 0;
  *status = sw_ck_backward_split(m, gr, lanes, P, (int)SW_MIN((long)nth, lanes * P));
  return 1;
}
"""
