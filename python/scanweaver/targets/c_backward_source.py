"""C source pieces of the fused backward kernel, assembled by :mod:`scanweaver.targets.c_backward`.

Tokens ``@NAME@`` are filled in by the emitter.  A tile runs three sweeps
over data that stays in cache: ``sw_states`` (the states h_t into a
per-thread buffer, recomputed or copied from the saved ones; it also
prefetches every operand of the tile, so that all memory streams are read
in this one sweep), ``sw_adjoint`` (the reverse scan of lam, writing g_t into
a second buffer) and ``sw_grads`` (one elementwise loop per gradient, in
memory order, with non-temporal stores where the target has them: the
gradients are written once and not read back by the kernel).  Both buffers
are in memory (time) order: ``hm[k + 1]`` is h at the tile's k-th element,
``hm[0]`` and ``hm[n + 1]`` the states just outside it.  Few memory streams
are live in each sweep: with every array starting at the same offset within
a page (as large allocations do), nine streams in one loop share an 8-way L1
set and evict each other on every access (measured: 4x slower).

The two scans come element by element (``SCANS_SCALAR``, any expression) or
``SW_VL`` at a time in registers (``SCANS_VECTOR``: the forward's in-register
block scan of :mod:`scanweaver.targets.c_chunked`, and the same for the
adjoint on lane-reversed blocks), for expressions of plain arithmetic.
"""

COMMON = r"""
typedef struct {
@FIELDS@
} sw_bctx;

/* Forward pair (A_t, U_t) of element i, resets applied. */
static inline void sw_fpair(const sw_bctx* sw, long i, SW_T* A, SW_T* U) {
@UNPACK@
  *A = @FA@;
  *U = @FU@;
}

/* Adjoint pair (A'_t, U'_t) of element i: lam_t = A'_t lam_{t+1} + U'_t. */
static inline void sw_bpair(const sw_bctx* sw, long i, SW_T* A, SW_T* U) {
@UNPACK@
  const SW_T dyv = sw->dy[i]; (void)dyv;
  *A = @BA@;
  *U = @BU@;
}

/* The reverse step at element i: returns g_t from *lam = lam_{t+1} and leaves lam_t in *lam. */
static inline SW_T sw_bstep(const sw_bctx* sw, long i, SW_T* lam) {
@UNPACK@
  const SW_T dyv = sw->dy[i]; (void)dyv;
  const SW_T g = *lam + @GOFF@;
  SW_T A, U;
  sw_bpair(sw, i, &A, &U);
  *lam = A * *lam + U;
  return g;
}

/* Memory index (from the lane's start) of a tile's first element, and the tile offset of position s. */
#define SW_LO(s0, s1) (SW_REVERSE ? len - (s1) : (s0))
#define SW_K(s) (SW_POS(len, s) - lo)
/* hm index of the state before the tile (in scan order), and the offset of h_{t-1} from h_t. */
#define SW_HIN(n) (SW_REVERSE ? (n) + 1 : 0)
#define SW_HPREV (SW_REVERSE ? 1 : -1)

#if defined(__GNUC__)
#define SW_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define SW_PREFETCH(p) ((void)(p))
#endif
/* Elements ahead of the states sweep that it prefetches (eight 64-byte lines of floats). */
#define SW_AHEAD 128
/* Elements per 64-byte line. */
#define SW_LINE (64 / (long)sizeof(SW_T))

/* Prefetches 64-byte lines [k0, k1) of every operand and dy, counted from flat index i0 (a tile's start). */
static inline void sw_prefetch_lines(const sw_bctx* sw, long i0, long k0, long k1) {
  for (long k = k0; k < k1; ++k) {
    const long i = i0 + k * SW_LINE;
@PREFETCH_LINE@
  }
}

/* Saved states of positions [s0, s1) into hm, prefetching the tile's operands as the recompute does. */
static inline void sw_copy_states(const sw_bctx* sw, long base, long s0, long s1, SW_T hin, SW_T* restrict hm) {
  const long len = sw->L, lo = SW_LO(s0, s1), n = s1 - s0;
  hm[SW_HIN(n)] = s0 > 0 ? sw->hs[base + SW_POS(len, s0 - 1)] : hin;
  sw_prefetch_lines(sw, base + lo, 0, (n + SW_LINE - 1) / SW_LINE);
  memcpy(hm + 1, sw->hs + base + lo, sizeof(SW_T) * (size_t)n);
}
"""

SCANS_SCALAR = r"""
/* States of positions [s0, s1) of the lane at base into hm (memory order, hin before the tile). */
static void sw_states(const sw_bctx* sw, long base, long s0, long s1, SW_T hin, SW_T* restrict hm) {
#if SW_SAVED
  sw_copy_states(sw, base, s0, s1, hin, hm);
#else
  const long len = sw->L, lo = SW_LO(s0, s1);
  SW_T h = hin;
  hm[SW_HIN(s1 - s0)] = h;
  for (long s = s0; s < s1; ++s) {
    const long i = base + SW_POS(len, s);
@PREFETCH@
    SW_T A, U;
    sw_fpair(sw, i, &A, &U);
    h = A * h + U;
    hm[SW_K(s) + 1] = h;
  }
#endif
}

/* The reverse scan over [s0, s1) from lam (= lam after the tile): gm[k] = g of the tile's k-th
 * element (memory order); returns lam at s0. */
static SW_T sw_adjoint(const sw_bctx* sw, long base, long s0, long s1, SW_T lam, SW_T* restrict gm,
                       long next, long nnext) {
  const long len = sw->L, lo = SW_LO(s0, s1);
  (void)next; (void)nnext;
  for (long s = s1 - 1; s >= s0; --s) gm[SW_K(s)] = sw_bstep(sw, base + SW_POS(len, s), &lam);
  return lam;
}

/* Aggregates of positions [s0, s1): h_out = fa h_in + fu (forward), lam_in = ba lam_out + bu (reverse). */
static void sw_tile_aggregates(const sw_bctx* sw, long lane, long s0, long s1, SW_T* agg) {
  const long len = sw->L, base = lane * len;
  SW_T pa = 1, pu = 0, qa = 1, qu = 0;
  for (long s = s0; s < s1 && !SW_SAVED; ++s) {
    SW_T A, U;
    sw_fpair(sw, base + SW_POS(len, s), &A, &U);
    pu = A * pu + U;
    pa = A * pa;
  }
  for (long s = s1 - 1; s >= s0; --s) {
    SW_T A, U;
    sw_bpair(sw, base + SW_POS(len, s), &A, &U);
    qu = A * qu + U;
    qa = A * qa;
  }
  agg[0] = pa; agg[1] = pu; agg[2] = qa; agg[3] = qu;
}
"""

SCANS_VECTOR = r"""
/* Memory (time) order <-> forward scan order, and <-> adjoint scan order (each an involution). */
SW_INLINE sw_vec sw_fwd(sw_vec v) { return SW_REVERSE ? sw_vrev(v) : v; }
SW_INLINE sw_vec sw_adj(sw_vec v) { return SW_REVERSE ? v : sw_vrev(v); }
/* v with the lanes of reset elements set to 0 (a select: a NaN gate at a reset stays out). */
SW_INLINE sw_vec sw_vmask(const sw_bctx* sw, long i0, sw_vec v) {
#if SW_HAS_RESET
  for (int j = 0; j < SW_VL; ++j) v[j] = sw->reset[i0 + j] ? (SW_T)0 : v[j];
#endif
  (void)sw; (void)i0;
  return v;
}

/* Block at scan positions [s, s + SW_VL) of the lane at base: the flat index of its first element in memory. */
#define SW_I0(s) (base + (SW_REVERSE ? len - (s) - SW_VL : (s)))

/* States of [s0, s1), SW_VL at a time in registers, then the tail element by element. */
static void sw_states(const sw_bctx* sw, long base, long s0, long s1, SW_T hin, SW_T* restrict hm) {
#if SW_SAVED
  sw_copy_states(sw, base, s0, s1, hin, hm);
#else
@UNPACK@
  const long len = sw->L, lo = SW_LO(s0, s1), sv = s0 + (s1 - s0) / SW_VL * SW_VL;
  sw_vec hb = sw_zero + hin;
  hm[SW_HIN(s1 - s0)] = hin;
  for (long s = s0; s < sv; s += SW_VL) {
    const long i0 = SW_I0(s), i = SW_REVERSE ? i0 : i0 + SW_VL - 1;
@PREFETCH@
    sw_vec A = sw_fwd(sw_vmask(sw, i0, @VFA@)), U = sw_fwd(@VFU@);
    sw_vscan(&A, &U);
    const sw_vec hv = A * hb + U, hmem = sw_fwd(hv);
    memcpy(hm + (i0 - base - lo) + 1, &hmem, sizeof hmem);
    hb = sw_vlast(hv);
  }
  SW_T h = hb[0];
  for (long s = sv; s < s1; ++s) {
    SW_T A, U;
    sw_fpair(sw, base + SW_POS(len, s), &A, &U);
    h = A * h + U;
    hm[SW_K(s) + 1] = h;
  }
#endif
}

/* The reverse scan over [s0, s1): the tail element by element, then blocks in registers, each
 * reversed so that lane 0 is its last position (the first the adjoint meets).  It computes on data
 * in cache, so meanwhile it prefetches the thread's next tile (``nnext`` elements from flat index
 * ``next``): that tile's states sweep then overlaps memory with this tile's arithmetic. */
static SW_T sw_adjoint(const sw_bctx* sw, long base, long s0, long s1, SW_T lam, SW_T* restrict gm,
                       long next, long nnext) {
@UNPACK@
  const long len = sw->L, lo = SW_LO(s0, s1), sv = s0 + (s1 - s0) / SW_VL * SW_VL;
  const long nblocks = (sv - s0) / SW_VL, lines = next >= 0 ? (nnext + SW_LINE - 1) / SW_LINE : 0;
  for (long s = s1 - 1; s >= sv; --s) gm[SW_K(s)] = sw_bstep(sw, base + SW_POS(len, s), &lam);
  sw_vec lb = sw_zero + lam;
  long j = 0;
  for (long s = sv - SW_VL; s >= s0; s -= SW_VL, ++j) {
    if (lines) sw_prefetch_lines(sw, next, j * lines / nblocks, (j + 1) * lines / nblocks);
    const long i0 = SW_I0(s);
    const sw_vec dyv = sw_vld(sw->dy, i0), kv = sw_vmask(sw, i0, sw_one);
    (void)kv;
    sw_vec A = sw_adj(@VBA@), U = sw_adj(@VBU@);
    sw_vscan(&A, &U);
    const sw_vec lv = A * lb + U;
    const sw_vec g = sw_adj(sw_vprev(lv, lb)) + @VGOFF@;
    memcpy(gm + (i0 - base - lo), &g, sizeof g);
    lb = sw_vlast(lv);
  }
  return lb[0];
}

/* Aggregates of positions [s0, s1), SW_VL at a time: h_out = fa h_in + fu, lam_in = ba lam_out + bu. */
static void sw_tile_aggregates(const sw_bctx* sw, long lane, long s0, long s1, SW_T* agg) {
@UNPACK@
  const long len = sw->L, base = lane * len, sv = s0 + (s1 - s0) / SW_VL * SW_VL;
  SW_T pa = 1, pu = 0, qa = 1, qu = 0;
#if !SW_SAVED
  for (long s = s0; s < sv; s += SW_VL) {
    const long i0 = SW_I0(s);
    sw_vec A = sw_fwd(sw_vmask(sw, i0, @VFA@)), U = sw_fwd(@VFU@);
    sw_vscan(&A, &U);
    pu = A[SW_VL - 1] * pu + U[SW_VL - 1];
    pa = A[SW_VL - 1] * pa;
  }
  for (long s = sv; s < s1; ++s) {
    SW_T A, U;
    sw_fpair(sw, base + SW_POS(len, s), &A, &U);
    pu = A * pu + U;
    pa = A * pa;
  }
#endif
  for (long s = s1 - 1; s >= sv; --s) {
    SW_T A, U;
    sw_bpair(sw, base + SW_POS(len, s), &A, &U);
    qu = A * qu + U;
    qa = A * qa;
  }
  for (long s = sv - SW_VL; s >= s0; s -= SW_VL) {
    const long i0 = SW_I0(s);
    const sw_vec dyv = sw_vld(sw->dy, i0), kv = sw_vmask(sw, i0, sw_one);
    (void)kv;
    sw_vec A = sw_adj(@VBA@), U = sw_adj(@VBU@);
    sw_vscan(&A, &U);
    qu = A[SW_VL - 1] * qu + U[SW_VL - 1];
    qa = A[SW_VL - 1] * qa;
  }
  agg[0] = pa; agg[1] = pu; agg[2] = qa; agg[3] = qu;
}
"""

GRADS = r"""
/* The gradients of positions [s0, s1) from the states (hm) and adjoints (gm): one loop each, in
 * memory order. */
static void sw_grads(const sw_bctx* sw, long base, long s0, long s1, const SW_T* restrict hm,
                     const SW_T* restrict gm) {
@UNPACK@
  const SW_T* restrict dyp = sw->dy; (void)dyp;
  const long len = sw->L, lo = SW_LO(s0, s1), n = s1 - s0, i_lo = base + lo;
  const SW_T* restrict hpm = hm + 1 + SW_HPREV;
  const SW_T* restrict hcm = hm + 1;
  (void)hpm; (void)hcm;
@LOOPS@
  SW_STREAM_FENCE();
}
"""

RUN = r"""
static inline SW_T sw_h0v(const sw_bctx* sw, long lane) { return SW_HAS_H0 ? sw->h0[lane] : (SW_T)0; }
static inline SW_T sw_dhlastv(const sw_bctx* sw, long lane) { return SW_HAS_DHLAST ? sw->dhlast[lane] : (SW_T)0; }

static int sw_run_backward(const sw_bctx* sw) {
  const long len = sw->L, nl = sw->nlanes;
  long nt = sw_threads();
  long tile = SW_MIN((long)SW_CHUNK, len);
  if (nl < nt) {  /* few lanes: shorter tiles, so that every thread has some */
    const long want = (len * nl + nt - 1) / nt;
    tile = SW_MIN(tile, want > SW_MIN_TILE ? want : SW_MIN_TILE);
  }
  const long ntiles = (len + tile - 1) / tile, items = nl * ntiles, stride = 2 * (tile + 2) + SW_SKEW;
  if (nt > items) nt = items;
  SW_T* scratch = (SW_T*)malloc(sizeof(SW_T) * (size_t)(nt * stride));
  SW_T* agg = ntiles > 1 ? (SW_T*)malloc(sizeof(SW_T) * (size_t)(6 * items)) : NULL;
  if (!scratch || (ntiles > 1 && !agg)) { free(scratch); free(agg); return SW_ENOMEM; }
  SW_T* carry = agg ? agg + 4 * items : NULL; /* per item: h and lam entering the tile */
  (void)nt;
  if (ntiles > 1) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long it = 0; it < items; ++it) {
      const long s0 = (it % ntiles) * tile;
      sw_tile_aggregates(sw, it / ntiles, s0, SW_MIN(s0 + tile, len), agg + 4 * it);
    }
    for (long lane = 0; lane < nl; ++lane) {
      const long first = lane * ntiles, last = first + ntiles - 1;
      SW_T h = sw_h0v(sw, lane), lam = sw_dhlastv(sw, lane);
      for (long it = first; it <= last; ++it) { carry[2 * it] = h; h = sw_carry(agg[4 * it], agg[4 * it + 1], h); }
      for (long it = last; it >= first; --it) {
        carry[2 * it + 1] = lam;
        lam = sw_carry(agg[4 * it + 2], agg[4 * it + 3], lam);
      }
    }
  }
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long it = 0; it < items; ++it) {
#ifdef _OPENMP
    const long tid = omp_get_thread_num();
#else
    const long tid = 0;
#endif
    const long lane = it / ntiles, tl = it % ntiles, s0 = tl * tile, s1 = SW_MIN(s0 + tile, len);
    const long base = lane * len;
    SW_T* hs = scratch + tid * stride;
    SW_T* gs = hs + tile + 2 + SW_SKEW;
    sw_states(sw, base, s0, s1, ntiles > 1 ? carry[2 * it] : sw_h0v(sw, lane), hs);
    long next = -1, nnext = 0;
    if (it + 1 < items) {  /* the next item, which static scheduling gives this thread too (or a neighbour) */
      const long s0n = ((it + 1) % ntiles) * tile, s1n = SW_MIN(s0n + tile, len);
      next = ((it + 1) / ntiles) * len + SW_LO(s0n, s1n);
      nnext = s1n - s0n;
    }
    const SW_T lam = sw_adjoint(sw, base, s0, s1, ntiles > 1 ? carry[2 * it + 1] : sw_dhlastv(sw, lane), gs,
                                next, nnext);
    sw_grads(sw, base, s0, s1, hs, gs);
    if (tl == 0 && sw->dh0) sw->dh0[lane] = lam;
  }
  free(scratch);
  free(agg);
  return SW_OK;
}
"""

ENTRY = r"""
/* Entry point: 0 on success, SW_ENOMEM when scratch memory is short. */
int sw_backward(@PARAMS@) {
  sw_bctx sw;
@INIT@
  if (nlanes <= 0 || L <= 0) return SW_OK;
  return sw_run_backward(&sw);
}
"""
