"""C source of the chunked (matmul) matrix-state backward on the chunk engine (assembled by :mod:`.fused_c_matrix`).

Per lane (sequence, head), two passes over its chunks, no state ever stored
per step:

1. *chunk-boundary states*: the states at the chunks' starts run again from
   h0 through ``S_end = e^{G_last} o S_0 + Kd^T V`` (one product per chunk)
   and are kept, or, past a memory budget, kept every ``e`` chunks and
   recomputed one segment at a time in the reverse pass;
2. *reverse pass* over the chunks with the adjoint dS of the chunk's end state
   (``dhlast`` at the lane's end): with A the intra-chunk matrix of the forward,
   ``dA = mask(dO V^T)``, Qs = Q o e^{Gq}, Kd = K o e^{G_last - Gk}::

       dV   = A^T dO + Kd dS
       dQ   = e^{Gq} o (dO S_0^T) + [adjoint of A in Q]       (decay per key: sw_ck_intra_key_adjoint;
       dK   = e^{G_last-Gk} o (V dS^T) + [adjoint of A in K]   per head: P = dA o weights, P K and P^T Q)
       dS  <- e^{G_last} o dS + Qs^T dO

   and the decay gradient by the identity of the recurrent backward
   (:mod:`.matrix_c_backward`): ``dg_t = sum_{s >= t} (a_s - b_s) + c`` with
   ``a = q o dq``, ``b = k o dk`` (the state parts), ``c`` the rows of
   ``dhlast o hlast``, and for RWKV-6's bonus readout the sum over ``s > t`` of
   ``a_s`` (``dg_t`` is the running sum before step t, less ``b_t``); then the bonus
   terms (``w_t = v_t . do_t``: dq += w u o k, dk += w u o q, du += w q o k).

A chunk with a positive (or NaN) log decay runs the recurrent backward over its
steps (a forward sweep for dq and a, a reverse sweep for dk, dv, b and dS),
as its forward runs the recurrence.  The runner (threads, group slices, du)
is :mod:`.matrix_c_backward`'s ``RUN``; this module gives it its workspace,
per-head function and units of a q/k group's heads (``Q K^T`` and the products
with P shared over a range of chunks), and, with fewer (sequence, group) items
than threads, the split of each item's chunks into parts
(:mod:`.matrix_c_chunked_parts`).
"""

from __future__ import annotations

from .matrix_c_chunked_parts import BACKWARD_PARTS

BACKWARD = r"""
/* Bytes of chunk-boundary states one thread keeps before it checkpoints (sw_ck_bwd_head). */
#define SW_CK_STATE_BUDGET (64L << 20)

/* The recurrent backward over one chunk that grows: dQ, dK (state parts), dV, and dS from the chunk's end to its
 * start; S0 the state at its start. */
static void sw_ck_recurrent_backward(const sw_ms* m, const sw_lane* x, sw_ck_tiles* c, int n, const SW_T* S0,
                                     SW_T* dS) {
  SW_T *S = c->St, *d = c->s.tmp;
  memcpy(S, S0, sizeof(SW_T) * SW_STATE);
  for (int i = 0; i < n; ++i) {
    sw_ck_step_decay(c, i, d);
    const SW_T *ki = c->K + (long)i * SW_KP, *vi = c->V + (long)i * SW_VP, *oi = c->DO + (long)i * SW_VP;
    for (int k = 0; k < SW_KP; ++k) c->dQ[(long)i * SW_KP + k] = 0;
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = d[SW_KEYDECAY ? k : 0], kk = ki[k];
      SW_T* row = S + (long)k * SW_VP;
      sw_v acc = sw_vzero;
      for (int j = 0; j < SW_VP; j += SW_W) {
        const sw_v old = sw_vload(row + j), nw = dk * old + kk * sw_vload(vi + j);
        sw_vstore(row + j, nw);
        acc += (SW_BONUS ? old : nw) * sw_vload(oi + j);
      }
      c->dQ[(long)i * SW_KP + k] = sw_vhsum(acc);
    }
  }
  for (int i = n - 1; i >= 0; --i) {
    sw_ck_step_decay(c, i, d);
    const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP, *vi = c->V + (long)i * SW_VP;
    const SW_T* oi = c->DO + (long)i * SW_VP;
    SW_T* dvi = c->dV + (long)i * SW_VP;
    const SW_T beta = SW_BONUS ? sw_ck_beta(m, x, c, i) : (SW_T)0;
    for (int j = 0; j < SW_VP; j += SW_W) sw_vstore(dvi + j, beta * sw_vload(oi + j));
    for (int k = 0; k < SW_KP; ++k) c->dK[(long)i * SW_KP + k] = 0;
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = d[SW_KEYDECAY ? k : 0], kk = ki[k], qq = qi[k];
      SW_T* gk = dS + (long)k * SW_VP;
      sw_v acc = sw_vzero;
      for (int j = 0; j < SW_VP; j += SW_W) {
        const sw_v o = sw_vload(oi + j), gv = SW_BONUS ? sw_vload(gk + j) : sw_vload(gk + j) + qq * o;
        acc += gv * sw_vload(vi + j);
        sw_vstore(dvi + j, sw_vload(dvi + j) + kk * gv);
        sw_vstore(gk + j, SW_BONUS ? dk * gv + qq * o : dk * gv);
      }
      c->dK[(long)i * SW_KP + k] = sw_vhsum(acc);
    }
  }
}

/* One chunk that does not grow: dQ, dK (state parts), dV, and dS from the chunk's end to its start. */
static void sw_ck_product_backward(const sw_ms* m, const sw_lane* x, sw_ck_tiles* c, int n, const SW_T* S0,
                                   SW_T* dS) {
  sw_ck_dec* d = &c->d;
  sw_ck_last(c);
  const int reuse = sw_ck_intra(m, x, c);
  if (!reuse) sw_ck_qs(c);
  const SW_T* Qs = reuse ? c->s.xr : c->Qs;
  sw_ck_kd(c, reuse);
  sw_ck_transpose(c->V, SW_VP, n, SW_V, c->Vt, SW_CP, SW_RUP(n));
  sw_ck_lower_prod(n, SW_V, c->DO, SW_VP, c->Vt, SW_CP, c->dA);
  sw_ck_mask(c->dA, n, SW_BONUS);
  sw_ck_trmm_t(n, SW_VP, c->A, SW_CP, c->DO, SW_VP, c->dV, SW_VP, 0, 0);
  sw_gemm(n, SW_VP, SW_K, c->Kd, SW_KP, 1, dS, SW_VP, c->dV, SW_VP, 1);
  sw_ck_transpose(S0, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, c->DO, SW_VP, 1, c->St, SW_KP, c->dQ, SW_KP, 0);
  sw_ck_transpose(dS, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, c->V, SW_VP, 1, c->St, SW_KP, c->dK, SW_KP, 0);
  const int l = n - 1;
#if SW_KEYDECAY
  if (d->plain) {
    sw_ck_trmm(n, SW_KP, c->dA, SW_CP, c->s.yr, SW_KP, c->dQ, SW_KP, 1, SW_BONUS);
    sw_ck_scale_rows(c->dQ, d->Eq, SW_KP, c->dQ, n);
    sw_ck_scale_rows(c->dK, c->el, 0, c->dK, n);
    sw_ck_trmm_t(n, SW_KP, c->dA, SW_CP, c->s.xr, SW_KP, c->dK, SW_KP, 1, SW_BONUS);
    sw_ck_scale_rows(c->dK, d->Ei, SW_KP, c->dK, n);
  } else {
    for (int i = 0; i < n; ++i) {
      sw_ck_fac(SW_GAT(d->Gq, i), SW_GAT(d->Nq, i), d->Z, d->NZ, 1.0, c->s.tmp, SW_KP);
      sw_ck_scale_rows(c->dQ + (long)i * SW_KP, c->s.tmp, 0, c->dQ + (long)i * SW_KP, 1);
      sw_ck_fac(SW_GAT(d->Gk, i), SW_GAT(d->Nk, i), SW_GAT(d->Gk, l), SW_GAT(d->Nk, l), -1.0, c->s.tmp, SW_KP);
      sw_ck_scale_rows(c->dK + (long)i * SW_KP, c->s.tmp, 0, c->dK + (long)i * SW_KP, 1);
    }
    sw_ck_intra_key_adjoint(d, c->Q, c->K, SW_BONUS, c->dA, c->dQ, c->dK, &c->s);
  }
#else
  if (d->plain) {
    sw_ck_scale_by(c->dQ, SW_KP, d->Eq, c->dQ, n, SW_KP);
    for (int j = 0; j < n; j += SW_W) sw_vstore(c->s.tmp + j, sw_vload(d->Ei + j) * c->el[0]);
  } else {
    sw_ck_fac_b(d->Gq, d->Nq, 0.0, 0, 1.0, c->s.tmp, n);
    sw_ck_scale_by(c->dQ, SW_KP, c->s.tmp, c->dQ, n, SW_KP);
    sw_ck_fac_b(d->Gk, d->Nk, d->Gk[l], d->Nk[l], -1.0, c->s.tmp, n);
  }
  sw_ck_scale_by(c->dK, SW_KP, c->s.tmp, c->dK, n, SW_KP);
  sw_ck_weights(d, c->dA, c->dA, SW_BONUS, &c->s);
  if (c->Psh) {  /* P K and P^T Q once for the unit's heads; the decay gradient's halves from P o Q K^T */
    for (int i = 0; i < n; ++i) c->ap[i] = c->bp[i] = 0;
    for (int i = 0; i < n; ++i) {
      const SW_T *p = c->dA + (long)i * SW_CP, *qk = c->QKsh + (long)i * SW_CP;
      SW_T* ps = c->Psh + (long)i * SW_CP;
      double ai = 0;
      for (int j = 0; j < i + 1 - SW_BONUS; ++j) {
        const double w = (double)(p[j] * qk[j]);
        ai += w;
        c->bp[j] += w;
        ps[j] += p[j];
      }
      c->ap[i] = ai;
    }
  } else {
    sw_ck_trmm(n, SW_KP, c->dA, SW_CP, c->K, SW_KP, c->dQ, SW_KP, 1, SW_BONUS);
    sw_ck_trmm_t(n, SW_KP, c->dA, SW_CP, c->Q, SW_KP, c->dK, SW_KP, 1, SW_BONUS);
  }
#endif
  sw_ck_decay_state(c, dS);
  sw_gemm(SW_K, SW_VP, n, Qs, 1, SW_KP, c->DO, SW_VP, dS, SW_VP, 1);
}

/* One chunk's backward (loaded in c, with dout): dQ, dK, dV rows, the decay gradient's halves a and b, du, and dS
 * from the chunk's end to its start. */
static void sw_ck_backward(const sw_ms* m, const sw_lane* x, sw_ck_tiles* c, int n, const SW_T* S0, SW_T* dS,
                           double* du) {
  sw_ck_prefix(&c->d, c->G, n);
  if (c->d.grow) sw_ck_recurrent_backward(m, x, c, n, S0, dS);
  else sw_ck_product_backward(m, x, c, n, S0, dS);
  for (int i = 0; i < n; ++i) {
    const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP;
    SW_T *dqi = c->dQ + (long)i * SW_KP, *dki = c->dK + (long)i * SW_KP;
    sw_vd va = (sw_vd){0}, vb = (sw_vd){0};
    for (int k = 0; k < SW_KP; k += SW_W) {  /* pads of q and k are 0 */
      const sw_vd a = __builtin_convertvector(sw_vload(qi + k) * sw_vload(dqi + k), sw_vd);
      const sw_vd b = __builtin_convertvector(sw_vload(ki + k) * sw_vload(dki + k), sw_vd);
      if (SW_KEYDECAY) {
        memcpy(c->a + (long)i * SW_GW + k, &a, sizeof a);
        memcpy(c->b + (long)i * SW_GW + k, &b, sizeof b);
      }
      va += a;
      vb += b;
    }
    double sa = 0, sb = 0;
    for (int k = 0; k < SW_W; ++k) {
      sa += va[k];
      sb += vb[k];
    }
    if (!SW_KEYDECAY) {
      const int shared = c->Psh && !c->d.grow;
      c->a[i] = sa + (shared ? c->ap[i] : 0);
      c->b[i] = sb + (shared ? c->bp[i] : 0);
    }
    if (SW_BONUS) {
      const SW_T* up = m->u + x->h * SW_K;
      SW_T w = 0;
      for (int j = 0; j < SW_V; ++j) w += c->V[(long)i * SW_VP + j] * c->DO[(long)i * SW_VP + j];
      for (int k = 0; k < SW_K; ++k) {
        dqi[k] += w * up[k] * ki[k];
        dki[k] += w * up[k] * qi[k];
        du[k] += (double)(w * qi[k] * ki[k]);
      }
    }
  }
}

/* The chunked form's workspace of one thread: chunk tiles, nsb chunk-boundary states, the state and its adjoint. */
#if SW_CHUNKED
typedef struct {
  void *raw, *raw_r, *raw_sh;
  sw_ck_tiles c;
  SW_T *Sb, *S, *dS;
  SW_T *QKall, *Psum;  /* a decay per head with groups: Q K^T of every chunk of the unit, and P summed over its heads */
  double *r, *du;
  long nsb, use, qk0; /* qk0: the chunk of QKall's first tile */
} sw_bws;

/* The workspace for ranges of at most nc chunks (the scratch is zeroed, so it is sized to what a thread runs). */
static int sw_ck_bws_alloc(sw_bws* w, const sw_ms* m, long nc) {
  const long fit = SW_CK_STATE_BUDGET / (long)(sizeof(SW_T) * SW_STATE);
  long root = 1;
  while (root * root < nc) ++root;
  w->nsb = nc <= fit ? nc : SW_MAX(fit, 2 * root + 1);
  w->r = (double*)sw_alloc(sizeof(double) * (size_t)(SW_GW + SW_K), &w->raw_r);
  if (!w->r) return SW_ENOMEM;
  w->QKall = w->Psum = NULL;
  w->raw_sh = NULL;
  w->use = w->qk0 = 0;
  if (!SW_KEYDECAY && m->H > m->Hq) {
    w->QKall = (SW_T*)sw_alloc(sizeof(SW_T) * 2 * (size_t)(nc * SW_C * SW_CP), &w->raw_sh);
    if (!w->QKall) {
      free(w->raw_r);
      return SW_ENOMEM;
    }
    w->Psum = w->QKall + nc * SW_C * SW_CP;
  }
  w->du = w->r + SW_GW;
  if (sw_ck_alloc(&w->c, &w->raw, w->nsb + 2, &w->Sb) != SW_OK) {
    free(w->raw_r);
    free(w->raw_sh);
    return SW_ENOMEM;
  }
  w->S = w->Sb + w->nsb * SW_STATE;
  w->dS = w->S + SW_STATE;
  return SW_OK;
}

/* The chunks of the longest sequence. */
static long sw_ck_longest(const sw_ms* m) {
  long nc = 0;
  for (long i = 0; i < m->nseq; ++i) {
    long b, start, stop;
    sw_seq(m, i, &b, &start, &stop);
    nc = SW_MAX(nc, (stop - start + SW_C - 1) / SW_C);
  }
  return nc;
}

static int sw_bws_alloc(sw_bws* w, const sw_ms* m) { return sw_ck_bws_alloc(w, m, sw_ck_longest(m)); }

static void sw_bws_free(sw_bws* w) {
  free(w->raw);
  free(w->raw_r);
  free(w->raw_sh);
}

/* A unit of heads [h0, h1) sharing q and k rows over chunks [c0, c1): with a decay per head and more than one head,
 * Q K^T of each chunk once, and the sum of P over the heads zeroed. */
static void sw_ck_unit_begin(const sw_ms* m, long row, long h0, long h1, long c0, long c1, sw_bws* w) {
  w->use = w->QKall && h1 - h0 > 1;
  w->qk0 = c0;
  if (!w->use) return;
  const sw_lane x = sw_lane_at(m, row, h0);
  const long len = x.stop - x.start;
  sw_ck_tiles* c = &w->c;
  for (long ci = c0; ci < c1; ++ci) {
    const int n = (int)SW_MIN((long)SW_C, len - ci * SW_C);
    SW_T* qk = w->QKall + (ci - c0) * SW_C * SW_CP;
    sw_ck_load_qk(m, &x, ci * SW_C, n, c, 1, SW_C, SW_CK_NEXT(&x, ci, c1));
    sw_ck_transpose(c->K, SW_KP, n, SW_K, c->s.yt, SW_CP, SW_RUP(n));
    sw_ck_lower_prod(n, SW_K, c->Q, SW_KP, c->s.yt, SW_CP, qk);
    memset(w->Psum + (ci - c0) * SW_C * SW_CP, 0, sizeof(SW_T) * SW_C * SW_CP);
  }
}

/* The unit's shared products over chunks [c0, c1): dq += P K and dk += P^T Q per chunk, P summed over its heads. */
static void sw_ck_unit_end(const sw_ms* m, long row, long h0, long c0, long c1, SW_T* qd, SW_T* kd, sw_bws* w) {
  if (!w->use) return;
  const sw_lane x = sw_lane_at(m, row, h0);
  const long len = x.stop - x.start;
  sw_ck_tiles* c = &w->c;
  for (long ci = c0; ci < c1; ++ci) {
    const long s0 = ci * SW_C;
    const int n = (int)SW_MIN((long)SW_C, len - s0);
    sw_ck_load_qk(m, &x, s0, n, c, 1, SW_C, SW_CK_NEXT(&x, ci, c1));
    const SW_T* P = w->Psum + (ci - c0) * SW_C * SW_CP;
    sw_ck_trmm(n, SW_KP, P, SW_CP, c->K, SW_KP, c->dQ, SW_KP, 0, SW_BONUS);
    sw_ck_trmm_t(n, SW_KP, P, SW_CP, c->Q, SW_KP, c->dK, SW_KP, 0, SW_BONUS);
    for (int i = 0; i < n; ++i) {
      const long t = SW_AT(x.start, x.stop, s0 + i);
      SW_T *dqt = qd + SW_QK(m, x.b, t, x.hq), *dkt = kd + SW_QK(m, x.b, t, x.hq);
      for (int k = 0; k < SW_K; ++k) {
        dqt[k] += c->dQ[(long)i * SW_KP + k];
        dkt[k] += c->dK[(long)i * SW_KP + k];
      }
    }
  }
  w->use = 0;
}

/* The runner's unit: the heads [h0, h1) of one q/k group over all the sequence's chunks. */
static void sw_bws_unit_begin(const sw_ms* m, long row, long h0, long h1, sw_bws* w) {
  const sw_lane x = sw_lane_at(m, row, h0);
  sw_ck_unit_begin(m, row, h0, h1, 0, SW_NCHUNKS(&x), w);
}

static void sw_bws_unit_end(const sw_ms* m, long row, long h0, long h1, SW_T* qd, SW_T* kd, sw_bws* w) {
  const sw_lane x = sw_lane_at(m, row, h0);
  (void)h1;
  sw_ck_unit_end(m, row, h0, 0, SW_NCHUNKS(&x), qd, kd, w);
}

/* dst[k] += src[k] for k < SW_K (a row of the caller's dq or dk, and of a tile). */
SW_INLINE void sw_ck_add_row(SW_T* restrict dst, const SW_T* restrict src) {
  int k = 0;
  for (; k + SW_W <= SW_K; k += SW_W) sw_vstore(dst + k, sw_vload(dst + k) + sw_vload(src + k));
  for (; k < SW_K; ++k) dst[k] += src[k];
}

/* Row i of the chunk into dg from the running sum r (in double, from the sequence's end), which takes a_i - b_i:
 * dg_i = r after it (before it, less b_i, for the bonus readout, whose q_i reads the state before step i's decay:
 * r - b_i, not the same value as r + a_i - b_i - a_i, which would carry a non-finite a_i into dg_i where the
 * recurrence's dg_i has no a_i). */
SW_INLINE void sw_ck_dg_row(SW_T* restrict dg, const sw_ck_tiles* c, int i, double* restrict r) {
  const double *a = c->a + (long)i * SW_GW, *b = c->b + (long)i * SW_GW;
  int k = 0;
#if SW_KEYDECAY
  for (; k + SW_W <= SW_K; k += SW_W) {
    const sw_vd rk = sw_vdload(r + k), bk = sw_vdload(b + k), next = rk + (sw_vdload(a + k) - bk);
    memcpy(r + k, &next, sizeof next);
    sw_vstore(dg + k, SW_TOV(SW_BONUS ? rk - bk : next));
  }
#endif
  for (; k < (SW_KEYDECAY ? SW_K : 1); ++k) {
    const double before = r[k];
    r[k] += a[k] - b[k];
    dg[k] = (SW_T)(SW_BONUS ? before - b[k] : r[k]);
  }
}

/* The backward of chunks [c0, c1) of lane x from Sin (the state at chunk c0's start) and w->dS (the adjoint of the
 * state at chunk c1's end): dq and dk added into qd / kd, dv written, each step's dg the running sum w->r (per key,
 * in double) continued from c1's end, du added into w->du; leaves the adjoint at c0's start in w->dS.  with_c: the
 * range ends the lane, and w->r first takes the rows of dhlast o hlast. */
static void sw_ck_bwd_range(const sw_ms* m, const sw_bgrads* gr, const sw_lane* x, long c0, long c1, const SW_T* Sin,
                            int with_c, SW_T* qd, SW_T* kd, sw_bws* w) {
  sw_ck_tiles* c = &w->c;
  const long nc = c1 - c0, len = x->stop - x->start;
  long every = 1;
  while (nc > w->nsb && (nc + every - 1) / every + every > w->nsb) ++every;
  const long ncp = (nc + every - 1) / every;
  SW_T* seg = w->Sb + (every > 1 ? ncp : 0) * SW_STATE;
  /* 1: the chunk-boundary states (every chunk's, or every `every`-th as checkpoints) */
  if (Sin != w->S) memcpy(w->S, Sin, sizeof(SW_T) * SW_STATE);
  for (long ci = c0; ci < c1; ++ci) {
    if ((ci - c0) % every == 0) memcpy(w->Sb + (ci - c0) / every * SW_STATE, w->S, sizeof(SW_T) * SW_STATE);
    const int n = (int)SW_MIN((long)SW_C, len - ci * SW_C);
    sw_ck_load(m, x, ci * SW_C, n, c, NULL, 0, SW_C, SW_CK_NEXT(x, ci, c1));
    sw_ck_forward(m, x, c, n, w->S, NULL, 0);
  }
  double *r = w->r, *du = w->du;
  if (with_c && SW_HAS_DHLAST && gr->dhlast)  /* hlast's share of the decay gradient */
    for (int k = 0; k < SW_K; ++k) {
      const SW_T* src = gr->dhlast + ((x->row * m->H + x->h) * SW_K + k) * SW_V;
      double sum = 0;
      for (int j = 0; j < SW_V; ++j) sum += (double)src[j] * w->S[(long)k * SW_VP + j];
      r[SW_KEYDECAY ? k : 0] += sum;
    }
  /* 2: reverse pass, one segment of `every` chunks at a time */
  for (long sg = ncp - 1; sg >= 0; --sg) {
    const long s0c = c0 + sg * every, s1c = SW_MIN(c1, s0c + every);
    if (every > 1) {
      memcpy(w->S, w->Sb + sg * SW_STATE, sizeof(SW_T) * SW_STATE);
      for (long ci = s0c; ci < s1c; ++ci) {
        memcpy(seg + (ci - s0c) * SW_STATE, w->S, sizeof(SW_T) * SW_STATE);
        if (ci + 1 < s1c) {
          const int n = (int)SW_MIN((long)SW_C, len - ci * SW_C);
          sw_ck_load(m, x, ci * SW_C, n, c, NULL, 0, 0, 0);
          sw_ck_forward(m, x, c, n, w->S, NULL, 0);
        }
      }
    }
    for (long ci = s1c - 1; ci >= s0c; --ci) {
      const long s0 = ci * SW_C;
      const int n = (int)SW_MIN((long)SW_C, len - s0);
      sw_ck_load(m, x, s0, n, c, gr->dout, 1, -SW_C, ci > c0 ? SW_C : 0);
      c->QKsh = w->use ? w->QKall + (ci - w->qk0) * SW_C * SW_CP : NULL;
      c->Psh = w->use ? w->Psum + (ci - w->qk0) * SW_C * SW_CP : NULL;
      sw_ck_backward(m, x, c, n, every > 1 ? seg + (ci - s0c) * SW_STATE : w->Sb + (ci - c0) * SW_STATE, w->dS, du);
      for (int i = n - 1; i >= 0; --i) {
        const long t = SW_AT(x->start, x->stop, s0 + i);
        sw_ck_add_row(qd + SW_QK(m, x->b, t, x->hq), c->dQ + (long)i * SW_KP);
        sw_ck_add_row(kd + SW_QK(m, x->b, t, x->hq), c->dK + (long)i * SW_KP);
        memcpy(gr->dv + SW_VO(m, x->b, t, x->h), c->dV + (long)i * SW_VP, sizeof(SW_T) * SW_V);
        if (gr->dg && SW_DECAY) sw_ck_dg_row(gr->dg + SW_G(m, x->b, t, x->h), c, i, r);
      }
    }
  }
  c->QKsh = NULL;
  c->Psh = NULL;
}

/* The lane's adjoint (K rows of SW_VP) into / out of a (nseq, H, K, V) array (NULL: zeros in). */
static void sw_ck_adj_in(const sw_ms* m, const sw_lane* x, const SW_T* src, SW_T* dS) {
  sw_ck_state_in(m, x, SW_HAS_DHLAST ? src : NULL, dS);
}

/* Head h of sequence row: dq and dk added into qd / kd (rows of the group hq), the rest written. */
static void sw_ck_bwd_head(const sw_ms* m, const sw_bgrads* gr, long row, long h, SW_T* qd, SW_T* kd, sw_bws* w) {
  const sw_lane x = sw_lane_at(m, row, h);
  for (int k = 0; k < SW_GW; ++k) w->r[k] = 0;
  for (int k = 0; k < SW_K; ++k) w->du[k] = 0;
  sw_ck_state_in(m, &x, SW_HAS_H0 ? m->h0 : NULL, w->S);
  sw_ck_adj_in(m, &x, gr->dhlast, w->dS);
  sw_ck_bwd_range(m, gr, &x, 0, SW_NCHUNKS(&x), w->S, 1, qd, kd, w);
  sw_ck_state_out(m, &x, w->dS, gr->dh0);
  if (SW_BONUS && gr->du_part)
    for (int k = 0; k < SW_K; ++k) gr->du_part[(row * m->H + h) * SW_K + k] = (SW_T)w->du[k];
}

#define sw_bws_head(m, gr, row, b, start, stop, h, hq, qd, kd, w) sw_ck_bwd_head(m, gr, row, h, qd, kd, w)
""" + BACKWARD_PARTS + r"""
#endif
"""
