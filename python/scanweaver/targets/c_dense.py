"""C source of dense k x k transitions (``kind=dense``): the element helpers, ``sequential``, and
``chunked`` for large states with a varying A.

h_t = A_t h_{t-1} + U_t with a state vector of ``SW_K`` entries per lane;
``h0`` and ``hlast`` hold ``SW_K`` values per lane.  :data:`CHUNKED` composes
each chunk's matrices element by element (k^3 work per element), chains the
chunk aggregates per lane, and replays each chunk from its carry; the usual
``chunked`` rendering is :mod:`scanweaver.targets.c_dense_vertical`.
Tokens ``@NAME@`` are filled in by :mod:`scanweaver.targets.c_target`.
"""

CONTEXT = r"""
typedef struct {
@FIELDS@
} sw_ctx;

/* A (row-major) and U of element i, resets applied. */
static inline void sw_dpair(const sw_ctx* sw, long i, SW_T* restrict A, SW_T* restrict U) {
@UNPACK@
@PAIR@
}

/* y_t of element i from h_t and h_{t-1}. */
static inline SW_T sw_dout(const sw_ctx* sw, long i, const SW_T* h, const SW_T* hp) {
@UNPACK@
  (void)h; (void)hp;
  return @OUT@;
}

/* h <- A h + U (h and hn may not alias). */
static inline void sw_dstep(const SW_T* restrict A, const SW_T* restrict U, const SW_T* restrict h,
                            SW_T* restrict hn) {
  for (int r = 0; r < SW_K; ++r) {
    SW_T acc = U[r];
    for (int c = 0; c < SW_K; ++c) acc += A[r * SW_K + c] * h[c];
    hn[r] = acc;
  }
}

/* hn <- M h + v for an aggregate (M, v) of many steps entered with the carry h: a zero entry of h takes no part,
 * so a zero carry gives v even where products in M have overflowed (inf * 0 would be NaN; see sw_carry). */
static inline void sw_dcarry(const SW_T* restrict M, const SW_T* restrict v, const SW_T* restrict h,
                             SW_T* restrict hn) {
  for (int r = 0; r < SW_K; ++r) {
    SW_T acc = v[r];
    for (int c = 0; c < SW_K; ++c)
      if (h[c] != (SW_T)0) acc += M[r * SW_K + c] * h[c];
    hn[r] = acc;
  }
}

/* (M, v) <- (A, U) o (M, v) = (A M, A v + U). */
static inline void sw_dcompose(const SW_T* restrict A, const SW_T* restrict U, SW_T* restrict M,
                               SW_T* restrict v) {
  SW_T Mn[SW_K * SW_K], vn[SW_K];
  for (int r = 0; r < SW_K; ++r) {
    SW_T acc = U[r];
    for (int c = 0; c < SW_K; ++c) acc += A[r * SW_K + c] * v[c];
    vn[r] = acc;
    for (int c = 0; c < SW_K; ++c) {
      SW_T m = 0;
      for (int q = 0; q < SW_K; ++q) m += A[r * SW_K + q] * M[q * SW_K + c];
      Mn[r * SW_K + c] = m;
    }
  }
  memcpy(M, Mn, sizeof Mn);
  memcpy(v, vn, sizeof vn);
}

static inline void sw_dh0(const sw_ctx* sw, long lane, SW_T* h) {
  for (int r = 0; r < SW_K; ++r) h[r] = SW_HAS_H0 ? sw->h0[lane * SW_K + r] : (SW_T)0;
}

static inline void sw_dstore_last(const sw_ctx* sw, long lane, const SW_T* h) {
  if (sw->hlast) for (int r = 0; r < SW_K; ++r) sw->hlast[lane * SW_K + r] = h[r];
}

/* Replays scan positions [s0, s1) of a lane from state h (updated in place). */
static inline void sw_dreplay(const sw_ctx* sw, long lane, long s0, long s1, SW_T* h) {
  const long len = sw->L;
  SW_T A[SW_K * SW_K], U[SW_K], hn[SW_K];
  for (long s = s0; s < s1; ++s) {
    const long i = lane * len + SW_POS(len, s);
    sw_dpair(sw, i, A, U);
    sw_dstep(A, U, h, hn);
    sw->y[i] = sw_dout(sw, i, hn, h);
    memcpy(h, hn, sizeof hn);
  }
}

"""

SEQUENTIAL = r"""
/* Schedule `sequential` over dense states: one loop over L per lane. */
static int sw_run(const sw_ctx* sw) {
  const long nl = sw->nlanes, len = sw->L;
  const int nt = (int)SW_MIN((long)sw_threads(), nl);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long lane = 0; lane < nl; ++lane) {
    SW_T h[SW_K];
    sw_dh0(sw, lane, h);
    sw_dreplay(sw, lane, 0, len, h);
    sw_dstore_last(sw, lane, h);
  }
  return SW_OK;
}
"""

CHUNKED = r"""
/* Schedule `chunked` over dense states: chunk aggregates, a chain per lane, replay per chunk. */
static int sw_run(const sw_ctx* sw) {
  const long nl = sw->nlanes, len = sw->L, chunk = SW_CHUNK;
  const long nc = (len + chunk - 1) / chunk, work = nl * nc;
  const int nt = sw_threads();
  (void)nt;
  SW_T* agg = (SW_T*)malloc(sizeof(SW_T) * (size_t)work * (SW_K * SW_K + SW_K));
  SW_T* carry = (SW_T*)malloc(sizeof(SW_T) * (size_t)work * SW_K);
  if (!agg || !carry) { free(agg); free(carry); return SW_ENOMEM; }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long w = 0; w < work; ++w) {
    const long lane = w / nc, s0 = (w % nc) * chunk, s1 = SW_MIN(s0 + chunk, len);
    SW_T* M = agg + w * (SW_K * SW_K + SW_K);
    SW_T* v = M + SW_K * SW_K;
    SW_T A[SW_K * SW_K], U[SW_K];
    for (int q = 0; q < SW_K * SW_K; ++q) M[q] = (q / SW_K == q % SW_K) ? (SW_T)1 : (SW_T)0;
    for (int r = 0; r < SW_K; ++r) v[r] = 0;
    for (long s = s0; s < s1; ++s) {
      sw_dpair(sw, lane * len + SW_POS(len, s), A, U);
      sw_dcompose(A, U, M, v);
    }
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long lane = 0; lane < nl; ++lane) {
    SW_T h[SW_K], hn[SW_K];
    sw_dh0(sw, lane, h);
    for (long c = 0; c < nc; ++c) {
      const SW_T* M = agg + (lane * nc + c) * (SW_K * SW_K + SW_K);
      memcpy(carry + (lane * nc + c) * SW_K, h, sizeof h);
      sw_dcarry(M, M + SW_K * SW_K, h, hn);
      memcpy(h, hn, sizeof h);
    }
    sw_dstore_last(sw, lane, h);
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long w = 0; w < work; ++w) {
    const long lane = w / nc, s0 = (w % nc) * chunk;
    SW_T h[SW_K];
    memcpy(h, carry + w * SW_K, sizeof h);
    sw_dreplay(sw, lane, s0, SW_MIN(s0 + chunk, len), h);
  }
  free(agg);
  free(carry);
  return SW_OK;
}
"""
