"""C source of the fused recurrent matrix-state forward (assembled by :mod:`.fused_c_matrix`).

Per (sequence, head, block of ``block_v`` value columns) the ``K x block_v`` tile of
the state lives in the thread's scratch (L1 for the default blocks), a row of
``block_v / W`` vectors per key: a step reads q_t, k_t, g_t and the block of v_t
once, updates every row with one multiply-add per vector (``S[k] = d_k S[k] +
k_t[k] v_t``) and accumulates ``o_t += q_t[k] S[k]`` in registers, so the
outputs are written once and no horizontal sum is needed.  Value columns are
independent in the forward, so blocks of columns are threads' work as much as
heads are.  When (sequence, head, block) items are fewer than the threads,
each sequence is cut into parts in scan order: the parts but the last run
from a zero state to their aggregate (end state and summed log decays, a
scalar or a K-vector), the carries are chained ``C_{p+1} = exp(G_p) C_p + E_p``
(in double, and ``E_p`` where ``C_p`` is 0, so that a part whose decays
overflow never multiplies ``inf`` by a zero carry), and every part reruns from
its carry writing o.

Entry point (ABI order of :meth:`~scanweaver.fused.matrix_state.MatrixState.params`)::

    int sw_matrix_state_forward(q, k, v, g, u, h0, cu_seqlens, o, hlast,
                                long batch, long T, long H, long Hq, long nseq);

0 on success, 1 when scratch memory is short, 2 for inconsistent sizes or offsets.
"""

from __future__ import annotations

RECURRENT = r"""
/* Value columns per block: SW_BLOCK_V rounded up to whole vectors, at most V's padded width. */
#define SW_CB0 (((SW_BLOCK_V) + SW_W - 1) / SW_W * SW_W)
#define SW_CB (SW_CB0 < SW_VP ? SW_CB0 : SW_VP)
#define SW_NCB ((SW_V + SW_CB - 1) / SW_CB)
#define SW_NVEC (SW_CB / SW_W)
/* Fewest steps per part when a sequence is split over threads (the aggregate pass and the carries must stay
 * small beside the work). */
#define SW_MIN_PART 64

/* One (sequence, head, column block) of the recurrent form. */
typedef struct { long b, start, stop, h, c0; int nv; } sw_item;

static sw_item sw_item_at(const sw_ms* m, long it) {
  sw_item x;
  const long cb = it % SW_NCB, rest = it / SW_NCB;
  x.h = rest % m->H;
  sw_seq(m, rest / m->H, &x.b, &x.start, &x.stop);
  x.c0 = cb * SW_CB;
  x.nv = (int)SW_MIN((long)SW_CB, SW_V - x.c0);
  return x;
}

/* Steps per packed block: the rows of q, k, the decays and the block of v of SW_TB steps are copied into
 * contiguous scratch before the state passes over them (rows of one operand are H*K apart in the caller's
 * arrays, 4 KiB at H*K = 1024 floats: every step's row would map to the same L1 sets as the previous one's
 * and evict the state), and the outputs are written there and copied out after the block. */
#define SW_TB 8
/* Vectors of value columns per register group: two steps of SW_GV vectors (state row, v, o) in registers. */
#define SW_GV 2

/* The packed block's rows, in the thread's heap scratch (24 K elements and more: at large K no thread's stack
 * holds them). */
typedef struct {
  SW_T *q, *k, *d, *v, *o, *beta;
} sw_pack;
#define SW_PACK_ELEMS (3L * SW_TB * SW_KP + 2L * SW_TB * SW_CB + SW_TB)

/* Steps i (d the decays, k, v, q rows of the packed block) on columns [j0, j0 + nv * SW_W): one pass over
 * the K rows of S for ns (1 or 2) steps. */
SW_INLINE void sw_rec_group(const sw_pack* restrict P, int i, int ns, int j0, int nv, SW_T* restrict S, int out) {
  sw_v v0[SW_GV], v1[SW_GV], o0[SW_GV], o1[SW_GV];
  for (int j = 0; j < nv; ++j) {
    v0[j] = sw_vload(P->v + i * SW_CB + j0 + j * SW_W);
    v1[j] = ns > 1 ? sw_vload(P->v + (i + 1) * SW_CB + j0 + j * SW_W) : sw_vzero;
    o0[j] = P->beta[i] * v0[j];
    o1[j] = ns > 1 ? P->beta[i + 1] * v1[j] : sw_vzero;
  }
  const SW_T *d0 = P->d + i * SW_KP, *k0 = P->k + i * SW_KP, *q0 = P->q + i * SW_KP;
  for (int k = 0; k < SW_K; ++k) {
    sw_v* restrict row = (sw_v*)(S + (long)k * SW_CB + j0);
    const SW_T da = SW_DECAY == 2 ? d0[k] : d0[0], ka = k0[k], qa = q0[k];
    if (ns > 1) {
      const SW_T db = SW_DECAY == 2 ? d0[SW_KP + k] : d0[SW_KP], kb = k0[SW_KP + k], qb = q0[SW_KP + k];
      for (int j = 0; j < nv; ++j) {
        const sw_v old = row[j], s1 = da * old + ka * v0[j], s2 = db * s1 + kb * v1[j];
        row[j] = s2;
        if (out) {
          o0[j] += qa * (SW_BONUS ? old : s1);
          o1[j] += qb * (SW_BONUS ? s1 : s2);
        }
      }
    } else {
      for (int j = 0; j < nv; ++j) {
        const sw_v old = row[j], s1 = da * old + ka * v0[j];
        row[j] = s1;
        if (out) o0[j] += qa * (SW_BONUS ? old : s1);
      }
    }
  }
  if (out)
    for (int j = 0; j < nv; ++j) {
      sw_vstore((SW_T*)P->o + i * SW_CB + j0 + j * SW_W, o0[j]);
      if (ns > 1) sw_vstore((SW_T*)P->o + (i + 1) * SW_CB + j0 + j * SW_W, o1[j]);
    }
}

/* The packed block in mem (SW_PACK_ELEMS, vector-aligned): zeros in the pads of the rows (never read but kept
 * finite), decays of 1, no bonus term. */
static void sw_pack_init(sw_pack* P, SW_T* mem) {
  P->q = mem;
  P->k = P->q + SW_TB * SW_KP;
  P->d = P->k + SW_TB * SW_KP;
  P->v = P->d + SW_TB * SW_KP;
  P->o = P->v + SW_TB * SW_CB;
  P->beta = P->o + SW_TB * SW_CB;
  for (int i = 0; i < SW_TB; ++i) {
    for (int j = 0; j < SW_KP; ++j) P->q[i * SW_KP + j] = P->k[i * SW_KP + j] = 0, P->d[i * SW_KP + j] = 1;
    for (int j = 0; j < SW_CB; ++j) P->v[i * SW_CB + j] = 0;
    P->beta[i] = 0;
  }
}

/* Scan positions [s0, s1) of item x from the state S (K rows of SW_CB, updated in place).  With o, writes o;
 * without, only the state runs and gsum (SW_KP, or [0] for "scalar") collects the summed log decays.  P: the
 * thread's packed block (sw_pack_init). */
static void sw_rec_range(const sw_ms* m, const sw_item* x, long s0, long s1, SW_T* restrict S, SW_T* restrict o,
                         double* restrict gsum, sw_pack* restrict Pp) {
  const long hq = x->h / (m->H / m->Hq);
  sw_pack* restrict const P = Pp;
  for (long sb = s0; sb < s1; sb += SW_TB) {
    const int nb = (int)SW_MIN((long)SW_TB, s1 - sb);
    for (int i = 0; i < nb; ++i) {
      const long t = SW_AT(x->start, x->stop, sb + i);
      if (sb + SW_TB + i < x->stop - x->start) {  /* the next block's rows: another page each (no hardware prefetch) */
        const long tn = SW_AT(x->start, x->stop, sb + SW_TB + i);
        sw_prefetch(m->q + SW_QK(m, x->b, tn, hq), SW_K, 0);
        sw_prefetch(m->k + SW_QK(m, x->b, tn, hq), SW_K, 0);
        sw_prefetch(m->v + SW_VO(m, x->b, tn, x->h) + x->c0, x->nv, 0);
        if (SW_DECAY == 2) sw_prefetch(m->g + SW_G(m, x->b, tn, x->h), SW_K, 0);
        if (o) sw_prefetch(o + SW_VO(m, x->b, tn, x->h) + x->c0, x->nv, 1);
      }
      sw_copy_n(P->q + i * SW_KP, m->q + SW_QK(m, x->b, t, hq), SW_K);
      sw_copy_n(P->k + i * SW_KP, m->k + SW_QK(m, x->b, t, hq), SW_K);
      sw_copy_n(P->v + i * SW_CB, m->v + SW_VO(m, x->b, t, x->h) + x->c0, x->nv);
      for (int j = x->nv; j < SW_CB; ++j) P->v[i * SW_CB + j] = 0;
      if (SW_DECAY) {
        const SW_T* gp = m->g + SW_G(m, x->b, t, x->h);
        sw_decays(gp, P->d + i * SW_KP);
        if (!o)
          for (int k = 0; k < (SW_DECAY == 2 ? SW_K : 1); ++k) gsum[k] += gp[k];
      }
      if (SW_BONUS && o) {
        const SW_T *up = m->u + x->h * SW_K, *qt = P->q + i * SW_KP, *kt = P->k + i * SW_KP;
        SW_T beta = 0;
        for (int k = 0; k < SW_K; ++k) beta += qt[k] * up[k] * kt[k];
        P->beta[i] = beta;
      }
    }
    /* the group's sizes and o as constants in each call, so that its loops are straight-line code */
    for (int j0 = 0; j0 + SW_GV * SW_W <= SW_CB; j0 += SW_GV * SW_W) {
      int i = 0;
      if (o)
        for (; i + 2 <= nb; i += 2) sw_rec_group(P, i, 2, j0, SW_GV, S, 1);
      else
        for (; i + 2 <= nb; i += 2) sw_rec_group(P, i, 2, j0, SW_GV, S, 0);
      if (i < nb) sw_rec_group(P, i, 1, j0, SW_GV, S, o != NULL);
    }
    for (int j0 = SW_CB / (SW_GV * SW_W) * (SW_GV * SW_W); j0 < SW_CB; j0 += SW_W)
      for (int i = 0; i < nb; ++i) sw_rec_group(P, i, 1, j0, 1, S, o != NULL);
    if (o)
      for (int i = 0; i < nb; ++i) {
        sw_copy_n(o + SW_VO(m, x->b, SW_AT(x->start, x->stop, sb + i), x->h) + x->c0, P->o + i * SW_CB, x->nv);
      }
  }
}

/* The item's block of a (nseq, H, K, V) state into / out of S. */
static void sw_state_in(const sw_ms* m, long row, const sw_item* x, const SW_T* src, SW_T* S) {
  for (int k = 0; k < SW_K; ++k) {
    SW_T* dst = S + (long)k * SW_CB;
    if (src) sw_copy_pad(dst, src + ((row * m->H + x->h) * SW_K + k) * SW_V + x->c0, x->nv, SW_CB);
    else memset(dst, 0, sizeof(SW_T) * SW_CB);
  }
}

static void sw_state_out(const sw_ms* m, long row, const sw_item* x, const SW_T* S, SW_T* dst) {
  if (dst)
    for (int k = 0; k < SW_K; ++k)
      memcpy(dst + ((row * m->H + x->h) * SW_K + k) * SW_V + x->c0, S + (long)k * SW_CB,
             sizeof(SW_T) * (size_t)x->nv);
}

#define SW_TILE ((long)SW_K * SW_CB)

/* Few items for the threads: each sequence cut into P parts (see the module notes). */
static int sw_rec_split(const sw_ms* m, SW_T* o, SW_T* hlast, long items, long P, int nth) {
  void* raw;
  SW_T* st = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)(2 * items * P * SW_TILE), &raw);
  double* gs = (double*)calloc((size_t)(items * P * SW_KP), sizeof(double));
  if (!st || !gs) {
    free(raw);
    free(gs);
    return SW_ENOMEM;
  }
  SW_T *agg = st, *carry = st + items * P * SW_TILE;
  int status = SW_OK;
  (void)nth;
#pragma omp parallel num_threads(nth)
  {
    void* raw_pk;
    SW_T* mem = (SW_T*)sw_alloc(sizeof(SW_T) * SW_PACK_ELEMS, &raw_pk);
    sw_pack pk;
    if (mem) sw_pack_init(&pk, mem);
    else {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (long w = 0; w < items * P; ++w) {
      if (status != SW_OK) continue;
      const long it = w / P, p = w % P;
      const sw_item x = sw_item_at(m, it);
      const long len = x.stop - x.start;
      memset(agg + w * SW_TILE, 0, sizeof(SW_T) * SW_TILE);
      if (p + 1 < P) sw_rec_range(m, &x, p * len / P, (p + 1) * len / P, agg + w * SW_TILE, NULL, gs + w * SW_KP, &pk);
    }
#pragma omp for schedule(static)
    for (long it = 0; it < items; ++it) {
      if (status != SW_OK) continue;
      const sw_item x = sw_item_at(m, it);
      SW_T* c = carry + it * P * SW_TILE;
      sw_state_in(m, it / SW_NCB / m->H, &x, SW_HAS_H0 ? m->h0 : NULL, c);
      for (long p = 0; p + 1 < P; ++p) {
        const double* gp = gs + (it * P + p) * SW_KP;
        const SW_T* e = agg + (it * P + p) * SW_TILE;
        SW_T* nx = c + (p + 1) * SW_TILE;
        /* C_{p+1} = exp(G_p) C_p + E_p in double; where C_p is 0 it is E_p: a part whose decays multiply to more
         * than the type holds never multiplies inf by a zero carry (a zero prefix of a growing sequence) */
        for (int k = 0; k < SW_K; ++k) {
          const double dk = SW_DECAY == 2 ? exp(gp[k]) : SW_DECAY == 1 ? exp(gp[0]) : 1.0;
          for (int j = 0; j < SW_CB; ++j) {
            const SW_T cj = c[p * SW_TILE + k * SW_CB + j], ej = e[k * SW_CB + j];
            nx[k * SW_CB + j] = cj == 0 ? ej : (SW_T)(dk * (double)cj + (double)ej);
          }
        }
      }
    }
#pragma omp for schedule(static)
    for (long w = 0; w < items * P; ++w) {
      if (status != SW_OK) continue;
      const long it = w / P, p = w % P;
      const sw_item x = sw_item_at(m, it);
      const long len = x.stop - x.start;
      sw_rec_range(m, &x, p * len / P, (p + 1) * len / P, carry + w * SW_TILE, o, NULL, &pk);
      if (p + 1 == P) sw_state_out(m, it / SW_NCB / m->H, &x, carry + w * SW_TILE, hlast);
    }
    free(raw_pk);
  }
  free(raw);
  free(gs);
  return status;
}

/* State bytes of the items that run in lockstep (see sw_forward_recurrent). */
#define SW_GROUP_BYTES (256L << 10)

/* Groups [g0, g1) of gi consecutive items each (the last ones cut at items), one thread. */
static int sw_rec_groups(const sw_ms* m, SW_T* o, SW_T* hlast, long g0, long g1, long gi, long items) {
  if (g0 >= g1) return SW_OK;
  void* raw;
  SW_T* S = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)(gi * SW_TILE + SW_PACK_ELEMS), &raw);
  if (!S) return SW_ENOMEM;
  sw_pack pk;
  sw_pack_init(&pk, S + gi * SW_TILE);
  for (long g = g0; g < g1; ++g) {
    const long i0 = g * gi, i1 = SW_MIN(items, i0 + gi);
    long longest = 0;
    for (long it = i0; it < i1; ++it) {
      const sw_item x = sw_item_at(m, it);
      sw_state_in(m, it / SW_NCB / m->H, &x, SW_HAS_H0 ? m->h0 : NULL, S + (it - i0) * SW_TILE);
      longest = SW_MAX(longest, x.stop - x.start);
    }
    for (long sb = 0; sb < longest; sb += SW_TB)
      for (long it = i0; it < i1; ++it) {
        const sw_item x = sw_item_at(m, it);
        const long len = x.stop - x.start;
        if (sb < len) sw_rec_range(m, &x, sb, SW_MIN(len, sb + SW_TB), S + (it - i0) * SW_TILE, o, NULL, &pk);
      }
    for (long it = i0; it < i1; ++it) {
      const sw_item x = sw_item_at(m, it);
      sw_state_out(m, it / SW_NCB / m->H, &x, S + (it - i0) * SW_TILE, hlast);
    }
  }
  free(raw);
  return SW_OK;
}

static int sw_forward_recurrent(const sw_ms* m, SW_T* o, SW_T* hlast) {
  const long items = m->nseq * m->H * SW_NCB;
  const int nth = sw_threads();
  long longest = 0;
  for (long i = 0; i < m->nseq; ++i) {
    long b, start, stop;
    sw_seq(m, i, &b, &start, &stop);
    longest = stop - start > longest ? stop - start : longest;
  }
  const long P = SW_MIN(nth / items, longest / SW_MIN_PART);
  if (P >= 2) return sw_rec_split(m, o, hlast, items, P, (int)SW_MIN((long)nth, items * P));
  const int nt = (int)SW_MIN((long)nth, items);
  /* Items in groups run in lockstep by blocks of SW_TB steps: the rows of one step for neighbouring heads share
   * a page, so a block reads whole pages instead of one row of each (the groups' states stay within L2). */
  const long per = (items + 4 * nt - 1) / (4 * nt), cap = SW_MAX(1L, SW_GROUP_BYTES / (long)(sizeof(SW_T) * SW_TILE));
  const long gi = SW_MIN(per, cap), groups = (items + gi - 1) / gi;
  if (nt <= 1 || groups <= 1) return sw_rec_groups(m, o, hlast, 0, groups, gi, items);
  int status = SW_OK;
  /* groups handed out one at a time: on a shared machine a descheduled thread leaves its share to the others */
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (long g = 0; g < groups; ++g) {
    const int st = sw_rec_groups(m, o, hlast, g, g + 1, gi, items);
    if (st != SW_OK) {
#pragma omp atomic write
      status = st;
    }
  }
  return status;
}
"""
