"""C source of the ``chunked`` schedule on CPU cores (assembled by :mod:`scanweaver.targets.c`).

The scan runs in tiles of ``SW_CHUNK`` scan positions.  Each tile's pairs
(A_t, U_t) are computed once into a scratch buffer (so input expressions such
as ``exp`` gates are evaluated once per element), and ``SW_INTERLEAVE``
independent recurrence chains advance together, so the latency of one
``h = A*h + U`` (a dependency chain of fused multiply-adds) is hidden behind
the others.  Two work layouts, picked per call from the shape:

* rows (many lanes): a thread takes ``SW_INTERLEAVE`` lanes at once and walks
  their tiles in order.  A lane's carry never leaves its thread, so the
  ``chunked.reduce`` pass is not needed: ``chunked.scan`` is the running state.
* split (few lanes, long L): the tiles of one lane are dealt round-robin to
  the threads.  A tile is reduced to its aggregate over ``SW_INTERLEAVE``
  contiguous sub-ranges at once (``chunked.reduce``), takes its carry-in from
  the previous tile through a ready flag and publishes its carry-out
  (``chunked.scan``, a chained hand-off), then replays its sub-ranges from
  their carries (``chunked.propagate``) while the tile is still in cache,
  so memory is read once.
"""

CHUNKED = r"""
#define SW_G SW_INTERLEAVE
/* Elements of padding after a scratch row or sub-range: a pitch that is a
 * multiple of 4 KiB puts every chain in the same L1 sets (4K aliasing). */
#define SW_ROW_PAD (64 / (long)sizeof(SW_T))
/* Bytes between the A and U scratch buffers modulo 4 KiB, past the chains' pads. */
#define SW_AU_SKEW 512
#define SW_PAGE (4096 / (long)sizeof(SW_T))
/* Row pitch of the rows layout: a compile-time constant, so the chains share one index. */
#define SW_ROWS_LD ((long)SW_CHUNK + SW_ROW_PAD)
#if defined(__GNUC__)
#define SW_INLINE static inline __attribute__((always_inline))
#else
#define SW_INLINE static inline
#endif
/* A tile is split over chains only when each chain gets this many elements. */
#define SW_SPLIT_MIN 32
/* A chain pass is cut into this many blocks; after each, a slice of the next
 * tile is prefetched, so memory streams while the chains compute. */
#define SW_PF_PARTS 16
/* Busy polls of a ready flag before the waiting thread yields its core. */
#define SW_SPINS 2048

/* Chains j < nch, row j at j*ld, over k in [k0, k1): h_j <- A h_j + U, h written over U. */
SW_INLINE void sw_chains_scan(const SW_T* restrict A, SW_T* restrict U, long ld, long k0, long k1,
                                  const int nch, SW_T* restrict h) {
  SW_T hh[SW_G];
  for (int j = 0; j < nch; ++j) hh[j] = h[j];
  for (long k = k0; k < k1; ++k) {
    const SW_T* a = A + k;
    SW_T* u = U + k;
    for (int j = 0; j < nch; ++j) {
      hh[j] = a[j * ld] * hh[j] + u[j * ld];
      u[j * ld] = hh[j];
    }
  }
  for (int j = 0; j < nch; ++j) h[j] = hh[j];
}

/* Aggregates of chains j < nch over k in [k0, k1): (ga, gu) <- (A ga, A gu + U). */
SW_INLINE void sw_chains_reduce(const SW_T* restrict A, const SW_T* restrict U, long ld, long k0, long k1,
                                    const int nch, SW_T* restrict ga, SW_T* restrict gu) {
  SW_T pa[SW_G], pu[SW_G];
  for (int j = 0; j < nch; ++j) { pa[j] = ga[j]; pu[j] = gu[j]; }
  for (long k = k0; k < k1; ++k) {
    const SW_T* a = A + k;
    const SW_T* u = U + k;
    for (int j = 0; j < nch; ++j) {
      pu[j] = a[j * ld] * pu[j] + u[j * ld];
      pa[j] = a[j * ld] * pa[j];
    }
  }
  for (int j = 0; j < nch; ++j) { ga[j] = pa[j]; gu[j] = pu[j]; }
}

/* (A_t, U_t) of scan positions s0 .. s0+n-1 of a lane into A[0..n), U[0..n). */
static void sw_fill(const sw_ctx* sw, long lane, long s0, long n, SW_T* restrict A, SW_T* restrict U) {
  const long len = sw->L, base = lane * len;
  for (long k = 0; k < n; ++k) sw_pair(sw, base + SW_POS(len, s0 + k), A + k, U + k);
}

/* y of scan positions s0 .. s0+n-1 of a lane from states H[0..n); hb is the state before. */
static void sw_emit(const sw_ctx* sw, long lane, long s0, long n, const SW_T* restrict H, SW_T hb) {
  const long len = sw->L, base = lane * len;
  SW_T* restrict y = sw->y;
  y[base + SW_POS(len, s0)] = sw_out(sw, base + SW_POS(len, s0), H[0], hb);
  for (long k = 1; k < n; ++k) {
    const long i = base + SW_POS(len, s0 + k);
    y[i] = sw_out(sw, i, H[k], H[k - 1]);
  }
}

/* Flat element range [lo, hi) of scan positions s0 .. s0+n-1 of a lane. */
typedef struct { const sw_ctx* sw; long lo, hi; } sw_span;

static sw_span sw_tile_span(const sw_ctx* sw, long lane, long s0, long n) {
  sw_span r;
  const long len = sw->L, base = lane * len;
  n = s0 < len ? SW_MIN(n, len - s0) : 0;
  r.sw = sw;
  r.lo = base + (SW_REVERSE ? len - s0 - n : s0);
  r.hi = r.lo + n;
  return r;
}

/* Prefetches part q of SW_PF_PARTS of a span. */
static inline void sw_prefetch_part(sw_span r, long q) {
  const long w = r.hi - r.lo;
  if (w > 0) sw_prefetch_range(r.sw, r.lo + w * q / SW_PF_PARTS, r.lo + w * (q + 1) / SW_PF_PARTS);
}

/* ---- rows: SW_G lanes per thread, each lane's tiles in order ---- */

static void sw_rows_group(const sw_ctx* sw, long g, SW_T* A, SW_T* U) {
  const long ld = SW_ROWS_LD;
  const long len = sw->L, l0 = g * SW_G;
  const int nv = (int)SW_MIN((long)SW_G, sw->nlanes - l0);
  SW_T h[SW_G], hb[SW_G];
  for (int j = 0; j < SW_G; ++j) {
    h[j] = j < nv ? sw_h0(sw, l0 + j) : (SW_T)0;
    if (j >= nv) {
      memset(A + j * ld, 0, sizeof(SW_T) * (size_t)ld);
      memset(U + j * ld, 0, sizeof(SW_T) * (size_t)ld);
    }
  }
  for (long s0 = 0; s0 < len; s0 += SW_CHUNK) {
    const long n = SW_MIN((long)SW_CHUNK, len - s0);
    for (int j = 0; j < nv; ++j) sw_fill(sw, l0 + j, s0, n, A + j * ld, U + j * ld);
    for (int j = 0; j < SW_G; ++j) hb[j] = h[j];
    for (long q = 0; q < SW_PF_PARTS; ++q) {
      sw_chains_scan(A, U, ld, n * q / SW_PF_PARTS, n * (q + 1) / SW_PF_PARTS, SW_G, h);
      for (int j = 0; j < nv; ++j) sw_prefetch_part(sw_tile_span(sw, l0 + j, s0 + SW_CHUNK, SW_CHUNK), q);
    }
    for (int j = 0; j < nv; ++j) sw_emit(sw, l0 + j, s0, n, U + j * ld, hb[j]);
  }
  for (int j = 0; j < nv; ++j) sw_store_last(sw, l0 + j, h[j]);
}

static int sw_run_rows(const sw_ctx* sw, int nt) {
  const long ngroups = (sw->nlanes + SW_G - 1) / SW_G;
  const long ubase = SW_G * SW_ROWS_LD + SW_AU_SKEW / (long)sizeof(SW_T);
  const long per_thread = 2 * ubase;
  SW_T* scratch = (SW_T*)malloc(sizeof(SW_T) * (size_t)(per_thread * nt));
  if (!scratch) return SW_ENOMEM;
#pragma omp parallel num_threads(nt)
  {
#ifdef _OPENMP
    SW_T* A = scratch + per_thread * omp_get_thread_num();
#else
    SW_T* A = scratch;
#endif
#pragma omp for schedule(dynamic, 1)
    for (long g = 0; g < ngroups; ++g) sw_rows_group(sw, g, A, A + ubase);
  }
  free(scratch);
  return SW_OK;
}

/* ---- split: one lane's tiles over the threads, chained carries ---- */

/* Sub-ranges of a tile of n: chains j < nch start at j*ld; the last one holds `last`. */
typedef struct { long ld, last; int nch; } sw_plan;

SW_INLINE sw_plan sw_plan_tile(long n) {
  sw_plan p;
  const long q = n / SW_G;
  if (q < SW_SPLIT_MIN) { p.ld = n; p.last = n; p.nch = 1; return p; }
  p.ld = q + (q >= 2 * SW_G * SW_ROW_PAD ? SW_ROW_PAD : 0);
  p.last = n - (SW_G - 1) * p.ld;
  p.nch = SW_G;
  return p;
}

/* Sub-range aggregates of a tile; prefetches span `next` on the way. */
SW_INLINE void sw_tile_reduce(const SW_T* A, const SW_T* U, sw_plan p, SW_T* ga, SW_T* gu, sw_span next) {
  for (int j = 0; j < SW_G; ++j) { ga[j] = (SW_T)1; gu[j] = (SW_T)0; }
  if (p.nch == 1) {
    sw_chains_reduce(A, U, p.ld, 0, p.ld, 1, ga, gu);
    for (long q = 0; q < SW_PF_PARTS; ++q) sw_prefetch_part(next, q);
    return;
  }
  const long common = SW_MIN(p.ld, p.last), tail = (SW_G - 1) * p.ld;
  for (long q = 0; q < SW_PF_PARTS; ++q) {
    sw_chains_reduce(A, U, p.ld, common * q / SW_PF_PARTS, common * (q + 1) / SW_PF_PARTS, SW_G, ga, gu);
    sw_prefetch_part(next, q);
  }
  if (p.last < p.ld) sw_chains_reduce(A, U, p.ld, common, p.ld, SW_G - 1, ga, gu);
  else sw_chains_reduce(A + tail, U + tail, p.ld, common, p.last, 1, ga + SW_G - 1, gu + SW_G - 1);
}

SW_INLINE void sw_tile_scan(const SW_T* A, SW_T* U, sw_plan p, const SW_T* ga, const SW_T* gu, SW_T carry) {
  SW_T h[SW_G];
  h[0] = carry;
  for (int j = 1; j < p.nch; ++j) h[j] = ga[j - 1] * h[j - 1] + gu[j - 1];
  if (p.nch == 1) { sw_chains_scan(A, U, p.ld, 0, p.ld, 1, h); return; }
  const long common = SW_MIN(p.ld, p.last), tail = (SW_G - 1) * p.ld;
  sw_chains_scan(A, U, p.ld, 0, common, SW_G, h);
  if (p.last < p.ld) sw_chains_scan(A, U, p.ld, common, p.ld, SW_G - 1, h);
  else sw_chains_scan(A + tail, U + tail, p.ld, common, p.last, 1, h + SW_G - 1);
}

static inline int sw_flag_get(int* p) {
#if defined(__GNUC__)
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  int v;
#pragma omp atomic read
  v = *p;
#pragma omp flush
  return v;
#endif
}

static inline void sw_flag_set(int* p) {
#if defined(__GNUC__)
  __atomic_store_n(p, 1, __ATOMIC_RELEASE);
#else
#pragma omp flush
#pragma omp atomic write
  *p = 1;
#endif
}

/* The carry into a tile, once the tile before has published it. */
static SW_T sw_wait_carry(int* ready, const SW_T* carry) {
  long spins = 0;
  while (!sw_flag_get(ready))
    if (++spins > SW_SPINS) SW_YIELD();
  return *carry;
}

static void sw_split_tile(const sw_ctx* sw, long lane, long tile, long ntiles, long nthreads, SW_T* A, SW_T* U,
                          SW_T* carry, int* ready) {
  const long s0 = tile * (long)SW_CHUNK, n = SW_MIN((long)SW_CHUNK, sw->L - s0);
  /* Full tiles get a compile-time plan (constant sub-range offsets). */
  const sw_plan p = n == SW_CHUNK ? sw_plan_tile(SW_CHUNK) : sw_plan_tile(n);
  const sw_span next = sw_tile_span(sw, lane, s0 + nthreads * (long)SW_CHUNK, SW_CHUNK);
  SW_T ga[SW_G], gu[SW_G];
  sw_fill(sw, lane, s0, n, A, U);
  if (n == SW_CHUNK) sw_tile_reduce(A, U, sw_plan_tile(SW_CHUNK), ga, gu, next);
  else sw_tile_reduce(A, U, p, ga, gu, next);
  const SW_T c = sw_wait_carry(ready + tile, carry + tile);
  /* Carry-out through the sub-range aggregates in order (not their product,
   * which underflows sooner and would turn an infinite state into NaN). */
  SW_T out = c;
  for (int j = 0; j < p.nch; ++j) out = ga[j] * out + gu[j];
  carry[tile + 1] = out;
  sw_flag_set(ready + tile + 1);
  if (n == SW_CHUNK) sw_tile_scan(A, U, sw_plan_tile(SW_CHUNK), ga, gu, c);
  else sw_tile_scan(A, U, p, ga, gu, c);
  sw_emit(sw, lane, s0, n, U, c);
  if (tile == ntiles - 1) carry[ntiles] = U[n - 1];
}

static int sw_run_split(const sw_ctx* sw, int nt) {
  const long len = sw->L, ntiles = (len + SW_CHUNK - 1) / SW_CHUNK;
  const long ld = SW_MIN((long)SW_CHUNK, len);
  const long ubase = (ld + SW_PAGE - 1) / SW_PAGE * SW_PAGE + SW_AU_SKEW / (long)sizeof(SW_T);
  const long per_thread = 2 * ubase;
  if (nt > ntiles) nt = (int)ntiles;
  SW_T* scratch = (SW_T*)malloc(sizeof(SW_T) * (size_t)(per_thread * nt));
  SW_T* carry = (SW_T*)malloc(sizeof(SW_T) * (size_t)(ntiles + 1));
  int* ready = (int*)malloc(sizeof(int) * (size_t)(ntiles + 1));
  if (!scratch || !carry || !ready) { free(scratch); free(carry); free(ready); return SW_ENOMEM; }
  for (long lane = 0; lane < sw->nlanes; ++lane) {
    memset(ready, 0, sizeof(int) * (size_t)(ntiles + 1));
    carry[0] = sw_h0(sw, lane);
    ready[0] = 1;
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
      const long tid = omp_get_thread_num(), P = omp_get_num_threads();
#else
      const long tid = 0, P = 1;
#endif
      SW_T* A = scratch + per_thread * tid;
      for (long tile = tid; tile < ntiles; tile += P) sw_split_tile(sw, lane, tile, ntiles, P, A, A + ubase, carry, ready);
    }
    sw_store_last(sw, lane, carry[ntiles]);
  }
  free(scratch); free(carry); free(ready);
  return SW_OK;
}

/* Rows when every thread gets at least half a group of lanes, else split. */
static int sw_run(const sw_ctx* sw) {
  const int nt = sw_threads();
  if (2 * sw->nlanes >= (long)nt * SW_G) {
    const long ngroups = (sw->nlanes + SW_G - 1) / SW_G;
    return sw_run_rows(sw, (int)SW_MIN((long)nt, ngroups));
  }
  return sw_run_split(sw, nt);
}
"""
