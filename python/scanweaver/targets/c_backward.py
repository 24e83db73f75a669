"""The C (CPU) emitter of stage ``adjoint`` for diagonal transitions: one fused backward kernel.

Each tile of a lane (cache-sized) is done by three sweeps over data that
stays in cache (:mod:`.c_backward_source`): the states h_t, recomputed from
the tile's checkpoint into a per-thread buffer (or copied from the states
the forward saved), while every operand of the tile is prefetched; the
reverse recurrence of lam (:mod:`scanweaver.ir.adjoint`) from the tile's
end, writing g_t into a second buffer and prefetching the thread's next
tile; then one loop per gradient over the rendered gradient expressions,
with streaming stores.  Both scans run SW_VL positions at a time in
registers (the forward's block scan) when their pairs are plain arithmetic,
element by element otherwise.  Operands and dy are read once from memory
and the gradients written once: 9 arrays of traffic for the selective scan
(5 in, 4 out) against 5 for its forward, and no (lanes, L) intermediate
ever exists.  Why recompute rather than save by default: saving makes the
forward write one more array and the backward read it, while recomputing
costs one multiply-add per element on data already in cache (both measured
in ``bench/autograd.py``).  Why not one sweep: nine streams in one loop,
all at the same offset within a page, evict each other from an 8-way L1 set
(measured 4x slower).

Work layout: lanes are split into tiles of ``SW_CHUNK`` positions (shorter
when there are fewer lanes than threads); tiles are independent work items
over the threads.  With more than one tile per lane a first parallel pass
reduces every tile to its forward aggregate (the state map h_in -> h_out)
and its reverse aggregate (lam_out -> lam_in), a cheap sequential chain per
lane turns them into each tile's state and adjoint carry-in, and the second
pass runs the tiles (the chunked schedule's reduce/scan/propagate, once in
each direction).

ABI::

    int sw_backward(const T* in_<name>..., const T* dy, const T* h0, const T* dhlast,
                    const unsigned char* reset, const T* hs, T* d_<name>... (one per wrt),
                    T* dh0, long nlanes, long L);

``h0``, ``dhlast``, ``reset``, ``hs`` (saved states, time order) and ``dh0``
may be NULL when their feature is off.  Returns 0, or 1 when scratch memory
could not be allocated.

Example:
    >>> from scanweaver.api import SELECTIVE
    >>> from scanweaver.passes.adjoint import adjoint
    >>> src = render_backward(adjoint(SELECTIVE.lower().affine))
    >>> "int sw_backward(" in src and "out[i] = (g * hp);" in src
    True
"""

from __future__ import annotations

from ..ir import expr as E
from ..ir.adjoint import AdjointIR
from . import c_source
from .base import source_name
from .c_backward_source import COMMON, ENTRY, GRADS, RUN, SCANS_SCALAR, SCANS_VECTOR
from .c_chunked import SHUFFLE, block_scan
from .cstyle import CStyleRenderer

#: Positions per tile: its operands and gradients (9 arrays x 8192 x 4 bytes) and the
#: state buffer stay in a 512 KiB L2 between the recompute and the reverse pass.
CHUNK = 8192
#: Shortest tile when few lanes are split over the threads.
MIN_TILE = 1024
#: Elements between the two per-thread buffers (and between threads' buffers): one cache line, so
#: that they do not start in the same L1 set.
SKEW = 16

#: Leaves of the gradient expressions -> the C locals of :data:`BODY` holding them.
LOCALS = {"state": "hp", "new_state": "hc", "adjoint": "g"}


def _locals(e: E.Expr) -> E.Expr:
    """``e`` with its state and adjoint leaves turned into reserved inputs named after C locals."""
    if e.op in LOCALS:
        return E.inp("\0" + LOCALS[e.op])
    if not e.args:
        return e
    return E.Expr(e.op, tuple(_locals(a) for a in e.args), e.name, e.value)


def render_backward(adj: AdjointIR, *, threads: int = 0, chunk: int = CHUNK) -> str:
    """The C translation unit of the fused backward of ``adj`` (diagonal transitions only).

    Args:
        adj: stage ``adjoint`` of a diagonal forward.
        threads: OpenMP threads (0: the free cores).
        chunk: tile length in positions.

    Raises:
        ValueError: for a dense forward (run by the generic backward instead).
    """
    fwd = adj.forward
    if fwd.kind != "diagonal":
        raise ValueError(f"C backward emitter: renders diagonal transitions only, got {fwd.kind}")
    r, dt = CStyleRenderer(), fwd.dtype
    T = r.ctype(dt)
    c = _scalar(r, adj)
    fA = c(fwd.A) if not fwd.features.has_reset else f"(reset[i] ? {r.literal(0.0, dt)} : {c(fwd.A)})"
    ptrs = ([f"const {T}* in_{n}" for n in fwd.inputs]
            + [f"const {T}* dy", f"const {T}* h0", f"const {T}* dhlast", "const unsigned char* reset",
               f"const {T}* hs"] + [f"{T}* d_{n}" for n in adj.wrt] + [f"{T}* dh0"])
    params = [*ptrs, "long nlanes", "long L"]
    names = [p.split("*")[-1].split()[-1] for p in params]
    unpack = "\n".join([f"  const SW_T* restrict in_{n} = sw->in_{n}; (void)in_{n};" for n in fwd.inputs]
                       + ["  const unsigned char* restrict reset = sw->reset; (void)reset;"])
    f = fwd.features
    defines = [f"#define SW_T {T}", f"#define SW_REVERSE {int(f.reverse)}", f"#define SW_HAS_H0 {int(f.has_h0)}",
               f"#define SW_HAS_RESET {int(f.has_reset)}", f"#define SW_HAS_DHLAST {int(adj.dh_last)}",
               f"#define SW_SAVED {int(adj.saved_states)}", f"#define SW_THREADS {int(threads)}",
               f"#define SW_CHUNK {int(chunk)}", f"#define SW_MIN_TILE {MIN_TILE}", f"#define SW_SKEW {SKEW}"]
    fields = "\n".join(f"  {p.replace('const long', 'long')};" for p in params)
    line_prefetch = "\n".join(f"    SW_PREFETCH(sw->{p} + i);" for p in [*(f"in_{n}" for n in fwd.inputs), "dy"])
    common = (COMMON.replace("@FIELDS@", fields).replace("@UNPACK@", unpack).replace("@PREFETCH_LINE@", line_prefetch)
              .replace("@FA@", fA).replace("@FU@", c(fwd.U)).replace("@BA@", c(adj.A)).replace("@BU@", c(adj.U))
              .replace("@GOFF@", c(adj.g_offset)))
    prefetch = "\n".join(f"    SW_PREFETCH(sw->{p} + i + (SW_REVERSE ? -SW_AHEAD : SW_AHEAD));"
                         for p in [*(f"in_{n}" for n in fwd.inputs), "dy"])
    if vectorised(fwd.A, fwd.U, adj.A, adj.U, adj.g_offset):
        scans = _vector_scans(r, adj, unpack).replace("@PREFETCH@", prefetch)
    else:
        scans = SCANS_SCALAR.replace("@PREFETCH@", f"    if (((s - s0) & 15) == 0) {{\n{prefetch}\n    }}")
    scans = _vector_head(dt) + scans
    grads = GRADS.replace("@UNPACK@", unpack).replace("@LOOPS@", _grad_loops(r, adj, c))
    entry = ENTRY.replace("@PARAMS@", ", ".join(params)).replace(
        "@INIT@", "\n".join(f"  sw.{n} = {n};" for n in names))
    parts = [f"/* scanweaver C backward kernel: {source_name(fwd.name)}, {dt}, wrt {', '.join(adj.wrt) or 'none'} */",
             "\n".join(defines), c_source.PRELUDE, r.helpers(dt), common, scans, grads, RUN, entry,
             c_source.EPILOGUE]
    return "\n".join(p.strip("\n") for p in parts) + "\n"


def vectorised(*exprs: E.Expr) -> bool:
    """True when the expressions are plain arithmetic (no function calls), so that they are
    computed on whole vectors; otherwise element by element."""
    return not any(n.op == "call" for e in exprs for n in e.walk())


def _scalar(r: CStyleRenderer, adj: AdjointIR):
    """Renders an expression for element ``i`` (locals ``dyv``, ``hp``, ``hc``, ``g``)."""
    dt = adj.forward.dtype
    zero, one = r.literal(0.0, dt), r.literal(1.0, dt)

    def load(name: str) -> str:
        if name.startswith("\0"):
            return name[1:]
        if name == adj.cotangent:
            return "dyv"
        if name == adj.keep:
            return f"(reset[i] ? {zero} : {one})"
        return f"in_{name}[i]"

    return lambda e: r.expr(_locals(e), load, dt)


def _vector(r: CStyleRenderer, adj: AdjointIR, at: str, k: str = ""):
    """Renders an expression on the block of ``SW_VL`` elements starting at memory index ``at``
    (the tile buffers at offset ``k``)."""
    dt = adj.forward.dtype
    local = {"hp": f"sw_vld(hpm, {k})", "hc": f"sw_vld(hcm, {k})", "g": f"sw_vld(gm, {k})"}

    def load(name: str) -> str:
        if name.startswith("\0"):
            return local[name[1:]]
        if name == adj.cotangent:
            return "dyv" if not k else f"sw_vld(dyp, {at})"
        if name == adj.keep:
            return "kv" if not k else f"sw_vmask(sw, {at}, sw_one)"
        return f"sw_vld(in_{name}, {at})"

    def render(e: E.Expr) -> str:
        e = _locals(e)
        text = r.expr(e, load, dt)
        return text if e.inputs() else f"(sw_zero + {text})"

    return render


def _grad_loops(r: CStyleRenderer, adj: AdjointIR, c) -> str:
    """One loop per gradient over the tile, in memory order: element by element up to a 32-byte
    boundary of the output, then whole vectors with streaming stores, then the tail."""
    loops = []
    for n, e in zip(adj.wrt, adj.grads, strict=True):
        scalar = (f"{{ const long i = i_lo + k; const SW_T hp = hpm[k], hc = hcm[k], g = gm[k], dyv = dyp[i];"
                  f" (void)hp; (void)hc; (void)g; (void)dyv; out[i] = {c(e)}; }}")
        body = [f"  {{\n    SW_T* restrict out = sw->d_{n};\n    long k = 0;"]
        if vectorised(e):
            v = _vector(r, adj, "i_lo + k", "k")
            body += [f"    for (; k < n && !SW_ALIGNED(out + i_lo + k); ++k) {scalar}",
                     f"    for (; k + SW_VL <= n; k += SW_VL) SW_STREAM(out + i_lo + k, {v(e)});"]
        body += [f"    for (; k < n; ++k) {scalar}", "  }"]
        loops.append("\n".join(body))
    return "\n".join(loops)


def _vector_head(dt: str) -> str:
    """Vector types, shuffles, the in-register block scan and streaming stores (AVX when present)."""
    vl = 8 if dt == "float32" else 4
    itype = "int" if dt == "float32" else "long long"
    rev = ", ".join(str(vl - 1 - j) for j in range(vl))
    ps, m = ("ps", "__m256") if dt == "float32" else ("pd", "__m256d")
    return (f"#define SW_VL {vl}\n"
            "#if defined(__GNUC__)\n#define SW_INLINE static inline __attribute__((always_inline))\n"
            "#else\n#define SW_INLINE static inline\n#endif\n"
            f"typedef SW_T sw_vec __attribute__((vector_size(32)));\n"
            f"typedef {itype} sw_ivec __attribute__((vector_size(32)));\n" + SHUFFLE
            + f"static const sw_vec sw_zero = {{0}}, sw_one = {{{', '.join(['1'] * vl)}}};\n"
            + f"SW_INLINE sw_vec sw_vrev(sw_vec v) {{ return SW_SHUF1(v, {rev}); }}\n"
            + "SW_INLINE sw_vec sw_vld(const SW_T* p, long i) { sw_vec v; memcpy(&v, p + i, sizeof v); return v; }\n"
            + "#define SW_ALIGNED(p) ((((unsigned long)(p)) & 31) == 0)\n"
            + "#if defined(__AVX__)\n#include <immintrin.h>\n"
            + f"#define SW_STREAM(p, v) _mm256_stream_{ps}((p), ({m})(v))\n"
            + "#define SW_STREAM_FENCE() _mm_sfence()\n#else\n"
            + "#define SW_STREAM(p, v) do { const sw_vec sw_v_ = (v); memcpy((p), &sw_v_, sizeof sw_v_); } while (0)\n"
            + "#define SW_STREAM_FENCE() ((void)0)\n#endif\n" + block_scan(vl))


def _vector_scans(r: CStyleRenderer, adj: AdjointIR, unpack: str) -> str:
    """``SCANS_VECTOR`` with its pair expressions rendered on vectors (GCC/Clang vector extensions)."""
    v = _vector(r, adj, "i0")
    return (SCANS_VECTOR.replace("@UNPACK@", unpack).replace("@VFA@", v(adj.forward.A))
            .replace("@VFU@", v(adj.forward.U)).replace("@VBA@", v(adj.A)).replace("@VBU@", v(adj.U))
            .replace("@VGOFF@", v(adj.g_offset)))
