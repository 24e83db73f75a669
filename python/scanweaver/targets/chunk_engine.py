"""The chunk engine: C primitives of the chunked (matmul) form of matrix-state scans, written once.

A matrix-state scan ``S_t = A_t S_{t-1} + k_t v_t^T`` (state ``K x V``) runs in
chunks of ``C`` steps: inside a chunk everything is a product of small tiles,
and only the chunk-boundary states cross chunks, through the affine map
``S_end = D S_0 + E`` of the chunk (an affine scan over chunks).  This module
emits the C text of the pieces every chunked kernel shares; a family's
kernels (:mod:`.matrix_c_chunked` for the diagonal family: Mamba-2, GLA,
RetNet, RWKV-6) assemble them with their own per-chunk algebra.

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

from functools import cache

#: Rows of accumulators of the micro-kernel: 12 where the ISA has 32 vector registers (AVX-512, AArch64), else 6.
MR_WIDE, MR_NARROW = 12, 6
#: Vectors of columns of the micro-kernel (MR x NR accumulators, NR loads and one broadcast in registers).
NR = 2

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


def micro_kernel(mr: int, nr: int) -> str:
    """``sw_mk_<mr>_<nr>``: one register block of ``C (+)= A B``, unrolled with named accumulators (an array of them
    is spilled to the stack at each call's ends by GCC)."""
    acc = [f"c{r}_{j}" for r in range(mr) for j in range(nr)]
    load = " ".join(f"c{r}_{j} = sw_vload(C + {r} * ldc + {j} * SW_W);" for r in range(mr) for j in range(nr))
    zero = " ".join(f"c{r}_{j} = sw_vzero;" for r in range(mr) for j in range(nr))
    bs = " ".join(f"const sw_v b{j} = sw_vload(B + (long)p * ldb + {j} * SW_W);" for j in range(nr))
    fma = "\n".join(f"    {{ const SW_T x = a[{r} * rs]; " + " ".join(f"c{r}_{j} += x * b{j};" for j in range(nr))
                    + " }" for r in range(mr))
    store = " ".join(f"sw_vstore(C + {r} * ldc + {j} * SW_W, c{r}_{j});" for r in range(mr) for j in range(nr))
    return (f"static void sw_mk_{mr}_{nr}(int kd, const SW_T* restrict A, long rs, long cs, const SW_T* restrict B, "
            f"long ldb, SW_T* restrict C, long ldc, int acc) {{\n  sw_v {', '.join(acc)};\n"
            f"  if (acc) {{ {load} }} else {{ {zero} }}\n"
            f"  for (int p = 0; p < kd; ++p) {{\n    {bs}\n    const SW_T* a = A + (long)p * cs;\n{fma}\n  }}\n"
            f"  {store}\n}}\n")


def _micro_kernels() -> str:
    """Every micro-kernel (rows 1..12, column vectors 1..NR; rows past ``SW_MR`` compiled only where used) and
    ``sw_mk_any``, which calls the one of a block's shape."""
    kernels, cases = [], []
    for r in range(1, MR_WIDE + 1):
        text = "".join(micro_kernel(r, j) for j in range(1, NR + 1))
        case = (f"    case {r}: if (nr == SW_NR) sw_mk_{r}_{NR}(kd, A, rs, cs, B, ldb, C, ldc, acc); "
                f"else sw_mk_{r}_1(kd, A, rs, cs, B, ldb, C, ldc, acc); break;")
        guard = r > MR_NARROW
        kernels.append(f"#if SW_MR >= {r}\n{text}#endif\n" if guard else text)
        cases.append(f"#if SW_MR >= {r}\n{case}\n#endif" if guard else case)
    return "\n".join(kernels) + (
        "\nstatic void sw_mk_any(int mr, int nr, int kd, const SW_T* A, long rs, long cs, const SW_T* B, long ldb, "
        "SW_T* C,\n                      long ldc, int acc) {\n  switch (mr) {\n" + "\n".join(cases) +
        "\n    default: break;\n  }\n}\n")


@cache
def gemm_source() -> str:
    """C text of the tile products (``sw_mk_*``, ``sw_mk_any``, ``sw_gemm``) and ``sw_ck_transpose``."""
    return rf"""
/* ---- tile products ---- */
#if defined(__AVX512F__) || defined(__aarch64__)
#define SW_MR {MR_WIDE}
#else
#define SW_MR {MR_NARROW}
#endif
#define SW_NR {NR}
/* Register blocks of C (+)= A B: mr rows of A (element (i, p) at A[i*rs + p*cs]) times nr vectors of columns of B
 * (row p at B + p*ldb), MR x NR accumulators, NR loads and one broadcast per step in registers. */
{_micro_kernels()}
/* C[M x N] (+)= A[M x kd] B[kd x N]: A(i, p) = A[i*rs + p*cs]; B and C row-major (ldb, ldc), N a multiple of
 * SW_W.  Column panels outside, so a panel of B stays in L1 while the rows of A pass over it. */
static void sw_gemm(int M, int N, int kd, const SW_T* A, long rs, long cs, const SW_T* B, long ldb, SW_T* C,
                    long ldc, int acc) {{
  int j = 0;
  for (; j + SW_NR * SW_W <= N; j += SW_NR * SW_W)
    for (int i = 0; i < M; i += SW_MR)
      sw_mk_any(SW_MIN(SW_MR, M - i), SW_NR, kd, A + (long)i * rs, rs, cs, B + j, ldb, C + (long)i * ldc + j, ldc,
                acc);
  for (; j < N; j += SW_W)
    for (int i = 0; i < M; i += SW_MR)
      sw_mk_any(SW_MIN(SW_MR, M - i), 1, kd, A + (long)i * rs, rs, cs, B + j, ldb, C + (long)i * ldc + j, ldc, acc);
}}

/* dst[c*ldd + r] = src[r*lds + c] for r < rows, c < cols; zeros for r in [rows, rpad) (W x W tiles in registers). */
static void sw_ck_transpose(const SW_T* src, long lds, int rows, int cols, SW_T* dst, long ldd, int rpad) {{
  int r0 = 0;
  for (; r0 + SW_W <= rows; r0 += SW_W) {{
    int c0 = 0;
    for (; c0 + SW_W <= cols; c0 += SW_W) {{
      sw_v t[SW_W];
      for (int r = 0; r < SW_W; ++r) t[r] = sw_vload(src + (long)(r0 + r) * lds + c0);
      sw_vtranspose(t);
      for (int c = 0; c < SW_W; ++c) sw_vstore(dst + (long)(c0 + c) * ldd + r0, t[c]);
    }}
    for (; c0 < cols; ++c0)
      for (int r = r0; r < r0 + SW_W; ++r) dst[(long)c0 * ldd + r] = src[(long)r * lds + c0];
  }}
  for (int c = 0; c < cols; ++c) {{
    for (int r = r0; r < rows; ++r) dst[(long)c * ldd + r] = src[(long)r * lds + c];
    for (int r = rows; r < rpad; ++r) dst[(long)c * ldd + r] = 0;
  }}
}}
"""


def engine_source() -> str:
    """The engine's C text (after the vector prelude and the family's sizes: ``SW_K``, ``SW_KP``, ``SW_DECAY``,
    ``SW_BONUS``, ``SW_CHUNK``)."""
    return PRELUDE + gemm_source() + INTRA


INTRA = r"""
/* ---- the masked intra-chunk decay matrix ---- */
#define SW_RUP(n) (((n) + SW_W - 1) / SW_W * SW_W)
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

/* C (+)= L B for L lower triangular (n x n, rows ldl apart): each block of SW_MR rows (one register block high) reads
 * the rows of B up to its last, so nearly every masked entry is skipped. */
static void sw_ck_trmm(int n, int N, const SW_T* L, long ldl, const SW_T* B, long ldb, SW_T* C, long ldc, int acc) {
  for (int i0 = 0; i0 < n; i0 += SW_MR) {
    const int i1 = SW_MIN(n, i0 + SW_MR);
    sw_gemm(i1 - i0, N, i1, L + (long)i0 * ldl, ldl, 1, B, ldb, C + (long)i0 * ldc, ldc, acc);
  }
}

/* C (+)= L^T B for L lower triangular: each block of SW_MR rows of C reads the rows of B from its first. */
static void sw_ck_trmm_t(int n, int N, const SW_T* L, long ldl, const SW_T* B, long ldb, SW_T* C, long ldc, int acc) {
  for (int j0 = 0; j0 < n; j0 += SW_MR) {
    const int j1 = SW_MIN(n, j0 + SW_MR);
    sw_gemm(j1 - j0, N, n - j0, L + (long)j0 * ldl + j0, 1, ldl, B + (long)j0 * ldb, ldb, C + (long)j0 * ldc, ldc,
            acc);
  }
}

/* The lower blocks of C = X Y^T (n x n, rows SW_CP apart) from Yt = Y^T (rows ldy apart, kd of them): each block of
 * SW_MR rows computes the columns up to its last, rounded up to whole vectors. */
static void sw_ck_lower_prod(int n, int kd, const SW_T* X, long ldx, const SW_T* Yt, long ldy, SW_T* C) {
  for (int i0 = 0; i0 < n; i0 += SW_MR) {
    const int i1 = SW_MIN(n, i0 + SW_MR);
    sw_gemm(i1 - i0, SW_RUP(i1), kd, X + (long)i0 * ldx, ldx, 1, Yt, ldy, C + (long)i0 * SW_CP, SW_CP, 0);
  }
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
    sw_ck_trmm(n, SW_KP, dA, SW_CP, s->yr, SW_KP, s->t1, SW_KP, 0);
    sw_ck_fma_rows(dX, d->Eq, s->t1, n);
    sw_ck_trmm_t(n, SW_KP, dA, SW_CP, s->xr, SW_KP, s->t1, SW_KP, 0);
    sw_ck_fma_rows(dY, d->Ei, s->t1, n);
    return;
  }
  for (int i0 = 0; i0 < n; i0 += SW_SUB) {
    const int i1 = SW_MIN(n, i0 + SW_SUB), J = sw_ck_block(d, X, Y, i0, s);
    if (J > 0) {
      sw_gemm(i1 - i0, SW_KP, J, dA + (long)i0 * SW_CP, SW_CP, 1, s->yr, SW_KP, s->t1, SW_KP, 0);
      sw_ck_fma_rows(dX + (long)i0 * SW_KP, s->ea + (long)i0 * SW_KP, s->t1, i1 - i0);
      sw_gemm(J, SW_KP, i1 - i0, dA + (long)i0 * SW_CP, 1, SW_CP, s->xr + (long)i0 * SW_KP, SW_KP, s->t1, SW_KP, 0);
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
