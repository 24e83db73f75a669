"""C source of the chunk-parallel carries of the chunked matrix-state form ("parts"), forward and backward.

When a call has fewer lanes (sequence, head) than threads (forward) or fewer
q/k groups (sequence, group) than threads (backward), each lane's chunks are
cut into P parts of whole chunks, and the affine map of a part carries what
crosses it, as the chunk engine's carry does between chunks:

* forward: the parts but the last run from a zero state to their end state
  E_p and summed log decays G_p; the carries are chained
  ``S_{p+1} = e^{G_p} o S_p + E_p`` (``sw_ck_carry``: in double, and E_p where
  S_p is 0), and every part reruns from its carry writing o;
* backward: the unit is one part of one q/k group (sequence, group), its
  heads run one after another, so the parts of different threads own disjoint
  rows of dq and dk (no partial copies) and the group's ``Q K^T`` and
  ``P K``, ``P^T Q`` are shared by its heads as in the unsplit backward.  Every
  part but the last runs to its heads' local end states E_p, every part but
  the first, in reverse, to its heads' local adjoints F_p (the adjoint at its
  start for a zero adjoint at its end: ``dS <- e^{G_last} o dS + Qs^T dO`` per
  chunk, or the recurrence on a chunk that grows; the last part sums its log
  decays there); per lane, the states at the parts' starts are chained forward
  as above and the adjoints at their ends in reverse,
  ``dS_{p-1} = e^{G_p} o dS_p + F_p`` (from dhlast); each part then runs the
  chunked backward from its two carries, its decay gradient a running sum from
  its own end (the last part's from the rows of dhlast o hlast, its end state
  being the lane's); last, each part's steps of dg take the offset
  ``sum_{q > p} (a - b summed over part q)``, and du sums the parts'.

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
/* The adjoints of the states of heads [h0, h1) of one q/k group of sequence row through chunks [c0, c1) in reverse:
 * each head's dS (SW_STATE apart) from the adjoint at c1's end to the one at c0's start, with the outputs' adjoints
 * flowing in (a part's local adjoints from zero); a chunk's rows of q are loaded once for all of them; each head's
 * summed log decays added to its row of gs (SW_GW apart) when given. */
static void sw_ck_unit_adjoint(const sw_ms* m, long row, long h0, long h1, long c0, long c1, sw_ck_tiles* c, SW_T* dS,
                               const SW_T* dout, double* gs) {
  const sw_lane x0 = sw_lane_at(m, row, h0);
  const long len = x0.stop - x0.start;
  for (long ci = c1 - 1; ci >= c0; --ci) {
    const long s0 = ci * SW_C;
    const int n = (int)SW_MIN((long)SW_C, len - s0), nn = ci > c0 ? SW_C : 0;
    sw_ck_load_qk(m, &x0, s0, n, c, 1, -SW_C, nn);
    for (long h = h0; h < h1; ++h) {
      const sw_lane x = sw_lane_at(m, row, h);
      SW_T* S = dS + (h - h0) * SW_STATE;
      sw_ck_load_head(m, &x, s0, n, c, dout, -SW_C, nn);
      sw_ck_prefix(&c->d, c->G, n);
      if (gs) sw_ck_sum_decays(c, gs + (h - h0) * SW_GW);
      if (!c->d.grow) {
        sw_ck_last(c);
        sw_ck_qs(c);
        sw_ck_decay_state(c, S);
        sw_gemm(SW_K, SW_VP, n, c->Qs, 1, SW_KP, c->DO, SW_VP, S, SW_VP, 1);
        continue;
      }
      for (int i = n - 1; i >= 0; --i) {  /* the recurrence: G = q do^T + d G (after), d G + q do^T (bonus) */
        sw_ck_step_decay(c, i, c->s.tmp);
        const SW_T *qi = c->Q + (long)i * SW_KP, *oi = c->DO + (long)i * SW_VP;
        for (int k = 0; k < SW_K; ++k) {
          const SW_T dk = c->s.tmp[SW_KEYDECAY ? k : 0], qq = qi[k];
          SW_T* r = S + (long)k * SW_VP;
          for (int j = 0; j < SW_VP; j += SW_W) {
            const sw_v o = sw_vload(oi + j), g = sw_vload(r + j);
            sw_vstore(r + j, SW_BONUS ? dk * g + qq * o : dk * (g + qq * o));
          }
        }
      }
    }
  }
}

/* The slot of (lane it, part p) in the split's per-part arrays: the heads of one q/k group adjacent within a part, as
 * sw_ck_unit_forward takes their states. */
SW_INLINE long sw_ck_slot(long it, long p, long P, long grp) { return (it / grp * P + p) * grp + it % grp; }

/* Few q/k groups (sequence, group) for the threads, backward: each group's chunks cut into P parts, a unit being one
 * part of one group with its heads run one after another (see the module notes).  Returns the status; the caller
 * reduces du_part. */
static int sw_ck_backward_split(const sw_ms* m, sw_bgrads* gr, long units, long P, int nth) {
  const long span = (sw_ck_longest(m) + P - 1) / P;  /* the chunks of a part at most */
  const long grp = m->H / m->Hq, lanes = units * grp, np = lanes * P;
  void *raw_st, *raw_d;
  SW_T* st = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)(4 * np * SW_STATE), &raw_st);
  double* dd = (double*)sw_alloc(sizeof(double) * (size_t)(np * (2 * SW_GW + SW_K)), &raw_d);
  if (!st || !dd) {
    free(raw_st);
    free(raw_d);
    return SW_ENOMEM;
  }
  SW_T *E = st, *F = E + np * SW_STATE, *Sin = F + np * SW_STATE, *dSo = Sin + np * SW_STATE;
  double *gs = dd, *tot = gs + np * SW_GW, *dup = tot + np * SW_GW;
  memset(dd, 0, sizeof(double) * (size_t)(np * (2 * SW_GW + SW_K)));
  int status = SW_OK;
  (void)nth;
#pragma omp parallel num_threads(nth)
  {
    sw_bws ws;
    const int ok = sw_ck_bws_alloc(&ws, m, span) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long w = 0; w < units * P; ++w) {  /* each unit's rows of dq and dk zeroed; its heads' local end states,
                                             * summed decays and local adjoints */
      const long p = w % P, row = w / P / m->Hq, h0 = w / P % m->Hq * grp;
      const sw_lane x0 = sw_lane_at(m, row, h0);
      const long nc = SW_NCHUNKS(&x0), a = p * nc / P, b = (p + 1) * nc / P;
      memset(E + w * grp * SW_STATE, 0, sizeof(SW_T) * (size_t)(grp * SW_STATE));
      memset(F + w * grp * SW_STATE, 0, sizeof(SW_T) * (size_t)(grp * SW_STATE));
      if (!ok) continue;
      for (long s = a * SW_C; s < SW_MIN(b * SW_C, x0.stop - x0.start); ++s) {
        const long t = SW_AT(x0.start, x0.stop, s);
        memset(gr->dq + SW_QK(m, x0.b, t, x0.hq), 0, sizeof(SW_T) * SW_K);
        memset(gr->dk + SW_QK(m, x0.b, t, x0.hq), 0, sizeof(SW_T) * SW_K);
      }
      if (p + 1 < P)
        sw_ck_unit_forward(m, row, h0, h0 + grp, a, b, &ws.c, E + w * grp * SW_STATE, NULL, gs + w * grp * SW_GW);
      if (p > 0)  /* the last part's summed decays here: its end state is not needed */
        sw_ck_unit_adjoint(m, row, h0, h0 + grp, a, b, &ws.c, F + w * grp * SW_STATE, gr->dout,
                           p + 1 == P ? gs + w * grp * SW_GW : NULL);
    }
#pragma omp for schedule(static)
    for (long it = 0; it < lanes; ++it) {  /* the carries: states forward, adjoints in reverse */
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long s0 = sw_ck_slot(it, 0, P, grp), step = grp * SW_STATE;  /* a lane's parts are grp slots apart */
      SW_T *e = E + s0 * SW_STATE, *f = F + s0 * SW_STATE, *si = Sin + s0 * SW_STATE, *so = dSo + s0 * SW_STATE;
      double* g = gs + s0 * SW_GW;
      for (long p = 0; p < P; ++p)
        for (int k = 0; k < SW_GW; ++k) g[p * grp * SW_GW + k] = exp(g[p * grp * SW_GW + k]);
      sw_ck_state_in(m, &x, SW_HAS_H0 ? m->h0 : NULL, si);
      for (long p = 0; p + 1 < P; ++p) {
        memcpy(si + (p + 1) * step, si + p * step, sizeof(SW_T) * SW_STATE);
        sw_ck_carry(si + (p + 1) * step, e + p * step, g + p * grp * SW_GW, SW_KEYDECAY, SW_VP, SW_VP);
      }
      sw_ck_adj_in(m, &x, gr->dhlast, so + (P - 1) * step);
      for (long p = P - 1; p > 0; --p) {
        memcpy(so + (p - 1) * step, so + p * step, sizeof(SW_T) * SW_STATE);
        sw_ck_carry(so + (p - 1) * step, f + p * step, g + p * grp * SW_GW, SW_KEYDECAY, SW_VP, SW_VP);
      }
    }
#pragma omp for schedule(static)
    for (long w = 0; w < units * P; ++w) {  /* each unit's backward from its heads' carries */
      if (!ok) continue;
      const long p = w % P, row = w / P / m->Hq, h0 = w / P % m->Hq * grp;
      const sw_lane x0 = sw_lane_at(m, row, h0);
      const long nc = SW_NCHUNKS(&x0), a = p * nc / P, b = (p + 1) * nc / P;
      sw_ck_unit_begin(m, row, h0, h0 + grp, a, b, &ws);
      for (long j = 0; j < grp; ++j) {
        const sw_lane x = sw_lane_at(m, row, h0 + j);
        const long sl = w * grp + j;
        for (int k = 0; k < SW_GW; ++k) ws.r[k] = 0;
        for (int k = 0; k < SW_K; ++k) ws.du[k] = 0;
        memcpy(ws.dS, dSo + sl * SW_STATE, sizeof(SW_T) * SW_STATE);
        sw_ck_bwd_range(m, gr, &x, a, b, Sin + sl * SW_STATE, p + 1 == P, gr->dq, gr->dk, &ws);
        memcpy(tot + sl * SW_GW, ws.r, sizeof(double) * SW_GW);
        memcpy(dup + sl * SW_K, ws.du, sizeof(double) * SW_K);
        if (p == 0) sw_ck_state_out(m, &x, ws.dS, gr->dh0);
      }
      sw_ck_unit_end(m, row, h0, a, b, gr->dq, gr->dk, &ws);
    }
#pragma omp for schedule(static)
    for (long sl = 0; sl < np; ++sl) {  /* dg: each part's offset from the parts after it (per lane) */
      const long p = sl / grp % P, it = sl / grp / P * grp + sl % grp;
      const sw_lane x = sw_lane_at(m, it / m->H, it % m->H);
      const long nc = SW_NCHUNKS(&x);
      if (gr->dg && SW_DECAY) {
        double* off = ws.r;
        for (int k = 0; k < SW_GW; ++k) {
          off[k] = 0;
          for (long q = p + 1; q < P; ++q) off[k] += tot[sw_ck_slot(it, q, P, grp) * SW_GW + k];
        }
        for (long s = p * nc / P * SW_C; s < SW_MIN((p + 1) * nc / P * SW_C, x.stop - x.start); ++s) {
          SW_T* dg = gr->dg + SW_G(m, x.b, SW_AT(x.start, x.stop, s), x.h);
          for (int k = 0; k < (SW_KEYDECAY ? SW_K : 1); ++k) dg[k] = (SW_T)((double)dg[k] + off[k]);
        }
      }
      if (SW_BONUS && gr->du_part && p == 0)
        for (int k = 0; k < SW_K; ++k) {
          double sum = 0;
          for (long q = 0; q < P; ++q) sum += dup[sw_ck_slot(it, q, P, grp) * SW_K + k];
          gr->du_part[(x.row * m->H + x.h) * SW_K + k] = (SW_T)sum;
        }
    }
    if (ok) sw_bws_free(&ws);
  }
  free(raw_st);
  free(raw_d);
  return status;
}

/* The runner's choice: parts of q/k groups when groups (sequence, group) are fewer than the threads and long enough;
 * returns 1 with *status set when it ran the backward. */
static int sw_bws_split(const sw_ms* m, sw_bgrads* gr, int* status) {
  const long units = m->nseq * m->Hq;
  const int nth = sw_threads();
  const long P = SW_MIN(nth / units, sw_ck_longest(m) / 2);
  if (P < 2) return 0;
  *status = sw_ck_backward_split(m, gr, units, P, (int)SW_MIN((long)nth, units * P));
  return 1;
}
"""
