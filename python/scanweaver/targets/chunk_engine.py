"""The chunk engine: C primitives of the chunked (matmul) form of matrix-state scans, written once.

A matrix-state scan ``S_t = A_t S_{t-1} + k_t v_t^T`` (state ``K x V``) runs in
chunks of ``C`` steps: inside a chunk everything is a product of small tiles,
and only the chunk-boundary states cross chunks, through the affine map
``S_end = D S_0 + E`` of the chunk (an affine scan over chunks).  This module
(with :mod:`.chunk_products` and :mod:`.chunk_intra`) emits the C text of the
pieces every chunked kernel shares; a family's kernels
(:mod:`.matrix_c_chunked` for the diagonal family: Mamba-2, GLA, RetNet,
RWKV-6) assemble them with their own per-chunk algebra.

Primitives (C names; ``SW_T`` the storage type, ``W`` lanes per vector):

* **tile products** ``sw_gemm(M, N, kd, A, rs, cs, B, ldb, C, ldc, acc)``:
  ``C (+)= A B`` with A read through two strides (``A[i*rs + p*cs]``, so a
  transposed operand is never copied) and B, C row-major with N a multiple
  of ``W``; a register-blocked micro-kernel of ``MR x NR`` vectors
  (:func:`gemm_source` emits it for the vector registers at hand) and
  :func:`gemm_source`'s ``sw_ck_transpose`` for B operands that must be
  transposed.
* **decay prefix** ``sw_ck_prefix``: the cumulative log decays of a chunk
  in double whatever the storage type, *relative to the last reset*, with a
  reset count beside them: a log decay of ``-inf`` (a hard reset), or one
  whose exponential is 0 in the storage type, restarts the sum at 0 and bumps
  the count, so no difference of two sums is ever ``-inf - -inf`` or loses
  its digits to a huge term.  Positions are k-side (``Gk_j``, the state after step j)
  and q-side (``Gq_i``: ``Gk_i`` for a readout after the update, ``Gk_{i-1}``
  for RWKV-6's bonus readout of the previous state).  It also says whether the
  chunk grows (a positive or NaN log decay: such chunks run the recurrence
  itself, :func:`recurrent_chunk` of the family) and whether it is *plain*
  (no reset, no growth, total decay within ``SW_RANGE``: one product form).
* **decay factors** ``sw_ck_fac`` / ``sw_ck_fac_b``: ``e^{s (X - Y)}`` of two
  prefix rows (or a row and a broadcast value), 0 across a reset, each
  exponent a double difference rounded to ``SW_T`` as hi + lo and
  exponentiated as ``e^hi (1 + lo)``, so it is accurate to a few ulp for any
  mix of huge and tiny decays.  Every factor of the decay-only path has a
  non-positive exponent, or one bounded by ``SW_RANGE`` (``e^{+-RANGE}`` are
  normal numbers), so nothing overflows.
* **the masked intra-chunk decay matrix** ``sw_ck_intra`` (and, in the
  backward, its adjoint ``sw_ck_intra_adjoint``): ``A_ij = sum_k X_ik Y_jk
  e^{Gq_ik - Gk_jk}`` for ``j <= i`` (``j < i`` strict), 0 above, masked by
  assignment before anything reads it.  A plain chunk is one product
  ``(X o e^{Gq}) (Y o e^{-Gk})^T``; otherwise the chunk is cut into
  sub-blocks of ``SW_SUB`` rows, the block of rows I against the earlier rows
  J a product of two factors with non-positive exponents (reference
  ``Gq_{i0}``), the diagonal block a product when its own range is within
  ``SW_RANGE``, else entry by entry.  For a decay per head the factor is a
  scalar per entry applied after the product ``X Y^T``.
* **chunk carries** ``sw_ck_carry``: ``S' = D o S + E`` over a K x V tile with
  a diagonal D (per key, or one value), taking ``S' = E`` where ``S == 0``
  so that a block whose product overflows never multiplies ``inf`` by a zero
  state.

The WY (UT-transform) form of the delta-rule family plugs into the same
primitives: ``K K^T o Gamma`` strictly masked is ``sw_ck_intra`` with X = Y = K
and the strict mask; the unit lower-triangular ``C x C`` solve is one more
primitive beside ``sw_gemm``; ``W``, ``U`` and the outputs are tile products;
its chunk transition ``e^{G_C} I - (K o e^{G_C-G})^T W`` is dense (``K x K``),
so its carry is ``S' = D S + E`` with D applied by ``sw_gemm`` instead of
``sw_ck_carry``'s diagonal scaling; the backward recomputes chunk states the
same way.

Example:
    >>> from scanweaver.targets.chunk_engine import engine_source
    >>> "sw_gemm" in engine_source() and "sw_ck_prefix" in engine_source()
    True
"""

from __future__ import annotations

from .chunk_intra import INTRA
from .chunk_products import gemm_source

PRELUDE = r"""
/* ---- chunk engine ---- */
#define SW_C (SW_CHUNK)
#define SW_CP (((SW_C) + SW_W - 1) / SW_W * SW_W)
/* Rows per sub-block of a chunk that is not plain (a multiple of every vector width). */
#define SW_SUB 16
/* Decay values per position in the prefix arrays: a row of keys (padded) or one value. */
#define SW_KEYDECAY (SW_DECAY == 2)
#define SW_GW (SW_KEYDECAY ? SW_KP : 1)
/* Widest exponent a factor of a product form may take: e^{+-SW_RANGE} are normal numbers of SW_T, and a product
 * of two such factors with a non-positive sum is at most 1. */
#if SW_MBITS == 52
#define SW_RANGE 600.0
#else
#define SW_RANGE 60.0
#endif
/* A log decay below this is a reset: its exponential is 0 in SW_T (as the recurrence computes it), and summing it
 * would leave every later difference of two sums of the chunk at the precision of its magnitude. */
#if SW_MBITS == 52
#define SW_RESET_BELOW -746.0
#else
#define SW_RESET_BELOW -104.0
#endif

/* Double lanes beside the storage lanes (the cumulative log decays are held in double). */
#if SW_MBITS == 52
typedef sw_v sw_vd;
typedef sw_vi sw_vdi;
#define SW_TOV(x) (x)
#define SW_TOVI(x) (x)
#else
typedef double sw_vd __attribute__((vector_size(SW_W * 8)));
typedef long long sw_vdi __attribute__((vector_size(SW_W * 8)));
#define SW_TOV(x) __builtin_convertvector((x), sw_v)
#define SW_TOVI(x) __builtin_convertvector((x), sw_vi)
#endif
SW_INLINE sw_vd sw_vdload(const double* p) { sw_vd v; memcpy(&v, p, sizeof v); return v; }
SW_INLINE sw_vd sw_vdsel(sw_vdi m, sw_vd a, sw_vd b) { return (sw_vd)(((sw_vdi)a & m) | ((sw_vdi)b & ~m)); }

/* e^x in SW_T for double lanes x: x = hi + lo (hi = x rounded to SW_T) and e^hi (1 + lo), a few ulp for any x;
 * -inf gives 0, +inf gives inf, NaN stays NaN (only compares of SW_T lanes: double-lane masks are slow). */
SW_INLINE sw_v sw_ck_exp(sw_vd x) {
#if SW_MBITS == 52
  return sw_vexp(x);
#else
  const sw_v hi = SW_TOV(x);
  sw_v lo = SW_TOV(x - __builtin_convertvector(hi, sw_vd));
  lo = sw_vsel(lo == lo, lo, sw_vzero);
  return sw_vexp(hi) * (1.0f + lo);
#endif
}

/* f[k] = e^{s (X[k] - Y[k])} for k < n (a multiple of SW_W), 0 where the reset counts NX[k] and NY[k] differ. */
static void sw_ck_fac(const double* X, const SW_T* NX, const double* Y, const SW_T* NY, double s, SW_T* f, int n) {
  for (int k = 0; k < n; k += SW_W) {
    const sw_vd d = (sw_vdload(X + k) - sw_vdload(Y + k)) * s;
    sw_vstore(f + k, sw_vsel(sw_vload(NX + k) == sw_vload(NY + k), sw_ck_exp(d), sw_vzero));
  }
}

/* f[j] = e^{s (X[j] - y)} for j < n (rounded up to SW_W; X and NX readable there), 0 where NX[j] != ny. */
static void sw_ck_fac_b(const double* X, const SW_T* NX, double y, SW_T ny, double s, SW_T* f, int n) {
  const sw_vd yv = (sw_vd){0} + y;
  for (int j = 0; j < n; j += SW_W) {
    const sw_vd d = (sw_vdload(X + j) - yv) * s;
    sw_vstore(f + j, sw_vsel(sw_vload(NX + j) == ny, sw_ck_exp(d), sw_vzero));
  }
}

/* Rows of x scaled by rows of f: y[i] = x[i] o f[i] (i < n, KP wide; f rows fs apart, fs = 0: one row for all). */
static void sw_ck_scale_rows(const SW_T* x, const SW_T* f, long fs, SW_T* y, int n) {
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < SW_KP; k += SW_W)
      sw_vstore(y + (long)i * SW_KP + k, sw_vload(x + (long)i * SW_KP + k) * sw_vload(f + i * fs + k));
}

/* Rows of x (ld apart, n of them, width wd a multiple of SW_W) times one scalar each: y[i] = x[i] * s[i]. */
static void sw_ck_scale_by(const SW_T* x, long ld, const SW_T* s, SW_T* y, int n, int wd) {
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < wd; k += SW_W)
      sw_vstore(y + (long)i * ld + k, sw_vload(x + (long)i * ld + k) * s[i]);
}

/* ---- decay prefix ---- */
/* The prefix of a chunk: rows of SW_GW values per position (positions contiguous for a decay per head).  Gk and Nk
 * have a row of zeros before position 0 (the chunk's start, Z), so the q-side rows of the bonus readout are the
 * k-side rows one position back: Gq = Gk - SW_GW. */
typedef struct {
  double *Gk, *Gq;  /* cumulative log decays since the last reset (in double) */
  SW_T *Nk, *Nq;    /* reset counts (small integers) */
  double* Z;        /* the row before position 0: zeros */
  SW_T* NZ;
  SW_T *E, *Eq, *Ei; /* e^{Gk} with a row of ones before position 0, its q-side rows, e^{-Gk}: a plain chunk's
                      * factors, computed with the prefix (unused, and not meaningful, on other chunks) */
  int n, grow, plain;
} sw_ck_dec;

#define SW_GAT(arr, i) ((arr) + (long)(i) * SW_GW)

/* The prefix of a chunk of n steps from its log decays gt (position-major, SW_GW apart for a decay per key, one per
 * position otherwise).  grow: some log decay is positive or NaN.  plain: no reset, no growth and every total decay
 * within SW_RANGE (so e^{Gq} and e^{-Gk} are normal numbers and A is one product). */
static void sw_ck_prefix(sw_ck_dec* d, const SW_T* gt, int n) {
  int grow = 0, resets = 0;
  double range = 0;
#if SW_KEYDECAY
  /* row by row (each row's keys as vectors, the previous row from L1): down the chunk one vector of keys at a
   * time is slower, its five streams a power-of-two stride apart */
  sw_v bad = sw_vzero, rst = sw_vzero;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < SW_KP; k += SW_W) {
      const sw_v x = sw_vload(gt + (long)i * SW_KP + k);
      const sw_vi reset = x < (SW_T)SW_RESET_BELOW;
      bad = sw_vsel(x <= sw_vzero, bad, bad + 1);
      rst = sw_vsel(reset, rst + 1, rst);
      /* a reset restarts the sum: (previous + 0) * 0; otherwise (previous + x) * 1 */
      const sw_vd x0 = __builtin_convertvector(sw_vsel(reset, sw_vzero, x), sw_vd);
      const sw_vd G = (sw_vdload(SW_GAT(d->Gk, i - 1) + k) + x0) *
                      __builtin_convertvector(sw_vsel(reset, sw_vzero, sw_vzero + 1), sw_vd);
      memcpy(SW_GAT(d->Gk, i) + k, &G, sizeof G);
      const sw_v N = sw_vload(SW_GAT(d->Nk, i - 1) + k) + sw_vsel(reset, sw_vzero + 1, sw_vzero);
      sw_vstore(SW_GAT(d->Nk, i) + k, N);
      const sw_v e = sw_ck_exp(G);
      sw_vstore(SW_GAT(d->E, i + 1) + k, e);
      sw_vstore(SW_GAT(d->Ei, i) + k, 1 / e);
    }
  for (int k = 0; k < SW_W; ++k) {
    grow |= bad[k] != 0;
    resets |= rst[k] != 0;
  }
  for (int k = 0; k < SW_K; ++k) range = SW_MAX(range, -SW_GAT(d->Gk, n - 1)[k]);
#else
  for (int i = 0; i < n; ++i) {
    const double x = SW_DECAY ? (double)gt[i] : 0.0;
    grow |= !(x <= 0);
    if (x < SW_RESET_BELOW) {
      d->Gk[i] = 0;
      d->Nk[i] = d->Nk[i - 1] + 1;
      resets = 1;
    } else {
      d->Gk[i] = d->Gk[i - 1] + x;
      d->Nk[i] = d->Nk[i - 1];
    }
  }
  range = -d->Gk[n - 1];
  for (int i = 0; i < n; i += SW_W) {
    const sw_v e = sw_ck_exp(sw_vdload(d->Gk + i));
    sw_vstore(d->Ei + i, 1 / e);
    memcpy(d->E + i + 1, &e, sizeof e);
  }
#endif
  d->n = n;
  d->grow = grow;
  d->plain = !grow && !resets && range <= SW_RANGE;
}

/* ---- chunk carries ---- */
/* S' = D o S + E over K rows of cols values (ld apart): D per row (per key) or d[0] for all; S' = E where S is 0. */
static void sw_ck_carry(SW_T* S, const SW_T* E, const double* d, int per_row, int cols, long ld) {
  for (int k = 0; k < SW_K; ++k) {
    const double dk = d[per_row ? k : 0];
    for (int j = 0; j < cols; ++j) {
      const SW_T s = S[k * ld + j], e = E[k * ld + j];
      S[k * ld + j] = s == 0 ? e : (SW_T)(dk * (double)s + (double)e);
    }
  }
}
"""


def engine_source() -> str:
    """The engine's C text (after the vector prelude and the family's sizes: ``SW_K``, ``SW_KP``, ``SW_DECAY``,
    ``SW_BONUS``, ``SW_CHUNK``)."""
    return PRELUDE + gemm_source() + INTRA
