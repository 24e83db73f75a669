"""C source shared by the matrix-state kernels (:mod:`.fused_c_matrix`): operands, sequences, decays.

Assembled after the vector prelude (:func:`~.cvec.vector_prelude`).  Sizes are
compile-time (``SW_K``, ``SW_V``); rows of value columns are padded to whole
vectors (``SW_VP``) in scratch, never in the caller's arrays.  The tile
products of the chunked form are the chunk engine's (:mod:`.chunk_engine`).
"""

from __future__ import annotations

COMMON = r"""
#define SW_EINPUT 2
#define SW_MAX(p, q) ((p) > (q) ? (p) : (q))
/* Rows of K and of V padded to whole vectors (scratch layouts). */
#define SW_KP (((SW_K) + SW_W - 1) / SW_W * SW_W)
#define SW_VP (((SW_V) + SW_W - 1) / SW_W * SW_W)

typedef struct {
  const SW_T *q, *k, *v, *g, *u, *h0;
  const int64_t* cu;
  long batch, T, H, Hq, nseq;
} sw_ms;

/* Scratch aligned for whole vectors. */
static void* sw_alloc(size_t bytes, void** raw) {
  *raw = malloc(bytes + 64);
  if (!*raw) return NULL;
  return (void*)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}

/* Checks the sizes and the packed-sequence offsets (0, non-decreasing, ending at T). */
static int sw_check(const sw_ms* m) {
  if (m->Hq <= 0 || m->H % m->Hq != 0) return SW_EINPUT;
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
static void sw_seq(const sw_ms* m, long i, long* b, long* start, long* stop) {
  if (SW_HAS_SEQLENS) {
    *b = 0;
    *start = (long)m->cu[i];
    *stop = (long)m->cu[i + 1];
  } else {
    *b = i;
    *start = 0;
    *stop = m->T;
  }
}

/* Time index of scan position s (0 = first step in scan order) of the sequence [start, stop). */
#define SW_AT(start, stop, s) (SW_REVERSE ? (stop) - 1 - (s) : (start) + (s))
/* Offsets of step t of batch b: q/k rows (head hq), v/o rows (head h), g (head h). */
#define SW_QK(m, b, t, hq) ((((b) * (m)->T + (t)) * (m)->Hq + (hq)) * SW_K)
#define SW_VO(m, b, t, h) ((((b) * (m)->T + (t)) * (m)->H + (h)) * SW_V)
#define SW_G(m, b, t, h) ((((b) * (m)->T + (t)) * (m)->H + (h)) * (SW_DECAY == 2 ? SW_K : 1))

/* n elements of src into dst, whole vectors then the tail, inline (rows are a few hundred bytes: a call of the
 * library's memcpy per row costs more than the copy). */
SW_INLINE void sw_copy_n(SW_T* restrict dst, const SW_T* restrict src, int n) {
  int j = 0;
  for (; j + SW_W <= n; j += SW_W) sw_vstore(dst + j, sw_vload(src + j));
  for (; j < n; ++j) dst[j] = src[j];
}

/* Prefetches the cache lines of n elements from p (write: for a store). */
SW_INLINE void sw_prefetch(const SW_T* p, int n, int write) {
  if (write) SW_PREFETCH_LINES(p, (long)n * (long)sizeof(SW_T), 1, 3);
  else SW_PREFETCH_LINES(p, (long)n * (long)sizeof(SW_T), 0, 3);
}

/* n elements of src into dst, zeros up to padded (whole vectors). */
SW_INLINE void sw_copy_pad(SW_T* restrict dst, const SW_T* restrict src, int n, int padded) {
  sw_copy_n(dst, src, n);
  for (int j = n; j < padded; ++j) dst[j] = 0;
}

/* The decays of one step: d[k] = exp(g[k]) for "key" (SW_KP, vectorised in place), d[0] = exp(g) for "scalar".
 * No buffer scales with K on the stack: a thread's stack may be 128 KiB (musl) or less. */
SW_INLINE void sw_decays(const SW_T* gp, SW_T* restrict d) {
#if SW_DECAY == 2
  sw_copy_pad(d, gp, SW_K, SW_KP);
  for (int k0 = 0; k0 < SW_KP; k0 += SW_W) sw_vstore(d + k0, sw_vexp(sw_vload(d + k0)));
#elif SW_DECAY == 1
  d[0] = (SW_T)exp((double)gp[0]);
#else
  (void)gp; (void)d;
#endif
}

"""
