"""Tiles of the chunk engine (:mod:`.chunk_engine`) every family's chunked kernel shares: scratch and decay factors.

A thread's tiles of one chunk (``sw_ck_tiles``: its rows of q, k, v, the log
decays, the C x C products, the backward's gradients; ``sw_ck_alloc``), the
recurrent form's decay of one step (``sw_ck_step_decay``), and the factors of
a chunk's prefix applied to tiles: ``sw_ck_last`` (``e^{G_last}``),
``sw_ck_scale_q`` / ``sw_ck_qs`` (rows times ``e^{Gq}`` from the chunk's
start), ``sw_ck_scale_k`` / ``sw_ck_kd`` (``K o e^{G_last - Gk}`` to its end) and
``sw_ck_decay_state``.  Every factor is 0 across a reset and has a
non-positive exponent, or one within ``SW_RANGE`` on a plain chunk.  The
diagonal family (:mod:`.matrix_c_chunked`) and the delta-rule family's WY form
(:mod:`.delta_c_chunked`) load their own rows into these tiles.

Needs the engine's text before it and ``SW_VP`` (value columns padded to whole vectors), ``SW_BONUS``.

Example:
    >>> from scanweaver.targets.chunk_tiles import CHUNK_TILES
    >>> "sw_ck_scale_q" in CHUNK_TILES and "sw_ck_alloc" in CHUNK_TILES
    True
"""

from __future__ import annotations

CHUNK_TILES = r"""
/* ---- the tiles of a chunk ---- */
#define SW_STATE ((long)SW_K * SW_VP)

/* One thread's tiles of a chunk. */
typedef struct {
  SW_T *Q, *K, *V, *G, *DO;     /* the chunk's rows: C x KP, C x KP, C x VP, C x GW, C x VP */
  SW_T *Qs, *Kd, *A, *dA, *O;   /* C x KP, C x KP, C x CP, C x CP, C x VP */
  SW_T* QK;                     /* C x CP: Q K^T of the chunk, shared by the heads of a group (decay per head) */
  int qk;                       /* QK holds the loaded chunk's product */
  const SW_T* QKsh;             /* the backward's Q K^T of the chunk computed once for its unit, or NULL */
  SW_T* Psh;                    /* the backward's sum over the unit's heads of P = dA o weights, or NULL */
  double *ap, *bp;              /* C: row and column sums of P o Q K^T (the decay gradient's shared halves) */
  SW_T *dQ, *dK, *dV, *St, *Vt; /* C x KP, C x KP, C x VP, VP x KP, VP x CP (backward) */
  SW_T *el;                     /* KP: e^{G_last} per key, or [0] */
  SW_T* bt;                     /* C: the delta rule's beta per step */
  double *a, *b;                /* C x GW: the decay gradient's two halves (backward) */
  sw_ck_scratch s;
  sw_ck_dec d;
} sw_ck_tiles;

/* Tiles and extra states of extra x SW_STATE elements (the caller's), aligned for whole vectors. */
static int sw_ck_alloc(sw_ck_tiles* c, void** raw, long extra, SW_T** states) {
  const size_t ck = (size_t)SW_C * SW_KP, cv = (size_t)SW_C * SW_VP, cc = (size_t)SW_C * SW_CP;
  const size_t gw = (size_t)(SW_CP + SW_W + 1) * SW_GW;
  const size_t nt = 11 * ck + 2 * gw + 4 * cv + 3 * cc + (size_t)SW_VP * SW_KP
                    + (size_t)SW_VP * SW_CP + (size_t)SW_KP * SW_CP + (size_t)SW_GW * SW_C + 2 * (size_t)SW_TW + gw
                    + SW_CP + (size_t)extra * SW_STATE;
  const size_t nd = gw + 2 * (size_t)SW_C * SW_GW + 2 * (size_t)SW_CP;
  char* p = (char*)sw_alloc(sizeof(SW_T) * (nt + 64 * (size_t)SW_W) + sizeof(double) * (nd + 8), raw);
  if (!p) return SW_ENOMEM;
  memset(p, 0, sizeof(SW_T) * (nt + 64 * (size_t)SW_W) + sizeof(double) * (nd + 8));
  double* q = (double*)p;
  c->d.Z = q;
  c->d.Gk = q + SW_GW;
  c->d.Gq = c->d.Gk - (SW_BONUS ? SW_GW : 0);
  q += gw;
  c->a = q; q += (size_t)SW_C * SW_GW;
  c->b = q; q += (size_t)SW_C * SW_GW;
  c->ap = q; q += SW_CP;
  c->bp = q; q += SW_CP;
  c->QKsh = NULL;
  c->Psh = NULL;
  SW_T* t = (SW_T*)(((uintptr_t)q + 63) & ~(uintptr_t)63);
#define SW_TAKE(f, n) do { f = t; t += ((n) + SW_W - 1) / SW_W * SW_W; } while (0)
  SW_TAKE(c->d.NZ, gw);
  c->d.Nk = c->d.NZ + SW_GW;
  c->d.Nq = c->d.Nk - (SW_BONUS ? SW_GW : 0);
  SW_TAKE(c->d.E, gw);
  c->d.Eq = c->d.E + (SW_BONUS ? 0 : SW_GW);
  SW_TAKE(c->d.Ei, gw);
  for (int k = 0; k < SW_GW; ++k) c->d.E[k] = 1;
  SW_TAKE(c->Q, ck); SW_TAKE(c->K, ck); SW_TAKE(c->Qs, ck); SW_TAKE(c->Kd, ck); SW_TAKE(c->dQ, ck);
  SW_TAKE(c->dK, ck); SW_TAKE(c->s.xr, ck); SW_TAKE(c->s.yr, ck); SW_TAKE(c->s.ea, ck);
  SW_TAKE(c->s.eb, ck); SW_TAKE(c->s.t1, ck);
  SW_TAKE(c->V, cv); SW_TAKE(c->DO, cv); SW_TAKE(c->O, cv); SW_TAKE(c->dV, cv);
  SW_TAKE(c->A, cc); SW_TAKE(c->dA, cc); SW_TAKE(c->QK, cc);
  SW_TAKE(c->St, (size_t)SW_VP * SW_KP); SW_TAKE(c->Vt, (size_t)SW_VP * SW_CP); SW_TAKE(c->s.yt, (size_t)SW_KP * SW_CP);
  SW_TAKE(c->G, (size_t)SW_GW * SW_C); SW_TAKE(c->s.tmp, SW_TW); SW_TAKE(c->el, SW_TW); SW_TAKE(c->bt, SW_CP);
  if (states) SW_TAKE(*states, (size_t)extra * SW_STATE);
#undef SW_TAKE
  return SW_OK;
}

SW_INLINE void sw_ck_prefetch_row(const SW_T* p, int n) {
  SW_PREFETCH_LINES(p, (long)n * (long)sizeof(SW_T), 0, 1);  /* to L2 */
}

/* The decay of one step as the recurrent form computes it: d[k] (per key) or d[0]. */
SW_INLINE void sw_ck_step_decay(const sw_ck_tiles* c, int i, SW_T* d) {
#if SW_DECAY == 2
  for (int k = 0; k < SW_KP; k += SW_W) sw_vstore(d + k, sw_vexp(sw_vload(c->G + (long)i * SW_KP + k)));
#elif SW_DECAY == 1
  d[0] = (SW_T)exp((double)c->G[i]);
#else
  d[0] = 1;
#endif
}

/* e^{G_last} per key (or [0]) into c->el. */
static void sw_ck_last(sw_ck_tiles* c) {
  const sw_ck_dec* d = &c->d;
  const int l = d->n - 1;
  if (d->plain) {
    memcpy(c->el, SW_GAT(d->E, d->n), sizeof(SW_T) * SW_GW);
    return;
  }
#if SW_KEYDECAY
  sw_ck_fac(SW_GAT(d->Gk, l), SW_GAT(d->Nk, l), d->Z, d->NZ, 1.0, c->el, SW_KP);
#else
  c->el[0] = d->Nk[l] != 0 ? (SW_T)0 : (SW_T)exp(d->Gk[l]);
#endif
}

/* Y = X o e^{Gq} (rows of the chunk from its start; Y and X apart). */
static void sw_ck_scale_q(sw_ck_tiles* c, const SW_T* X, SW_T* Y) {
  const sw_ck_dec* d = &c->d;
#if SW_KEYDECAY
  if (d->plain) {
    sw_ck_scale_rows(X, d->Eq, SW_KP, Y, d->n);
    return;
  }
  for (int i = 0; i < d->n; ++i)
    sw_ck_fac(SW_GAT(d->Gq, i), SW_GAT(d->Nq, i), d->Z, d->NZ, 1.0, Y + (long)i * SW_KP, SW_KP);
  sw_ck_scale_rows(X, Y, SW_KP, Y, d->n);
#else
  if (d->plain) {
    sw_ck_scale_by(X, SW_KP, d->Eq, Y, d->n, SW_KP);
    return;
  }
  sw_ck_fac_b(d->Gq, d->Nq, 0.0, 0, 1.0, c->s.tmp, d->n);
  sw_ck_scale_by(X, SW_KP, c->s.tmp, Y, d->n, SW_KP);
#endif
}

/* Qs = Q o e^{Gq}. */
static void sw_ck_qs(sw_ck_tiles* c) { sw_ck_scale_q(c, c->Q, c->Qs); }

/* Y = X o e^{G_last - Gk} (rows to the chunk's end; Y and X apart); reuse: from the plain intra's yr = X o e^{-Gk}. */
static void sw_ck_scale_k(sw_ck_tiles* c, const SW_T* X, SW_T* Y, int reuse) {
  const sw_ck_dec* d = &c->d;
  const int l = d->n - 1;
#if SW_KEYDECAY
  if (reuse) {
    sw_ck_scale_rows(c->s.yr, c->el, 0, Y, d->n);
    return;
  }
  if (d->plain) {  /* e^{G_last} e^{-Gk}: both normal numbers */
    for (int j = 0; j < d->n; ++j)
      for (int k = 0; k < SW_KP; k += SW_W)
        sw_vstore(Y + (long)j * SW_KP + k, sw_vload(X + (long)j * SW_KP + k) *
                                                 sw_vload(SW_GAT(d->Ei, j) + k) * sw_vload(c->el + k));
    return;
  }
  for (int j = 0; j < d->n; ++j)
    sw_ck_fac(SW_GAT(d->Gk, j), SW_GAT(d->Nk, j), SW_GAT(d->Gk, l), SW_GAT(d->Nk, l), -1.0,
              Y + (long)j * SW_KP, SW_KP);
  sw_ck_scale_rows(X, Y, SW_KP, Y, d->n);
#else
  (void)reuse;
  if (d->plain)
    for (int j = 0; j < d->n; j += SW_W) sw_vstore(c->s.tmp + j, sw_vload(d->Ei + j) * c->el[0]);
  else
    sw_ck_fac_b(d->Gk, d->Nk, d->Gk[l], d->Nk[l], -1.0, c->s.tmp, d->n);
  sw_ck_scale_by(X, SW_KP, c->s.tmp, Y, d->n, SW_KP);
#endif
}

/* Kd = K o e^{G_last - Gk}. */
static void sw_ck_kd(sw_ck_tiles* c, int reuse) { sw_ck_scale_k(c, c->K, c->Kd, reuse); }

/* S = e^{G_last} o S (rows of the state by their key's factor, or all by one). */
static void sw_ck_decay_state(const sw_ck_tiles* c, SW_T* S) {
  for (int k = 0; k < SW_K; ++k) {
    const SW_T e = c->el[SW_KEYDECAY ? k : 0];
    for (int j = 0; j < SW_VP; j += SW_W) sw_vstore(S + (long)k * SW_VP + j, sw_vload(S + (long)k * SW_VP + j) * e);
  }
}
"""
