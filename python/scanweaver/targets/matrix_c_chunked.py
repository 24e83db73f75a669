"""C source of the chunked (matmul) matrix-state forward on the chunk engine (assembled by :mod:`.fused_c_matrix`).

Per lane (sequence, head), chunks of ``chunk`` steps in scan order.  With the
chunk's prefix of :mod:`.chunk_engine` (cumulative log decays since the last
reset, held in double), S_0 the state at the chunk's start and Gq the q-side
prefix (``Gk_i`` after the update, ``Gk_{i-1}`` for RWKV-6's bonus readout)::

    O      = (Q o e^{Gq}) S_0 + A V                 A: sw_ck_intra_key / sw_ck_weights (masked),
                                                    A_ii = q_i . (u o k_i) for the bonus readout
    S_end  = e^{G_last} o S_0 + (K o e^{G_last - Gk})^T V

Every factor has a non-positive exponent or one bounded by ``SW_RANGE``, and a
log decay of ``-inf`` is an exact reset.  A chunk with a positive (or NaN) log
decay runs the recurrence itself over its steps (:c:func:`sw_ck_recurrent`),
so growth is computed as the recurrence defines it and overflows exactly where
it does.  The threads' work units are the q/k groups of each sequence (the
heads of a group share a chunk's rows of q and k and, for a decay per head,
``Q K^T``: Mamba-2's 24 heads per group of B and C), the group's heads cut
into slices when groups are fewer than the threads.  When even the lanes
(sequence, head) are fewer than the threads, each lane is cut into parts of
whole chunks: the parts but the last run from a
zero state to their end state and summed log decays, the carries are chained
by ``sw_ck_carry`` (the affine scan over parts), and every part reruns from its
carry writing o.

Entry: ``sw_forward_chunked(m, o, hlast)`` called by ``sw_matrix_state_forward``.
"""

from __future__ import annotations

from .chunk_tiles import CHUNK_TILES
from .matrix_c_chunked_parts import FORWARD_PARTS

TILES = r"""
/* ---- the diagonal family's chunks ---- */
/* One lane: sequence row (batch index b, time range [start, stop)), head h and its q/k head hq. */
typedef struct { long b, start, stop, h, hq, row; } sw_lane;

static sw_lane sw_lane_at(const sw_ms* m, long row, long h) {
  sw_lane x;
  sw_seq(m, row, &x.b, &x.start, &x.stop);
  x.h = h;
  x.hq = h / (m->H / m->Hq);
  x.row = row;
  return x;
}

#define SW_NCHUNKS(x) (((x)->stop - (x)->start + SW_C - 1) / SW_C)

/* Rows of scan positions [s0, s0 + n) of lane x into the tiles: q (with q_rows) and k, the rows its group shares.
 * Row i of the chunk at s0 + ahead (nn rows of it) is prefetched as row i is copied: rows of consecutive steps are
 * H*K apart (a page apart at H*K = 1024 floats, where no hardware prefetcher follows), and a burst of a whole chunk's
 * prefetches would overflow the miss buffers. */
static void sw_ck_load_qk(const sw_ms* m, const sw_lane* x, long s0, int n, sw_ck_tiles* c, int q_rows, long ahead,
                          int nn) {
  for (int i = 0; i < n; ++i) {
    const long t = SW_AT(x->start, x->stop, s0 + i);
    if (i < nn) {
      const long tn = SW_AT(x->start, x->stop, s0 + ahead + i);
      if (q_rows) sw_ck_prefetch_row(m->q + SW_QK(m, x->b, tn, x->hq), SW_K);
      sw_ck_prefetch_row(m->k + SW_QK(m, x->b, tn, x->hq), SW_K);
    }
    if (q_rows) sw_copy_pad(c->Q + (long)i * SW_KP, m->q + SW_QK(m, x->b, t, x->hq), SW_K, SW_KP);
    sw_copy_pad(c->K + (long)i * SW_KP, m->k + SW_QK(m, x->b, t, x->hq), SW_K, SW_KP);
  }
  c->qk = 0;
}

/* The head's rows of the chunk: v, the log decays and dout (when given); prefetches as sw_ck_load_qk. */
static void sw_ck_load_head(const sw_ms* m, const sw_lane* x, long s0, int n, sw_ck_tiles* c, const SW_T* dout,
                            long ahead, int nn) {
  for (int i = 0; i < n; ++i) {
    const long t = SW_AT(x->start, x->stop, s0 + i);
    if (i < nn) {
      const long tn = SW_AT(x->start, x->stop, s0 + ahead + i);
      sw_ck_prefetch_row(m->v + SW_VO(m, x->b, tn, x->h), SW_V);
      if (dout) sw_ck_prefetch_row(dout + SW_VO(m, x->b, tn, x->h), SW_V);
      if (SW_DECAY) sw_ck_prefetch_row(m->g + SW_G(m, x->b, tn, x->h), SW_KEYDECAY ? SW_K : 1);
    }
    sw_copy_pad(c->V + (long)i * SW_VP, m->v + SW_VO(m, x->b, t, x->h), SW_V, SW_VP);
    if (dout) sw_copy_pad(c->DO + (long)i * SW_VP, dout + SW_VO(m, x->b, t, x->h), SW_V, SW_VP);
#if SW_DECAY == 2
    sw_copy_pad(c->G + (long)i * SW_KP, m->g + SW_G(m, x->b, t, x->h), SW_K, SW_KP);
#elif SW_DECAY == 1
    c->G[i] = m->g[SW_G(m, x->b, t, x->h)];
#else
    c->G[i] = 0;
#endif
  }
}

static void sw_ck_load(const sw_ms* m, const sw_lane* x, long s0, int n, sw_ck_tiles* c, const SW_T* dout,
                       int q_rows, long ahead, int nn) {
  sw_ck_load_qk(m, x, s0, n, c, q_rows, ahead, nn);
  sw_ck_load_head(m, x, s0, n, c, dout, ahead, nn);
}

/* Steps of the chunk after chunk ci of lane x when it is before chunk c1 (0 otherwise). */
#define SW_CK_NEXT(x, ci, c1) \
  ((ci) + 1 < (c1) ? (int)SW_MIN((long)SW_C, (x)->stop - (x)->start - ((ci) + 1) * SW_C) : 0)

/* The lane's row of a (nseq, H, K, V) state into / out of S (K rows of SW_VP). */
static void sw_ck_state_in(const sw_ms* m, const sw_lane* x, const SW_T* src, SW_T* S) {
  for (int k = 0; k < SW_K; ++k) {
    if (src) sw_copy_pad(S + (long)k * SW_VP, src + ((x->row * m->H + x->h) * SW_K + k) * SW_V, SW_V, SW_VP);
    else memset(S + (long)k * SW_VP, 0, sizeof(SW_T) * SW_VP);
  }
}

static void sw_ck_state_out(const sw_ms* m, const sw_lane* x, const SW_T* S, SW_T* dst) {
  if (dst)
    for (int k = 0; k < SW_K; ++k)
      memcpy(dst + ((x->row * m->H + x->h) * SW_K + k) * SW_V, S + (long)k * SW_VP, sizeof(SW_T) * SW_V);
}

/* beta_i = q_i . (u o k_i), the bonus readout's diagonal (rows of the tiles). */
SW_INLINE SW_T sw_ck_beta(const sw_ms* m, const sw_lane* x, const sw_ck_tiles* c, int i) {
  const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP, *up = m->u + x->h * SW_K;
  SW_T beta = 0;
  for (int k = 0; k < SW_K; ++k) beta += qi[k] * up[k] * ki[k];
  return beta;
}

/* The intra-chunk matrix A of Q and K (masked; the bonus diagonal for RWKV-6); returns 1 when the plain intra left
 * Qs (as s.xr) and K o e^{-Gk} (as s.yr) behind. */
static int sw_ck_intra(const sw_ms* m, const sw_lane* x, sw_ck_tiles* c) {
  const int n = c->d.n;
  int plain = 0;
#if SW_KEYDECAY
  sw_ck_intra_key(&c->d, c->Q, c->K, SW_BONUS, c->A, &c->s);
  plain = c->d.plain;
#else
  if (!c->QKsh && !c->qk) {  /* Q K^T once per loaded chunk: the heads of a group share it */
    sw_ck_transpose(c->K, SW_KP, n, SW_K, c->s.yt, SW_CP, SW_RUP(n));
    sw_ck_lower_prod(n, SW_K, c->Q, SW_KP, c->s.yt, SW_CP, c->QK);
    c->qk = 1;
  }
  sw_ck_weights(&c->d, c->QKsh ? c->QKsh : c->QK, c->A, SW_BONUS, &c->s);
#endif
  if (SW_BONUS)
    for (int i = 0; i < n; ++i) c->A[(long)i * SW_CP + i] = sw_ck_beta(m, x, c, i);
  return plain;
}
"""

FORWARD = r"""
/* The recurrence itself over the chunk's n steps from S (a chunk that grows): o rows into O (ldo apart) when out. */
static void sw_ck_recurrent(const sw_ms* m, const sw_lane* x, sw_ck_tiles* c, int n, SW_T* S, SW_T* O, long ldo) {
  const int out = O != NULL;
  SW_T* d = c->s.tmp;
  for (int i = 0; i < n; ++i) {
    sw_ck_step_decay(c, i, d);
    const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP, *vi = c->V + (long)i * SW_VP;
    SW_T* oi = out ? O + i * ldo : NULL;
    if (out) {
      const SW_T beta = SW_BONUS ? sw_ck_beta(m, x, c, i) : (SW_T)0;
      for (int j = 0; j < SW_VP; j += SW_W) sw_vstore(oi + j, beta * sw_vload(vi + j));
    }
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = d[SW_KEYDECAY ? k : 0], kk = ki[k], qq = qi[k];
      SW_T* row = S + (long)k * SW_VP;
      for (int j = 0; j < SW_VP; j += SW_W) {
        const sw_v old = sw_vload(row + j), nw = dk * old + kk * sw_vload(vi + j);
        sw_vstore(row + j, nw);
        if (out) sw_vstore(oi + j, sw_vload(oi + j) + qq * (SW_BONUS ? old : nw));
      }
    }
  }
}

/* One chunk of n steps (loaded in c) from the state S (updated); o rows into O (ldo apart) unless O is NULL. */
static void sw_ck_forward(const sw_ms* m, const sw_lane* x, sw_ck_tiles* c, int n, SW_T* S, SW_T* O, long ldo) {
  sw_ck_prefix(&c->d, c->G, n);
  if (c->d.grow) {
    sw_ck_recurrent(m, x, c, n, S, O, ldo);
    return;
  }
  sw_ck_last(c);
  int reuse = 0;
  if (O) {
    reuse = sw_ck_intra(m, x, c);
    if (!reuse) sw_ck_qs(c);
    sw_gemm(n, SW_VP, SW_K, reuse ? c->s.xr : c->Qs, SW_KP, 1, S, SW_VP, O, ldo, 0);
    sw_ck_trmm(n, SW_VP, c->A, SW_CP, c->V, SW_VP, O, ldo, 1, 0);
  }
  sw_ck_kd(c, reuse);
  sw_ck_decay_state(c, S);
  sw_gemm(SW_K, SW_VP, n, c->Kd, 1, SW_KP, c->V, SW_VP, S, SW_VP, 1);
}

/* The chunk's summed log decays (per key, or [0]) added to gs: -inf after a reset. */
static void sw_ck_sum_decays(const sw_ck_tiles* c, double* gs) {
  const int l = c->d.n - 1;
  for (int k = 0; k < (SW_KEYDECAY ? SW_K : 1); ++k)
    gs[k] += SW_GAT(c->d.Nk, l)[k] != 0 ? -INFINITY : SW_GAT(c->d.Gk, l)[k];
}

/* Chunks [c0, c1) of the heads [h0, h1) of one q/k group of sequence row, from their states S (SW_STATE apart):
 * a chunk's rows of q and k (and Q K^T) are loaded once for all of them, then each head runs the chunk.  Writes o
 * when given; adds each head's summed log decays to its row of gs (SW_GW apart) when given. */
static void sw_ck_unit_forward(const sw_ms* m, long row, long h0, long h1, long c0, long c1, sw_ck_tiles* c, SW_T* S,
                               SW_T* o, double* gs) {
  const sw_lane x0 = sw_lane_at(m, row, h0);
  const long len = x0.stop - x0.start;
  for (long ci = c0; ci < c1; ++ci) {
    const long s0 = ci * SW_C;
    const int n = (int)SW_MIN((long)SW_C, len - s0), nn = SW_CK_NEXT(&x0, ci, c1);
    sw_ck_load_qk(m, &x0, s0, n, c, o != NULL, SW_C, nn);
    for (long h = h0; h < h1; ++h) {
      const sw_lane x = sw_lane_at(m, row, h);
      sw_ck_load_head(m, &x, s0, n, c, NULL, SW_C, nn);
      /* o's rows take the products directly when they are whole vectors (scan order: H*V apart, back in reverse) */
      const int direct = o && SW_V % SW_W == 0;
      SW_T* O = direct ? o + SW_VO(m, x.b, SW_AT(x.start, x.stop, s0), h) : o ? c->O : NULL;
      sw_ck_forward(m, &x, c, n, S + (h - h0) * SW_STATE, O, direct ? (SW_REVERSE ? -1 : 1) * m->H * SW_V : SW_VP);
      if (gs) sw_ck_sum_decays(c, gs + (h - h0) * SW_GW);
      if (o && !direct)
        for (int i = 0; i < n; ++i)
          memcpy(o + SW_VO(m, x.b, SW_AT(x.start, x.stop, s0 + i), h), c->O + (long)i * SW_VP, sizeof(SW_T) * SW_V);
    }
  }
}

"""

DRIVER = r"""
static int sw_forward_chunked(const sw_ms* m, SW_T* o, SW_T* hlast) {
  const long lanes = m->nseq * m->H, groups = m->nseq * m->Hq, grp = m->H / m->Hq;
  const int nth = sw_threads();
  long longest = 0;
  for (long i = 0; i < m->nseq; ++i) {
    long b, start, stop;
    sw_seq(m, i, &b, &start, &stop);
    longest = SW_MAX(longest, stop - start);
  }
  const long P = SW_MIN(nth / lanes, (longest + SW_C - 1) / SW_C / 2);
  if (P >= 2) return sw_ck_forward_split(m, o, hlast, lanes, P, (int)SW_MIN((long)nth, lanes * P));
  /* units: a q/k group of one sequence, its heads cut into slices when groups are fewer than the threads */
  const long slices = SW_MIN(grp, (nth + groups - 1) / groups), units = groups * slices;
  const int nt = (int)SW_MIN((long)nth, units);
  int status = SW_OK;
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    void* raw;
    sw_ck_tiles c;
    SW_T* S = NULL;
    const int ok = sw_ck_alloc(&c, &raw, (grp + slices - 1) / slices, &S) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(dynamic, 1)
    for (long u = 0; u < units; ++u) {
      if (!ok) continue;
      const long gi = u / slices, sl = u % slices, row = gi / m->Hq, hq = gi % m->Hq;
      const long h0 = hq * grp + sl * grp / slices, h1 = hq * grp + (sl + 1) * grp / slices;
      for (long h = h0; h < h1; ++h) {
        const sw_lane x = sw_lane_at(m, row, h);
        sw_ck_state_in(m, &x, SW_HAS_H0 ? m->h0 : NULL, S + (h - h0) * SW_STATE);
      }
      const sw_lane x0 = sw_lane_at(m, row, h0);
      sw_ck_unit_forward(m, row, h0, h1, 0, SW_NCHUNKS(&x0), &c, S, o, NULL);
      for (long h = h0; h < h1; ++h) {
        const sw_lane x = sw_lane_at(m, row, h);
        sw_ck_state_out(m, &x, S + (h - h0) * SW_STATE, hlast);
      }
    }
    if (ok) free(raw);
  }
  return status;
}
"""

#: The chunked forward's C text: the family's tiles and chunk pieces, the parts of lanes, then the forward itself.
CHUNKED = CHUNK_TILES + TILES + FORWARD + FORWARD_PARTS + DRIVER
