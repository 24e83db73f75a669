"""C source of the ``chunked`` schedule on CPU cores (assembled by :mod:`scanweaver.targets.c_target`).

The chunks of the schedule are vector blocks of ``SW_VL`` scan positions,
one vector of the machine the kernel is compiled for (``SW_VBYTES``: 64 bytes
with AVX-512, 32 with AVX, 16 with SSE or NEON; see :data:`VECTOR_BYTES`).  Each block's pairs (A_t, U_t) are
computed once, then scanned in registers in log2(SW_VL) steps of
shift-and-compose (``chunked.reduce`` within the block); one fused
multiply-add per block applies the carry-in to every position
(``chunked.propagate``), and the carry-out, the block's last state, feeds
the next block (``chunked.scan``).  The dependency chain from block to block
is one multiply-add per SW_VL elements instead of one per element, so a
single lane streams at memory speed.  Two work layouts, picked per call:

* lanes (many lanes): each thread takes ``SW_INTERLEAVE`` lanes at a time
  and streams through them block by block; every byte is read once.
* split (few lanes, long L): tiles of ``SW_CHUNK`` positions of one lane are
  dealt round-robin to the threads.  A tile is first reduced to its aggregate
  (reading memory), takes its carry-in from the tile before through a ready
  flag, publishes its carry-out, and replays its blocks from the carry while
  the tile is still in cache, so memory is read once.
"""

from __future__ import annotations

from ..ir.expr import is_const
from .c_source import C_SCHEDULES, CSchedule

#: Two-vector shuffles of the vector-extension dialects (GCC, Clang).
SHUFFLE = r"""
#if defined(__clang__)
#define SW_SHUF2(x, y, ...) __builtin_shufflevector((x), (y), __VA_ARGS__)
#define SW_SHUF1(x, ...) __builtin_shufflevector((x), (x), __VA_ARGS__)
#else
#define SW_SHUF2(x, y, ...) __builtin_shuffle((x), (y), (sw_ivec){__VA_ARGS__})
#define SW_SHUF1(x, ...) __builtin_shuffle((x), (sw_ivec){__VA_ARGS__})
#endif
"""


def _shift_mask(vl: int, s: int) -> str:
    """Lanes i >= s take x[i-s]; lanes below s take the fill vector's lane i."""
    return ", ".join(str(i - s if i >= s else vl + i) for i in range(vl))


def _half_masks(vl: int) -> list[str]:
    """Shift-and-compose masks: in-half shifts of each 16-byte half, then one cross-half step.

    Shuffles within a 16-byte half are single cheap instructions on x86 (and
    NEON); only the last step moves data across halves.
    """
    h = vl // 2
    masks = []
    s = 1
    while s < h:
        masks.append(", ".join(str(i - s if i % h >= s else vl + i) for i in range(vl)))
        s *= 2
    masks.append(", ".join(str(h - 1 if i >= h else vl + i) for i in range(vl)))
    return masks


def block_scan(vl: int) -> str:
    """The in-register inclusive scan of one block of ``vl`` pairs (shift-and-compose steps)."""
    steps = [f"  {{ const sw_vec as = SW_SHUF2(a, sw_one, {m}), us = SW_SHUF2(u, sw_zero, {m});\n"
             f"    u = a * us + u; a = a * as; }}" for m in _half_masks(vl)]
    last = ", ".join([str(vl - 1)] * vl)
    prev = _shift_mask(vl, 1)
    return f"""
/* Inclusive scan of a block of pairs in registers: lane i becomes elem(i) o ... o elem(0). */
SW_INLINE void sw_vscan(sw_vec* A, sw_vec* U) {{
  sw_vec a = *A, u = *U;
{chr(10).join(steps)}
  *A = a; *U = u;
}}
SW_INLINE sw_vec sw_vlast(sw_vec v) {{ return SW_SHUF1(v, {last}); }}
/* h_{{t-1}} of every lane: lane 0 takes the carry-in (broadcast in hin). */
SW_INLINE sw_vec sw_vprev(sw_vec h, sw_vec hin) {{ return SW_SHUF2(h, hin, {prev}); }}
"""


def _vector_operand(layout: str, name: str) -> str:
    """A block of operand ``name`` in scan order: a vector load, or a broadcast of its one value
    (``scalar``) or of its lane's value (``lane``, the lane of flat index ``i0``)."""
    if layout == "scalar":
        return f"(sw_zero + sw->in_{name}[0])"
    if layout == "lane":
        return f"(sw_zero + sw->in_{name}[i0 / sw->L])"
    return f"sw_vload(sw->in_{name}, i0)"


def vector_pairs(renderer, stages) -> str:
    """``sw_vpairs``/``sw_vout`` on whole vectors when A, U and y are plain arithmetic of the
    operands (no function calls, no reset mask); otherwise element by element.

    Building a block from scalars goes through the stack, and a 32-byte load of
    what was stored in pieces stalls store-to-load forwarding; plain arithmetic
    is rendered on vector loads instead.
    """
    aff = stages.affine
    exprs = [aff.A, aff.U, aff.output.new, aff.output.old, aff.output.const]
    plain = not aff.features.has_reset and not any(n.op == "call" for e in exprs for n in e.walk())
    if not plain:
        return SCALAR_PAIRS
    dt = aff.dtype
    load = lambda n: _vector_operand(aff.features.layout(n), n)  # noqa: E731
    vec = lambda e: renderer.expr(e, load, dt) if e.inputs() else f"(sw_zero + {renderer.expr(e, load, dt)})"  # noqa: E731
    out = aff.output
    terms = [f"{vec(e)} * {v}" for e, v in ((out.new, "H"), (out.old, "P")) if not is_const(e, 0.0)]
    terms += [] if is_const(out.const, 0.0) else [vec(out.const)]
    y = "H" if out.is_identity else (" + ".join(terms) or "sw_zero")
    return VECTOR_PAIRS.replace("@A@", vec(aff.A)).replace("@U@", vec(aff.U)).replace("@Y@", y)


#: Positions ahead of the current block that the chunked kernel prefetches (2 KiB of float32 per stream).
AHEAD = 512

#: Vector sizes in bytes the chunked kernel is rendered for; the compiler picks one (:data:`VECTOR_BYTES`).
WIDTHS = (64, 32, 16)

#: The vector size of the machine the kernel is compiled for, from the compiler's predefined macros:
#: 64 bytes with AVX-512, 32 with AVX, 16 otherwise (SSE, NEON and unknown ISAs, where the compiler
#: lowers vector extensions to what it has).  ``-DSW_VBYTES=n`` overrides it.
VECTOR_BYTES = r"""
#ifndef SW_VBYTES
#if defined(__AVX512F__)
#define SW_VBYTES 64
#elif defined(__AVX__)
#define SW_VBYTES 32
#else
#define SW_VBYTES 16
#endif
#endif
"""


def _width(dtype: str, vbytes: int) -> str:
    """Vector types, constants and the block scan for vectors of ``vbytes`` bytes."""
    item = 4 if dtype == "float32" else 8
    vl = vbytes // item
    itype = "int" if dtype == "float32" else "long long"
    rev = ", ".join(str(vl - 1 - k) for k in range(vl))
    return (f"#define SW_VL {vl}\n"
            f"typedef SW_T sw_vec __attribute__((vector_size({vbytes})));\n"
            f"typedef {itype} sw_ivec __attribute__((vector_size({vbytes})));\n"
            f"static const sw_vec sw_zero = {{0}}, sw_one = {{{', '.join(['1'] * vl)}}};\n"
            + f"SW_INLINE sw_vec sw_vrev(sw_vec v) {{ return SW_SHUF1(v, {rev}); }}\n"
            + block_scan(vl).strip("\n"))


def chunked_source(renderer, stages) -> str:
    """The ``chunked`` schedule's C source: one rendering per vector size of :data:`WIDTHS`, the
    compiler keeping the one of its target (:data:`VECTOR_BYTES`)."""
    dtype = stages.affine.dtype
    branches = []
    for i, vbytes in enumerate(WIDTHS):
        branches.append(f"#{'if' if i == 0 else 'elif'} SW_VBYTES == {vbytes}\n{_width(dtype, vbytes)}")
    widths = "\n".join([*branches, "#else", f"#error \"SW_VBYTES must be one of {WIDTHS}\"", "#endif"])
    return (VECTOR_BYTES + SHUFFLE + PRELUDE + widths + "\n"
            + VECTOR_IO + vector_pairs(renderer, stages) + ahead(stages) + BODY)


def ahead(stages) -> str:
    """``sw_ahead(sw, i0)``: prefetches every full operand :data:`AHEAD` positions further in scan order.

    The blocks of a lane read several streams at once; asking for them ahead measured 15-20% faster on
    one lane of 2^24 (float32, 2 threads, AVX-512), where the hardware prefetchers alone fall behind.
    """
    aff = stages.affine
    lines = [f"  SW_PREFETCH(sw->in_{n} + i0 + (SW_REVERSE ? -SW_AHEAD : SW_AHEAD), 0);"
             for n in aff.inputs if aff.features.layout(n) == "full"]
    return (f"\n/* Positions of a lane read ahead of the block being scanned (prefetched, never loaded). */\n"
            f"#define SW_AHEAD {AHEAD}\n"
            f"SW_INLINE void sw_ahead(const sw_ctx* sw, long i0) {{\n  (void)sw; (void)i0;\n"
            + "\n".join(lines) + "\n}\n")


VECTOR_IO = r"""
/* The block of SW_VL elements of p in scan order whose first element sits at flat index i0. */
SW_INLINE sw_vec sw_vload(const SW_T* p, long i0) {
  sw_vec v;
  memcpy(&v, p + (SW_REVERSE ? i0 - (SW_VL - 1) : i0), sizeof v);
  return SW_REVERSE ? sw_vrev(v) : v;
}
SW_INLINE void sw_vstore(SW_T* p, long i0, sw_vec v) {
  if (SW_REVERSE) v = sw_vrev(v);
  memcpy(p + (SW_REVERSE ? i0 - (SW_VL - 1) : i0), &v, sizeof v);
}
"""

VECTOR_PAIRS = r"""
/* Pairs of the block starting (in scan order) at flat index i0, on whole vectors. */
SW_INLINE void sw_vpairs_at(const sw_ctx* sw, long i0, sw_vec* A, sw_vec* U) {
  *A = @A@;
  *U = @U@;
}
/* y of the block from states H (h_t) and P (h_{t-1}). */
SW_INLINE void sw_vout(const sw_ctx* sw, long i0, sw_vec H, sw_vec P) {
  (void)P;
  sw_vstore(sw->y, i0, @Y@);
}
"""

SCALAR_PAIRS = r"""
/* Pairs of the block starting (in scan order) at flat index i0, element by element. */
SW_INLINE void sw_vpairs_at(const sw_ctx* sw, long i0, sw_vec* A, sw_vec* U) {
  const long step = SW_REVERSE ? -1 : 1;
  for (int k = 0; k < SW_VL; ++k) {
    SW_T a, u;
    sw_pair(sw, i0 + step * k, &a, &u);
    (*A)[k] = a;
    (*U)[k] = u;
  }
}
/* y of the block from states H (h_t) and P (h_{t-1}). */
SW_INLINE void sw_vout(const sw_ctx* sw, long i0, sw_vec H, sw_vec P) {
  const long step = SW_REVERSE ? -1 : 1;
  for (int k = 0; k < SW_VL; ++k) sw->y[i0 + step * k] = sw_out(sw, i0 + step * k, H[k], P[k]);
}
"""


PRELUDE = r"""
#define SW_G SW_INTERLEAVE
#if defined(__GNUC__)
#define SW_INLINE static inline __attribute__((always_inline))
#else
#define SW_INLINE static inline
#endif
"""

BODY = r"""
/* Pairs of scan positions s0 .. s0+SW_VL-1 of the lane at flat offset base. */
SW_INLINE void sw_vpairs(const sw_ctx* sw, long base, long s0, sw_vec* A, sw_vec* U) {
  sw_vpairs_at(sw, base + SW_POS(sw->L, s0), A, U);
}

/* One block: scan, apply the carry-in (broadcast in *hb), write y, leave the carry-out
 * broadcast in *hb (kept in a register: the block-to-block chain is a multiply-add and a shuffle). */
SW_INLINE void sw_vblock(const sw_ctx* sw, long base, long s0, sw_vec* hb) {
  sw_vec A, U;
  const long i0 = base + SW_POS(sw->L, s0);
  sw_ahead(sw, i0);
  sw_vpairs_at(sw, i0, &A, &U);
  sw_vscan(&A, &U);
  const sw_vec hin = *hb;
  const sw_vec hv = A * hin + U;
  sw_vout(sw, i0, hv, sw_vprev(hv, hin));
  *hb = sw_vlast(hv);
}

/* Scalar steps for positions [s0, s1) of a lane (block tails). */
static void sw_steps(const sw_ctx* sw, long base, long s0, long s1, SW_T* h) {
  const long len = sw->L;
  for (long s = s0; s < s1; ++s) {
    const long i = base + SW_POS(len, s);
    SW_T A, U;
    sw_pair(sw, i, &A, &U);
    const SW_T hp = *h;
    *h = A * *h + U;
    sw->y[i] = sw_out(sw, i, *h, hp);
  }
}

/* Positions [s0, s1) of a lane from state *h: whole blocks, then scalar steps. */
static void sw_replay(const sw_ctx* sw, long lane, long s0, long s1, SW_T* h) {
  const long base = lane * sw->L;
  long s = s0;
  sw_vec hb = sw_zero + *h;
  for (; s + SW_VL <= s1; s += SW_VL) sw_vblock(sw, base, s, &hb);
  *h = hb[0];
  sw_steps(sw, base, s, s1, h);
}

/* ---- lanes: SW_G lanes per step of a thread, each streamed block by block ---- */

static void sw_lane_group(const sw_ctx* sw, long l0, int ng) {
  const long len = sw->L, nb = len / SW_VL * SW_VL;
  if (ng == 1) {  /* one chain: keep its carry in a register */
    SW_T h = sw_h0(sw, l0);
    sw_replay(sw, l0, 0, len, &h);
    sw_store_last(sw, l0, h);
    return;
  }
  sw_vec hb[SW_G];
  SW_T h[SW_G];
  for (int g = 0; g < ng; ++g) hb[g] = sw_zero + sw_h0(sw, l0 + g);
  for (long s = 0; s < nb; s += SW_VL)
    for (int g = 0; g < ng; ++g) sw_vblock(sw, (l0 + g) * len, s, hb + g);
  for (int g = 0; g < ng; ++g) {
    h[g] = hb[g][0];
    sw_steps(sw, (l0 + g) * len, nb, len, h + g);
    sw_store_last(sw, l0 + g, h[g]);
  }
}

static int sw_run_lanes(const sw_ctx* sw, int nt) {
  const long ngroups = (sw->nlanes + SW_G - 1) / SW_G;
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long g = 0; g < ngroups; ++g) {
    const long l0 = g * SW_G;
    sw_lane_group(sw, l0, (int)SW_MIN((long)SW_G, sw->nlanes - l0));
  }
  return SW_OK;
}

/* ---- split: one lane's tiles over the threads, chained carries ---- */

/* Aggregate (ga, gu) of positions [s0, s1) of a lane: h_out = ga * h_in + gu. */
static void sw_tile_reduce(const sw_ctx* sw, long base, long s0, long s1, SW_T* ga, SW_T* gu) {
  SW_T pa = 1, pu = 0;
  long s = s0;
  for (; s + SW_VL <= s1; s += SW_VL) {
    sw_vec A, U;
    sw_ahead(sw, base + SW_POS(sw->L, s));
    sw_vpairs(sw, base, s, &A, &U);
    sw_vscan(&A, &U);
    const SW_T ba = A[SW_VL - 1], bu = U[SW_VL - 1];
    pu = ba * pu + bu;
    pa = ba * pa;
  }
  const long len = sw->L;
  for (; s < s1; ++s) {
    SW_T A, U;
    sw_pair(sw, base + SW_POS(len, s), &A, &U);
    pu = A * pu + U;
    pa = A * pa;
  }
  *ga = pa;
  *gu = pu;
}

/* The carry into a tile, once the tile before has published it. */
static SW_T sw_wait_carry(int* ready, const SW_T* carry) {
  sw_flag_wait(ready);
  return *carry;
}

/* A tile: its aggregate, its carry-in, its carry-out published (sw_carry: a zero carry-in gives gu even where the
 * product ga has overflowed), then its replay.  A product that overflowed (growing transitions) entered with a
 * carry that is not zero gives the carry-out by the replay itself, as a loop would (the next tile waits). */
static void sw_split_tile(const sw_ctx* sw, long lane, long tile, SW_T* carry, int* ready) {
  const long s0 = tile * (long)SW_CHUNK, s1 = SW_MIN(s0 + (long)SW_CHUNK, sw->L);
  SW_T ga, gu;
  sw_tile_reduce(sw, lane * sw->L, s0, s1, &ga, &gu);
  SW_T h = sw_wait_carry(ready + tile, carry + tile);
  const int finite = ga - ga == (SW_T)0;  /* false for inf and NaN */
  if (!finite && h != (SW_T)0) {
    sw_replay(sw, lane, s0, s1, &h);
    carry[tile + 1] = h;
    sw_flag_set(ready + tile + 1);
    return;
  }
  carry[tile + 1] = sw_carry(ga, gu, h);
  sw_flag_set(ready + tile + 1);
  sw_replay(sw, lane, s0, s1, &h);
}

static int sw_run_split(const sw_ctx* sw, int nt) {
  const long len = sw->L, ntiles = (len + SW_CHUNK - 1) / SW_CHUNK;
  if (nt > ntiles) nt = (int)ntiles;
  SW_T* carry = (SW_T*)malloc(sizeof(SW_T) * (size_t)(ntiles + 1));
  int* ready = (int*)malloc(sizeof(int) * (size_t)(ntiles + 1));
  if (!carry || !ready) { free(carry); free(ready); return SW_ENOMEM; }
  for (long lane = 0; lane < sw->nlanes; ++lane) {
    memset(ready, 0, sizeof(int) * (size_t)(ntiles + 1));
    carry[0] = sw_h0(sw, lane);
    ready[0] = 1;
    if (nt <= 1) {
      SW_T h = carry[0];
      sw_replay(sw, lane, 0, len, &h);
      carry[ntiles] = h;
    } else {
#pragma omp parallel num_threads(nt)
      {
#ifdef _OPENMP
        const long tid = omp_get_thread_num(), P = omp_get_num_threads();
#else
        const long tid = 0, P = 1;
#endif
        for (long tile = tid; tile < ntiles; tile += P) sw_split_tile(sw, lane, tile, carry, ready);
      }
    }
    sw_store_last(sw, lane, carry[ntiles]);
  }
  free(carry);
  free(ready);
  return SW_OK;
}

/* Lanes when they spread evenly (or plentifully) over the threads, else split tiles of one lane. */
static int sw_run(const sw_ctx* sw) {
  const int nt = sw_threads();
  const long per = (long)nt * SW_G;
  if (nt <= 1 || sw->nlanes % per == 0 || sw->nlanes >= 8 * per)
    return sw_run_lanes(sw, (int)SW_MIN((long)nt, (sw->nlanes + SW_G - 1) / SW_G));
  return sw_run_split(sw, nt);
}
"""


def dense_source(renderer, stages) -> str:
    """The dense rendering of ``chunked`` (:mod:`.c_dense_vertical`, which reads this module's widths)."""
    from .c_dense_vertical import source

    return source(renderer, stages)


C_SCHEDULES.register(CSchedule("chunked", chunked_source, dense_source, ("chunk", "interleave", "threads")))
