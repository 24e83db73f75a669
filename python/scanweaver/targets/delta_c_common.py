"""C source shared by the delta-rule kernels (:mod:`.fused_c_delta_rule`): operands, storage, packed steps, the sweep.

Assembled after the vector prelude (:func:`~.cvec.vector_prelude`, in the
accumulation type ``SW_T``).  Operands are stored as ``sw_s``: ``SW_T`` itself,
``_Float16`` (``SW_STORE 1``) or bfloat16 bits (``SW_STORE 2``, rounded to
nearest even); states are ``SW_T``.  Every buffer sized by K or V is heap
scratch (a K = 65536 state must not meet a thread's stack).

*Packed steps* (``sw_pk``): the rows one step needs, in ``SW_T``, contiguous
and padded to whole vectors: q (normalised), the update column ``x`` (delta:
k; dplr: b), ``y`` (dplr: k), the projection ``a`` (delta: D k, so that
``a^T S_{t-1} = k^T S'_t``; dplr: a), the decays ``d`` (``key``), and the
item's value columns of v (and do for the backward).

*The sweep* (:c:func:`sw_group`): one column group of the state tile (``nv``
vectors of value columns, in registers) through the steps of a packed block,
one pass over the K rows per step.  The projection ``p_t = a_t^T S_{t-1}`` that
step t needs is accumulated during step t-1's pass (the column group's
values are final there), so a step reads and writes each state row once:
``s = d_k s + x_k X + y_k Y`` (delta: X = beta (v - p); dplr: X = p, Y = v),
``o += q_k s``, ``p_next += a_next,k s``.
"""

from __future__ import annotations

COMMON = r"""
#define SW_EINPUT 2
#define SW_MAX(p, q) ((p) > (q) ? (p) : (q))
#define SW_KP (((SW_K) + SW_W - 1) / SW_W * SW_W)
#define SW_VP (((SW_V) + SW_W - 1) / SW_W * SW_W)
/* Steps per packed block of the forward. */
#define SW_TB 16

#if SW_STORE == 1
#if !defined(__FLT16_MAX__)
#error "float16 storage needs a C compiler with _Float16 (GCC 12 or Clang 15 on x86-64 and AArch64)"
#endif
typedef _Float16 sw_s;
SW_INLINE SW_T sw_in(sw_s x) { return (SW_T)x; }
SW_INLINE sw_s sw_out(SW_T x) { return (sw_s)x; }
#elif SW_STORE == 2
typedef uint16_t sw_s;
SW_INLINE SW_T sw_in(sw_s x) {
  const uint32_t u = (uint32_t)x << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
SW_INLINE sw_s sw_out(SW_T f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (sw_s)((u >> 16) | 0x40u); /* NaN stays a (quiet) NaN */
  return (sw_s)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                 /* to nearest, ties to even */
}
#else
typedef SW_T sw_s;
SW_INLINE SW_T sw_in(sw_s x) { return x; }
SW_INLINE sw_s sw_out(SW_T x) { return x; }
#endif

typedef struct {
  const sw_s *q, *k, *v, *g, *beta, *a, *b;
  const SW_T* h0;
  const int64_t* cu;
  long batch, T, H, Hq, nseq;
} sw_dr;

/* Offsets of step t of batch b: q/k rows (head hq); per value head h: K rows (a, b, key decays), V rows (v, o),
 * scalars (beta, scalar decays); and row k of head h of a state (nseq, H, K, V). */
#define SW_QK(m, b, t, hq) ((((b) * (m)->T + (t)) * (m)->Hq + (hq)) * SW_K)
#define SW_HK(m, b, t, h) ((((b) * (m)->T + (t)) * (m)->H + (h)) * SW_K)
#define SW_VO(m, b, t, h) ((((b) * (m)->T + (t)) * (m)->H + (h)) * SW_V)
#define SW_BT(m, b, t, h) (((b) * (m)->T + (t)) * (m)->H + (h))
#define SW_SK(m, row, h, k) ((((row) * (m)->H + (h)) * SW_K + (k)) * SW_V)

/* Sizes consistent, and packed-sequence offsets rising from 0 to T. */
static int sw_check(const sw_dr* m) {
  if (m->Hq <= 0 || m->H % m->Hq != 0 || m->T < 0) return SW_EINPUT;
  if (SW_HAS_SEQLENS) {
    if (m->batch != 1 || m->cu[0] != 0 || m->cu[m->nseq] != m->T) return SW_EINPUT;
    for (long i = 0; i < m->nseq; ++i)
      if (m->cu[i + 1] < m->cu[i]) return SW_EINPUT;
  } else if (m->nseq != m->batch) {
    return SW_EINPUT;
  }
  return SW_OK;
}

/* Sequence i: its batch index and time range [start, stop). */
static void sw_seq(const sw_dr* m, long i, long* b, long* start, long* stop) {
  *b = SW_HAS_SEQLENS ? 0 : i;
  *start = SW_HAS_SEQLENS ? (long)m->cu[i] : 0;
  *stop = SW_HAS_SEQLENS ? (long)m->cu[i + 1] : m->T;
}

static long sw_longest(const sw_dr* m) {
  long most = 0;
  for (long i = 0; i < m->nseq; ++i) {
    long b, start, stop;
    sw_seq(m, i, &b, &start, &stop);
    most = SW_MAX(most, stop - start);
  }
  return most;
}

/* Scratch aligned for whole vectors (NULL when short). */
static void* sw_alloc(size_t bytes, void** raw) {
  *raw = malloc(bytes + 64);
  if (!*raw) return NULL;
  return (void*)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}

/* n stored elements into dst, zeros up to padded. */
SW_INLINE void sw_load_row(SW_T* restrict dst, const sw_s* restrict src, int n, int padded) {
  int j = 0;
#if SW_STORE == 0
  for (; j + SW_W <= n; j += SW_W) sw_vstore(dst + j, sw_vload(src + j));
#endif
  for (; j < n; ++j) dst[j] = sw_in(src[j]);
  for (; j < padded; ++j) dst[j] = 0;
}

/* The cache lines of n stored elements from p (a row of the next block) towards L2. */
SW_INLINE void sw_prefetch_row(const sw_s* p, int n) { SW_PREFETCH_LINES(p, (long)n * (long)sizeof(sw_s), 0, 2); }

SW_INLINE void sw_store_row(sw_s* restrict dst, const SW_T* restrict src, int n) {
  int j = 0;
#if SW_STORE == 0
  for (; j + SW_W <= n; j += SW_W) sw_vstore(dst + j, sw_vload(src + j));
#endif
  for (; j < n; ++j) dst[j] = sw_out(src[j]);
}

/* Columns [c0, c0 + nv) of head h of state row `row` (or zeros) into a tile of K rows of cb; and back. */
static void sw_state_in(const sw_dr* m, const SW_T* src, long row, long h, long c0, int nv, int cb, SW_T* tile) {
  for (int k = 0; k < SW_K; ++k)
    for (int j = 0; j < cb; ++j) tile[(long)k * cb + j] = src && j < nv ? src[SW_SK(m, row, h, k) + c0 + j] : 0;
}

static void sw_state_out(const sw_dr* m, SW_T* dst, long row, long h, long c0, int nv, int cb, const SW_T* tile) {
  if (dst)
    for (int k = 0; k < SW_K; ++k) memcpy(dst + SW_SK(m, row, h, k) + c0, tile + (long)k * cb, sizeof(SW_T) * nv);
}

/* x /= sqrt(sum x^2 + 1e-6) over K (fla's l2norm); returns 1 / sqrt(...). */
SW_INLINE SW_T sw_l2(SW_T* x) {
  SW_T s = 0;
  for (int k = 0; k < SW_K; ++k) s += x[k] * x[k];
  const SW_T r = (SW_T)(1.0 / sqrt((double)(s + (SW_T)1e-6)));
  for (int k = 0; k < SW_K; ++k) x[k] *= r;
  return r;
}

typedef struct {
  int cap, cb;                  /* steps held, value columns per row */
  SW_T *q, *x, *y, *a, *d;      /* cap + 1 rows of SW_KP (a's extra row: the projection after the last step) */
  SW_T *v, *dout, *o, *p;       /* cap rows of cb: v, do, the readout, the projections p_t */
  SW_T *beta, *ds;              /* cap: beta (delta), the scalar decay exp(g) */
  void* raw;
} sw_pk;

static int sw_pk_new(sw_pk* P, int cap, int cb) {
  const size_t rows = (size_t)(cap + 1) * SW_KP, cols = (size_t)cap * (size_t)cb, all = 5 * rows + 4 * cols + 2 * cap;
  SW_T* base = (SW_T*)sw_alloc(sizeof(SW_T) * all, &P->raw);
  if (!base) return SW_ENOMEM;
  memset(base, 0, sizeof(SW_T) * all);
  P->cap = cap, P->cb = cb;
  P->q = base, P->x = P->q + rows, P->y = P->x + rows, P->a = P->y + rows, P->d = P->a + rows;
  P->v = P->d + rows, P->dout = P->v + cols, P->o = P->dout + cols, P->p = P->o + cols;
  P->beta = P->p + cols, P->ds = P->beta + cap;
  return SW_OK;
}

/* Steps t0 .. t0 + n - 1 of value head h (q/k head hq) of batch b, value columns [c0, c0 + nv), into P (do when
 * dout is given); with ahead > 0 the rows of steps t + ahead, which the next pack reads, are prefetched. */
static void sw_pack(const sw_dr* m, sw_pk* P, long b, long h, long hq, long t0, int n, long c0, int nv,
                    const sw_s* dout, long ahead) {
  for (int i = 0; i < n; ++i) {
    const long t = t0 + i;
    /* A step of a (B, T, H, K) tensor spans a page or more once H * K * 4 >= 4096 bytes, and the hardware's
     * prefetchers stop at page boundaries: the forward at (1, 4096, 32, 64, 64) (RWKV-7) and (1, 4096, 16, 128,
     * 128) (DeltaNet) ran in 0.85-0.93 of the time with this (2 threads, AVX2); the backward's sweeps ran in
     * 1.07x with their next chunk prefetched, and prefetch nothing. */
    const long tp = t + ahead;
    if (ahead > 0 && tp < m->T) {
      sw_prefetch_row(m->q + SW_QK(m, b, tp, hq), SW_K);
      sw_prefetch_row(m->k + SW_QK(m, b, tp, hq), SW_K);
      if (SW_GATE == 2) sw_prefetch_row(m->g + SW_HK(m, b, tp, h), SW_K);
      if (SW_DPLR) {
        sw_prefetch_row(m->a + SW_HK(m, b, tp, h), SW_K);
        sw_prefetch_row(m->b + SW_HK(m, b, tp, h), SW_K);
      }
      sw_prefetch_row(m->v + SW_VO(m, b, tp, h) + c0, nv);
      if (dout) sw_prefetch_row(dout + SW_VO(m, b, tp, h) + c0, nv);
    }
    SW_T *q = P->q + i * SW_KP, *kn = (SW_DPLR ? P->y : P->x) + i * SW_KP, *a = P->a + i * SW_KP;
    SW_T* d = P->d + i * SW_KP;
    sw_load_row(q, m->q + SW_QK(m, b, t, hq), SW_K, SW_KP);
    sw_load_row(kn, m->k + SW_QK(m, b, t, hq), SW_K, SW_KP);
#if SW_L2
    sw_l2(q);
    sw_l2(kn);
#endif
#if SW_GATE == 2
    sw_load_row(d, m->g + SW_HK(m, b, t, h), SW_K, SW_KP);
    for (int k0 = 0; k0 < SW_KP; k0 += SW_W) sw_vstore(d + k0, sw_vexp(sw_vload(d + k0)));
#elif SW_GATE == 1
    P->ds[i] = (SW_T)exp((double)sw_in(m->g[SW_BT(m, b, t, h)]));
#endif
    (void)d;
#if SW_DPLR
    sw_load_row(P->x + i * SW_KP, m->b + SW_HK(m, b, t, h), SW_K, SW_KP);
    sw_load_row(a, m->a + SW_HK(m, b, t, h), SW_K, SW_KP);
#else
    P->beta[i] = sw_in(m->beta[SW_BT(m, b, t, h)]);
    for (int k = 0; k < SW_K; ++k) a[k] = (SW_GATE == 2 ? d[k] : SW_GATE == 1 ? P->ds[i] : (SW_T)1) * kn[k];
#endif
    sw_load_row(P->v + i * P->cb, m->v + SW_VO(m, b, t, h) + c0, nv, P->cb);
    if (dout) sw_load_row(P->dout + i * P->cb, dout + SW_VO(m, b, t, h) + c0, nv, P->cb);
  }
}

/* Steps [0, n) of the packed block on the columns [j0, j0 + nv * SW_W) of the state tiles (K rows of P->cb):
 * step i reads tile S + i * stride and writes S + (i + 1) * stride (stride 0: in place).  Writes the readout
 * rows of P->o (out) and the projections p_i to P->p (keep_p). */
SW_INLINE void sw_group(sw_pk* P, int n, int j0, int nv, SW_T* S, long stride, int out, int keep_p) {
  const int cb = P->cb;
  sw_v p[SW_GV], pn[SW_GV], X[SW_GV], Y[SW_GV], o[SW_GV];
  for (int j = 0; j < nv; ++j) p[j] = sw_vzero;
  for (int k = 0; k < SW_K; ++k) {
    const SW_T ak = P->a[k];
    for (int j = 0; j < nv; ++j) p[j] += ak * sw_vload(S + (long)k * cb + j0 + j * SW_W);
  }
  for (int i = 0; i < n; ++i) {
    const SW_T* src = S + i * stride;
    SW_T* dst = S + (i + 1) * stride;
    const SW_T *q = P->q + i * SW_KP, *x = P->x + i * SW_KP, *an = P->a + (i + 1) * SW_KP;
    const SW_T* d = P->d + i * SW_KP;
    const SW_T* y = P->y + i * SW_KP;
    const SW_T ds = P->ds[i], beta = P->beta[i];
    (void)d, (void)y, (void)ds, (void)beta;
    for (int j = 0; j < nv; ++j) {
      const sw_v vj = sw_vload(P->v + i * cb + j0 + j * SW_W);
      if (keep_p) sw_vstore(P->p + i * cb + j0 + j * SW_W, p[j]);
      X[j] = SW_DPLR ? p[j] : beta * (vj - p[j]);
      Y[j] = vj;
      o[j] = pn[j] = sw_vzero;
    }
    for (int k = 0; k < SW_K; ++k) {
      const SW_T *sr = src + (long)k * cb + j0;
      SW_T* dr = dst + (long)k * cb + j0;
      const SW_T xs = x[k], qs = q[k], as = an[k];
#if SW_GATE == 2
      const SW_T dd = d[k];
#elif SW_GATE == 1
      const SW_T dd = ds;
#endif
#if SW_DPLR
      const SW_T ys = y[k];
#endif
      for (int j = 0; j < nv; ++j) {
        sw_v s = sw_vload(sr + j * SW_W);
#if SW_GATE
        s = dd * s;
#endif
        s += xs * X[j];
#if SW_DPLR
        s += ys * Y[j];
#endif
        sw_vstore(dr + j * SW_W, s);
        o[j] += qs * s;
        pn[j] += as * s;
      }
    }
    for (int j = 0; j < nv; ++j) {
      if (out) sw_vstore(P->o + i * cb + j0 + j * SW_W, o[j]);
      p[j] = pn[j];
    }
  }
}

/* Every column group of the tiles through the block (see sw_group). */
static void sw_groups(sw_pk* P, int n, SW_T* S, long stride, int out, int keep_p) {
  int j0 = 0;
  for (; j0 + SW_GV * SW_W <= P->cb; j0 += SW_GV * SW_W) sw_group(P, n, j0, SW_GV, S, stride, out, keep_p);
  for (; j0 < P->cb; j0 += SW_W) sw_group(P, n, j0, 1, S, stride, out, keep_p);
}
"""
