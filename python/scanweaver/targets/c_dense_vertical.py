"""``chunked`` over dense k x k transitions on CPU cores: the stripes of a tile side by side in vector lanes.

A lane's scan positions are cut into tiles of about ``SW_CHUNK`` positions, and each tile into ``SW_W``
stripes of equal length ``m`` (``SW_W`` = elements per vector of the target, as in the diagonal
``chunked`` kernel).  Vector lane j carries stripe j, so one vector multiply-add advances ``SW_W``
independent chains: the multiply-add chain that bounds a filter loop (one step per element) becomes
one step per ``SW_W`` elements.  Per tile:

1. ``reduce``: every stripe's aggregate ``(M_j, v_j)`` (``h_out = M_j h_in + v_j``) from the identity,
   operands read as ``SW_W x SW_W`` tiles transposed in registers (rows are stripes, ``m`` apart);
   when A does not depend on full operands (filter coefficients passed as scalars or per lane, no
   resets) only ``v_j`` is scanned and ``M_j = A^m`` is one matrix power;
2. carries: ``c_0`` = the tile's carry-in, ``c_{j+1} = M_j c_j + v_j`` (scalar, ``SW_W`` steps), the
   ``< SW_W`` positions past the last stripe stepped one by one; the last state is the tile's carry-out;
3. ``replay``: every stripe from its carry, writing y through the same transposes.

Many lanes run lane by lane over the threads; few long lanes deal their tiles round-robin to the
threads, each waiting only for the carry-out of the tile before (as the diagonal ``split`` layout).
Stripe lengths are moved off multiples of 4 KiB so that a tile's rows do not share L1 sets.

Expressions of A, U and y are evaluated on whole vectors when they are plain arithmetic (resets become
a mask); with function calls the pairs are computed element by element (``sw_dpair``) into the lanes.
States above :data:`VERTICAL_MAX_STATE` with a varying A use :data:`.c_dense.CHUNKED` instead.
"""

from __future__ import annotations

from ..ir.expr import is_const
from . import c_dense
from .c_chunked import VECTOR_BYTES, WIDTHS
from .cvec import SHUFFLE, TILES, transpose

#: Largest state whose matrices the stripes compose in vectors (k^3 multiply-adds a step, and k^3 vector
#: registers' worth of code to compile); beyond it, unless A is the same at every step, chunk aggregates
#: are composed element by element (:data:`.c_dense.CHUNKED`).
VERTICAL_MAX_STATE = 3


#: Full operands up to which the tile transposes of :mod:`.cvec` are inlined (a filter reads one, x); with
#: more they are called: a kernel with many operands would otherwise inline a transpose per operand per
#: pass (minutes of compile time for sixteen-lane vectors), and the call costs little next to a tile.
INLINE_TILES_MAX = 2


def _widths(dtype: str) -> str:
    """Vector types and the in-register transpose for each vector size, the compiler keeping its target's."""
    item = 4 if dtype == "float32" else 8
    itype = "int" if dtype == "float32" else "long long"
    out = []
    for i, vbytes in enumerate(WIDTHS):
        w = vbytes // item
        out.append(f"#{'if' if i == 0 else 'elif'} SW_VBYTES == {vbytes}\n#define SW_W {w}\n"
                   f"typedef SW_T sw_v __attribute__((vector_size({vbytes})));\n"
                   f"typedef {itype} sw_vi __attribute__((vector_size({vbytes})));\n"
                   + SHUFFLE.strip("\n") + "\n" + transpose(w))
    return "\n".join([*out, "#else", f'#error "SW_VBYTES must be one of {WIDTHS}"', "#endif"])


def _vector_mode(aff) -> bool:
    """True when A, U and y are plain arithmetic (no calls): they are then evaluated on vectors."""
    out = aff.output
    exprs = [*aff.A, *aff.U, *out.new, *out.old, out.const]
    return not any(n.op == "call" for e in exprs for n in e.walk())


def _const_a(aff) -> bool:
    """True when A is the same at every step of a lane: it reads no full operand and there are no resets."""
    return not aff.features.has_reset and all(aff.features.layout(n) != "full" for e in aff.A for n in e.inputs())


def _used(aff) -> list[str]:
    out = aff.output
    names: set[str] = set()
    for e in (*aff.A, *aff.U, *out.new, *out.old, out.const):
        names |= e.inputs()
    return [n for n in aff.inputs if n in names]


def _pair_lines(renderer, aff, indent: str) -> tuple[list[str], list[str], list[str]]:
    """``(setup, A lines, U lines)``: broadcasts once per lane, and the per-step vectors ``A``, ``U``."""
    dt = aff.dtype
    setup, tiles = [], []
    for n in _used(aff):
        layout = aff.features.layout(n)
        if layout == "full":
            tiles.append(n)
        else:
            at = "0" if layout == "scalar" else "lane"
            setup.append(f"  const sw_v S_{n} = sw_vzero + sw->in_{n}[{at}];")

    def load(n: str) -> str:
        return f"T_{n}[t]" if aff.features.layout(n) == "full" else f"S_{n}"

    def vec(e) -> str:
        text = renderer.expr(e, load, dt)
        return text if e.inputs() else f"(sw_vzero + {text})"

    a_lines = [f"{indent}A[{j}] = {vec(e)};" for j, e in enumerate(aff.A)]
    if aff.features.has_reset:
        a_lines.append(f"{indent}for (int r = 0; r < SW_K * SW_K; ++r) A[r] *= K_[t];")
    u_lines = [f"{indent}U[{j}] = {vec(e)};" for j, e in enumerate(aff.U)]
    return setup, a_lines, u_lines


def _tile_loads(aff, names: list[str]) -> str:
    lines = [f"    sw_v T_{n}[SW_W]; sw_tile_in(sw->in_{n} + src, stride, SW_W, cols, T_{n});" for n in names]
    if aff.features.has_reset:
        lines += ["    sw_v K_[SW_W];",
                  "    for (int c = 0; c < SW_W; ++c) for (int j = 0; j < SW_W; ++j)",
                  "      K_[c][j] = (c < cols && !sw->reset[src + j * stride + c]) ? (SW_T)1 : (SW_T)0;"]
    return "\n".join(lines)


def _output(renderer, aff) -> str:
    """Vector expression of y from ``H`` (h_t) and ``P`` (h_{t-1})."""
    dt = aff.dtype
    out = aff.output

    def load(n: str) -> str:
        return f"T_{n}[t]" if aff.features.layout(n) == "full" else f"S_{n}"

    def vec(e) -> str:
        text = renderer.expr(e, load, dt)
        return text if e.inputs() else f"(sw_vzero + {text})"

    terms = [f"{vec(c)} * {s}[{j}]" for j, (new, old) in enumerate(zip(out.new, out.old, strict=True))
             for c, s in ((new, "H"), (old, "P")) if not is_const(c, 0.0)]
    if not is_const(out.const, 0.0):
        terms.append(vec(out.const))
    return " + ".join(terms) or "sw_vzero"


def source(renderer, stages) -> str:
    """The C source of the dense ``chunked`` schedule (``static int sw_run(const sw_ctx*)``)."""
    aff = stages.affine
    vector = _vector_mode(aff)
    const_a = vector and _const_a(aff)
    if not const_a and aff.state_size > VERTICAL_MAX_STATE:
        return c_dense.CHUNKED
    full = [n for n in _used(aff) if aff.features.layout(n) == "full"]
    if vector:
        setup, a_lines, u_lines = _pair_lines(renderer, aff, "      ")
        loads = _tile_loads(aff, full)
        pair = "\n".join(([] if const_a else a_lines) + u_lines)
        y = f"Y[t] = {_output(renderer, aff)};"
        a_once = "\n".join("  " + line.lstrip() for line in a_lines) if const_a else ""
    else:
        setup, loads, a_once = [], "", ""
        pair = SCALAR_PAIR
        y = SCALAR_OUT
    body = (BODY.replace("@SETUP@", "\n".join(setup)).replace("@LOADS@", loads).replace("@PAIR@", pair)
            .replace("@Y@", y).replace("@A_ONCE@", a_once).replace("@CONST_A@", "1" if const_a else "0"))
    tiles = TILES.strip("\n")
    if len(full) > INLINE_TILES_MAX:
        tiles = tiles.replace("SW_INLINE void", "SW_NOINLINE void")
    return "\n".join([VECTOR_BYTES.strip("\n"), INLINE.strip("\n"), _widths(aff.dtype), HELPERS.strip("\n"), tiles,
                      body.strip("\n"), RUN.strip("\n")]) + "\n"


SCALAR_PAIR = r"""      for (int j = 0; j < SW_W; ++j) {
        SW_T a[SW_K * SW_K], u[SW_K];
        sw_dpair(sw, src + j * stride + t, a, u);
        for (int r = 0; r < SW_K * SW_K; ++r) A[r][j] = a[r];
        for (int r = 0; r < SW_K; ++r) U[r][j] = u[r];
      }"""

SCALAR_OUT = r"""for (int j = 0; j < SW_W; ++j) {
          SW_T h[SW_K], hp[SW_K];
          for (int r = 0; r < SW_K; ++r) { h[r] = H[r][j]; hp[r] = P[r][j]; }
          Y[t][j] = sw_dout(sw, src + j * stride + t, h, hp);
        }"""

INLINE = r"""
#if defined(__GNUC__)
#define SW_INLINE static inline __attribute__((always_inline))
#define SW_NOINLINE static __attribute__((noinline))
#else
#define SW_INLINE static inline
#define SW_NOINLINE static
#endif
"""

HELPERS = r"""
static const sw_v sw_vzero = {0};
SW_INLINE sw_v sw_vload(const SW_T* p) { sw_v v; memcpy(&v, p, sizeof v); return v; }
SW_INLINE void sw_vstore(SW_T* p, sw_v v) { memcpy(p, &v, sizeof v); }

/* Stripe length of a whole tile: SW_CHUNK / SW_W positions, moved off multiples of 4 KiB (rows of a
 * tile that far apart share L1 sets and evict each other). */
static long sw_stripe(void) {
  long m = SW_CHUNK / SW_W;
  if (m < SW_W) m = SW_W;
  const long off = (m * (long)sizeof(SW_T)) & 4095;
  if (off < 512 || off > 3584) m += 768 / (long)sizeof(SW_T);
  return m;
}

/* P <- A^e (k x k, row-major) by repeated squaring. */
static void sw_dpow(const SW_T* A, long e, SW_T* P) {
  SW_T B[SW_K * SW_K], T[SW_K * SW_K];
  memcpy(B, A, sizeof B);
  for (int q = 0; q < SW_K * SW_K; ++q) P[q] = (q / SW_K == q % SW_K) ? (SW_T)1 : (SW_T)0;
  for (; e > 0; e >>= 1) {
    if (e & 1) {
      for (int r = 0; r < SW_K; ++r)
        for (int c = 0; c < SW_K; ++c) {
          SW_T acc = 0;
          for (int q = 0; q < SW_K; ++q) acc += B[r * SW_K + q] * P[q * SW_K + c];
          T[r * SW_K + c] = acc;
        }
      memcpy(P, T, sizeof T);
    }
    for (int r = 0; r < SW_K; ++r)
      for (int c = 0; c < SW_K; ++c) {
        SW_T acc = 0;
        for (int q = 0; q < SW_K; ++q) acc += B[r * SW_K + q] * B[q * SW_K + c];
        T[r * SW_K + c] = acc;
      }
    memcpy(B, T, sizeof T);
  }
}

/* Aggregates of the SW_W stripes of a tile: h_out = M[j] h_in + V[j] for stripe j. */
typedef struct { SW_T M[SW_W][SW_K * SW_K]; SW_T V[SW_W][SW_K]; SW_T c[SW_W][SW_K]; } sw_dv_tile;
"""

BODY = r"""
/* Reduce (replay = 0: aggregates into g) or replay (replay = 1: states from g->c, y written) the SW_W
 * stripes of m positions from scan position s0 of a lane.  Stripe j's position p sits at scan
 * position s0 + j*m + p; a tile of operands (rows: stripes, columns: SW_W positions) is transposed
 * so that T_name[t] holds memory column t of every stripe. */
SW_INLINE void sw_dv_pass(const sw_ctx* sw, long lane, long s0, long m, sw_dv_tile* g, int replay) {
  const long len = sw->L, base = lane * len;
  const long stride = SW_REVERSE ? -m : m;
@SETUP@
  sw_v A[SW_K * SW_K], U[SW_K], M[SW_K * SW_K], V[SW_K], H[SW_K], P[SW_K], Y[SW_W];
  (void)P; (void)Y; (void)M;
@A_ONCE@
  for (int r = 0; r < SW_K; ++r) {
    V[r] = sw_vzero;
    for (int j = 0; j < SW_W; ++j) H[r][j] = g->c[j][r];
    for (int c = 0; c < SW_K; ++c) M[r * SW_K + c] = sw_vzero + (SW_T)(r == c);
  }
  for (long p = 0; p < m; p += SW_W) {
    const int cols = (int)SW_MIN((long)SW_W, m - p);
    const long x = base + SW_POS(len, s0 + p);
    const long src = SW_REVERSE ? x - (cols - 1) : x;
@LOADS@
    for (int q = 0; q < cols; ++q) {
      const int t = SW_REVERSE ? cols - 1 - q : q;
@PAIR@
      if (replay) {
        for (int r = 0; r < SW_K; ++r) P[r] = H[r];
        for (int r = 0; r < SW_K; ++r) {
          sw_v acc = U[r];
          for (int c = 0; c < SW_K; ++c) acc += A[r * SW_K + c] * P[c];
          H[r] = acc;
        }
        @Y@
      } else {
        sw_v Vn[SW_K];
        for (int r = 0; r < SW_K; ++r) {
          sw_v acc = U[r];
          for (int c = 0; c < SW_K; ++c) acc += A[r * SW_K + c] * V[c];
          Vn[r] = acc;
        }
        for (int r = 0; r < SW_K; ++r) V[r] = Vn[r];
        if (!@CONST_A@) {
          sw_v Mn[SW_K * SW_K];
          for (int r = 0; r < SW_K; ++r)
            for (int c = 0; c < SW_K; ++c) {
              sw_v acc = sw_vzero;
              for (int e = 0; e < SW_K; ++e) acc += A[r * SW_K + e] * M[e * SW_K + c];
              Mn[r * SW_K + c] = acc;
            }
          for (int r = 0; r < SW_K * SW_K; ++r) M[r] = Mn[r];
        }
      }
    }
    if (replay) sw_tile_out(Y, sw->y + src, stride, SW_W, cols);
  }
  if (replay) return;
  if (@CONST_A@) {
    SW_T a[SW_K * SW_K], pw[SW_K * SW_K];
    for (int r = 0; r < SW_K * SW_K; ++r) a[r] = A[r][0];
    sw_dpow(a, m, pw);
    for (int j = 0; j < SW_W; ++j) memcpy(g->M[j], pw, sizeof pw);
  } else {
    for (int j = 0; j < SW_W; ++j)
      for (int r = 0; r < SW_K * SW_K; ++r) g->M[j][r] = M[r][j];
  }
  for (int j = 0; j < SW_W; ++j)
    for (int r = 0; r < SW_K; ++r) g->V[j][r] = V[r][j];
}

/* Stripe length of the tile [s0, s1): whole vectors of stripes, the rest stepped one by one. */
static long sw_dv_m(long s0, long s1) { return (s1 - s0) / SW_W; }

/* Carries of the stripes from the tile's carry-in h, then the positions past the last stripe stepped
 * one by one (writing their y); h becomes the tile's carry-out. */
static void sw_dv_carries(const sw_ctx* sw, long lane, long s0, long s1, sw_dv_tile* g, SW_T* h) {
  const long m = sw_dv_m(s0, s1);
  if (m > 0) {
    for (int j = 0; j < SW_W; ++j) {
      SW_T hn[SW_K];
      memcpy(g->c[j], h, sizeof hn);
      sw_dcarry(g->M[j], g->V[j], h, hn);
      memcpy(h, hn, sizeof hn);
    }
  }
  sw_dreplay(sw, lane, s0 + SW_W * m, s1, h);
}

static void sw_dv_reduce(const sw_ctx* sw, long lane, long s0, long s1, sw_dv_tile* g) {
  const long m = sw_dv_m(s0, s1);
  if (m > 0) {
    memset(g->c, 0, sizeof g->c);
    sw_dv_pass(sw, lane, s0, m, g, 0);
  }
}

static void sw_dv_replay(const sw_ctx* sw, long lane, long s0, long s1, sw_dv_tile* g) {
  const long m = sw_dv_m(s0, s1);
  if (m > 0) sw_dv_pass(sw, lane, s0, m, g, 1);
}
"""

RUN = r"""
/* A whole lane on one thread: tile by tile, each reduced, given its carry and replayed in cache. */
static void sw_dv_lane(const sw_ctx* sw, long lane, long tile) {
  sw_dv_tile g;
  SW_T h[SW_K];
  sw_dh0(sw, lane, h);
  for (long s0 = 0; s0 < sw->L; s0 += tile) {
    const long s1 = SW_MIN(s0 + tile, sw->L);
    sw_dv_reduce(sw, lane, s0, s1, &g);
    sw_dv_carries(sw, lane, s0, s1, &g, h);
    sw_dv_replay(sw, lane, s0, s1, &g);
  }
  sw_dstore_last(sw, lane, h);
}

/* Lanes over the threads when they spread evenly (or plentifully); else the tiles of one lane at a
 * time round-robin over the threads, each tile waiting only for the carry-out of the one before. */
static int sw_run(const sw_ctx* sw) {
  const long nl = sw->nlanes, tile = SW_W * sw_stripe();
  int nt = sw_threads();
  if (nt <= 1 || nl % nt == 0 || nl >= 8L * nt) {
    nt = (int)SW_MIN((long)nt, nl);
    (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long lane = 0; lane < nl; ++lane) sw_dv_lane(sw, lane, tile);
    return SW_OK;
  }
  const long ntiles = (sw->L + tile - 1) / tile;
  if (nt > ntiles) nt = (int)ntiles;
  SW_T* carry = (SW_T*)malloc(sizeof(SW_T) * SW_K * (size_t)(ntiles + 1));
  int* ready = (int*)malloc(sizeof(int) * (size_t)(ntiles + 1));
  if (!carry || !ready) { free(carry); free(ready); return SW_ENOMEM; }
  for (long lane = 0; lane < nl; ++lane) {
    memset(ready, 0, sizeof(int) * (size_t)(ntiles + 1));
    sw_dh0(sw, lane, carry);
    ready[0] = 1;
#pragma omp parallel num_threads(nt)
    {
#ifdef _OPENMP
      const long tid = omp_get_thread_num(), np = omp_get_num_threads();
#else
      const long tid = 0, np = 1;
#endif
      sw_dv_tile g;
      for (long k = tid; k < ntiles; k += np) {
        const long s0 = k * tile, s1 = SW_MIN(s0 + tile, sw->L);
        sw_dv_reduce(sw, lane, s0, s1, &g);
        sw_flag_wait(ready + k);
        SW_T h[SW_K];
        memcpy(h, carry + k * SW_K, sizeof h);
        sw_dv_carries(sw, lane, s0, s1, &g, h);
        memcpy(carry + (k + 1) * SW_K, h, sizeof h);
        sw_flag_set(ready + k + 1);
        sw_dv_replay(sw, lane, s0, s1, &g);
      }
    }
    sw_dstore_last(sw, lane, carry + ntiles * SW_K);
  }
  free(carry);
  free(ready);
  return SW_OK;
}
"""
