"""The masked intra-chunk decay matrix of the chunk engine (:mod:`.chunk_engine`) and its adjoint.

``A_ij = sum_k X_ik Y_jk e^{Gq_ik - Gk_jk}`` for ``j <= i`` (``j < i`` strict), 0
above, masked by assignment before anything reads it.  A plain chunk (no
reset, no growth, every total decay within ``SW_RANGE``) is one product
``(X o e^{Gq}) (Y o e^{-Gk})^T`` with the prefix's factors; otherwise the chunk
is cut into sub-blocks of ``SW_SUB`` rows: rows I against the earlier rows J are
a product of two factors with non-positive exponents (the reference
``Gq_{i0}``), the diagonal block a product when its own range is within
``SW_RANGE``, else entry by entry.  ``sw_ck_intra_key_adjoint`` adds
``dX_i += sum_j dA_ij Y_j o Gamma_ij`` and ``dY_j += sum_i dA_ij X_i o Gamma_ij``
by the same blocks (a diagonal block by triangular products, so no row reads a
masked entry's later row: 0 times its NaN would be NaN).  For a decay per head (or none), ``sw_ck_weights`` scales any
C x C matrix by the decay entry by entry (``X Y^T`` then the weights).

Example:
    >>> from scanweaver.targets.chunk_intra import INTRA
    >>> "sw_ck_intra_key_adjoint" in INTRA
    True
"""

from __future__ import annotations

INTRA = r"""
/* ---- the masked intra-chunk decay matrix ---- */
#define SW_TW (SW_KP > SW_CP ? SW_KP : SW_CP)

/* Scratch of the intra-chunk primitives (one per thread). */
typedef struct {
  SW_T *xr, *yr, *ea, *eb, *t1;  /* SW_C x SW_KP: scaled rows, their factors, products before their factors */
  SW_T *yt;                      /* SW_KP x SW_CP: a transposed operand */
  SW_T *tmp;                     /* SW_TW */
} sw_ck_scratch;

/* dst[i] += f[i] o t[i] for rows i < n (SW_KP wide). */
static void sw_ck_fma_rows(SW_T* dst, const SW_T* f, const SW_T* t, int n) {
  for (long e = 0; e < (long)n * SW_KP; e += SW_W)
    sw_vstore(dst + e, sw_vload(dst + e) + sw_vload(f + e) * sw_vload(t + e));
}

/* A[i][j] = 0 for j > i (j >= i with strict), up to the padded width, rows i < n (SW_CP apart). */
static void sw_ck_mask(SW_T* A, int n, int strict) {
  const int np = SW_RUP(n);
  for (int i = 0; i < n; ++i)
    for (int j = i + 1 - strict; j < np; ++j) A[(long)i * SW_CP + j] = 0;
}

/* One entry of a decay per key computed directly: sum_k x_k y_k e^{Gq_ik - Gk_jk} (j <= i). */
static SW_T sw_ck_entry(const sw_ck_dec* d, const SW_T* x, const SW_T* y, int i, int j, SW_T* tmp) {
  sw_ck_fac(SW_GAT(d->Gq, i), SW_GAT(d->Nq, i), SW_GAT(d->Gk, j), SW_GAT(d->Nk, j), 1.0, tmp, SW_KP);
  sw_v acc = sw_vzero;
  for (int k = 0; k < SW_KP; k += SW_W) acc += sw_vload(x + k) * sw_vload(y + k) * sw_vload(tmp + k);
  return sw_vhsum(acc);
}

/* Block of rows I = [i0, i0 + SW_SUB) of a chunk that is not plain, reference (Gq_{i0}, Nq_{i0}): ea, xr for the
 * rows of I and eb, yr for the rows [0, J) in the scratch.  J is the block's end when its diagonal block is a
 * product too (no reset inside, range within SW_RANGE), else i0 (its entries are computed one by one).  Every
 * exponent is non-positive but those of eb on the diagonal block, which are at most SW_RANGE. */
static int sw_ck_block(const sw_ck_dec* d, const SW_T* X, const SW_T* Y, int i0, sw_ck_scratch* s) {
  const int i1 = SW_MIN(d->n, i0 + SW_SUB);
  const double *R = SW_GAT(d->Gq, i0), *Gl = SW_GAT(d->Gk, i1 - 1);
  const SW_T *NR = SW_GAT(d->Nq, i0), *Nl = SW_GAT(d->Nk, i1 - 1);
  int ok = 1;
  for (int k = 0; k < SW_K; ++k) ok &= Nl[k] == NR[k] && R[k] - Gl[k] <= SW_RANGE;
  const int J = ok ? i1 : i0;
  for (int i = i0; i < i1; ++i)
    sw_ck_fac(SW_GAT(d->Gq, i), SW_GAT(d->Nq, i), R, NR, 1.0, s->ea + (long)i * SW_KP, SW_KP);
  for (int j = 0; j < J; ++j)
    sw_ck_fac(SW_GAT(d->Gk, j), SW_GAT(d->Nk, j), R, NR, -1.0, s->eb + (long)j * SW_KP, SW_KP);
  sw_ck_scale_rows(X + (long)i0 * SW_KP, s->ea + (long)i0 * SW_KP, SW_KP, s->xr + (long)i0 * SW_KP, i1 - i0);
  sw_ck_scale_rows(Y, s->eb, SW_KP, s->yr, J);
  return J;
}

/* A (n x n, rows SW_CP apart, masked) = sum_k X_ik Y_jk e^{Gq_ik - Gk_jk} for a decay per key, X and Y n rows of
 * SW_KP.  A plain chunk leaves xr = X o e^{Gq} and yr = Y o e^{-Gk} in the scratch. */
static void sw_ck_intra_key(const sw_ck_dec* d, const SW_T* X, const SW_T* Y, int strict, SW_T* A, sw_ck_scratch* s) {
  const int n = d->n;
  if (d->plain) {  /* the factors of the prefix: e^{Gq} (e^{Gk} one row back for the bonus) and e^{-Gk} */
    sw_ck_scale_rows(X, d->Eq, SW_KP, s->xr, n);
    sw_ck_scale_rows(Y, d->Ei, SW_KP, s->yr, n);
    sw_ck_transpose(s->yr, SW_KP, n, SW_K, s->yt, SW_CP, SW_RUP(n));
    sw_ck_lower_prod(n, SW_K, s->xr, SW_KP, s->yt, SW_CP, A);
  } else {
    for (int i0 = 0; i0 < n; i0 += SW_SUB) {
      const int i1 = SW_MIN(n, i0 + SW_SUB), J = sw_ck_block(d, X, Y, i0, s);
      if (J > 0) {
        sw_ck_transpose(s->yr, SW_KP, J, SW_K, s->yt, SW_CP, SW_RUP(J));
        sw_gemm(i1 - i0, SW_RUP(J), SW_K, s->xr + (long)i0 * SW_KP, SW_KP, 1, s->yt, SW_CP, A + (long)i0 * SW_CP,
                SW_CP, 0);
      }
      if (J == i0)
        for (int i = i0; i < i1; ++i)
          for (int j = i0; j < i + 1 - strict; ++j)
            A[(long)i * SW_CP + j] = sw_ck_entry(d, X + (long)i * SW_KP, Y + (long)j * SW_KP, i, j, s->tmp);
    }
  }
  sw_ck_mask(A, n, strict);
}

/* The adjoint of sw_ck_intra_key for a masked dA: dX_i += sum_j dA_ij Y_j o Gamma_ij, dY_j += sum_i dA_ij X_i o
 * Gamma_ij.  A plain chunk reads the scratch as sw_ck_intra_key left it. */
static void sw_ck_intra_key_adjoint(const sw_ck_dec* d, const SW_T* X, const SW_T* Y, int strict, const SW_T* dA,
                                    SW_T* dX, SW_T* dY, sw_ck_scratch* s) {
  const int n = d->n;
  if (d->plain) {
    sw_ck_trmm(n, SW_KP, dA, SW_CP, s->yr, SW_KP, s->t1, SW_KP, 0, strict);
    sw_ck_fma_rows(dX, d->Eq, s->t1, n);
    sw_ck_trmm_t(n, SW_KP, dA, SW_CP, s->xr, SW_KP, s->t1, SW_KP, 0, strict);
    sw_ck_fma_rows(dY, d->Ei, s->t1, n);
    return;
  }
  for (int i0 = 0; i0 < n; i0 += SW_SUB) {
    const int i1 = SW_MIN(n, i0 + SW_SUB), J = sw_ck_block(d, X, Y, i0, s);
    if (J > 0) {  /* the earlier rows by one product, a diagonal block that is a product by triangular ones */
      const SW_T* dB = dA + (long)i0 * SW_CP + i0;
      sw_gemm(i1 - i0, SW_KP, i0, dA + (long)i0 * SW_CP, SW_CP, 1, s->yr, SW_KP, s->t1, SW_KP, 0);
      if (J > i0) sw_ck_trmm(i1 - i0, SW_KP, dB, SW_CP, s->yr + (long)i0 * SW_KP, SW_KP, s->t1, SW_KP, 1, strict);
      sw_ck_fma_rows(dX + (long)i0 * SW_KP, s->ea + (long)i0 * SW_KP, s->t1, i1 - i0);
      sw_gemm(i0, SW_KP, i1 - i0, dA + (long)i0 * SW_CP, 1, SW_CP, s->xr + (long)i0 * SW_KP, SW_KP, s->t1, SW_KP, 0);
      if (J > i0)
        sw_ck_trmm_t(i1 - i0, SW_KP, dB, SW_CP, s->xr + (long)i0 * SW_KP, SW_KP, s->t1 + (long)i0 * SW_KP, SW_KP, 0,
                     strict);
      sw_ck_fma_rows(dY, s->eb, s->t1, J);
    }
    if (J == i0)
      for (int i = i0; i < i1; ++i)
        for (int j = i0; j < i + 1 - strict; ++j) {
          const SW_T a = dA[(long)i * SW_CP + j];
          sw_ck_fac(SW_GAT(d->Gq, i), SW_GAT(d->Nq, i), SW_GAT(d->Gk, j), SW_GAT(d->Nk, j), 1.0, s->tmp, SW_KP);
          SW_T *dxi = dX + (long)i * SW_KP, *dyj = dY + (long)j * SW_KP;
          const SW_T *xi = X + (long)i * SW_KP, *yj = Y + (long)j * SW_KP;
          for (int k = 0; k < SW_KP; k += SW_W) {
            const sw_v g = sw_vload(s->tmp + k) * a;
            sw_vstore(dxi + k, sw_vload(dxi + k) + g * sw_vload(yj + k));
            sw_vstore(dyj + k, sw_vload(dyj + k) + g * sw_vload(xi + k));
          }
        }
  }
}

/* Decay weights of a decay per head (or none) applied to M: Wt_ij = M_ij e^{Gq_i - Gk_j} for j <= i (j < i with
 * strict), 0 elsewhere (Wt may be M).  A plain chunk takes e^{Gq_i} e^{-Gk_j} (both normal numbers). */
static void sw_ck_weights(const sw_ck_dec* d, const SW_T* M, SW_T* Wt, int strict, sw_ck_scratch* s) {
  const int n = d->n;
#if SW_DECAY
  if (d->plain) {
    for (int i = 0; i < n; ++i) {
      const SW_T fi = d->Eq[i];
      for (int j = 0; j < i + 1 - strict; j += SW_W)
        sw_vstore(Wt + (long)i * SW_CP + j, sw_vload(M + (long)i * SW_CP + j) * fi * sw_vload(d->Ei + j));
    }
  } else {
    for (int i = 0; i < n; ++i) {
      sw_ck_fac_b(d->Gk, d->Nk, d->Gq[i], d->Nq[i], -1.0, s->tmp, i + 1);
      for (int j = 0; j < i + 1 - strict; j += SW_W)
        sw_vstore(Wt + (long)i * SW_CP + j, sw_vload(M + (long)i * SW_CP + j) * sw_vload(s->tmp + j));
    }
  }
#else
  if (Wt != M)
    for (int i = 0; i < n; ++i) memcpy(Wt + (long)i * SW_CP, M + (long)i * SW_CP, sizeof(SW_T) * SW_RUP(i + 1));
#endif
  sw_ck_mask(Wt, n, strict);
}
"""
