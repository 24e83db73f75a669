"""Tile products of the chunk engine (:mod:`.chunk_engine`): register-blocked micro-kernels, GEMM, transposes.

``sw_gemm(M, N, kd, A, rs, cs, B, ldb, C, ldc, acc)`` computes ``C (+)= A B``
with A read through two strides (``A[i*rs + p*cs]``: a transposed operand is
never copied) and B, C row-major, N a multiple of the vector width; its
micro-kernels hold ``MR x NR`` vectors of accumulators (``MR`` 12 where the ISA
has 32 vector registers, AVX-512 and AArch64; 6 with 16), are emitted here
unrolled with named accumulators (an array of them is spilled to the stack at
each call's ends by GCC), one per shape of a block.  The triangular products
(``sw_ck_trmm``, ``sw_ck_trmm_t``, ``sw_ck_lower_prod``) run in blocks of one
register block's height, so nearly every masked entry of a chunk's
``C x C`` matrices is skipped; the two that multiply a masked matrix take
each block's diagonal block row by row, so no entry above the diagonal is read
(0 times a NaN or inf in a later step's row would be NaN in an earlier
step's), nor, for a strictly lower matrix, the masked diagonal;
``sw_ck_transpose`` moves tiles through ``W x W`` register transposes.

Example:
    >>> from scanweaver.targets.chunk_products import micro_kernel
    >>> "c5_1 += x * b1;" in micro_kernel(6, 2)
    True
"""

from __future__ import annotations

from functools import cache

#: Rows of accumulators of the micro-kernel: 12 where the ISA has 32 vector registers (AVX-512, AArch64), else 6.
MR_WIDE, MR_NARROW = 12, 6
#: Vectors of columns of the micro-kernel (MR x NR accumulators, NR loads and one broadcast in registers).
NR = 2


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

#define SW_RUP(n) (((n) + SW_W - 1) / SW_W * SW_W)

/* C (+)= L B for L lower triangular (n x n, rows ldl apart): each block of SW_MR rows (one register block high) takes
 * the rows of B before it in one product and its own diagonal block row by row, so nearly every masked entry is
 * skipped and row i never reads a row of B past i (a NaN or inf there stays out of the earlier rows, as in the
 * recurrence, where 0 times it would be NaN); with strict (L's diagonal masked) not row i either. */
static void sw_ck_trmm(int n, int N, const SW_T* L, long ldl, const SW_T* B, long ldb, SW_T* C, long ldc, int acc,
                       int strict) {{
  for (int i0 = 0; i0 < n; i0 += SW_MR) {{
    const int i1 = SW_MIN(n, i0 + SW_MR);
    sw_gemm(i1 - i0, N, i0, L + (long)i0 * ldl, ldl, 1, B, ldb, C + (long)i0 * ldc, ldc, acc);
    for (int i = i0; i < i1; ++i)
      sw_gemm(1, N, i - i0 + 1 - strict, L + (long)i * ldl + i0, ldl, 1, B + (long)i0 * ldb, ldb, C + (long)i * ldc,
              ldc, 1);
  }}
}}

/* C (+)= L^T B for L lower triangular: each block of SW_MR rows of C takes the rows of B after it in one product and
 * its own diagonal block row by row, so row j never reads a row of B before j (with strict, nor row j). */
static void sw_ck_trmm_t(int n, int N, const SW_T* L, long ldl, const SW_T* B, long ldb, SW_T* C, long ldc, int acc,
                         int strict) {{
  for (int j0 = 0; j0 < n; j0 += SW_MR) {{
    const int j1 = SW_MIN(n, j0 + SW_MR);
    sw_gemm(j1 - j0, N, n - j1, L + (long)j1 * ldl + j0, 1, ldl, B + (long)j1 * ldb, ldb, C + (long)j0 * ldc, ldc,
            acc);
    for (int j = j0; j < j1; ++j)
      sw_gemm(1, N, j1 - j - strict, L + (long)(j + strict) * ldl + j, 1, ldl, B + (long)(j + strict) * ldb, ldb,
              C + (long)j * ldc, ldc, 1);
  }}
}}

/* The lower blocks of C = X Y^T (n x n, rows SW_CP apart) from Yt = Y^T (rows ldy apart, kd of them): each block of
 * SW_MR rows computes the columns up to its last, rounded up to whole vectors. */
static void sw_ck_lower_prod(int n, int kd, const SW_T* X, long ldx, const SW_T* Yt, long ldy, SW_T* C) {{
  for (int i0 = 0; i0 < n; i0 += SW_MR) {{
    const int i1 = SW_MIN(n, i0 + SW_MR);
    sw_gemm(i1 - i0, SW_RUP(i1), kd, X + (long)i0 * ldx, ldx, 1, Yt, ldy, C + (long)i0 * SW_CP, SW_CP, 0);
  }}
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
