"""Portable SIMD for fused C kernels: vector types, exp2/exp/log1p/softplus/sigmoid, tile transposes.

The C text is written once in GCC/Clang vector extensions (``sw_v``: ``SW_W``
lanes of ``SW_T``) and compiles everywhere those exist (x86, Arm, and any
other target, where the compiler lowers the vectors to what the machine
has).  Where the compiler targets an ISA with the right instructions, a few
primitives use them (``vroundscale``/``vscalef`` with AVX-512, ``vround`` and
``vmax``/``vmin`` with AVX, ``vrndn``/``vmax`` with NEON); the generic path
does the same arithmetic with bit operations (``-DSW_VEC_GENERIC`` forces it).

Accuracy (checked against NumPy in float64 by ``test/test_fused_cvec.py``):
``sw_vexp2`` has a relative error below 2 ulp in float32 (a degree-6
polynomial of 2^f on [-1/2, 1/2]) and below 2 ulp in float64 (degree 11);
it underflows to 0 and overflows to +inf like ``exp2``, and NaN stays NaN.
``sw_vlog1p01`` (log1p on [0, 1]) and the functions built on it are within a
few ulp.

Transposes move a ``rows x cols`` tile (rows ``stride`` apart) into vectors
of ``SW_W`` lanes, one vector per column, with ``log2(SW_W)`` stages of
two-input shuffles on full ``SW_W x SW_W`` tiles and a scalar path for
partial ones (zeros fill the missing lanes).

Example:
    >>> from scanweaver.targets.cvec import vector_prelude
    >>> "sw_vexp2" in vector_prelude("float32", 8)
    True
"""

from __future__ import annotations

from functools import cache

#: Widths (lanes per vector) the prelude renders; a power of two so the transposes are butterflies.
WIDTHS = (1, 2, 4, 8, 16)

#: 2^f on [-1/2, 1/2]: near-minimax (Chebyshev) fits, constant term first.
EXP2_F32 = (1.0, 0.693147206703, 0.240226509223, 0.0555032722667, 0.00961805667852,
            0.00134004281776, 0.000154614446986)
EXP2_F64 = (0.99999999999999999693, 0.69314718055994530925, 0.24022650695910159567,
            0.055504108664821627039, 0.0096181291075872566681, 0.0013333558146406470697,
            0.00015403530463724354209, 0.000015252733841556772589, 1.3215432535912376166e-6,
            1.0178057087733941105e-7, 7.0741942972885210056e-9, 4.455817908336064493e-10)

#: ln 2 = hi + lo with hi exact in few bits, so k*hi is exact for the k of exp's range (Cody & Waite).
LN2_HI = {"float32": "0.693359375f", "float64": "0.693147180369123816490"}
LN2_LO = {"float32": "-2.12194440e-4f", "float64": "1.90821492927058770002e-10"}

#: Terms of 2*atanh(s) = 2*(s + s^3/3 + ...) for |s| <= 3 - 2*sqrt(2) (log on [sqrt(1/2), sqrt(2)]).
ATANH_TERMS = {"float32": 5, "float64": 11}

ISA = r"""
#if defined(SW_VEC_GENERIC)
/* the portable path only (tests of the generic code on any machine) */
#elif defined(__AVX512F__) && SW_VBYTES == 64
#define SW_ISA_AVX512 1
#elif defined(__AVX512F__) && defined(__AVX512VL__) && (SW_VBYTES == 32 || SW_VBYTES == 16)
#define SW_ISA_AVX512 1
#elif defined(__AVX__) && SW_VBYTES == 32
#define SW_ISA_AVX 1
#elif defined(__SSE4_1__) && SW_VBYTES == 16
#define SW_ISA_SSE41 1
#elif defined(__ARM_NEON) && defined(__aarch64__) && SW_VBYTES == 16
#define SW_ISA_NEON 1
#endif
#if defined(SW_ISA_AVX512) || defined(SW_ISA_AVX) || defined(SW_ISA_SSE41)
#include <immintrin.h>
#elif defined(SW_ISA_NEON)
#include <arm_neon.h>
#endif
"""


def _isa_ops(dtype: str, vbytes: int) -> str:
    """``sw_vround``, ``sw_vmax``, ``sw_vmin`` and (AVX-512) ``sw_vscale`` for one vector size."""
    s = "ps" if dtype == "float32" else "pd"
    bits = {64: "512", 32: "256", 16: ""}.get(vbytes)
    if bits is None:
        return ""
    m = f"_mm{bits}"
    reg = f"__m{bits or '128'}{'' if dtype == 'float32' else 'd'}"
    neon = "f32" if dtype == "float32" else "f64"
    return f"""
#if defined(SW_ISA_AVX512)
SW_INLINE sw_v sw_vround(sw_v x) {{ return (sw_v){m}_roundscale_{s}(({reg})x, 8); }}
SW_INLINE sw_v sw_vscale(sw_v p, sw_v k) {{ return (sw_v){m}_scalef_{s}(({reg})p, ({reg})k); }}
#define SW_HAS_VSCALE 1
#if defined(__AVX512DQ__)
/* x - round(x) in one instruction; 0 for +-inf, so 2^x needs no clamp (vscalef gives inf or 0). */
SW_INLINE sw_v sw_vreduce(sw_v x) {{ return (sw_v){m}_reduce_{s}(({reg})x, 8); }}
#define SW_HAS_VREDUCE 1
#endif
#elif defined(SW_ISA_AVX) || defined(SW_ISA_SSE41)
SW_INLINE sw_v sw_vround(sw_v x) {{ return (sw_v){m}_round_{s}(({reg})x, 8); }}
#elif defined(SW_ISA_NEON)
SW_INLINE sw_v sw_vround(sw_v x) {{ return (sw_v)vrndnq_{neon}(x); }}
#endif
#if defined(SW_ISA_AVX512) || defined(SW_ISA_AVX) || defined(SW_ISA_SSE41)
/* x86 max/min return the second operand when either is NaN: NaN in x stays NaN. */
SW_INLINE sw_v sw_vmax(sw_v lo, sw_v x) {{ return (sw_v){m}_max_{s}(({reg})lo, ({reg})x); }}
SW_INLINE sw_v sw_vmin(sw_v hi, sw_v x) {{ return (sw_v){m}_min_{s}(({reg})hi, ({reg})x); }}
#define SW_HAS_VROUND 1
#elif defined(SW_ISA_NEON)
SW_INLINE sw_v sw_vmax(sw_v lo, sw_v x) {{ return (sw_v)vmaxq_{neon}(lo, x); }}
SW_INLINE sw_v sw_vmin(sw_v hi, sw_v x) {{ return (sw_v)vminq_{neon}(hi, x); }}
#define SW_HAS_VROUND 1
#endif
"""


GENERIC = r"""
#ifdef SW_HAS_VSCALE
/* Exponents of 2^x that vscalef handles exactly (denormals, 0 and inf included). */
#define SW_EMIN SW_EMIN_SCALEF
#define SW_EMAX SW_EMAX_SCALEF
#else
/* Built from exponent bits: results below 2^(SW_EMIN+0.5) flush to 0, above 2^SW_EMAX overflow to inf. */
#define SW_EMIN SW_EMIN_BITS
#define SW_EMAX SW_EMAX_BITS
#endif
#ifndef SW_HAS_VROUND
/* Portable max/min/round: NaN in x stays NaN (comparisons with NaN are false). */
SW_INLINE sw_v sw_vmax(sw_v lo, sw_v x) { return sw_vsel(x < lo, lo, x); }
SW_INLINE sw_v sw_vmin(sw_v hi, sw_v x) { return sw_vsel(x > hi, hi, x); }
SW_INLINE sw_v sw_vround(sw_v x) { return (x + SW_MAGIC) - SW_MAGIC; }  /* |x| < 2^(mantissa-1) */
#endif
#ifndef SW_HAS_VSCALE
/* p * 2^k for integral k in [SW_EMIN, SW_EMAX]: (2p) * 2^(k-1), 2^(k-1) from its exponent bits
 * (k = SW_EMIN gives the bits of 0, so the smallest results flush to 0; k = SW_EMAX gives 2^SW_EMAX). */
SW_INLINE sw_v sw_vscale(sw_v p, sw_v k) {
  const sw_vi e = (sw_vi)(k + SW_MAGIC) - (sw_vi)(sw_vzero + SW_MAGIC) + (sw_vi)(sw_vizero + (SW_EBIAS - 1));
  return (p + p) * (sw_v)(e << SW_MBITS);
}
#endif
"""


def _poly(coeffs: tuple[float, ...], var: str, suffix: str) -> list[str]:
    lines = [f"  sw_v p = sw_vzero + {coeffs[-1]!r}{suffix};"]
    lines += [f"  p = p * {var} + {c!r}{suffix};" for c in reversed(coeffs[:-1])]
    return lines


@cache
def vector_prelude(dtype: str, width: int) -> str:
    """C text of the vector types, math and transposes for ``width`` lanes of ``dtype``.

    Needs ``SW_INLINE`` defined before it.  Defines ``SW_T``, ``SW_W``,
    ``sw_v``, ``sw_vi``, ``sw_vzero``, ``sw_vload``/``sw_vstore`` (unaligned),
    ``sw_vsel``, ``sw_vexp2``, ``sw_vexp``, ``sw_vlog1p01``, ``sw_vsoftplus``,
    ``sw_vsigmoid``, ``sw_vhsum``, ``sw_tile_in``, ``sw_tile_out`` and ``SW_PREFETCH_LINES``.

    Args:
        dtype: ``float32`` or ``float64``.
        width: lanes per vector, one of :data:`WIDTHS`.
    """
    if dtype not in ("float32", "float64"):
        raise ValueError(f"vector_prelude: dtype must be float32 or float64, got {dtype!r}")
    if width not in WIDTHS:
        raise ValueError(f"vector_prelude: width must be one of {WIDTHS}, got {width}")
    f32 = dtype == "float32"
    T, itype, suf = ("float", "int", "f") if f32 else ("double", "long long", "")
    item = 4 if f32 else 8
    consts = (
        f"#define SW_T {T}\n#define SW_W {width}\n#define SW_VBYTES {width * item}\n"
        f"#define SW_MAGIC {'12582912.0f' if f32 else '6755399441055744.0'}\n"
        f"#define SW_EBIAS {127 if f32 else 1023}\n#define SW_MBITS {23 if f32 else 52}\n"
        f"#define SW_EMIN_SCALEF {-160 if f32 else -1100}\n#define SW_EMAX_SCALEF {129 if f32 else 1025}\n"
        f"#define SW_EMIN_BITS {-126 if f32 else -1022}\n#define SW_EMAX_BITS {128 if f32 else 1024}\n"
    )
    types = (
        f"typedef SW_T sw_v __attribute__((vector_size(SW_VBYTES)));\n"
        f"typedef {itype} sw_vi __attribute__((vector_size(SW_VBYTES)));\n"
        "static const sw_v sw_vzero = {0};\nstatic const sw_vi sw_vizero = {0};\n"
        "SW_INLINE sw_v sw_vsel(sw_vi m, sw_v a, sw_v b) { return (sw_v)(((sw_vi)a & m) | ((sw_vi)b & ~m)); }\n"
        "SW_INLINE sw_v sw_vload(const SW_T* p) { sw_v v; memcpy(&v, p, sizeof v); return v; }\n"
        "SW_INLINE void sw_vstore(SW_T* p, sw_v v) { memcpy(p, &v, sizeof v); }\n"
        "/* Every cache line of `bytes` bytes from p towards the caches: a hint, never a fault or a wait (rw and\n"
        " * loc are __builtin_prefetch's: 1 for a store; 3 into L1, 1 into L2).  Rows a page or more apart need\n"
        " * it: the hardware's prefetchers stop at page boundaries. */\n"
        "#define SW_PREFETCH_LINES(p, bytes, rw, loc) do { const char* sw_pl_ = (const char*)(p); \\\n"
        "  for (long sw_po_ = 0; sw_po_ < (long)(bytes); sw_po_ += 64) \\\n"
        "    __builtin_prefetch(sw_pl_ + sw_po_, rw, loc); \\\n"
        "} while (0)\n"
    )
    exp2 = "\n".join([
        "/* 2^x: x = k + f with k integral and |f| <= 1/2, 2^f by a polynomial, then scaled by 2^k. */",
        "SW_INLINE sw_v sw_vexp2(sw_v x) {",
        "#ifdef SW_HAS_VREDUCE",
        "  const sw_v k = sw_vround(x), f = sw_vreduce(x);",
        "#else",
        "  x = sw_vmin(sw_vzero + (SW_T)SW_EMAX, sw_vmax(sw_vzero + (SW_T)SW_EMIN, x));",
        "  const sw_v k = sw_vround(x), f = x - k;",
        "#endif",
        *_poly(EXP2_F32 if f32 else EXP2_F64, "f", suf),
        "  return sw_vscale(p, k);",
        "}",
        "/* e^x to ~1 ulp: k = round(x/ln2), r = x - k*ln2 in two parts (Cody & Waite), 2^(r/ln2) * 2^k. */",
        "SW_INLINE sw_v sw_vexp(sw_v x) {",
        f"  x = sw_vmin(sw_vzero + (SW_T)(SW_EMAX + 1) * 0.6931471805599453{suf}, "
        f"sw_vmax(sw_vzero + (SW_T)SW_EMIN * 0.6931471805599453{suf}, x));",
        f"  const sw_v k = sw_vround(x * 1.4426950408889634074{suf});",
        f"  const sw_v f = ((x - k * {LN2_HI[dtype]}) - k * {LN2_LO[dtype]}) * 1.4426950408889634074{suf};",
        *_poly(EXP2_F32 if f32 else EXP2_F64, "f", suf),
        "  return sw_vscale(p, k);",
        "}",
    ])
    n_atanh = ATANH_TERMS[dtype]
    atanh = [f"  sw_v q = sw_vzero + {1.0 / (2 * n_atanh - 1)!r}{suf};"]
    atanh += [f"  q = q * s2 + {1.0 / (2 * k - 1)!r}{suf};" for k in range(n_atanh - 1, 0, -1)]
    log = "\n".join([
        "/* log(w) for w in [1, 2]: 2*atanh((m-1)/(m+1)) with m = w or w/2 in [sqrt(1/2), sqrt(2)]. */",
        "SW_INLINE sw_v sw_vlog12(sw_v w) {",
        f"  const sw_vi big = w > 1.41421356237309505{suf};",
        f"  const sw_v m = sw_vsel(big, w * 0.5{suf}, w);",
        f"  const sw_v e = sw_vsel(big, sw_vzero + 0.69314718055994530942{suf}, sw_vzero);",
        f"  const sw_v s = (m - 1.0{suf}) / (m + 1.0{suf}), s2 = s * s;",
        *atanh,
        "  return e + 2 * s * q;",
        "}",
        "/* log1p(v) for v in [0, 1], accurate for tiny v: log(1+v) * v / ((1+v) - 1) (Goldberg). */",
        "SW_INLINE sw_v sw_vlog1p01(sw_v v) {",
        f"  const sw_v w = 1.0{suf} + v, dw = w - 1.0{suf};",
        "  const sw_vi same = dw == sw_vzero;",
        f"  return sw_vsel(same, v, sw_vlog12(w) * v / sw_vsel(same, sw_vzero + 1.0{suf}, dw));",
        "}",
        "/* softplus(x) = max(x, 0) + log1p(exp(-|x|)); sigmoid(x) = 1 / (1 + exp(-x)). */",
        "SW_INLINE sw_v sw_vsoftplus(sw_v x) {",
        "  const sw_v ax = sw_vsel(x < sw_vzero, -x, x);",
        "  return sw_vsel(x > sw_vzero, x, sw_vzero) + sw_vlog1p01(sw_vexp(-ax));",
        "}",
        f"SW_INLINE sw_v sw_vsigmoid(sw_v x) {{ return 1.0{suf} / (1.0{suf} + sw_vexp(-x)); }}",
    ])
    return "\n".join([consts, ISA, types, _isa_ops(dtype, width * item), GENERIC, exp2, log,
                      SHUFFLE, horizontal_sum(width), transpose(width), TILES]) + "\n"


SHUFFLE = r"""
#if defined(__clang__)
#define SW_VSHUF2(x, y, ...) __builtin_shufflevector((x), (y), __VA_ARGS__)
#else
#define SW_VSHUF2(x, y, ...) __builtin_shuffle((x), (y), (sw_vi){__VA_ARGS__})
#endif
"""



def transpose_masks(width: int) -> list[tuple[int, str, str]]:
    """Butterfly stages of a ``width x width`` transpose: ``(distance, first mask, second mask)``.

    At distance s, rows i and i+s (i & s == 0) swap their off-diagonal s x s blocks.
    """
    stages = []
    s = width // 2
    while s:
        lo = ", ".join(str(e if not e & s else width + e - s) for e in range(width))
        hi = ", ".join(str(width + e if e & s else e + s) for e in range(width))
        stages.append((s, lo, hi))
        s //= 2
    return stages


def horizontal_sum(width: int) -> str:
    """``sw_vhsum(v)``: the sum of the lanes, by halving rotations (log2(width) shuffles and adds)."""
    lines = ["SW_INLINE SW_T sw_vhsum(sw_v v) {"]
    s = width // 2
    while s:
        mask = ", ".join(str((i + s) % width) for i in range(width))
        lines.append(f"  v += SW_VSHUF2(v, v, {mask});")
        s //= 2
    lines += ["  return v[0];", "}"]
    return "\n".join(lines)


def transpose(width: int) -> str:
    """``sw_vtranspose(sw_v r[SW_W])``: rows become columns, in registers."""
    lines = ["SW_INLINE void sw_vtranspose(sw_v* r) {"]
    if width > 1:
        lines.append("  sw_v lo, hi;")
    for s, lo, hi in transpose_masks(width):
        for i in range(width):
            if i & s:
                continue
            lines.append(f"  lo = SW_VSHUF2(r[{i}], r[{i + s}], {lo}); hi = SW_VSHUF2(r[{i}], r[{i + s}], {hi}); "
                         f"r[{i}] = lo; r[{i + s}] = hi;")
    lines.append("}")
    return "\n".join(lines)


TILES = r"""
/* Tile in: out[c][r] = src[r*stride + c] for r < rows, c < cols (else 0); out has SW_W vectors. */
SW_INLINE void sw_tile_in(const SW_T* src, long stride, int rows, int cols, sw_v* out) {
  if (rows == SW_W && cols == SW_W) {
    for (int r = 0; r < SW_W; ++r) out[r] = sw_vload(src + r * stride);
    sw_vtranspose(out);
    return;
  }
  for (int c = 0; c < SW_W; ++c) out[c] = sw_vzero;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[c][r] = src[r * stride + c];
}

/* Tile out: dst[r*stride + c] = in[c][r] for r < rows, c < cols (in is overwritten). */
SW_INLINE void sw_tile_out(sw_v* in, SW_T* dst, long stride, int rows, int cols) {
  if (rows == SW_W && cols == SW_W) {
    sw_vtranspose(in);
    for (int r = 0; r < SW_W; ++r) sw_vstore(dst + r * stride, in[r]);
    return;
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[r * stride + c] = in[c][r];
}
"""
