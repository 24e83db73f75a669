"""C source of the chunked (matmul) matrix-state forward (assembled by :mod:`.fused_c_matrix`).

Per (sequence, head), chunks of ``chunk`` steps in scan order.  With G_i the
cumulative log decay inside the chunk (inclusive; accumulated in double, a
scalar or a K-vector), Gq_i = G_i for ``after`` and G_{i-1} (0 at i = 0) for
``bonus``, and S_0 the state at the chunk's start::

    O      = (Q * e^{Gq}) S_0 + A V
    A_ij   = sum_k q_ik k_jk e^{Gq_ik - G_jk}   for j <= i (j < i for bonus; A_ii = q_i . (u * k_i) for bonus)
    S_end  = e^{G_last} * S_0 + (K * e^{G_last - G})^T V

Every exponent is a difference that is never positive, so nothing overflows
at any decay: for a scalar decay A is ``Q K^T`` scaled entry-wise by
e^{Gq_i - G_j}; for a decay per key the chunk is cut into sub-blocks of
``SW_SUB`` rows: the block of rows I against the earlier rows J < i0 is one
product ``(Q_I * e^{Gq_I - R}) (K_J * e^{R - G_J})^T`` with the reference R =
Gq_{i0} (both factors at most 1), and the diagonal block takes its
differences directly (a vector over k per entry).  The products run through
the register-blocked ``sw_gemm``; only the chunk-end states are carried from
chunk to chunk (a sequential scan per head; heads are the threads' work).
Terms are accumulated in the storage precision (float32 or float64), the
cumulative log decays in double.
"""

from __future__ import annotations

CHUNKED = r"""
#define SW_C (SW_CHUNK)
#define SW_CP (((SW_C) + SW_W - 1) / SW_W * SW_W)
/* Rows per sub-block of the per-key intra-chunk term: the diagonal blocks take their exponent differences
 * one entry at a time (cost SW_SUB/2 exps per entry of Q), the rest run as products. */
#define SW_SUB 16
#define SW_GW (SW_DECAY == 2 ? SW_KP : 1)

typedef struct {
  SW_T *Q, *Kc, *Ks, *Kt, *Vc, *A, *O, *Qs, *S, *Gk, *Gq;
} sw_chunk_bufs;

static int sw_chunk_alloc(sw_chunk_bufs* c, void** raw) {
  const size_t ck = (size_t)SW_C * SW_KP, cv = (size_t)SW_C * SW_VP, kc = (size_t)SW_KP * SW_CP;
  const size_t n = 4 * ck + kc + 2 * cv + (size_t)SW_C * SW_CP + (size_t)SW_K * SW_VP + 2 * (size_t)SW_C * SW_GW;
  SW_T* p = (SW_T*)sw_alloc(sizeof(SW_T) * (n + 16 * (size_t)SW_W), raw);
  if (!p) return SW_ENOMEM;
  memset(p, 0, sizeof(SW_T) * n);
  c->Q = p; p += ck;
  c->Kc = p; p += ck;
  c->Qs = p; p += ck;
  c->Ks = p; p += ck;
  c->Kt = p; p += kc;
  c->Vc = p; p += cv;
  c->O = p; p += cv;
  c->A = p; p += (size_t)SW_C * SW_CP;
  c->S = p; p += (size_t)SW_K * SW_VP;
  c->Gk = p; p += (size_t)SW_C * SW_GW;
  c->Gq = p;
  return SW_OK;
}

/* Kt[k][j] = Kc[j][k] * e^{R_k - Gk_jk} for j < n (zeros up to padded; R NULL: no scaling): the rows
 * scaled as vectors over k (per key) or by one factor (scalar), then transposed. */
static void sw_scaled_kt(const sw_chunk_bufs* c, int n, int padded, const SW_T* R) {
  const SW_T* src = c->Kc;
  SW_T e[SW_CP];
  for (int j = 0; j < n; ++j) e[j] = 1;
#if SW_DECAY == 2
  if (R) {
    for (int j = 0; j < n; ++j)
      for (int k0 = 0; k0 < SW_KP; k0 += SW_W)
        sw_vstore(c->Ks + (long)j * SW_KP + k0, sw_vload(c->Kc + (long)j * SW_KP + k0) *
                                                    sw_vexp(sw_vload(R + k0) - sw_vload(c->Gk + (long)j * SW_KP + k0)));
    src = c->Ks;
  }
#elif SW_DECAY == 1
  if (R)
    for (int j = 0; j < n; ++j) e[j] = (SW_T)exp((double)R[0] - (double)c->Gk[j]);
#endif
  for (int k = 0; k < SW_K; ++k) {
    SW_T* row = c->Kt + (long)k * SW_CP;
    for (int j = 0; j < n; ++j) row[j] = src[(long)j * SW_KP + k] * e[j];
    for (int j = n; j < padded; ++j) row[j] = 0;
  }
}

/* A (n x n, SW_CP apart): the intra-chunk term with its mask and the bonus diagonal. */
static void sw_intra(const sw_ms* m, long h, const sw_chunk_bufs* c, int n) {
  const int np = (n + SW_W - 1) / SW_W * SW_W;
#if SW_DECAY == 2
  for (int i0 = 0; i0 < n; i0 += SW_SUB) {
    const int i1 = SW_MIN(n, i0 + SW_SUB);
    const SW_T* R = c->Gq + (long)i0 * SW_KP;
    if (i0 > 0) {
      const int jp = (i0 + SW_W - 1) / SW_W * SW_W;
      for (int i = i0; i < i1; ++i) {
        SW_T* qs = c->Qs + (long)i * SW_KP;
        const SW_T* gq = c->Gq + (long)i * SW_KP;
        for (int k0 = 0; k0 < SW_KP; k0 += SW_W)
          sw_vstore(qs + k0, sw_vload(c->Q + (long)i * SW_KP + k0) *
                                 sw_vexp(sw_vload(gq + k0) - sw_vload(R + k0)));
      }
      sw_scaled_kt(c, i0, jp, R);
      sw_gemm(i1 - i0, jp, SW_K, c->Qs + (long)i0 * SW_KP, SW_KP, c->Kt, SW_CP, c->A + (long)i0 * SW_CP, SW_CP, 0);
    }
    for (int i = i0; i < i1; ++i) {
      const SW_T* qi = c->Q + (long)i * SW_KP;
      const SW_T* gq = c->Gq + (long)i * SW_KP;
      const int last = SW_BONUS ? i - 1 : i;
      for (int j = i0; j <= last; ++j) {
        const SW_T* kj = c->Kc + (long)j * SW_KP;
        const SW_T* gk = c->Gk + (long)j * SW_KP;
        sw_v acc = sw_vzero;
        for (int k0 = 0; k0 < SW_KP; k0 += SW_W)
          acc += sw_vload(qi + k0) * sw_vload(kj + k0) * sw_vexp(sw_vload(gq + k0) - sw_vload(gk + k0));
        c->A[(long)i * SW_CP + j] = sw_vhsum(acc);
      }
    }
  }
#else
  sw_scaled_kt(c, n, np, NULL);
  sw_gemm(n, np, SW_K, c->Q, SW_KP, c->Kt, SW_CP, c->A, SW_CP, 0);
  if (SW_DECAY)  /* masked below: entries past the diagonal (and Gk past n) may take any finite factor */
    for (int i = 0; i < n; ++i)
      for (int j0 = 0; j0 <= i; j0 += SW_W) {
        SW_T* a = c->A + (long)i * SW_CP + j0;
        sw_vstore(a, sw_vload(a) * sw_vexp(sw_vmin(sw_vzero, c->Gq[i] - sw_vload(c->Gk + j0))));
      }
#endif
  for (int i = 0; i < n; ++i) {
    SW_T* a = c->A + (long)i * SW_CP;
    for (int j = i + (SW_BONUS ? 0 : 1); j < np; ++j) a[j] = 0;
    if (SW_BONUS) {
      const SW_T *qi = c->Q + (long)i * SW_KP, *ki = c->Kc + (long)i * SW_KP, *up = m->u + h * SW_K;
      SW_T beta = 0;
      for (int k = 0; k < SW_K; ++k) beta += qi[k] * up[k] * ki[k];
      a[i] = beta;
    }
  }
}

/* One chunk: scan positions [s0, s0 + n) of sequence (b, start, stop), head h, from c->S (updated). */
static void sw_chunk_step(const sw_ms* m, long b, long start, long stop, long h, long s0, int n,
                          const sw_chunk_bufs* c, SW_T* o) {
  const long hq = h / (m->H / m->Hq);
  double acc[SW_GW];
  for (int k = 0; k < SW_GW; ++k) acc[k] = 0;
  for (int i = 0; i < n; ++i) {
    const long t = SW_AT(start, stop, s0 + i);
    sw_copy_pad(c->Q + (long)i * SW_KP, m->q + SW_QK(m, b, t, hq), SW_K, SW_KP);
    sw_copy_pad(c->Kc + (long)i * SW_KP, m->k + SW_QK(m, b, t, hq), SW_K, SW_KP);
    sw_copy_pad(c->Vc + (long)i * SW_VP, m->v + SW_VO(m, b, t, h), SW_V, SW_VP);
    if (SW_DECAY) {
      const SW_T* gp = m->g + SW_G(m, b, t, h);
      for (int k = 0; k < (SW_DECAY == 2 ? SW_K : 1); ++k) {
        c->Gq[i * SW_GW + k] = (SW_T)(SW_BONUS ? acc[k] : acc[k] + gp[k]);
        acc[k] += gp[k];
        c->Gk[i * SW_GW + k] = (SW_T)acc[k];
      }
    }
  }
  /* O = (Q * e^{Gq}) S_0 */
  for (int i = 0; i < n; ++i) {
    const SW_T* gq = c->Gq + (long)i * SW_GW;
    const SW_T es = SW_DECAY == 1 ? (SW_T)exp((double)gq[0]) : (SW_T)1;
    for (int k0 = 0; k0 < SW_KP; k0 += SW_W) {
      const sw_v qv = sw_vload(c->Q + (long)i * SW_KP + k0);
      sw_vstore(c->Qs + (long)i * SW_KP + k0, SW_DECAY == 2 ? qv * sw_vexp(sw_vload(gq + k0)) : qv * es);
    }
  }
  sw_gemm(n, SW_VP, SW_K, c->Qs, SW_KP, c->S, SW_VP, c->O, SW_VP, 0);
  sw_intra(m, h, c, n);
  sw_gemm(n, SW_VP, n, c->A, SW_CP, c->Vc, SW_VP, c->O, SW_VP, 1);
  for (int i = 0; i < n; ++i)
    memcpy(o + SW_VO(m, b, SW_AT(start, stop, s0 + i), h), c->O + (long)i * SW_VP, sizeof(SW_T) * SW_V);
  /* S_end = e^{G_last} S_0 + (K * e^{G_last - G})^T V */
  const SW_T* last = c->Gk + (long)(n - 1) * SW_GW;
  if (SW_DECAY)
    for (int k = 0; k < SW_K; ++k) {
      const SW_T e = (SW_T)exp((double)last[SW_DECAY == 2 ? k : 0]);
      for (int j = 0; j < SW_VP; ++j) c->S[(long)k * SW_VP + j] *= e;
    }
  sw_scaled_kt(c, n, n, SW_DECAY ? last : NULL);
  sw_gemm(SW_K, SW_VP, n, c->Kt, SW_CP, c->Vc, SW_VP, c->S, SW_VP, 1);
}

static int sw_forward_chunked(const sw_ms* m, SW_T* o, SW_T* hlast) {
  const long items = m->nseq * m->H;
  const int nt = (int)SW_MIN((long)sw_threads(), items);
  int status = SW_OK;
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    void* raw;
    sw_chunk_bufs c;
    const int ok = sw_chunk_alloc(&c, &raw) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long it = 0; it < items; ++it) {
      if (!ok) continue;
      const long h = it % m->H, row = it / m->H;
      long b, start, stop;
      sw_seq(m, row, &b, &start, &stop);
      for (int k = 0; k < SW_K; ++k) {
        SW_T* dst = c.S + (long)k * SW_VP;
        if (SW_HAS_H0) sw_copy_pad(dst, m->h0 + ((row * m->H + h) * SW_K + k) * SW_V, SW_V, SW_VP);
        else memset(dst, 0, sizeof(SW_T) * SW_VP);
      }
      for (long s0 = 0; s0 < stop - start; s0 += SW_C)
        sw_chunk_step(m, b, start, stop, h, s0, (int)SW_MIN((long)SW_C, stop - start - s0), &c, o);
      if (hlast)
        for (int k = 0; k < SW_K; ++k)
          memcpy(hlast + ((row * m->H + h) * SW_K + k) * SW_V, c.S + (long)k * SW_VP, sizeof(SW_T) * SW_V);
    }
    if (ok) free(raw);
  }
  return status;
}
"""
