"""C (CPU) source of the fused Mamba-1 backward (assembled by :mod:`.fused_c_mamba1`).

The same layout as the forward (a vector of ``width`` channels, N state
vectors in registers, tiles of ``chunk`` steps transposed in and out).  Per
block of channels:

1. *checkpoints*: the forward recurrence without y, keeping the state at the
   start of every tile (``ckpt``: one per ``chunk`` steps, per thread);
2. *tiles in reverse*: each tile's states h_t and gates a_t are recomputed
   from its checkpoint into the thread's tile buffers, then the reverse scan
   g_t = C_t dy_t + a_{t+1} g_{t+1} runs down the tile, accumulating dA, ddt,
   du and the B/C gradients on the fly.  Nothing of size (batch, D, N, L)
   exists at any time.

Reductions stay deterministic (no atomics): dA, dD, delta_bias and fixed
B/C gradients are per-lane sums written per batch element and summed over
the batch after the parallel region; varying B/C gradients (a sum over the
channels of a group) are summed over the lanes of a block, into a partial
``(N, L)`` buffer per *slice* of blocks, and the slices are added in order
at the end.  The number of slices follows the thread count, so results are
bit-identical from run to run for a given ``threads``.

Entry point (ABI order of :meth:`~scanweaver.fused.mamba1.Mamba1.params`)::

    int sw_mamba1_backward(u, delta, A, B, C, D, z, delta_bias, h0, reset, dout, dhlast,
                           du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0,
                           long batch, long dim, long L, long groups_b, long groups_c);
"""

from __future__ import annotations

BACKWARD = r"""
typedef struct {
  sw_v *dt, *u, *dtu, *z, *dout, *sg, *ypre, *du, *ddt;
  SW_T *Bt, *Ct, *gBt, *gCt;
  sw_v *hs, *da, *ckpt;
  sw_v* st;  /* the block's N-vector arrays when they are not on the stack (SW_STATES) */
} sw_bwd_tiles;

#define SW_BWD_STATES 9

/* dst[n*L + t] += tile[t * SW_NP + n] for t < nt, n < SW_N: a tile's B or C gradient (summed over the
 * block's lanes, [t][n] in the thread's buffer so that the scan's stores never alias across n) added to
 * the slice's (N, L) rows, transposed on the way. */
static void sw_add_states(const SW_T* tile, int nt, SW_T* dst, long L) {
  sw_v tmp[SW_W];
  for (int n0 = 0; n0 < SW_N; n0 += SW_W)
    for (int c0 = 0; c0 < nt; c0 += SW_W) {
      const int rows = SW_MIN(SW_W, nt - c0), cols = SW_MIN(SW_W, SW_N - n0);
      sw_tile_in(tile + (long)c0 * SW_NP + n0, SW_NP, rows, cols, tmp);
      for (int c = 0; c < cols; ++c) {
        SW_T* d = dst + (long)(n0 + c) * L + c0;
        if (rows == SW_W) sw_vstore(d, sw_vload(d) + tmp[c]);
        else for (int r = 0; r < rows; ++r) d[r] += tmp[c][r];
      }
    }
}

typedef struct {
  const SW_T* dout; const SW_T* dhlast;
  SW_T *du, *ddelta, *dz, *dh0;
  SW_T *pA, *pD, *pbias, *pB, *pC;  /* per-batch partials (batch, dim[, N]) */
  SW_T *sB, *sC;                     /* per-slice partials of varying B / C (N, L each) */
  long slices;
} sw_grads;

#if SW_B_FIXED
#define SW_BN(n) bf[n]
#else
#define SW_BN(n) bt[n]
#endif
#if SW_C_FIXED
#define SW_CN(n) cf[n]
#else
#define SW_CN(n) ct[n]
#endif

/* Loads and gates one tile: dt (softplus applied), dtu, and sigmoid(delta + bias) for the chain rule. */
static void sw_bwd_gates(const sw_mamba* m, long row, long t0, int nl, int nt, sw_v bias,
                         const sw_bwd_tiles* s) {
  sw_load_rows(m->delta + row + t0, m->L, nl, nt, s->dt);
  sw_load_rows(m->u + row + t0, m->L, nl, nt, s->u);
  for (int t = 0; t < nt; ++t) {
    sw_v v = s->dt[t];
    if (SW_HAS_BIAS) v += bias;
    if (SW_SOFTPLUS) { s->sg[t] = sw_vsigmoid(v); v = sw_vsoftplus(v); }
    s->dt[t] = v;
    s->dtu[t] = v * s->u[t];
  }
}

static void sw_bwd_block(const sw_mamba* m, const sw_grads* gr, long b, long d0, int nl, SW_T* sB, SW_T* sC,
                         const sw_bwd_tiles* s) {
  const long L = m->L, row = (b * m->dim + d0) * L, ntiles = (L + SW_CHUNK - 1) / SW_CHUNK;
  SW_STATES(a2, s->st);
  SW_STATES(aa, s->st + SW_N);
  SW_STATES(h, s->st + 2 * SW_N);
  SW_STATES(bf, s->st + 3 * SW_N);
  SW_STATES(cf, s->st + 4 * SW_N);
  SW_STATES(G, s->st + 5 * SW_N);
  SW_STATES(dA, s->st + 6 * SW_N);
  SW_STATES(dBf, s->st + 7 * SW_N);
  SW_STATES(dCf, s->st + 8 * SW_N);
  sw_lane_matrix(m->A, d0, nl, (SW_T)SW_LOG2E, a2);
  sw_lane_matrix(m->A, d0, nl, 1, aa);
  if (SW_B_FIXED) sw_lane_matrix(m->B, d0, nl, 1, bf);
  if (SW_C_FIXED) sw_lane_matrix(m->C, d0, nl, 1, cf);
  const sw_v Dv = SW_HAS_D ? sw_lane_vector(m->D, d0, nl) : sw_vzero;
  const sw_v bias = SW_HAS_BIAS ? sw_lane_vector(m->bias, d0, nl) : sw_vzero;
  const SW_T* Brow = SW_B_FIXED ? NULL : sw_rows(m->B, m->gb, m, b, d0);
  const SW_T* Crow = SW_C_FIXED ? NULL : sw_rows(m->C, m->gc, m, b, d0);
  for (int n = 0; n < SW_N; ++n) {
    h[n] = G[n] = dA[n] = dBf[n] = dCf[n] = sw_vzero;
    for (int j = 0; j < nl; ++j) {
      if (SW_HAS_H0) h[n][j] = m->h0[(b * m->dim + d0 + j) * SW_N + n];
      if (SW_HAS_DHLAST) G[n][j] = gr->dhlast[(b * m->dim + d0 + j) * SW_N + n];
    }
  }
  /* 1. checkpoints: the state before every tile */
  for (long k = 0; k < ntiles; ++k) {
    const long t0 = k * SW_CHUNK;
    const int nt = (int)SW_MIN((long)SW_CHUNK, L - t0);
    for (int n = 0; n < SW_N; ++n) s->ckpt[k * SW_N + n] = h[n];
    sw_load_rows(m->delta + row + t0, L, nl, nt, s->dt);
    sw_load_rows(m->u + row + t0, L, nl, nt, s->u);
    sw_gates(s->dt, s->u, s->dtu, bias, nt);
    if (!SW_B_FIXED) sw_load_states(Brow + t0, L, nt, s->Bt);
    for (int t = 0; t < nt; ++t) {
      if (SW_HAS_RESET && m->reset[t0 + t])
        for (int n = 0; n < SW_N; ++n) h[n] = sw_vzero;
      const sw_v dt = s->dt[t], dtu = s->dtu[t];
      const SW_T* bt = s->Bt + (long)t * SW_NP;
      (void)bt;
#pragma GCC unroll 16
      for (int n = 0; n < SW_N; ++n) h[n] = sw_vexp2(dt * a2[n]) * h[n] + dtu * SW_BN(n);
    }
  }
  /* 2. tiles in reverse: recompute states and gates, then the reverse scan */
  sw_v dD = sw_vzero, dbias = sw_vzero;
  for (long k = ntiles - 1; k >= 0; --k) {
    const long t0 = k * SW_CHUNK;
    const int nt = (int)SW_MIN((long)SW_CHUNK, L - t0);
    sw_bwd_gates(m, row, t0, nl, nt, bias, s);
    sw_load_rows(gr->dout + row + t0, L, nl, nt, s->dout);
    if (SW_HAS_Z) sw_load_rows(m->z + row + t0, L, nl, nt, s->z);
    if (!SW_B_FIXED) sw_load_states(Brow + t0, L, nt, s->Bt);
    if (!SW_C_FIXED) sw_load_states(Crow + t0, L, nt, s->Ct);
    for (int n = 0; n < SW_N; ++n) s->hs[n] = s->ckpt[k * SW_N + n];
    for (int t = 0; t < nt; ++t) {
      const int reset = SW_HAS_RESET && m->reset[t0 + t];
      const sw_v dt = s->dt[t], dtu = s->dtu[t];
      const SW_T* bt = s->Bt + (long)t * SW_NP;
      const SW_T* ct = s->Ct + (long)t * SW_NP;
      const sw_v* hp = s->hs + (long)t * SW_N;
      sw_v* hn = s->hs + (long)(t + 1) * SW_N;
      sw_v* da = s->da + (long)t * SW_N;
      sw_v y = sw_vzero;
      (void)bt; (void)ct;
#pragma GCC unroll 16
      for (int n = 0; n < SW_N; ++n) {
        da[n] = reset ? sw_vzero : sw_vexp2(dt * a2[n]);
        hn[n] = da[n] * hp[n] + dtu * SW_BN(n);
        y += SW_CN(n) * hn[n];
      }
      s->ypre[t] = y;
    }
    for (int t = 0; t < nt; ++t) {  /* dy (in dout's tile) and dz */
      if (SW_HAS_Z) {
        const sw_v z = s->z[t], sz = sw_vsigmoid(z), yp = s->ypre[t] + Dv * s->u[t], g = s->dout[t];
        s->z[t] = g * yp * sz * (1 + z * (1 - sz));
        s->dout[t] = g * z * sz;
      }
    }
    for (int t = nt - 1; t >= 0; --t) {
      const sw_v dt = s->dt[t], dtu = s->dtu[t], dy = s->dout[t];
      const SW_T* bt = s->Bt + (long)t * SW_NP;
      const SW_T* ct = s->Ct + (long)t * SW_NP;
      const sw_v* hp = s->hs + (long)t * SW_N;
      const sw_v* hn = s->hs + (long)(t + 1) * SW_N;
      const sw_v* da = s->da + (long)t * SW_N;
      sw_v ddt = sw_vzero, sBg = sw_vzero;
      (void)bt; (void)ct;
#pragma GCC unroll 16
      for (int n = 0; n < SW_N; ++n) {
        const sw_v g = SW_CN(n) * dy + G[n];
        const sw_v q = g * da[n] * hp[n];
        dA[n] += q * dt;
        ddt += q * aa[n];
        sBg += g * SW_BN(n);
        if (SW_C_FIXED) dCf[n] += dy * hn[n]; else s->gCt[t * SW_NP + n] = sw_vhsum(dy * hn[n]);
        if (SW_B_FIXED) dBf[n] += g * dtu; else s->gBt[t * SW_NP + n] = sw_vhsum(g * dtu);
        G[n] = da[n] * g;
      }
      ddt += sBg * s->u[t];
      s->du[t] = sBg * dt + Dv * dy;
      if (SW_HAS_D) dD += dy * s->u[t];
      if (SW_SOFTPLUS) ddt *= s->sg[t];
      if (SW_HAS_BIAS) dbias += ddt;
      s->ddt[t] = ddt;
    }
    if (!SW_B_FIXED) sw_add_states(s->gBt, nt, sB + t0, L);
    if (!SW_C_FIXED) sw_add_states(s->gCt, nt, sC + t0, L);
    sw_store_rows(s->du, gr->du + row + t0, L, nl, nt);
    sw_store_rows(s->ddt, gr->ddelta + row + t0, L, nl, nt);
    if (SW_HAS_Z && gr->dz) sw_store_rows(s->z, gr->dz + row + t0, L, nl, nt);
  }
  const long bd = b * m->dim + d0;
  for (int j = 0; j < nl; ++j) {
    for (int n = 0; n < SW_N; ++n) {
      gr->pA[(bd + j) * SW_N + n] = dA[n][j];
      if (SW_B_FIXED) gr->pB[(bd + j) * SW_N + n] = dBf[n][j];
      if (SW_C_FIXED) gr->pC[(bd + j) * SW_N + n] = dCf[n][j];
      if (gr->dh0) gr->dh0[(bd + j) * SW_N + n] = G[n][j];
    }
    if (SW_HAS_D) gr->pD[bd + j] = dD[j];
    if (SW_HAS_BIAS) gr->pbias[bd + j] = dbias[j];
  }
}

/* out[i] = sum over b of part[b * n + i] (in batch order). */
static void sw_sum_batch(const SW_T* part, long batch, long n, SW_T* out) {
  for (long i = 0; i < n; ++i) {
    SW_T acc = 0;
    for (long b = 0; b < batch; ++b) acc += part[b * n + i];
    out[i] = acc;
  }
}

/* Varying dB / dC of (batch, groups): the slices of every segment of a group, added in order. */
static void sw_sum_slices(const sw_mamba* m, const SW_T* sl, long slices, long groups, SW_T* out) {
  const long NL = (long)SW_N * m->L, per_group = m->nseg / groups;
  for (long b = 0; b < m->batch; ++b)
    for (long g = 0; g < groups; ++g) {
      SW_T* o = out + (b * groups + g) * NL;
      memset(o, 0, sizeof(SW_T) * (size_t)NL);
      for (long sg = g * per_group; sg < (g + 1) * per_group; ++sg)
        for (long q = 0; q < slices; ++q) {
          const SW_T* p = sl + ((b * m->nseg + sg) * slices + q) * NL;
          for (long i = 0; i < NL; ++i) o[i] += p[i];
        }
    }
}

int sw_mamba1_backward(const SW_T* u, const SW_T* delta, const SW_T* A, const SW_T* B, const SW_T* C,
                       const SW_T* D, const SW_T* z, const SW_T* delta_bias, const SW_T* h0,
                       const unsigned char* reset, const SW_T* dout, const SW_T* dhlast,
                       SW_T* du, SW_T* ddelta, SW_T* dA, SW_T* dB, SW_T* dC, SW_T* dD, SW_T* dz,
                       SW_T* ddelta_bias, SW_T* dh0, long batch, long dim, long L, long groups_b, long groups_c) {
  sw_mamba m = {u, delta, A, B, C, D, z, delta_bias, h0, reset, batch, dim, L, groups_b, groups_c, 0, 0, 0, 0};
  if (batch <= 0 || dim <= 0 || L <= 0) return SW_OK;
  sw_grid(&m);
  const int nth = sw_threads();
  const long items0 = batch * m.nseg;
  const long slices = SW_MIN(m.per_seg, SW_MIN(64L, (2L * nth + items0 - 1) / items0));
  const long items = items0 * slices, bdn = batch * dim * SW_N, NL = (long)SW_N * L;
  sw_grads gr = {dout, dhlast, du, ddelta, dz, dh0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, slices};
  void* raw_p;
  const size_t np = (size_t)(bdn * (1 + SW_B_FIXED + SW_C_FIXED) + 2 * batch * dim);
  const size_t ns = (size_t)((SW_B_FIXED ? 0 : 1) + (SW_C_FIXED ? 0 : 1)) * (size_t)(items * NL);
  SW_T* part = (SW_T*)sw_alloc(sizeof(SW_T) * (np + ns + 1), &raw_p);
  if (!part) return SW_ENOMEM;
  gr.pA = part;
  gr.pB = part + bdn;
  gr.pC = gr.pB + (SW_B_FIXED ? bdn : 0);
  gr.pD = gr.pC + (SW_C_FIXED ? bdn : 0);
  gr.pbias = gr.pD + batch * dim;
  gr.sB = gr.pbias + batch * dim;
  gr.sC = gr.sB + (SW_B_FIXED ? 0 : items * NL);
  const int nt = (int)SW_MIN((long)nth, items);
  int status = SW_OK;
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    const long ntiles = (L + SW_CHUNK - 1) / SW_CHUNK;
    const size_t vec = sizeof(sw_v) * SW_CHUNK, sc = sizeof(SW_T) * SW_CHUNK * SW_NP;
    const size_t hs = sizeof(sw_v) * SW_N * (2 * SW_CHUNK + 1), ck = sizeof(sw_v) * SW_N * (size_t)ntiles;
    const size_t st = SW_STATES_ON_STACK ? 0 : sizeof(sw_v) * SW_N * SW_BWD_STATES;
    void* raw;
    char* p = (char*)sw_alloc(9 * vec + 4 * sc + hs + ck + st, &raw);
    if (!p) {
#pragma omp atomic write
      status = SW_ENOMEM;
    } else {
      sw_bwd_tiles s;
      sw_v** v[9] = {&s.dt, &s.u, &s.dtu, &s.z, &s.dout, &s.sg, &s.ypre, &s.du, &s.ddt};
      for (int i = 0; i < 9; ++i) *v[i] = (sw_v*)(p + i * vec);
      s.Bt = (SW_T*)(p + 9 * vec);
      s.Ct = (SW_T*)(p + 9 * vec + sc);
      s.gBt = (SW_T*)(p + 9 * vec + 2 * sc);
      s.gCt = (SW_T*)(p + 9 * vec + 3 * sc);
      s.hs = (sw_v*)(p + 9 * vec + 4 * sc);
      s.da = s.hs + SW_N * (SW_CHUNK + 1);
      s.ckpt = (sw_v*)(p + 9 * vec + 4 * sc + hs);
      s.st = (sw_v*)(p + 9 * vec + 4 * sc + hs + ck);
#pragma omp for schedule(static)
      for (long it = 0; it < items; ++it) {
        const long seg = it / slices, q = it % slices, b = seg / m.nseg, sg = seg % m.nseg;
        SW_T* sB = SW_B_FIXED ? NULL : gr.sB + it * NL;
        SW_T* sC = SW_C_FIXED ? NULL : gr.sC + it * NL;
        if (sB) memset(sB, 0, sizeof(SW_T) * (size_t)NL);
        if (sC) memset(sC, 0, sizeof(SW_T) * (size_t)NL);
        const long j0 = q * m.per_seg / slices, j1 = (q + 1) * m.per_seg / slices;
        for (long j = j0; j < j1; ++j) {
          const long d0 = sg * m.seg + j * SW_W;
          sw_bwd_block(&m, &gr, b, d0, (int)SW_MIN((long)SW_W, m.seg - j * SW_W), sB, sC, &s);
        }
      }
      free(raw);
    }
  }
  if (status == SW_OK) {
    sw_sum_batch(gr.pA, batch, dim * SW_N, dA);
    if (SW_B_FIXED) sw_sum_batch(gr.pB, batch, dim * SW_N, dB); else sw_sum_slices(&m, gr.sB, slices, groups_b, dB);
    if (SW_C_FIXED) sw_sum_batch(gr.pC, batch, dim * SW_N, dC); else sw_sum_slices(&m, gr.sC, slices, groups_c, dC);
    if (SW_HAS_D && dD) sw_sum_batch(gr.pD, batch, dim, dD);
    if (SW_HAS_BIAS && ddelta_bias) sw_sum_batch(gr.pbias, batch, dim, ddelta_bias);
  }
  free(raw_p);
  return status;
}
"""
