"""C source of the chunked (WY / UT transform) delta-rule forward on the chunk engine (assembled by
:mod:`.fused_c_delta_rule`).

The ``delta`` form (DeltaNet, Gated DeltaNet, KDA) per lane (sequence, value
head), chunks of ``chunk`` steps.  With the chunk's prefix of
:mod:`.chunk_engine` (cumulative log decays ``G`` since the last reset, in
double; per key for KDA), ``Gamma_ij = e^{G_i - G_j}`` (per key inside the key
dot), S_0 the state at the chunk's start and ``u_t = beta_t (v_t - S'_t^T
k_t)`` the new values of the recurrence::

    N = strict-lower(K K^T o Gamma)                      sw_ck_intra_key / sw_ck_weights, strict mask
    U = (I + diag(beta) N)^{-1} diag(beta) (V - (K o e^{G}) S_0)   forward substitution (sw_wy_solve)
    O = (Q o e^{G}) S_0 + (Q K^T o Gamma o M_incl) U
    S_end = e^{G_last} o S_0 + (K o e^{G_last - G})^T U

so the output and the carry are the diagonal family's chunk with U in place of
V (:mod:`.chunk_tiles`' factors, the engine's products).  The substitution runs
in blocks of one register block's height: the earlier rows enter by one
product (``sw_gemm``), the block's own rows one by one.  Every factor has a
non-positive exponent, or one within ``SW_RANGE`` on a plain chunk; a log
decay of ``-inf`` is an exact reset; a chunk with a positive (or NaN) log
decay runs the recurrence itself (:c:func:`sw_wy_recurrent`), so growth is
computed as the recurrence defines it.  Work items are the lanes, over the
threads (a long lane is not split: the chunk's transition is dense, K x K).

The ``dplr`` form (RWKV-7, :c:func:`sw_dplr_chunk`) solves for ``w_i = S_{i-1}^T
a_i`` the same way, with the q-side prefix one step back (``G_{i-1}``, the
engine's shift of RWKV-6's bonus readout) for the strict products of a, then
reads out and carries both W (through b) and V (through k).  The chunked
backward of both forms is :mod:`.delta_c_chunked_backward` (the ``delta``
form keeps the residuals ``X`` of ``sw_wy_solve``; the ``dplr`` form solves
W again, ``sw_dplr_chunk`` without its outputs).

Entry: ``sw_forward_chunked(m, o, hlast)``, called by ``sw_delta_rule_forward`` when ``SW_CHUNKED``.

Example:
    >>> from scanweaver.targets.delta_c_chunked import WY
    >>> "sw_wy_solve" in WY
    True
"""

from __future__ import annotations

WY = r"""
/* ---- the delta rule's chunks (WY form) ---- */
/* Steps [t0, t0 + n) of value head h (q/k head hq) of batch b into the tiles: q and k (normalised), v, the log
 * decays, beta (delta) or the rows of a and b (dplr: in the tiles dQ and dK, unused by the forward). */
static void sw_wy_load(const sw_dr* m, long b, long h, long hq, long t0, int n, sw_ck_tiles* c) {
  for (int i = 0; i < n; ++i) {
    const long t = t0 + i;
    SW_T *q = c->Q + (long)i * SW_KP, *k = c->K + (long)i * SW_KP;
    sw_load_row(q, m->q + SW_QK(m, b, t, hq), SW_K, SW_KP);
    sw_load_row(k, m->k + SW_QK(m, b, t, hq), SW_K, SW_KP);
#if SW_L2
    sw_l2(q);
    sw_l2(k);
#endif
    sw_load_row(c->V + (long)i * SW_VP, m->v + SW_VO(m, b, t, h), SW_V, SW_VP);
#if SW_GATE == 2
    sw_load_row(c->G + (long)i * SW_KP, m->g + SW_HK(m, b, t, h), SW_K, SW_KP);
#elif SW_GATE == 1
    c->G[i] = sw_in(m->g[SW_BT(m, b, t, h)]);
#else
    c->G[i] = 0;
#endif
#if SW_DPLR
    sw_load_row(c->dQ + (long)i * SW_KP, m->a + SW_HK(m, b, t, h), SW_K, SW_KP);
    sw_load_row(c->dK + (long)i * SW_KP, m->b + SW_HK(m, b, t, h), SW_K, SW_KP);
#else
    c->bt[i] = sw_in(m->beta[SW_BT(m, b, t, h)]);
#endif
  }
}

#if !SW_DPLR
/* The recurrence itself over the chunk's n steps from S (a chunk that grows): the new values u in dV, o rows in O. */
static void sw_wy_recurrent(sw_ck_tiles* c, int n, SW_T* S) {
  SW_T* d = c->s.tmp;
  for (int i = 0; i < n; ++i) {
    sw_ck_step_decay(c, i, d);
    const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP, *vi = c->V + (long)i * SW_VP;
    SW_T *ui = c->dV + (long)i * SW_VP, *oi = c->O + (long)i * SW_VP;
    for (int j = 0; j < SW_VP; j += SW_W) sw_vstore(ui + j, sw_vzero);
    for (int k = 0; k < SW_K; ++k) {  /* S' = D S, p = S'^T k */
      const SW_T dk = d[SW_KEYDECAY ? k : 0], kk = ki[k];
      SW_T* row = S + (long)k * SW_VP;
      for (int j = 0; j < SW_VP; j += SW_W) {
        const sw_v s = dk * sw_vload(row + j);
        sw_vstore(row + j, s);
        sw_vstore(ui + j, sw_vload(ui + j) + kk * s);
      }
    }
    const SW_T beta = c->bt[i];
    for (int j = 0; j < SW_VP; j += SW_W) {
      sw_vstore(ui + j, beta * (sw_vload(vi + j) - sw_vload(ui + j)));
      sw_vstore(oi + j, sw_vzero);
    }
    for (int k = 0; k < SW_K; ++k) {  /* S = S' + k u^T, o = S^T q */
      const SW_T kk = ki[k], qq = qi[k];
      SW_T* row = S + (long)k * SW_VP;
      for (int j = 0; j < SW_VP; j += SW_W) {
        const sw_v s = sw_vload(row + j) + kk * sw_vload(ui + j);
        sw_vstore(row + j, s);
        sw_vstore(oi + j, sw_vload(oi + j) + qq * s);
      }
    }
  }
}
#endif

/* A (masked, rows SW_CP apart) = X Y^T o Gamma, j < i with strict, j <= i otherwise.  For a decay per head (or
 * none) Y^T is transposed into s.yt when fresh and reused otherwise.  Returns 1 when the plain key intra left
 * X o e^{Gq} (s.xr) and Y o e^{-Gk} (s.yr) behind. */
static int sw_wy_intra(sw_ck_tiles* c, const SW_T* X, const SW_T* Y, int strict, SW_T* A, int fresh) {
  const int n = c->d.n;
#if SW_KEYDECAY
  (void)fresh, (void)n;
  sw_ck_intra_key(&c->d, X, Y, strict, A, &c->s);
  return c->d.plain;
#else
  if (fresh) sw_ck_transpose(Y, SW_KP, n, SW_K, c->s.yt, SW_CP, SW_RUP(n));
  sw_ck_lower_prod(n, SW_K, X, SW_KP, c->s.yt, SW_CP, c->QK);
  sw_ck_weights(&c->d, c->QK, A, strict, &c->s);
  return 0;
#endif
}

/* U (in place of R, n rows of SW_VP) with U_i = beta_i X_i, X_i = R_i + sum_{j<i} N_ij U_j (beta NULL: 1), N strictly
 * lower: blocks of SW_MR rows, the earlier rows by one product, the block's own rows one by one.  X (or NULL) keeps
 * the rows X_i (the backward's residuals). */
static void sw_wy_solve(const SW_T* N, const SW_T* beta, SW_T* U, int n, SW_T* X) {
  for (int i0 = 0; i0 < n; i0 += SW_MR) {
    const int i1 = SW_MIN(n, i0 + SW_MR);
    if (i0) sw_gemm(i1 - i0, SW_VP, i0, N + (long)i0 * SW_CP, SW_CP, 1, U, SW_VP, U + (long)i0 * SW_VP, SW_VP, 1);
    for (int i = i0; i < i1; ++i) {
      SW_T* ui = U + (long)i * SW_VP;
      for (int j = i0; j < i; ++j) {
        const SW_T a = N[(long)i * SW_CP + j];
        const SW_T* uj = U + (long)j * SW_VP;
        for (int c = 0; c < SW_VP; c += SW_W) sw_vstore(ui + c, sw_vload(ui + c) + a * sw_vload(uj + c));
      }
      if (X) memcpy(X + (long)i * SW_VP, ui, sizeof(SW_T) * SW_VP);
      if (beta)
        for (int c = 0; c < SW_VP; c += SW_W) sw_vstore(ui + c, beta[i] * sw_vload(ui + c));
    }
  }
}

#if !SW_DPLR
/* One chunk of n steps (loaded in c) from the state S (updated); o rows into c->O (out: else only S, as the
 * backward's chunk-boundary states need). */
static void sw_wy_chunk(sw_ck_tiles* c, int n, SW_T* S, int out) {
  sw_ck_prefix(&c->d, c->G, n);
  if (c->d.grow) {
    sw_wy_recurrent(c, n, S);
    return;
  }
  sw_ck_last(c);
  sw_wy_intra(c, c->K, c->K, 1, c->dA, 1);
  for (int i = 1; i < n; ++i)  /* N = -(K K^T o Gamma) */
    for (int j = 0; j < i; ++j) c->dA[(long)i * SW_CP + j] = -c->dA[(long)i * SW_CP + j];
  sw_ck_scale_q(c, c->K, c->Kd);  /* R = V - (K o e^{G}) S_0 into dV */
  sw_gemm(n, SW_VP, SW_K, c->Kd, SW_KP, 1, S, SW_VP, c->dV, SW_VP, 0);
  for (long e = 0; e < (long)n * SW_VP; e += SW_W) sw_vstore(c->dV + e, sw_vload(c->V + e) - sw_vload(c->dV + e));
  sw_wy_solve(c->dA, c->bt, c->dV, n, NULL);
  const int reuse = out && sw_wy_intra(c, c->Q, c->K, 0, c->A, 0);
  if (out) {
    if (!reuse) sw_ck_qs(c);
    sw_gemm(n, SW_VP, SW_K, reuse ? c->s.xr : c->Qs, SW_KP, 1, S, SW_VP, c->O, SW_VP, 0);
    sw_ck_trmm(n, SW_VP, c->A, SW_CP, c->dV, SW_VP, c->O, SW_VP, 1, 0);
  }
  sw_ck_kd(c, reuse);
  sw_ck_decay_state(c, S);
  sw_gemm(SW_K, SW_VP, n, c->Kd, 1, SW_KP, c->dV, SW_VP, S, SW_VP, 1);
}
#endif

#if SW_DPLR
/* The q-side prefix one step back (Gq_i = G_{i-1}: a_i reads S_{i-1}) or at the step (the readout of S_i). */
static void sw_wy_shift(sw_ck_dec* d, int back) {
  d->Gq = d->Gk - (back ? SW_GW : 0);
  d->Nq = d->Nk - (back ? SW_GW : 0);
  d->Eq = d->E + (back ? 0 : SW_GW);
}

/* The dplr recurrence itself over the chunk's n steps from S (a chunk that grows): w_i = S_{i-1}^T a_i in dV, o in
 * O. */
static void sw_dplr_recurrent(sw_ck_tiles* c, int n, SW_T* S) {
  SW_T* d = c->s.tmp;
  for (int i = 0; i < n; ++i) {
    sw_ck_step_decay(c, i, d);
    const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->K + (long)i * SW_KP, *vi = c->V + (long)i * SW_VP;
    const SW_T *ai = c->dQ + (long)i * SW_KP, *bi = c->dK + (long)i * SW_KP;
    SW_T *wi = c->dV + (long)i * SW_VP, *oi = c->O + (long)i * SW_VP;
    for (int j = 0; j < SW_VP; j += SW_W) sw_vstore(wi + j, sw_vzero), sw_vstore(oi + j, sw_vzero);
    for (int k = 0; k < SW_K; ++k)
      for (int j = 0; j < SW_VP; j += SW_W)
        sw_vstore(wi + j, sw_vload(wi + j) + ai[k] * sw_vload(S + (long)k * SW_VP + j));
    for (int k = 0; k < SW_K; ++k) {
      const SW_T dk = d[SW_KEYDECAY ? k : 0], bk = bi[k], kk = ki[k], qq = qi[k];
      SW_T* row = S + (long)k * SW_VP;
      for (int j = 0; j < SW_VP; j += SW_W) {
        const sw_v s = dk * sw_vload(row + j) + bk * sw_vload(wi + j) + kk * sw_vload(vi + j);
        sw_vstore(row + j, s);
        sw_vstore(oi + j, sw_vload(oi + j) + qq * s);
      }
    }
  }
}

/* One dplr chunk (RWKV-7) of n steps from S (updated); o rows into c->O (out: else only S and W, as the backward
 * needs).  With w_i = S_{i-1}^T a_i (rows of W, in c->dV):
 * W = (A o e^{G_{i-1}}) S_0 + (A K^T o Gamma') V + (A B^T o Gamma') W (strict, Gamma' from G_{i-1}), solved by
 * forward substitution; O = (Q o e^G) S_0 + (Q B^T o Gamma) W + (Q K^T o Gamma) V (inclusive);
 * S_end = e^{G_last} o S_0 + (B o e^{G_last - G})^T W + (K o e^{G_last - G})^T V. */
static void sw_dplr_chunk(sw_ck_tiles* c, int n, SW_T* S, int out) {
  SW_T *Ar = c->dQ, *Br = c->dK, *W = c->dV;
  sw_ck_prefix(&c->d, c->G, n);
  if (c->d.grow) {
    sw_dplr_recurrent(c, n, S);
    return;
  }
  sw_ck_last(c);
  sw_wy_shift(&c->d, 1);
  sw_wy_intra(c, Ar, c->K, 1, c->A, 1);
  sw_ck_scale_q(c, Ar, c->Qs);
  sw_gemm(n, SW_VP, SW_K, c->Qs, SW_KP, 1, S, SW_VP, W, SW_VP, 0);
  sw_ck_trmm(n, SW_VP, c->A, SW_CP, c->V, SW_VP, W, SW_VP, 1, 1);
  sw_wy_intra(c, Ar, Br, 1, c->dA, 1);
  sw_wy_solve(c->dA, NULL, W, n, NULL);
  sw_wy_shift(&c->d, 0);
  if (out) {
    sw_ck_qs(c);
    sw_gemm(n, SW_VP, SW_K, c->Qs, SW_KP, 1, S, SW_VP, c->O, SW_VP, 0);
    sw_wy_intra(c, c->Q, Br, 0, c->dA, 1);
    sw_ck_trmm(n, SW_VP, c->dA, SW_CP, W, SW_VP, c->O, SW_VP, 1, 0);
    sw_wy_intra(c, c->Q, c->K, 0, c->A, 1);
    sw_ck_trmm(n, SW_VP, c->A, SW_CP, c->V, SW_VP, c->O, SW_VP, 1, 0);
  }
  sw_ck_decay_state(c, S);
  sw_ck_scale_k(c, Br, c->Kd, 0);
  sw_gemm(SW_K, SW_VP, n, c->Kd, 1, SW_KP, W, SW_VP, S, SW_VP, 1);
  sw_ck_kd(c, 0);
  sw_gemm(SW_K, SW_VP, n, c->Kd, 1, SW_KP, c->V, SW_VP, S, SW_VP, 1);
}
#endif

static int sw_forward_chunked(const sw_dr* m, sw_s* o, SW_T* hlast) {
  const long items = m->nseq * m->H;
  const int nt = (int)SW_MIN((long)sw_threads(), items);
  int status = SW_OK;
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    void* raw;
    sw_ck_tiles c;
    SW_T* S = NULL;
    const int ok = sw_ck_alloc(&c, &raw, 1, &S) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(dynamic, 1)
    for (long it = 0; it < items; ++it) {
      if (!ok) continue;
      const long row = it / m->H, h = it % m->H, hq = h / (m->H / m->Hq);
      long b, start, stop;
      sw_seq(m, row, &b, &start, &stop);
      sw_state_in(m, SW_HAS_H0 ? m->h0 : NULL, row, h, 0, SW_V, SW_VP, S);
      for (long s0 = start; s0 < stop; s0 += SW_C) {
        const int n = (int)SW_MIN((long)SW_C, stop - s0);
        sw_wy_load(m, b, h, hq, s0, n, &c);
#if SW_DPLR
        sw_dplr_chunk(&c, n, S, 1);
#else
        sw_wy_chunk(&c, n, S, 1);
#endif
        for (int i = 0; i < n; ++i) sw_store_row(o + SW_VO(m, b, s0 + i, h), c.O + (long)i * SW_VP, SW_V);
      }
      sw_state_out(m, hlast, row, h, 0, SW_V, SW_VP, S);
    }
    if (ok) free(raw);
  }
  return status;
}
"""
