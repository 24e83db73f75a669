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
by the recurrence (``sw_wy_recurrent``, ``sw_dplr_recurrent``), runs the recurrent backward of
:mod:`.delta_c_backward` (``sw_bwd_head``) entirely, so the gradients of
growth are those of the recurrence.

The ``dplr`` form (RWKV-7, ``sw_dplrb_chunk``): the same two passes, lanes, checkpoints and fallbacks.  In the
notation of ``sw_dplr_chunk`` (:mod:`.delta_c_chunked`: ``W`` the rows ``w_i = S_{i-1}^T a_i``, ``Ak =
strict(A K^T o Gamma')``, ``Ab = strict(A B^T o Gamma')``, ``Ag = A o e^{G_{i-1}}`` with the q-side prefix one step
back, ``Mb = Q B^T o Gamma``, ``Mk = Q K^T o Gamma`` inclusive, ``Bd``, ``Kd`` the rows scaled to the chunk's
end), the chunk's W solved again from S_0, then::

    Z   = Mb^T dO + Bd dS;  Z += Ab^T Z      (a backward substitution, sw_wy_solve_t: the total adjoint of W)
    dV  = Mk^T dO + Kd dS + Ak^T Z
    dQ  = e^{G} o (dO S_0^T) + [adjoints of Mb, Mk in Q]
    dA  = e^{G_{i-1}} o (Z S_0^T) + [adjoints of Ab, Ak in A]
    dB  = e^{G_last - G} o (W dS^T) + [adjoints of Mb, Ab in B]
    dK  = e^{G_last - G} o (V dS^T) + [adjoints of Mk, Ak in K]
    dS <- e^{G_last} o dS + (Q o e^{G})^T dO + Ag^T Z

with ``dMb = dO W^T``, ``dMk = dO V^T``, ``dAb = Z W^T``, ``dAk = Z V^T`` (masked) through the engine's
adjoints (``sw_ck_intra_key_adjoint``; ``sw_ck_weights`` and two triangular products for a decay per head).  The
gauge makes q scale by ``Lambda_t``, b and k by ``Lambda_t^{-1}``, and a_t (which reads ``S_{t-1}``) by
``Lambda_{t-1}``, so ``l_t = q_t o dq_t - b_t o db_t - k_t o dk_t + a_{t+1} o da_{t+1}`` (the next step's term
carried across a chunk's end), and the recurrence's ``dg_t = D_t rows(dS_t o S_{t-1}) = rows(S_{t-1} o
dS_{t-1}) - a_t o da_t``: the sums from the chunk's start and after a reset subtract ``a o da`` of their row.  A
non-finite a_t or b_t reaches every key of ``S_t`` (through ``w_t``) and of ``dS_{t-1}`` (through ``a_t
dp^T``), so dg of the step before it (of b: its own step) can be finite in the recurrence while both sums are
not; such rows take the recurrence's value, the chunk's states kept and the adjoint run back one step at a time
(``sw_dplrb_direct``: only in a chunk with a row left non-finite).  The default algorithm rule
(:attr:`~scanweaver.fused.delta_rule.DeltaRule.chunked_from`) runs this backward from 1024 steps per sequence
with K * V >= 8192 (a decay per key, as KDA's), and wherever ``algorithm="chunked"`` or ``chunk_size=`` asks for it.

Example:
    >>> from scanweaver.targets.delta_c_chunked_backward import WY_BACKWARD
    >>> "sw_wy_solve_t" in WY_BACKWARD
    True
"""

from __future__ import annotations

WY_BACKWARD = r"""
#if SW_CHUNKED
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
  SW_T *ga, *gb, *gq, *gk, *M; /* dplr: the chunk's da, db, dq, dk (C x KP) and a C x CP product */
  SW_T* Sn;                     /* dplr: the states of a chunk's steps (sw_dplrb_direct; allocated when needed) */
  double *r, *b0, *bs, *l, *rr, *an;  /* an (dplr): a o da of the first row of the chunk after this one */
  long nsb;
} sw_wyb;

static int sw_wyb_alloc(sw_wyb* y, const sw_dr* m) {
  const long nc = (sw_longest(m) + SW_C - 1) / SW_C, fit = SW_WY_STATE_BUDGET / (long)(sizeof(SW_T) * SW_STATE);
  long root = 1;
  while (root * root < nc) ++root;
  y->nsb = nc <= fit ? nc : SW_MAX(fit, 2 * root + 1);
  const size_t cv = (size_t)SW_C * SW_VP, ck = (size_t)SW_C * SW_KP;
  const size_t dgw = (size_t)(2 * SW_C + 4) * SW_GW, dp = SW_DPLR ? 4 * ck + (size_t)SW_C * SW_CP : 0;
  char* p = (char*)sw_alloc(sizeof(SW_T) * (2 * cv + 3 * ck + SW_CP + dp) + sizeof(double) * dgw + 64, &y->raw_x);
  if (!p) return SW_ENOMEM;
  y->X = (SW_T*)p, y->W = y->X + cv, y->dKy = y->W + cv, y->t1 = y->dKy + ck, y->Kg = y->t1 + ck;
  y->ga = y->Kg + ck, y->gb = y->ga + (SW_DPLR ? ck : 0), y->gq = y->gb + (SW_DPLR ? ck : 0);
  y->gk = y->gq + (SW_DPLR ? ck : 0), y->M = y->gk + (SW_DPLR ? ck : 0);
  y->db = y->M + (SW_DPLR ? (size_t)SW_C * SW_CP : 0);
  y->r = (double*)(((uintptr_t)(y->db + SW_CP) + 7) & ~(uintptr_t)7);
  y->b0 = y->r + SW_GW, y->bs = y->b0 + SW_GW, y->l = y->bs + SW_GW, y->rr = y->l + (long)SW_C * SW_GW;
  y->an = y->rr + (long)SW_C * SW_GW;
  y->Sn = NULL;
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

#if !SW_DPLR
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
#else
/* The adjoint of the masked M = X Y^T o Gamma (Gamma of the prefix's current shift) for a masked dM (overwritten
 * for a decay per head): dX_i += sum_j dM_ij Y_j o Gamma_ij, dY_j += sum_i dM_ij X_i o Gamma_ij, by the engine's
 * adjoints (a plain chunk's scratch, X o e^{Gq} and Y o e^{-Gk}, scaled here first). */
static void sw_dplrb_adj(sw_ck_tiles* c, const SW_T* X, const SW_T* Y, int strict, SW_T* dM, SW_T* dX, SW_T* dY) {
  sw_ck_dec* d = &c->d;
  const int n = d->n;
#if SW_KEYDECAY
  if (d->plain) {  /* the scratch the plain adjoint reads: X o e^{Gq}, Y o e^{-Gk} */
    sw_ck_scale_rows(X, d->Eq, SW_KP, c->s.xr, n);
    sw_ck_scale_rows(Y, d->Ei, SW_KP, c->s.yr, n);
  }
  sw_ck_intra_key_adjoint(d, X, Y, strict, dM, dX, dY, &c->s);
#else
  sw_ck_weights(d, dM, dM, strict, &c->s);
  sw_ck_trmm(n, SW_KP, dM, SW_CP, Y, SW_KP, dX, SW_KP, 1, strict);
  sw_ck_trmm_t(n, SW_KP, dM, SW_CP, X, SW_KP, dY, SW_KP, 1, strict);
#endif
}

/* M (masked, strict or not) = X Z^T for n rows of SW_VP (the product of two row sets of values). */
static void sw_dplrb_vprod(sw_ck_tiles* c, const SW_T* X, const SW_T* Z, SW_T* M, int strict) {
  const int n = c->d.n;
  sw_ck_transpose(Z, SW_VP, n, SW_V, c->Vt, SW_CP, SW_RUP(n));
  sw_ck_lower_prod(n, SW_V, X, SW_VP, c->Vt, SW_CP, M);
  sw_ck_mask(M, n, strict);
}

/* One dplr chunk's backward (loaded in c: a and b rows in c->dQ and c->dK, with dO; it does not grow) from S0, its
 * start state: dq, dk, da, db (y->gq, gk, ga, gb), dv (c->dV), and dS from the chunk's end to its start.  In the
 * notation of sw_dplr_chunk (Ak = strict(A K^T o Gamma'), Ab = strict(A B^T o Gamma'), Ag = A o e^{G_{i-1}};
 * Mb = Q B^T o Gamma, Mk = Q K^T o Gamma inclusive; Bd, Kd rows scaled to the chunk's end):
 *   Z  = Mb^T dO + Bd dS, then Z += Ab^T Z (backward substitution: the total adjoint of W)
 *   dv = Mk^T dO + Kd dS + Ak^T Z
 *   dq = e^{G} o (dO S0^T) + [Mb, Mk in Q];  da = e^{G_{i-1}} o (Z S0^T) + [Ab, Ak in A]
 *   db = e^{G_last - G} o (W dS^T) + [Mb, Ab in B];  dk = e^{G_last - G} o (V dS^T) + [Mk, Ak in K]
 *   dS <- e^{G_last} o dS + (Q o e^{G})^T dO + Ag^T Z
 * with the adjoints of the masked products dMb = dO W^T, dMk = dO V^T, dAb = Z W^T, dAk = Z V^T. */
static void sw_dplrb_chunk(sw_ck_tiles* c, sw_wyb* y, int n, const SW_T* S0, SW_T* dS) {
  sw_ck_dec* d = &c->d;
  const SW_T *Ar = c->dQ, *Br = c->dK;
  SW_T *Wm = y->X, *Z = y->W, *M = y->M, *Ag = y->Kg;
  sw_ck_prefix(d, c->G, n);
  sw_ck_last(c);
  for (int i = 0; i < n; ++i) c->bt[i] = 1;
  /* the forward's W: Ak into A, Ab into dA (kept for the substitutions), Ag */
  sw_wy_shift(d, 1);
  sw_wy_intra(c, Ar, c->K, 1, c->A, 1);
  sw_ck_scale_q(c, Ar, Ag);
  sw_gemm(n, SW_VP, SW_K, Ag, SW_KP, 1, S0, SW_VP, Wm, SW_VP, 0);
  sw_ck_trmm(n, SW_VP, c->A, SW_CP, c->V, SW_VP, Wm, SW_VP, 1, 1);
  sw_wy_intra(c, Ar, Br, 1, c->dA, 1);
  sw_wy_solve(c->dA, NULL, Wm, n, NULL);
  /* the readout's and the carry's parts (the prefix at the step) */
  sw_wy_shift(d, 0);
  sw_ck_transpose(S0, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, c->DO, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_q(c, y->t1, y->gq);
  sw_ck_transpose(dS, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, c->V, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_k(c, y->t1, y->gk, 0);
  sw_gemm(n, SW_KP, SW_V, Wm, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_k(c, y->t1, y->gb, 0);
  sw_wy_intra(c, c->Q, Br, 0, M, 1);  /* Z = Mb^T dO + Bd dS */
  sw_ck_trmm_t(n, SW_VP, M, SW_CP, c->DO, SW_VP, Z, SW_VP, 0, 0);
  sw_ck_scale_k(c, Br, c->Kd, 0);
  sw_gemm(n, SW_VP, SW_K, c->Kd, SW_KP, 1, dS, SW_VP, Z, SW_VP, 1);
  sw_wy_intra(c, c->Q, c->K, 0, M, 1);  /* dv = Mk^T dO + Kd dS */
  sw_ck_trmm_t(n, SW_VP, M, SW_CP, c->DO, SW_VP, c->dV, SW_VP, 0, 0);
  sw_ck_kd(c, 0);
  sw_gemm(n, SW_VP, SW_K, c->Kd, SW_KP, 1, dS, SW_VP, c->dV, SW_VP, 1);
  sw_dplrb_vprod(c, c->DO, Wm, M, 0);  /* the adjoints of Mb and Mk */
  sw_dplrb_adj(c, c->Q, Br, 0, M, y->gq, y->gb);
  sw_dplrb_vprod(c, c->DO, c->V, M, 0);
  sw_dplrb_adj(c, c->Q, c->K, 0, M, y->gq, y->gk);
  sw_ck_decay_state(c, dS);  /* dS_0 = e^{G_last} o dS + (Q o e^{G})^T dO (+ Ag^T Z below) */
  sw_ck_qs(c);
  sw_gemm(SW_K, SW_VP, n, c->Qs, 1, SW_KP, c->DO, SW_VP, dS, SW_VP, 1);
  /* W's own adjoint, and what reaches W's inputs (the prefix one step back) */
  sw_wy_solve_t(c->dA, c->bt, Z, Z, n);
  sw_wy_shift(d, 1);
  sw_ck_transpose(S0, SW_VP, SW_K, SW_V, c->St, SW_KP, SW_KP);
  sw_gemm(n, SW_KP, SW_V, Z, SW_VP, 1, c->St, SW_KP, y->t1, SW_KP, 0);
  sw_ck_scale_q(c, y->t1, y->ga);
  sw_gemm(SW_K, SW_VP, n, Ag, 1, SW_KP, Z, SW_VP, dS, SW_VP, 1);
  sw_ck_trmm_t(n, SW_VP, c->A, SW_CP, Z, SW_VP, c->dV, SW_VP, 1, 1);
  sw_dplrb_vprod(c, Z, c->V, M, 1);
  sw_dplrb_adj(c, Ar, c->K, 1, M, y->ga, y->gk);
  sw_dplrb_vprod(c, Z, Wm, M, 1);
  sw_dplrb_adj(c, Ar, Br, 1, M, y->ga, y->gb);
  sw_wy_shift(d, 0);
}
#endif

/* 1 when some log decay of value head h over steps [start, stop) of batch b is positive or NaN (the lane runs the
 * recurrent backward). */
static int sw_wyb_grows(const sw_dr* m, long b, long start, long stop, long h) {
#if SW_GATE
  for (long t = start; t < stop; ++t) {
    int bad = 0;  /* a whole row at a time (no branch per key) */
    for (int k = 0; k < (SW_GATE == 2 ? SW_K : 1); ++k) {
      const SW_T x = sw_in(m->g[SW_GATE == 2 ? SW_HK(m, b, t, h) + k : SW_BT(m, b, t, h)]);
      bad |= !(x <= 0);
    }
    if (bad) return 1;
  }
#else
  (void)m, (void)b, (void)start, (void)stop, (void)h;
#endif
  return 0;
}

#if !SW_DPLR
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
#else
/* Row i of the n rows of the chunk starting at t0 (dplr): dq and dk added into the thread's sums, dv, da and db
 * written, and the row's term of the decay gradient, q o dq - b o db - k o dk + a' o da' (a', da' of the next
 * step: row i + 1, or y->an past the chunk's end; in double), into y->l. */
static void sw_wyb_row(const sw_dr* m, const sw_bg* gr, sw_bw* w, sw_wyb* y, long b, long start, long t0, int i,
                       int n, long h) {
  const sw_ck_tiles* c = &y->c;
  const long t = t0 + i, ti = t - start, r = (long)i * SW_KP;
  const SW_T *qi = c->Q + r, *ki = c->K + r, *bi = c->dK + r, *dqi = y->gq + r, *dki = y->gk + r, *dbi = y->gb + r;
  const SW_T *an = c->dQ + r + SW_KP, *dan = y->ga + r + SW_KP;
  SW_T *dq = w->dqh + ti * SW_KP, *dk = w->dkh + ti * SW_KP;
  double* l = y->l + (long)i * SW_GW;
  const int last = i + 1 == n;
  sw_vd sum = (sw_vd){0};
  for (int k = 0; k < SW_KP; k += SW_W) {
    const sw_v gq = sw_vload(dqi + k), gk = sw_vload(dki + k);
    sw_vstore(dq + k, sw_vload(dq + k) + gq);
    sw_vstore(dk + k, sw_vload(dk + k) + gk);
    sw_vd x = __builtin_convertvector(sw_vload(qi + k) * gq, sw_vd) -
              __builtin_convertvector(sw_vload(bi + k) * sw_vload(dbi + k), sw_vd) -
              __builtin_convertvector(sw_vload(ki + k) * gk, sw_vd);
    if (!last) x += __builtin_convertvector(sw_vload(an + k) * sw_vload(dan + k), sw_vd);
    else if (SW_KEYDECAY) x += sw_vdload(y->an + k);
    if (SW_KEYDECAY) {
      memcpy(l + k, &x, sizeof x);
    } else {
      for (int j = SW_K - k; j < SW_W; ++j) x[j] = 0;  /* the padded keys stay out of the sum */
      sum += x;
    }
  }
  if (!SW_KEYDECAY) {
    l[0] = last ? y->an[0] : 0;
    for (int j = 0; j < SW_W; ++j) l[0] += sum[j];
  }
  sw_store_row(gr->dv + SW_VO(m, b, t, h), c->dV + (long)i * SW_VP, SW_V);
  sw_store_row(gr->da + SW_HK(m, b, t, h), y->ga + r, SW_K);
  sw_store_row(gr->db + SW_HK(m, b, t, h), y->gb + r, SW_K);
}

/* a o da of row i (per key, or summed over the keys) into out, in double. */
static void sw_wyb_ada(const sw_wyb* y, int i, double* out) {
  const SW_T *a = y->c.dQ + (long)i * SW_KP, *da = y->ga + (long)i * SW_KP;
  for (int k = 0; k < SW_GW; ++k) out[k] = 0;
  for (int k = 0; k < SW_K; ++k) out[SW_KEYDECAY ? k : 0] += (double)(a[k] * da[k]);
}
#endif

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
#if SW_DPLR
  for (int s = 0; s <= i; ++s) {  /* u = S^T a, S = D S + b u^T + k v^T */
    const SW_T *ks = c->K + (long)s * SW_KP, *vs = c->V + (long)s * SW_VP;
    const SW_T *as = c->dQ + (long)s * SW_KP, *bs = c->dK + (long)s * SW_KP;
    sw_ck_step_decay(c, s, d);
    for (int j = 0; j < SW_V; ++j) u[j] = 0;
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) u[j] += S[(long)k * SW_VP + j] * as[k];
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = S + (long)k * SW_VP + j;
        *x = d[SW_KEYDECAY ? k : 0] * *x + bs[k] * u[j] + ks[k] * vs[j];
      }
  }
  memcpy(G, y->dSe, sizeof(SW_T) * SW_STATE);
  for (int s = n - 1; s > i; --s) {  /* G += q do^T, dp = G^T b, G = D G + a dp^T */
    const SW_T *qs = c->Q + (long)s * SW_KP, *os = c->DO + (long)s * SW_VP;
    const SW_T *as = c->dQ + (long)s * SW_KP, *bs = c->dK + (long)s * SW_KP;
    sw_ck_step_decay(c, s, d);
    for (int j = 0; j < SW_V; ++j) u[j] = 0;
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = G + (long)k * SW_VP + j;
        *x += qs[k] * os[j];
        u[j] += *x * bs[k];
      }
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = G + (long)k * SW_VP + j;
        *x = d[SW_KEYDECAY ? k : 0] * *x + as[k] * u[j];
      }
  }
#else
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
#endif
  for (int k = 0; k < (SW_KEYDECAY ? SW_K : 1); ++k) out[k] = 0;
  for (int k = 0; k < SW_K; ++k) {
    double sum = 0;
    for (int j = 0; j < SW_V; ++j) sum += (double)S[(long)k * SW_VP + j] * G[(long)k * SW_VP + j];
    out[SW_KEYDECAY ? k : 0] += sum;
  }
#if SW_DPLR  /* dplr: dg_{i+1} = rows(S_i o dS_i) - a_{i+1} o da_{i+1} (dS_i holds a_{i+1} dp^T) */
  double ad[SW_GW];
  sw_wyb_ada(y, i + 1, ad);
  for (int k = 0; k < (SW_KEYDECAY ? SW_K : 1); ++k) out[k] -= ad[k];
#endif
}
#endif

#if SW_DPLR && SW_GATE
/* The rows of dg still non-finite after the sums (a non-finite a or b: w_t = S_{t-1}^T a_t reaches every key of
 * S_t, and the adjoint's a_t dp^T every key of dS_{t-1}, so the terms of the step after, and the state and adjoint
 * before, are non-finite while dg_t itself is not) take the recurrence's dg_i = D_i rows(dS_i o S_{i-1}): the
 * chunk's states from S0 kept (y->Sn), then the adjoint from y->dSe back to the chunk's start, one step at a time
 * as the recurrent backward (a chunk with such a row only). */
static void sw_dplrb_direct(sw_wyb* y, int n, const SW_T* S0) {
  const sw_ck_tiles* c = &y->c;
  SW_T *G = y->dSr, *u = y->u, *d = y->d;
  if (!y->Sn) y->Sn = (SW_T*)malloc(sizeof(SW_T) * (size_t)SW_C * SW_STATE);
  if (!y->Sn) return;  /* no memory: those rows stay as the sums left them */
  memcpy(y->Sn, S0, sizeof(SW_T) * SW_STATE);
  for (int s = 0; s + 1 < n; ++s) {  /* Sn[s + 1] = S_s: u = S^T a, S = D S + b u^T + k v^T */
    const SW_T *S = y->Sn + (long)s * SW_STATE, *ks = c->K + (long)s * SW_KP, *vs = c->V + (long)s * SW_VP;
    const SW_T *as = c->dQ + (long)s * SW_KP, *bs = c->dK + (long)s * SW_KP;
    SW_T* Sx = y->Sn + (long)(s + 1) * SW_STATE;
    sw_ck_step_decay(c, s, d);
    for (int j = 0; j < SW_V; ++j) u[j] = 0;
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) u[j] += S[(long)k * SW_VP + j] * as[k];
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j)
        Sx[(long)k * SW_VP + j] = d[SW_KEYDECAY ? k : 0] * S[(long)k * SW_VP + j] + bs[k] * u[j] + ks[k] * vs[j];
  }
  memcpy(G, y->dSe, sizeof(SW_T) * SW_STATE);
  for (int s = n - 1; s >= 0; --s) {  /* G += q do^T; dg = D rows(G o S_{s-1}); dp = G^T b, G = D G + a dp^T */
    const SW_T *qs = c->Q + (long)s * SW_KP, *os = c->DO + (long)s * SW_VP, *P = y->Sn + (long)s * SW_STATE;
    const SW_T *as = c->dQ + (long)s * SW_KP, *bs = c->dK + (long)s * SW_KP;
    double* rr = y->rr + (long)s * SW_GW;
    double acc[SW_GW];
    sw_ck_step_decay(c, s, d);
    for (int k = 0; k < SW_GW; ++k) acc[k] = 0;
    for (int j = 0; j < SW_V; ++j) u[j] = 0;
    for (int k = 0; k < SW_K; ++k) {
      SW_T dot = 0;
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = G + (long)k * SW_VP + j;
        *x += qs[k] * os[j];
        u[j] += *x * bs[k];
        dot += *x * P[(long)k * SW_VP + j];
      }
      acc[SW_KEYDECAY ? k : 0] += (double)(d[SW_KEYDECAY ? k : 0] * dot);
    }
    for (int k = 0; k < SW_GW; ++k)
      if (!sw_wyb_finite(rr[k])) rr[k] = acc[k];
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_V; ++j) {
        SW_T* x = G + (long)k * SW_VP + j;
        *x = d[SW_KEYDECAY ? k : 0] * *x + as[k] * u[j];
      }
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
#if SW_DPLR  /* dplr: dg_0 = rows(S_0 o dS_0) - a_0 o da_0 */
    for (int k = 0; k < ng; ++k) f[k] -= y->an[k];
#endif
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
#if SW_DPLR
    int left = 0;
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < ng; ++k) left |= !sw_wyb_finite(y->rr[(long)i * SW_GW + k]);
    if (left) sw_dplrb_direct(y, n, S0);
#endif
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

/* The state at the chunk's end from its start (the chunked forward without its outputs). */
#if SW_DPLR
#define SW_WYB_STATE(c, n, S) sw_dplr_chunk(c, n, S, 0)
#else
#define SW_WYB_STATE(c, n, S) sw_wy_chunk(c, n, S, 0)
#endif

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
    SW_WYB_STATE(c, n, y->S);
  }
  for (int k = 0; k < SW_GW; ++k) y->r[k] = y->an[k] = 0;
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
          SW_WYB_STATE(c, n, y->S);
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
#if SW_DPLR
      sw_dplrb_chunk(c, y, n, S0, y->dS);
      for (int i = n - 1; i >= 0; --i) sw_wyb_row(m, gr, w, y, b, start, t0, i, n, h);
      sw_wyb_ada(y, 0, y->an);
#else
      sw_wyb_chunk(c, y, n, S0, y->dS);
      for (int i = n - 1; i >= 0; --i) sw_wyb_row(m, gr, w, y, b, start, t0, i, h);
#endif
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
      free(y.Sn);
    }
  }
  return status;
}
#endif
"""
