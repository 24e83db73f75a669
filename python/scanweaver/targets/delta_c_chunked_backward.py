"""C source of the chunked (WY / UT transform) delta-rule backward on the chunk engine (assembled by
:mod:`.fused_c_delta_rule` after :mod:`.delta_c_backward`, whose entry calls it when ``SW_CHUNKED``).

The ``delta`` form (DeltaNet, Gated DeltaNet, KDA).  One work item per
(sequence, q/k head), as the recurrent backward: its value heads one after
another, dq and dk summed over them in the thread's rows and passed back
through the L2 normalisation once (``sw_bwd_qk``).  Per value head (lane),
two passes over its chunks, no state ever stored per step:

1. *chunk-boundary states*: the states at the chunks' starts run again from h0
   through the chunked forward (``sw_wy_chunk`` without its outputs) and are kept, or, past a
   memory budget, kept every ``e`` chunks and recomputed one segment at a
   time in the reverse pass (as :mod:`.matrix_c_chunked_backward`);
2. *reverse pass* over the chunks with dS the adjoint of the chunk's end state
   (``dhlast`` at the lane's end).  In the notation of :mod:`.delta_c_chunked`
   (``A = Q K^T o Gamma o M_incl``, ``N = -strict(K K^T o Gamma)``, ``X_i = R_i +
   sum_{j<i} N_ij U_j`` the residuals, ``U = diag(beta) X``, ``Kg = K o e^{G}``,
   ``Qg = Q o e^{G}``, ``Kd = K o e^{G_last - G}``)::

       dU   = A^T dO + Kd dS                       (the total adjoint of U)
       W    = dU + (N^T diag(beta) W)  (strictly upper: a backward substitution, sw_wy_solve_t)
       dV   = diag(beta) W;  dbeta_i = W_i . X_i
       dQ   = e^{G} o (dO S_0^T) + [adjoint of A in Q]
       dKx  = e^{G_last - G} o (U dS^T) + [adjoint of A in K] + [adjoint of K K^T o Gamma in its columns]
       dKy  = -e^{G} o (dV S_0^T) + [adjoint of K K^T o Gamma in its rows]     (dA of K K^T o Gamma: -dV U^T)
       dS  <- e^{G_last} o dS + Qg^T dO - Kg^T dV

   with the intra-chunk adjoints of the engine (``sw_ck_intra_key_adjoint`` for
   a decay per key; ``sw_ck_weights`` and two triangular products otherwise).

k plays two parts in a step: the column of the update (``S += k u^T``, dKx)
and the row of the projection (``u = beta (v - S'^T k)``, dKy); dk is their
sum.  The decay gradient comes from the identity of the gauge ``S_t ->
Lambda_t^{-1} S_t`` (per key, or one value): q and the projection's k scale by
``Lambda_t``, the update's k by ``Lambda_t^{-1}``, so ``dg_t = sum_{s >= t}
l_s + rows(dhlast o hlast)`` with ``l_s = q_s o dq_s + k_s o dKy_s - k_s o
dKx_s`` (summed over the keys for a decay per head), a running sum in double
from the lane's end, as the diagonal family's chunked backward does.  At a
reset (a log decay below ``SW_RESET_BELOW``: its decay is 0 in the storage
type) the sum is 0 exactly, as the recurrence's ``rows(S'_t o Gs)`` with
``S'_t = 0``; the running sum restarts there.

The recurrence's ``dg_t = rows(S_{t-1} o dS_{t-1})`` is non-finite only where
that state or its adjoint is, but one non-finite ``l_s`` would make the running
sum so at every earlier step.  So where the running sum is not finite
(``sw_wyb_dg``) a row takes the same value summed from the chunk's start,
``f_i = f_{i-1} - l_{i-1}`` from ``f_0 = rows(S_0 o dS_0)`` (its start state
and the adjoint the chunk's backward leaves), or, past a reset at row j, from
``f_{j+1} = rows(S_j o dS_j)`` with ``S_j`` and ``dS_j`` run by the recurrence
inside the chunk (``sw_wyb_after_reset``: only in a chunk with a non-finite
sum, and only for a reset that a later row needs); and the sum carried to the
previous chunk restarts from ``f_0``.  A non-finite term so stays out of the
rows whose state and adjoint it does not reach, as in the recurrence.  An all-finite lane
reads the running sum only (its results as before; the adjoint at each chunk's
end is kept, one copy of the state per chunk, for ``sw_wyb_after_reset``).

A lane with a positive (or NaN) log decay, whose forward runs those chunks
by the recurrence (``sw_wy_recurrent``), runs the recurrent backward of
:mod:`.delta_c_backward` (``sw_bwd_head``) entirely, so the gradients of
growth are those of the recurrence.  The ``dplr`` form (RWKV-7) has no
chunked backward: its kernels are rendered without ``SW_CHUNKED`` (see
:func:`~.fused_c_delta_rule.chunked`).

Example:
    >>> from scanweaver.targets.delta_c_chunked_backward import WY_BACKWARD
    >>> "sw_wy_solve_t" in WY_BACKWARD
    True
"""

from __future__ import annotations

WY_BACKWARD = r"""
#if SW_CHUNKED && !SW_DPLR
/* ---- the delta rule's chunked backward (WY form) ---- */
/* Bytes of chunk-boundary states one thread keeps before it checkpoints (as the diagonal family's). */
#define SW_WY_STATE_BUDGET (64L << 20)

/* A thread's workspace: chunk tiles, nsb chunk-boundary states, the state and its adjoint, the adjoint at the
 * chunk's end (dSe), a state and an adjoint inside the chunk (Sr, dSr) with a row u and decays d, the residuals X, W
 * (the adjoint of U), dKy, a product before its factors, Kg (rows of SW_VP or SW_KP), dbeta per row; in double,
 * SW_GW values each: the decay gradient's running sum r, the sum from the chunk's start (b0, then f), the value after
 * a reset from the state (bs), and per row the chunk's terms l and the running sums rr. */
typedef struct {
  sw_ck_tiles c;
  void *raw, *raw_x;
  SW_T *Sb, *S, *dS, *dSe, *Sr, *dSr, *u, *d, *X, *W, *dKy, *t1, *Kg, *db;
  double *r, *b0, *bs, *l, *rr;
  long nsb;
} sw_wyb;

static int sw_wyb_alloc(sw_wyb* y, const sw_dr* m) {
  const long nc = (sw_longest(m) + SW_C - 1) / SW_C, fit = SW_WY_STATE_BUDGET / (long)(sizeof(SW_T) * SW_STATE);
  long root = 1;
  while (root * root < nc) ++root;
  y->nsb = nc <= fit ? nc : SW_MAX(fit, 2 * root + 1);
  const size_t cv = (size_t)SW_C * SW_VP, ck = (size_t)SW_C * SW_KP;
  const size_t dgw = (size_t)(2 * SW_C + 3) * SW_GW;
  char* p = (char*)sw_alloc(sizeof(SW_T) * (2 * cv + 3 * ck + SW_CP) + sizeof(double) * dgw + 64, &y->raw_x);
  if (!p) return SW_ENOMEM;
  y->X = (SW_T*)p, y->W = y->X + cv, y->dKy = y->W + cv, y->t1 = y->dKy + ck, y->Kg = y->t1 + ck;
  y->db = y->Kg + ck;
  y->r = (double*)(((uintptr_t)(y->db + SW_CP) + 7) & ~(uintptr_t)7);
  y->b0 = y->r + SW_GW, y->bs = y->b0 + SW_GW, y->l = y->bs + SW_GW, y->rr = y->l + (long)SW_C * SW_GW;
  if (sw_ck_alloc(&y->c, &y->raw, y->nsb + 7, &y->Sb) != SW_OK) {
    free(y->raw_x);
    return SW_ENOMEM;
  }
  y->S = y->Sb + y->nsb * SW_STATE;
  y->dS = y->S + SW_STATE;
  y->dSe = y->dS + SW_STATE, y->Sr = y->dSe + SW_STATE, y->dSr = y->Sr + SW_STATE;
  y->u = y->dSr + SW_STATE, y->d = y->u + SW_STATE;
  return SW_OK;
}

/* W (the total adjoint of U, from dU in place) with W_i = dU_i + sum_{j>i} N_ji BW_j and BW = diag(beta) W: the
 * transpose of sw_wy_solve, blocks of SW_MR rows from the last, the later rows by one product. */
static void sw_wy_solve_t(const SW_T* N, const SW_T* beta, SW_T* W, SW_T* BW, int n) {
  for (int i0 = (n - 1) / SW_MR * SW_MR; i0 >= 0; i0 -= SW_MR) {
    const int i1 = SW_MIN(n, i0 + SW_MR);
    if (i1 < n)
      sw_gemm(i1 - i0, SW_VP, n - i1, N + (long)i1 * SW_CP + i0, 1, SW_CP, BW + (long)i1 * SW_VP, SW_VP,
              W + (long)i0 * SW_VP, SW_VP, 1);
    for (int i = i1 - 1; i >= i0; --i) {
      SW_T *wi = W + (long)i * SW_VP, *bi = BW + (long)i * SW_VP;
      for (int j = i + 1; j < i1; ++j) {
        const SW_T a = N[(long)j * SW_CP + i];
        const SW_T* bj = BW + (long)j * SW_VP;
        for (int c = 0; c < SW_VP; c += SW_W) sw_vstore(wi + c, sw_vload(wi + c) + a * sw_vload(bj + c));
      }
      for (int c = 0; c < SW_VP; c += SW_W) sw_vstore(bi + c, beta[i] * sw_vload(wi + c));
    }
  }
}

/* One chunk's backward (loaded in c, with dO; it does not grow) from S0, its start state: dQ (c->dQ), dKx (c->dK),
 * dKy, dV (c->dV), dbeta (y->db), and dS from the chunk's end to its start. */
static void sw_wyb_chunk(sw_ck_tiles* c, sw_wyb* y, int n, const SW_T* S0, SW_T* dS) {
  sw_ck_dec* d = &c->d;
  SW_T *U = c->O, *NB = y->X;
  sw_ck_prefix(d, c->G, n);
  sw_ck_last(c);
  /* the forward's U and residuals X: N into dA, R = V - Kg S_0 */
  sw_wy_intra(c, c->K, c->K, 1, c->dA, 1);
  for (int i = 1; i < n; ++i)
    for (int j = 0; j < i; ++j) c->dA[(long)i * SW_CP + j] = -c->dA[(long)i * SW_CP + j];
  sw_ck_scale_q(c, c->K, y->Kg);
  sw_gemm(n, SW_VP, SW_K, y->Kg, SW_KP, 1, S0, SW_VP, U, SW_VP, 0);
  for (long e = 0; e < (long)n * SW_VP; e += SW_W) sw_vstore(U + e, sw_vload(c->V + e) - sw_vload(U + e));
  sw_wy_solve(c->dA, c->bt, U, n, y->X);
  const int reuse = sw_wy_intra(c, c->Q, c->K, 0, c->A, 0);
  if (!reuse) sw_ck_qs(c);
  const SW_T* Qg = reuse ? c->s.xr : c->Qs;
  sw_ck_kd(c, reuse);
  /* dU = A^T dO + Kd dS into W; dKx's state part e^{G_last - G} o (U dS^T) */
  sw_ck_trmm_t(n, SW_VP, c->A, SW_CP, c->DO, SW_VP, y->W, SW_VP, 0, 0);
  sw_gemm(n, SW_VP, SW_K, c->Kd, SW_KP, 1, dS, SW_VP, y->W, SW_VP, 1);
  sw_ck_transpose(dS, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, U, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_k(c, y->t1, c->dK, 0);
  /* dA = mask(dO U^T) into A (A read no more) */
  sw_ck_transpose(U, SW_VP, n, SW_V, c->Vt, SW_CP, SW_RUP(n));
  sw_ck_lower_prod(n, SW_V, c->DO, SW_VP, c->Vt, SW_CP, c->A);
  sw_ck_mask(c->A, n, 0);
  /* W, dV = diag(beta) W, dbeta = rows W . X; then NB = -dV in place of X */
  sw_wy_solve_t(c->dA, c->bt, y->W, c->dV, n);
  for (int i = 0; i < n; ++i) {
    sw_v acc = sw_vzero;
    SW_T *xi = y->X + (long)i * SW_VP;
    const SW_T *wi = y->W + (long)i * SW_VP, *vi = c->dV + (long)i * SW_VP;
    for (int j = 0; j < SW_VP; j += SW_W) {
      acc += sw_vload(wi + j) * sw_vload(xi + j);
      sw_vstore(xi + j, -sw_vload(vi + j));
    }
    y->db[i] = sw_vhsum(acc);
  }
  /* the state parts of dQ and dKy: e^{G} o (dO S_0^T), e^{G} o (NB S_0^T) */
  sw_ck_transpose(S0, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, c->DO, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_q(c, y->t1, c->dQ);
  sw_gemm(n, SW_KP, SW_V, NB, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_q(c, y->t1, y->dKy);
  /* the adjoint of A (Q and the update's K) */
#if SW_KEYDECAY
  sw_ck_intra_key_adjoint(d, c->Q, c->K, 0, c->A, c->dQ, c->dK, &c->s);
#else
  sw_ck_weights(d, c->A, c->A, 0, &c->s);
  sw_ck_trmm(n, SW_KP, c->A, SW_CP, c->K, SW_KP, c->dQ, SW_KP, 1, 0);
  sw_ck_trmm_t(n, SW_KP, c->A, SW_CP, c->Q, SW_KP, c->dK, SW_KP, 1, 0);
#endif
  /* dS_0 = e^{G_last} o dS + Qg^T dO + Kg^T NB */
  sw_ck_decay_state(c, dS);
  sw_gemm(SW_K, SW_VP, n, Qg, 1, SW_KP, c->DO, SW_VP, dS, SW_VP, 1);
  sw_gemm(SW_K, SW_VP, n, y->Kg, 1, SW_KP, NB, SW_VP, dS, SW_VP, 1);
  /* the adjoint of K K^T o Gamma (strict): dA = NB U^T (= -dN); rows the projection's K, columns the update's */
  sw_ck_lower_prod(n, SW_V, NB, SW_VP, c->Vt, SW_CP, c->A);
  sw_ck_mask(c->A, n, 1);
#if SW_KEYDECAY
  if (d->plain) sw_wy_intra(c, c->K, c->K, 1, c->dA, 1);  /* the scratch of K K^T o Gamma for its adjoint */
  sw_ck_intra_key_adjoint(d, c->K, c->K, 1, c->A, y->dKy, c->dK, &c->s);
#else
  sw_ck_weights(d, c->A, c->A, 1, &c->s);
  sw_ck_trmm(n, SW_KP, c->A, SW_CP, c->K, SW_KP, y->dKy, SW_KP, 1, 1);
  sw_ck_trmm_t(n, SW_KP, c->A, SW_CP, c->K, SW_KP, c->dK, SW_KP, 1, 1);
#endif
}

/* 1 when some log decay of value head h over steps [start, stop) of batch b is positive or NaN (the lane runs the
 * recurrent backward). */
static int sw_wyb_grows(const sw_dr* m, long b, long start, long stop, long h) {
#if SW_GATE
  for (long t = start; t < stop; ++t)
    for (int k = 0; k < (SW_GATE == 2 ? SW_K : 1); ++k) {
      const SW_T x = sw_in(m->g[SW_GATE == 2 ? SW_HK(m, b, t, h) + k : SW_BT(m, b, t, h)]);
      if (!(x <= 0)) return 1;
    }
#else
  (void)m, (void)b, (void)start, (void)stop, (void)h;
#endif
  return 0;
}

/* Row i of the chunk starting at t0: dq and dk added into the thread's sums, dv and dbeta written, and the row's
 * term of the decay gradient, q o dq + k o dKy - k o dKx (in double), into y->l. */
static void sw_wyb_row(const sw_dr* m, const sw_bg* gr, sw_bw* w, sw_wyb* y, long b, long start, long t0, int i,
                       long h) {
  const sw_ck_tiles* c = &y->c;
  const long t = t0 + i, ti = t - start;
  const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP, *dqi = c->dQ + (long)i * SW_KP;
  const SW_T *dxi = c->dK + (long)i * SW_KP, *dyi = y->dKy + (long)i * SW_KP;
  SW_T *dq = w->dqh + ti * SW_KP, *dk = w->dkh + ti * SW_KP;
  double* l = y->l + (long)i * SW_GW;
  l[0] = 0;
  for (int k = 0; k < SW_K; ++k) {
    dq[k] += dqi[k];
    dk[k] += dxi[k] + dyi[k];
    const double x = (double)(qi[k] * dqi[k] + ki[k] * dyi[k]) - (double)(ki[k] * dxi[k]);
    if (SW_KEYDECAY) l[k] = x;
    else l[0] += x;
  }
  sw_store_row(gr->dv + SW_VO(m, b, t, h), c->dV + (long)i * SW_VP, SW_V);
  gr->dbeta[SW_BT(m, b, t, h)] = sw_out(y->db[i]);
}

/* 1 when x is neither infinite nor NaN. */
SW_INLINE int sw_wyb_finite(double x) { return x - x == 0; }

/* rows(S_i o dS_i) into out (per key, or summed over the keys): the recurrence's dg_{i+1}, for the row after a reset
 * at row i, where the sum from the chunk's start has no value.  S_i from S0 by the recurrence over rows 0..i, dS_i
 * (the adjoint of S_i from the steps after i) from y->dSe by the reverse recurrence over rows n-1..i+1, one step
 * at a time as the recurrent backward (a lane with a non-finite value only). */
#if SW_GATE
static void sw_wyb_after_reset(sw_wyb* y, int n, int i, const SW_T* S0, double* out) {
  const sw_ck_tiles* c = &y->c;
  SW_T *S = y->Sr, *G = y->dSr, *u = y->u, *d = y->d;
  memcpy(S, S0, sizeof(SW_T) * SW_STATE);
  for (int s = 0; s <= i; ++s) {  /* S' = D S, u = beta (v - S'^T k), S = S' + k u^T */
    const SW_T *ks = c->K + (long)s * SW_KP, *vs = c->V + (long)s * SW_VP;
    sw_ck_step_decay(c, s, d);
    for (int j = 0; j < SW_V; ++j) u[j] = 0;
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = S + (long)k * SW_VP + j;
        *x *= d[SW_KEYDECAY ? k : 0];
        u[j] += *x * ks[k];
      }
    for (int j = 0; j < SW_V; ++j) u[j] = c->bt[s] * (vs[j] - u[j]);
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) S[(long)k * SW_VP + j] += ks[k] * u[j];
  }
  memcpy(G, y->dSe, sizeof(SW_T) * SW_STATE);
  for (int s = n - 1; s > i; --s) {  /* G += q do^T, du = G^T k, G = D (G - beta k du^T) */
    const SW_T *qs = c->Q + (long)s * SW_KP, *ks = c->K + (long)s * SW_KP, *os = c->DO + (long)s * SW_VP;
    sw_ck_step_decay(c, s, d);
    for (int j = 0; j < SW_V; ++j) u[j] = 0;
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = G + (long)k * SW_VP + j;
        *x += qs[k] * os[j];
        u[j] += *x * ks[k];
      }
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = G + (long)k * SW_VP + j;
        *x = d[SW_KEYDECAY ? k : 0] * (*x - c->bt[s] * ks[k] * u[j]);
      }
  }
  for (int k = 0; k < (SW_KEYDECAY ? SW_K : 1); ++k) out[k] = 0;
  for (int k = 0; k < SW_K; ++k) {
    double sum = 0;
    for (int j = 0; j < SW_V; ++j) sum += (double)S[(long)k * SW_VP + j] * G[(long)k * SW_VP + j];
    out[SW_KEYDECAY ? k : 0] += sum;
  }
}
#endif

/* dg of the chunk's n rows (starting at t0; its terms in y->l), and y->r from the chunk's end (the running sum) to
 * its start.  The running sum r_i = r_{i+1} + l_i (0 at a reset) carries a non-finite term to every earlier step;
 * the recurrence's dg_t = rows(S_{t-1} o dS_{t-1}) has it only where the state or its adjoint has.  The same value
 * from the chunk's start: f_0 = b0 = rows(S_0 o dS_0) (S0 the chunk's start state, y->dS its adjoint now), f_i =
 * f_{i-1} - l_{i-1}, and after a reset at row j (for its key) f_{j+1} = rows(S_j o dS_j) from the state
 * (sw_wyb_after_reset, when a row needs it).  A row whose r_i is not finite takes f_i where that is, and the sum
 * carried to the previous chunk is b0 where r_0 is not finite.  An all-finite lane reads r only (results as
 * before). */
static void sw_wyb_dg(const sw_dr* m, const sw_bg* gr, sw_wyb* y, long b, long t0, int n, long h, const SW_T* S0) {
#if SW_GATE
  sw_ck_tiles* c = &y->c;
  const int ng = SW_GATE == 2 ? SW_K : 1;
  int all = 1;
  for (int i = n - 1; i >= 0; --i)
    for (int k = 0; k < ng; ++k) {
      const long e = (long)i * SW_GW + k;
      y->r[k] += y->l[e];
      if (c->G[e] < (SW_T)SW_RESET_BELOW) y->r[k] = 0;  /* a reset: the sum is 0 there, exactly */
      y->rr[e] = y->r[k];
      all &= sw_wyb_finite(y->r[k]);
    }
  if (!all) {
    double* f = y->b0;
    int from[SW_GW], at = -1;  /* from: the last reset (-1: f has its value); at: the reset y->bs is of */
    for (int k = 0; k < ng; ++k) f[k] = 0, from[k] = -1;
    for (int k = 0; k < SW_K; ++k) {
      double sum = 0;
      for (int j = 0; j < SW_V; ++j) sum += (double)S0[(long)k * SW_VP + j] * y->dS[(long)k * SW_VP + j];
      f[SW_KEYDECAY ? k : 0] += sum;
    }
    for (int k = 0; k < ng; ++k)
      if (!sw_wyb_finite(y->r[k]) && sw_wyb_finite(f[k])) y->r[k] = f[k];
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < ng; ++k) {
        const long e = (long)i * SW_GW + k;
        if (!sw_wyb_finite(y->rr[e])) {
          if (from[k] >= 0) {
            if (at != from[k]) sw_wyb_after_reset(y, n, at = from[k], S0, y->bs);
            f[k] = y->bs[k];
            for (int j = from[k] + 1; j < i; ++j) f[k] -= y->l[(long)j * SW_GW + k];
            from[k] = -1;
          }
          if (sw_wyb_finite(f[k])) y->rr[e] = f[k];
        }
        if (c->G[e] < (SW_T)SW_RESET_BELOW) from[k] = i;
        else if (from[k] < 0) f[k] -= y->l[e];
      }
  }
  for (int i = 0; i < n; ++i) {
    const long t = t0 + i;
    for (int k = 0; k < ng; ++k) c->s.tmp[k] = (SW_T)y->rr[(long)i * SW_GW + k];
#if SW_GATE == 2
    sw_store_row(gr->dg + SW_HK(m, b, t, h), c->s.tmp, SW_K);
#else
    gr->dg[SW_BT(m, b, t, h)] = sw_out(c->s.tmp[0]);
#endif
  }
#else
  (void)m, (void)gr, (void)y, (void)b, (void)t0, (void)n, (void)h, (void)S0;
#endif
}

/* Value head h of sequence row (batch b, steps [start, stop)) by chunks: dv, dg, dbeta and dh0 written, its dq and
 * dk rows added into the thread's sums. */
static void sw_wyb_head(const sw_dr* m, const sw_bg* gr, sw_bw* w, sw_wyb* y, long row, long b, long start,
                        long stop, long h, long hq) {
  sw_ck_tiles* c = &y->c;
  const long len = stop - start, nc = (len + SW_C - 1) / SW_C;
  const size_t bytes = sizeof(SW_T) * SW_STATE;
  long every = 1;
  while (nc > y->nsb && (nc + every - 1) / every + every > y->nsb) ++every;
  const long ncp = (nc + every - 1) / every;
  SW_T* seg = y->Sb + (every > 1 ? ncp : 0) * SW_STATE;
  /* 1: the chunk-boundary states (every chunk's, or every `every`-th as checkpoints) */
  sw_state_in(m, SW_HAS_H0 ? m->h0 : NULL, row, h, 0, SW_V, SW_VP, y->S);
  for (long ci = 0; ci < nc; ++ci) {
    if (ci % every == 0) memcpy(y->Sb + ci / every * SW_STATE, y->S, bytes);
    const int n = (int)SW_MIN((long)SW_C, len - ci * SW_C);
    sw_wy_load(m, b, h, hq, start + ci * SW_C, n, c);
    sw_wy_chunk(c, n, y->S, 0);
  }
  for (int k = 0; k < SW_GW; ++k) y->r[k] = 0;
  if (SW_GATE && SW_HAS_DHLAST && gr->dhlast)  /* hlast's share of the decay gradient: rows of dhlast o hlast */
    for (int k = 0; k < SW_K; ++k) {
      const SW_T* src = gr->dhlast + SW_SK(m, row, h, k);
      double sum = 0;
      for (int j = 0; j < SW_V; ++j) sum += (double)src[j] * y->S[(long)k * SW_VP + j];
      y->r[SW_KEYDECAY ? k : 0] += sum;
    }
  sw_state_in(m, SW_HAS_DHLAST ? gr->dhlast : NULL, row, h, 0, SW_V, SW_VP, y->dS);
  /* 2: reverse pass, one segment of `every` chunks at a time */
  for (long sg = ncp - 1; sg >= 0; --sg) {
    const long s0c = sg * every, s1c = SW_MIN(nc, s0c + every);
    if (every > 1) {
      memcpy(y->S, y->Sb + sg * SW_STATE, bytes);
      for (long ci = s0c; ci < s1c; ++ci) {
        memcpy(seg + (ci - s0c) * SW_STATE, y->S, bytes);
        if (ci + 1 < s1c) {
          const int n = (int)SW_MIN((long)SW_C, len - ci * SW_C);
          sw_wy_load(m, b, h, hq, start + ci * SW_C, n, c);
          sw_wy_chunk(c, n, y->S, 0);
        }
      }
    }
    for (long ci = s1c - 1; ci >= s0c; --ci) {
      const long t0 = start + ci * SW_C;
      const int n = (int)SW_MIN((long)SW_C, len - ci * SW_C);
      sw_wy_load(m, b, h, hq, t0, n, c);
      for (int i = 0; i < n; ++i)
        sw_load_row(c->DO + (long)i * SW_VP, gr->dout + SW_VO(m, b, t0 + i, h), SW_V, SW_VP);
      const SW_T* S0 = every > 1 ? seg + (ci - s0c) * SW_STATE : y->Sb + ci * SW_STATE;
      if (SW_GATE) memcpy(y->dSe, y->dS, bytes);  /* for sw_wyb_after_reset */
      sw_wyb_chunk(c, y, n, S0, y->dS);
      for (int i = n - 1; i >= 0; --i) sw_wyb_row(m, gr, w, y, b, start, t0, i, h);
      sw_wyb_dg(m, gr, y, b, t0, n, h, S0);
    }
  }
  sw_state_out(m, gr->dh0, row, h, 0, SW_V, SW_VP, y->dS);
}

/* Sequence `row`, q/k head hq: its value heads (by chunks, or by the recurrence where one grows), then dq and dk. */
static void sw_wyb_item(const sw_dr* m, const sw_bg* gr, sw_bw* w, sw_wyb* y, long row, long hq) {
  long b, start, stop;
  sw_seq(m, row, &b, &start, &stop);
  const long len = stop - start, grp = m->H / m->Hq;
  memset(w->dqh, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
  memset(w->dkh, 0, sizeof(SW_T) * (size_t)(len * SW_KP));
  for (long h = hq * grp; h < (hq + 1) * grp; ++h) {
    if (sw_wyb_grows(m, b, start, stop, h)) sw_bwd_head(m, gr, w, row, b, start, stop, h, hq);
    else sw_wyb_head(m, gr, w, y, row, b, start, stop, h, hq);
  }
  sw_bwd_qk(m, gr, w, b, start, stop, hq);
}

static int sw_backward_chunked(const sw_dr* m, const sw_bg* gr) {
  const long items = m->nseq * m->Hq, L = sw_longest(m), nck = (L + SW_CKPT - 1) / SW_CKPT;
  const int nt = (int)SW_MIN((long)sw_threads(), items);
  int status = SW_OK;
#pragma omp parallel num_threads(nt)
  {
    sw_bw w;
    sw_wyb y;
    const int okw = sw_bw_new(&w, L, nck) == SW_OK, oky = okw && sw_wyb_alloc(&y, m) == SW_OK;
    if (!oky) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(dynamic, 1)
    for (long it = 0; it < items; ++it)
      if (oky) sw_wyb_item(m, gr, &w, &y, it / m->Hq, it % m->Hq);
    free(w.raw);
    free(w.P.raw);
    if (oky) {
      free(y.raw);
      free(y.raw_x);
    }
  }
  return status;
}
#endif
"""
