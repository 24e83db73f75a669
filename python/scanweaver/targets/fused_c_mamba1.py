"""C (CPU) rendering of the fused Mamba-1 selective scan (:mod:`scanweaver.fused.mamba1`), forward part.

Vectorised over channels: one vector holds ``width`` channels of one batch
element, and the N states of those channels are N vectors kept in registers
(``h[n]``), so a time step is N rounds of ``exp2``, two multiply-adds and a
multiply-add of the contraction, with no horizontal reduction.  The data are
``(batch, D, L)`` rows, so each tile of ``chunk`` time steps is transposed in
registers into ``[t][lane]`` vectors on the way in (u, delta, z; B and C rows
into ``[t][n]``) and back on the way out (y); everything else stays in
registers or in the per-thread tile buffers.  Threads (OpenMP) take blocks
of channels: a block never straddles a group of B or C, so B_t[n] and C_t[n]
are one broadcast scalar per block.  With fewer blocks than threads, each
block's L is split over threads too: parts of whole tiles run to their
aggregate (end state and gate product ``exp(A * sum dt)``) from zero, the
carries are chained, and the parts rerun from their carries writing y.  Vectorising over N instead (one channel
at a time, N states in the lanes) needs a horizontal sum per step for y and
wastes lanes for N below the vector width.  Measured on this 2-core AVX-512
machine (one thread, float32, N = 16, (2, 768, 16, 2048)): over channels 0.40
ns per (b, d, n, t); over N 0.39 when the transposed B/C tiles are shared by
all channels, 1.08 when each channel transposes its own; so over channels,
which keeps every lane busy for any N.

Entry points (parameters in the ABI order of :meth:`Mamba1.params`; NULL for
the optional arrays a call does not use)::

    int sw_mamba1_forward(u, delta, A, B, C, D, z, delta_bias, h0, reset, y, hlast,
                          long batch, long dim, long L, long groups_b, long groups_c);

returning 0, or 1 when scratch memory could not be allocated; the backward
(``sw_mamba1_backward``) is in :mod:`.mamba1_c_backward`.
"""

from __future__ import annotations

from ..fused.mamba1 import Mamba1, Mamba1Features
from .c_source import THREADS, fused_timed, tunable_defines
from .cvec import vector_prelude
from .fused import KERNELS, FusedKernel
from .mamba1_c_backward import BACKWARD

#: Bytes of N-state vector arrays a block may keep on the stack: below it they stay local arrays (in
#: registers for small N, the measured speed), above it they live in each thread's heap scratch.  A thread's
#: stack can be 128 KiB (musl), 512 KiB (macOS) or whatever ``threading.stack_size`` set, and the kernel
#: runs on the caller's thread; N = 8192 on 64-byte vectors is 512 KiB per array.
STACK_BUDGET = 32 * 1024
#: N-state vector arrays a block keeps per part (the forward's a2, bf, cf, h; the backward's nine).
STATE_ARRAYS = {"forward": 4, "backward": 9}

#: Placeholders filled per call.
HEAD = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __cplusplus
#define restrict __restrict
extern "C" {
#endif
#if defined(__GNUC__)
#define SW_INLINE static inline __attribute__((always_inline))
#else
#define SW_INLINE static inline
#endif
#define SW_OK 0
#define SW_ENOMEM 1
#define SW_MIN(p, q) ((p) < (q) ? (p) : (q))
"""

COMMON = r"""
#define SW_LOG2E 1.4426950408889634074
/* B and C rows padded to whole vectors of states. */
#define SW_NP (((SW_N) + SW_W - 1) / SW_W * SW_W)

typedef struct {
  const SW_T *u, *delta, *A, *B, *C, *D, *z, *bias, *h0;
  const unsigned char* reset;
  long batch, dim, L, gb, gc;
  /* blocks: channels are cut into segments that lie inside one group of B and of C */
  long seg, per_seg, nseg, nblocks;
} sw_mamba;

static long sw_gcd(long p, long q) { while (q) { long r = p % q; p = q; q = r; } return p; }

static void sw_grid(sw_mamba* m) {
  const long gb = m->gb > 0 ? m->gb : 1, gc = m->gc > 0 ? m->gc : 1;
  m->nseg = gb / sw_gcd(gb, gc) * gc;
  m->seg = m->dim / m->nseg;
  m->per_seg = (m->seg + SW_W - 1) / SW_W;
  m->nblocks = m->batch * m->nseg * m->per_seg;
}

/* Block k: batch element, first channel, active lanes. */
static void sw_block(const sw_mamba* m, long k, long* b, long* d0, int* nl) {
  const long per_b = m->nseg * m->per_seg, r = k % per_b, j = r % m->per_seg;
  *b = k / per_b;
  *d0 = (r / m->per_seg) * m->seg + j * SW_W;
  *nl = (int)SW_MIN((long)SW_W, m->seg - j * SW_W);
}

/* Row n = 0 of B or C for batch b and channel d0 (varying layouts), L apart per state. */
static const SW_T* sw_rows(const SW_T* M, long groups, const sw_mamba* m, long b, long d0) {
  return M + (b * groups + d0 / (m->dim / groups)) * (long)SW_N * m->L;
}

/* nt time steps from t0 of nl rows (L apart) into [t][lane] vectors. */
static void sw_load_rows(const SW_T* src, long L, int nl, int nt, sw_v* out) {
  for (int c0 = 0; c0 < nt; c0 += SW_W) sw_tile_in(src + c0, L, nl, SW_MIN(SW_W, nt - c0), out + c0);
}

static void sw_store_rows(sw_v* in, SW_T* dst, long L, int nl, int nt) {
  for (int c0 = 0; c0 < nt; c0 += SW_W) sw_tile_out(in + c0, dst + c0, L, nl, SW_MIN(SW_W, nt - c0));
}

#if defined(__GNUC__)
#define SW_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define SW_PREFETCH(p) ((void)(p))
#endif
/* Prefetches n elements of each of rows rows (L apart): the next tile, while this one computes
 * (dozens of row streams at once are more than the hardware prefetchers follow). */
static void sw_prefetch_rows(const SW_T* src, long L, int rows, long n) {
  for (int r = 0; r < rows; ++r)
    for (long c = 0; c < n; c += 64 / (long)sizeof(SW_T)) SW_PREFETCH(src + r * L + c);
}

/* nt steps of B or C rows (N rows, L apart) into out[t * SW_NP + n]. */
static void sw_load_states(const SW_T* src, long L, int nt, SW_T* out) {
  sw_v tmp[SW_W];
  for (int n0 = 0; n0 < SW_N; n0 += SW_W)
    for (int c0 = 0; c0 < nt; c0 += SW_W) {
      const int cols = SW_MIN(SW_W, nt - c0);
      sw_tile_in(src + (long)n0 * L + c0, L, SW_MIN(SW_W, SW_N - n0), cols, tmp);
      for (int c = 0; c < cols; ++c) sw_vstore(out + (long)(c0 + c) * SW_NP + n0, tmp[c]);
    }
}

/* Per-lane values of a (dim, N) matrix (A, fixed B or C) for channels d0.., scaled. */
static void sw_lane_matrix(const SW_T* M, long d0, int nl, SW_T scale, sw_v* out) {
  for (int n = 0; n < SW_N; ++n) {
    out[n] = sw_vzero;
    for (int j = 0; j < nl; ++j) out[n][j] = M[(d0 + j) * SW_N + n] * scale;
  }
}

static sw_v sw_lane_vector(const SW_T* v, long d0, int nl) {
  sw_v out = sw_vzero;
  for (int j = 0; j < nl; ++j) out[j] = v[d0 + j];
  return out;
}

/* dt = softplus(delta + bias) (as configured) in place; dtu = dt * u. */
static void sw_gates(sw_v* dt, const sw_v* u, sw_v* dtu, sw_v bias, int nt) {
  for (int t = 0; t < nt; ++t) {
    sw_v v = dt[t];
    if (SW_HAS_BIAS) v += bias;
    if (SW_SOFTPLUS) v = sw_vsoftplus(v);
    dt[t] = v;
    dtu[t] = v * u[t];
  }
}


/* An array of N state vectors of a block: on the stack (kept in registers for small N) while the kernel's
 * arrays of them fit STACK_BUDGET bytes, else the slot at heap of the thread's scratch (a thread's stack
 * may be as small as 128 KiB, and the states of a large N would overflow it). */
#if SW_STATES_ON_STACK
#define SW_STATES(name, heap) sw_v name[SW_N]
#else
#define SW_STATES(name, heap) sw_v* const name = (heap)
#endif

/* Scratch of one thread, aligned for whole vectors. */
static void* sw_alloc(size_t bytes, void** raw) {
  *raw = malloc(bytes + 64);
  if (!*raw) return NULL;
  return (void*)(((uintptr_t)*raw + 63) & ~(uintptr_t)63);
}
"""

FORWARD = r"""
/* B_t[n] and C_t[n]: per-lane vectors when fixed, else one scalar of the tile (broadcast by the multiply). */
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

/* Partial sums of the contraction over n: independent multiply-add chains. */
#define SW_ACC (SW_N < 4 ? SW_N : 4)
/* Fewest tiles of L per part when one block's sequence is split over threads (the aggregate pass
 * and the chained carries must stay small beside the work). */
#define SW_MIN_PART_TILES 4

/* N-vector arrays of the forward (SW_STATES): a2, bf, cf of a range, h of a block. */
#define SW_FWD_STATES 4

typedef struct { sw_v *dt, *u, *dtu, *z, *y; SW_T *Bt, *Ct; sw_v* st; } sw_fwd_tiles;

/* Steps [t_begin, t_end) of a block from the states h (updated in place).  With y, writes y; without,
 * only the states run, and *sum_dt / *reset_seen collect the block's summed dt and whether a packed
 * sequence starts inside (the aggregate of a part of L: h_end = exp(A * sum dt) * h_begin + h_end(0)). */
static void sw_fwd_range(const sw_mamba* m, long b, long d0, int nl, const sw_fwd_tiles* s, long t_begin,
                         long t_end, sw_v* h, SW_T* restrict y, sw_v* sum_dt, int* reset_seen) {
  const long L = m->L, row = (b * m->dim + d0) * L;
  SW_STATES(a2, s->st);
  SW_STATES(bf, s->st + SW_N);
  SW_STATES(cf, s->st + 2 * SW_N);
  sw_lane_matrix(m->A, d0, nl, (SW_T)SW_LOG2E, a2);
  if (SW_B_FIXED) sw_lane_matrix(m->B, d0, nl, 1, bf);
  if (SW_C_FIXED) sw_lane_matrix(m->C, d0, nl, 1, cf);
  const sw_v Dv = SW_HAS_D ? sw_lane_vector(m->D, d0, nl) : sw_vzero;
  const sw_v bias = SW_HAS_BIAS ? sw_lane_vector(m->bias, d0, nl) : sw_vzero;
  const SW_T* Brow = SW_B_FIXED ? NULL : sw_rows(m->B, m->gb, m, b, d0);
  const SW_T* Crow = SW_C_FIXED ? NULL : sw_rows(m->C, m->gc, m, b, d0);
  for (long t0 = t_begin; t0 < t_end; t0 += SW_CHUNK) {
    const int nt = (int)SW_MIN((long)SW_CHUNK, t_end - t0);
    sw_load_rows(m->delta + row + t0, L, nl, nt, s->dt);
    sw_load_rows(m->u + row + t0, L, nl, nt, s->u);
    if (SW_HAS_Z && y) sw_load_rows(m->z + row + t0, L, nl, nt, s->z);
    if (!SW_B_FIXED) sw_load_states(Brow + t0, L, nt, s->Bt);
    if (!SW_C_FIXED && y) sw_load_states(Crow + t0, L, nt, s->Ct);
    sw_gates(s->dt, s->u, s->dtu, bias, nt);
    if (t0 + SW_CHUNK < t_end) {
      const long t1 = t0 + SW_CHUNK, n1 = SW_MIN((long)SW_CHUNK, t_end - t1);
      sw_prefetch_rows(m->delta + row + t1, L, nl, n1);
      sw_prefetch_rows(m->u + row + t1, L, nl, n1);
      if (SW_HAS_Z && y) sw_prefetch_rows(m->z + row + t1, L, nl, n1);
      if (!SW_B_FIXED) sw_prefetch_rows(Brow + t1, L, SW_N, n1);
      if (!SW_C_FIXED && y) sw_prefetch_rows(Crow + t1, L, SW_N, n1);
    }
    if (!y) {  /* states only (the aggregate pass of a split sequence) */
      for (int t = 0; t < nt; ++t) {
        if (SW_HAS_RESET && m->reset[t0 + t]) {
          for (int n = 0; n < SW_N; ++n) h[n] = sw_vzero;
          *sum_dt = sw_vzero;
          *reset_seen = 1;
        }
        const sw_v dt = s->dt[t], dtu = s->dtu[t];
        const SW_T* bt = s->Bt + (long)t * SW_NP;
        (void)bt;
        *sum_dt += dt;
#pragma GCC unroll 16
        for (int n = 0; n < SW_N; ++n) h[n] = sw_vexp2(dt * a2[n]) * h[n] + dtu * SW_BN(n);
      }
      continue;
    }
    for (int t = 0; t < nt; ++t) {
      if (SW_HAS_RESET && m->reset[t0 + t])
        for (int n = 0; n < SW_N; ++n) h[n] = sw_vzero;
      const sw_v dt = s->dt[t], dtu = s->dtu[t];
      const SW_T* bt = s->Bt + (long)t * SW_NP;
      const SW_T* ct = s->Ct + (long)t * SW_NP;
      (void)bt; (void)ct;
      sw_v acc[SW_ACC];
      for (int q = 0; q < SW_ACC; ++q) acc[q] = sw_vzero;
#pragma GCC unroll 16
      for (int n = 0; n < SW_N; ++n) {
        const sw_v da = sw_vexp2(dt * a2[n]);
        h[n] = da * h[n] + dtu * SW_BN(n);
        acc[n % SW_ACC] += SW_CN(n) * h[n];
      }
      for (int q = 1; q < SW_ACC; ++q) acc[0] += acc[q];
      s->y[t] = acc[0];
    }
    for (int t = 0; t < nt; ++t) {
      sw_v v = s->y[t];
      if (SW_HAS_D) v += Dv * s->u[t];
      if (SW_HAS_Z) v *= s->z[t] * sw_vsigmoid(s->z[t]);
      s->y[t] = v;
    }
    sw_store_rows(s->y, y + row + t0, L, nl, nt);
  }
}

/* The initial states of a block (h0 or zeros) and the store of its final ones. */
static void sw_h0_block(const sw_mamba* m, long b, long d0, int nl, sw_v* h) {
  for (int n = 0; n < SW_N; ++n) {
    h[n] = sw_vzero;
    if (SW_HAS_H0)
      for (int j = 0; j < nl; ++j) h[n][j] = m->h0[(b * m->dim + d0 + j) * SW_N + n];
  }
}

static void sw_hlast_block(const sw_mamba* m, long b, long d0, int nl, const sw_v* h, SW_T* hlast) {
  if (hlast)
    for (int n = 0; n < SW_N; ++n)
      for (int j = 0; j < nl; ++j) hlast[(b * m->dim + d0 + j) * SW_N + n] = h[n][j];
}

static int sw_fwd_tiles_alloc(sw_fwd_tiles* s, void** raw) {
  const size_t vec = sizeof(sw_v) * SW_CHUNK, sc = sizeof(SW_T) * SW_CHUNK * SW_NP;
  const size_t st = SW_STATES_ON_STACK ? 0 : sizeof(sw_v) * SW_N * SW_FWD_STATES;
  char* p = (char*)sw_alloc(5 * vec + 2 * sc + st, raw);
  if (!p) return SW_ENOMEM;
  s->dt = (sw_v*)p;
  s->u = (sw_v*)(p + vec);
  s->dtu = (sw_v*)(p + 2 * vec);
  s->z = (sw_v*)(p + 3 * vec);
  s->y = (sw_v*)(p + 4 * vec);
  s->Bt = (SW_T*)(p + 5 * vec);
  s->Ct = (SW_T*)(p + 5 * vec + sc);
  s->st = (sw_v*)(p + 5 * vec + 2 * sc);
  return SW_OK;
}

/* Few blocks of channels for the threads: each block's L is cut into P parts of whole tiles.  The parts
 * but the last run from zero states to their aggregate (end state, and the product of their gates
 * exp(A * sum dt), 0 past a packed-sequence start); the carries are chained in order; then every part
 * reruns from its carry and writes y.  One pair of (multiplier, state) per lane and state crosses parts. */
static int sw_forward_split(const sw_mamba* m, SW_T* y, SW_T* hlast, int nth, long P) {
  const long ntiles = (m->L + SW_CHUNK - 1) / SW_CHUNK, items = m->nblocks * P;
  void* raw_c;
  sw_v* agg = (sw_v*)sw_alloc(sizeof(sw_v) * (size_t)(3 * items * SW_N), &raw_c);
  if (!agg) return SW_ENOMEM;
  sw_v *mult = agg, *state = agg + items * SW_N, *carry = agg + 2 * items * SW_N;
  int status = SW_OK;
#pragma omp parallel num_threads(nth)
  {
    void* raw;
    sw_fwd_tiles s;
    const int ok = sw_fwd_tiles_alloc(&s, &raw) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(static)
    for (long it = 0; it < items; ++it) {
      const long k = it / P, q = it % P;
      long b, d0;
      int nl, seen = 0;
      sw_block(m, k, &b, &d0, &nl);
      if (!ok || q == P - 1) continue;
      sw_v* h = state + it * SW_N;
      sw_v sum_dt = sw_vzero;
      SW_STATES(a2, s.st);
      for (int n = 0; n < SW_N; ++n) h[n] = sw_vzero;
      sw_fwd_range(m, b, d0, nl, &s, q * ntiles / P * SW_CHUNK, (q + 1) * ntiles / P * SW_CHUNK, h, NULL,
                   &sum_dt, &seen);
      sw_lane_matrix(m->A, d0, nl, (SW_T)SW_LOG2E, a2);
      for (int n = 0; n < SW_N; ++n) mult[it * SW_N + n] = seen ? sw_vzero : sw_vexp2(sum_dt * a2[n]);
    }
#pragma omp single
    for (long k = 0; k < m->nblocks; ++k) {
      long b, d0;
      int nl;
      sw_block(m, k, &b, &d0, &nl);
      sw_h0_block(m, b, d0, nl, carry + k * P * SW_N);
      for (long q = 0; q + 1 < P; ++q)
        for (int n = 0; n < SW_N; ++n) {
          const long i = (k * P + q) * SW_N + n;
          carry[i + SW_N] = mult[i] * carry[i] + state[i];
        }
    }
#pragma omp for schedule(static)
    for (long it = 0; it < items; ++it) {
      const long k = it / P, q = it % P;
      long b, d0;
      int nl;
      sw_block(m, k, &b, &d0, &nl);
      if (!ok) continue;
      sw_v* h = carry + it * SW_N;
      const long t1 = q == P - 1 ? m->L : (q + 1) * ntiles / P * SW_CHUNK;
      sw_fwd_range(m, b, d0, nl, &s, q * ntiles / P * SW_CHUNK, t1, h, y, NULL, NULL);
      if (q == P - 1) sw_hlast_block(m, b, d0, nl, h, hlast);
    }
    if (ok) free(raw);
  }
  free(raw_c);
  return status;
}

int sw_mamba1_forward(const SW_T* u, const SW_T* delta, const SW_T* A, const SW_T* B, const SW_T* C,
                      const SW_T* D, const SW_T* z, const SW_T* delta_bias, const SW_T* h0,
                      const unsigned char* reset, SW_T* y, SW_T* hlast,
                      long batch, long dim, long L, long groups_b, long groups_c) {
  sw_mamba m = {u, delta, A, B, C, D, z, delta_bias, h0, reset, batch, dim, L, groups_b, groups_c, 0, 0, 0, 0};
  if (batch <= 0 || dim <= 0 || L <= 0) return SW_OK;
  sw_grid(&m);
  const int nth = sw_threads();
  const long ntiles = (L + SW_CHUNK - 1) / SW_CHUNK, parts = SW_MIN(nth / m.nblocks, ntiles / SW_MIN_PART_TILES);
  if (parts >= 2) return sw_forward_split(&m, y, hlast, (int)(m.nblocks * parts), parts);
  const int nt = (int)SW_MIN((long)nth, m.nblocks);
  int status = SW_OK;
  (void)nt;
#pragma omp parallel num_threads(nt)
  {
    void* raw;
    sw_fwd_tiles s;
    if (sw_fwd_tiles_alloc(&s, &raw) != SW_OK) {
#pragma omp atomic write
      status = SW_ENOMEM;
    } else {
#pragma omp for schedule(static)
      for (long k = 0; k < m.nblocks; ++k) {
        long b, d0;
        int nl;
        SW_STATES(h, s.st + 3 * SW_N);
        sw_block(&m, k, &b, &d0, &nl);
        sw_h0_block(&m, b, d0, nl, h);
        sw_fwd_range(&m, b, d0, nl, &s, 0, L, h, y, NULL, NULL);
        sw_hlast_block(&m, b, d0, nl, h, hlast);
      }
      free(raw);
    }
  }
  return status;
}
"""

TAIL = r"""
#ifdef __cplusplus
}
#endif
"""


def feature_defines(features: Mamba1Features) -> str:
    """``#define`` lines of the compile-time features (shared by the C and GPU renderings)."""
    flags = {"SW_N": features.N, "SW_B_FIXED": features.b_fixed, "SW_C_FIXED": features.c_fixed,
             "SW_HAS_D": features.has_D, "SW_HAS_Z": features.has_z, "SW_HAS_BIAS": features.has_bias,
             "SW_SOFTPLUS": features.softplus, "SW_HAS_H0": features.has_h0, "SW_HAS_RESET": features.has_reset,
             "SW_HAS_DHLAST": features.has_dhlast}
    return "\n".join(f"#define {k} {int(v)}" for k, v in flags.items())


def defines(features: Mamba1Features, config: dict, kernel_tuner: bool = False) -> str:
    """``#define`` lines of the features and tunables; tunables under ``#ifndef`` guards
    (with ``kernel_tuner``, Kernel Tuner's bare-name defines win)."""
    lines = [feature_defines(features)]
    lines += tunable_defines(("chunk", "threads"), config, kernel_tuner)
    return "\n".join(lines)


def render(renderer, call, kernel_tuner: bool = False) -> str:
    """The C unit of ``call`` (a :class:`~scanweaver.fused.FusedCall` of ``mamba1``).

    With ``kernel_tuner``, the tunables ``chunk`` and ``threads`` read Kernel Tuner's bare-name
    defines (``width`` shapes the generated text, so it is one unit per value).
    """
    f, cfg = call.features, call.params
    title = (f"/* scanweaver fused C kernel: mamba1 {call.part}, {f.dtype}, N={f.N}, width {cfg['width']} */")
    body = FORWARD if call.part == "forward" else BACKWARD
    stack = f"#define SW_STATES_ON_STACK {int(states_on_stack(call))}"
    parts = [title, defines(f, cfg, kernel_tuner), stack, HEAD, THREADS, vector_prelude(f.dtype, cfg["width"]), COMMON,
             body]
    if kernel_tuner:
        parts.append(fused_timed(Mamba1(), call))
    return "\n".join([*parts, TAIL])


def states_on_stack(call) -> bool:
    """True when the N-state arrays of ``call``'s blocks fit :data:`STACK_BUDGET` (else they are heap scratch)."""
    item = 8 if call.features.dtype == "float64" else 4
    return STATE_ARRAYS[call.part] * call.features.N * call.params["width"] * item <= STACK_BUDGET


KERNELS.register(FusedKernel(Mamba1.name, "c", ("forward", "backward"), render,
                             lambda part: f"sw_mamba1_{part}"))
