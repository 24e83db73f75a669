"""The chunked backward of the fused ``matrix_state`` scan on the GPU (OpenCL, CUDA), in the C-family macros.

Selected by ``algorithm="chunked"`` (``chunk`` steps per chunk, at most
:data:`~.matrix_gpu_chunked.MAX_CHUNK`); :mod:`.fused_gpu_matrix_state`
renders it.  States are recomputed per chunk, never stored per step, and every
kernel is parallel over chunks: the longest sequential walk is a chunk (the
carries walk the chunks of a sequence, one step per chunk).  With G the
cumulative log decay since a chunk's start (or its last reset, as in
:mod:`.matrix_gpu_chunked`) and ``Gq_i`` the q side's (``G_i`` for the readout
after the update, ``G_{i-1}`` for RWKV-6's bonus readout of S_{i-1}), the
adjoint ``L_c`` of chunk c's last state arriving from later steps (the
recurrent backward's ``dhlast`` of that chunk) obeys::

    E'_c   = sum_i (q_i o e^{Gq_i}) do_i^T                   (0 where a reset lies at or before Gq_i's step)
    L_last = dhlast,   L_{c-1} = e^{G_last(c)} o L_c + E'_c   (L_{c-1} = E'_c where chunk c holds a reset)

and the step past the first chunk gives dh0.  Eight kernels (six without a decay):

1. the chunked forward's ``sw_matrix_state_chunk_prefix``, ``_local`` and
   ``_carry``: the prefix planes, and each chunk's start state in the scratch
   (the final state is not written);
2. ``sw_matrix_state_chunk_adjoint_local``: per (chunk, head, tile of value
   columns), E' (the local kernel with q in k's place, do in v's);
3. ``sw_matrix_state_chunk_adjoint_carry``: per (sequence, head, state
   element), the chunks from last to first: it replaces each E' by L_c and
   writes dh0;
4. the recurrent backward's keys, values and decay kernels
   (:mod:`.matrix_state_gpu_backward`), renamed ``sw_matrix_state_chunk_bwd_*``,
   on the chunks as if each were a sequence of its own (:data:`SLOT_SEGMENT`),
   with the chunk's start state as h0 and L_c as dhlast: dq, dk, dv and dg of
   every step are the recurrent backward's (each chunk is a genuine instance
   of the recurrence: its dg identity uses L_c and the chunk's final state,
   which the keys kernel recomputes), du adds up over the chunks, and the
   chunks' dh0 are not written.

Exactness: L is formed as the forward's states are (factors from sums in
``SW_ACC``, resets by counts, a zero adjoint element adds 0 whatever its
factor), so the answers are the recurrent backward's wherever those are
finite, up to the same overflow limits as the chunked forward (a weight
``q_i e^{Gq_i}`` leaving the storage type's range inside one chunk).

Scratch (elements of the storage type): the chunk-start states and the
adjoints, ``2 * slots * H * K * V``; the prefix planes, ``3 * slots * H * C``
times K for a decay per key (1 per head); for a decay per head, the recurrent
backward's per-row terms, ``batch * T * H * K``; one element holding the chunk
length; ``slots`` as in :func:`~.matrix_gpu_chunked.slots`.

Example:
    >>> from scanweaver.fused.matrix_state import MatrixStateFeatures
    >>> from scanweaver.targets.matrix_gpu_chunked_backward import plan_launches
    >>> f = MatrixStateFeatures("float32", 4, 4, "scalar")
    >>> launches, ws = plan_launches(f, {"chunk": 4}, {"batch": 1, "T": 8, "H": 1, "nseq": 1}, 32, 4, 4)
    >>> [name[16:] for name, _, _ in launches], ws
    (['chunk_prefix', 'chunk_local', 'chunk_carry', 'chunk_adjoint_local', 'chunk_adjoint_carry', 'chunk_bwd_keys', \
'chunk_bwd_values', 'chunk_bwd_decay'], 121)
"""

from __future__ import annotations

from ..fused.matrix_state import MatrixStateFeatures
from .matrix_gpu_chunked import slots

__all__ = ["ADJOINT", "HOOKS", "SLOT_SEGMENT", "plan_launches", "slot_segment"]

#: Where the recurrent backward's kernels find their states, and where their per-chunk results go.
HOOKS = r"""
/* scratch: the start states (offset 0), the prefix planes, the adjoints L, then the scalar decay's row terms */
#define SW_LAMBDA ((sw_index)SW_NSLOTS * H * SW_K * SW_V + (SW_DECAY ? 3 * SW_PSZ : 0))
#define SW_EOFF (SW_LAMBDA + (sw_index)SW_NSLOTS * H * SW_K * SW_V)
/* the chunk length, stored by the adjoints' carry for the slot kernels to load (see SLOT_SEGMENT) */
#define SW_CAPAT (SW_EOFF + (SW_DECAY == 1 ? (sw_index)batch * T * H * SW_K : 0))
#define SW_HLAST_PUT(at, x) (void)(x)
#define SW_H0_ON 1
#define SW_H0_AT(x) ws[x]
#define SW_DHLAST_ON 1
#define SW_DHLAST_AT(x) ws[SW_LAMBDA + (x)]
#define SW_DH0_ON 0
#define SW_ESCR (ws + SW_EOFF)
#define SW_MANY_SEQ 1
"""

#: The adjoints' kernels.
ADJOINT = r"""
SW_KERNEL_TILED void sw_matrix_state_chunk_adjoint_local(@PARAMS@) {
  SW_LOCAL SW_T sw[SW_TT * SW_K];
  SW_LOCAL SW_T sx[SW_TT * SW_CT];
  const int lid = SW_LID, c = lid % SW_CT, r = lid / SW_CT;
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, h = grp / SW_NVT % H, sl = grp / SW_NVT / H;
  const sw_index j = vt * SW_CT + c;
  const int live = j < SW_V;
  SW_SLOT(sl);
  SW_T e[SW_KP];
#pragma unroll
  for (int m = 0; m < SW_KP; ++m) e[m] = (SW_T)0;
  for (int p0 = 0; p0 < n; p0 += SW_TT) {
    const int nn = n - p0 < SW_TT ? n - p0 : SW_TT;
    SW_BARRIER();
    for (int x = lid; x < nn * SW_K; x += SW_WG) {
      /* q o e^{Gq}: the prefix row of the step itself, or (bonus) of the step before (-1: the chunk's start) */
      const int tt = x / SW_K, i = x % SW_K, dd = SW_DECAY == 2 ? i : 0, pq = p0 + tt - SW_BONUS;
      const SW_T qv = q[SW_QK(SW_STEP(cs + p0 + tt)) + i];
      (void)dd;
      sw[x] = !SW_DECAY || pq < 0 ? qv : SW_PN(sl, pq, dd) == 0 ? SW_SCALE(qv, SW_PG(sl, pq, dd)) : (SW_T)0;
    }
    for (int x = lid; x < nn * SW_CT; x += SW_WG) {
      const sw_index jj = vt * SW_CT + x % SW_CT;
      sx[x] = jj < SW_V ? do_[SW_VO(SW_STEP(cs + p0 + x / SW_CT)) + jj] : (SW_T)0;
    }
    SW_BARRIER();
    if (live)
      for (int tt = 0; tt < nn; ++tt) {
        const SW_T dj = sx[tt * SW_CT + c];
#pragma unroll
        for (int m = 0; m < SW_KP; ++m)
          if (SW_KEY_OK(m)) e[m] += sw[tt * SW_K + SW_KEY(m)] * dj;
      }
  }
  if (live) {
#pragma unroll
    for (int m = 0; m < SW_KP; ++m)
      if (SW_KEY_OK(m)) ws[SW_LAMBDA + SW_EIDX(sl, SW_KEY(m), j)] = e[m];
  }
}

SW_KERNEL_TILED void sw_matrix_state_chunk_adjoint_carry(@PARAMS@) {
  const int lid = SW_LID;
  const sw_index ne = ((sw_index)SW_K * SW_V + SW_WG - 1) / SW_WG, grp = SW_GROUP;
  const sw_index x = grp % ne * SW_WG + lid, h = grp / ne % H, seq = grp / ne / H;
  if (grp == 0 && lid == 0) ws[SW_CAPAT] = (SW_T)SW_C;
  if (x >= (sw_index)SW_K * SW_V) return;
  const sw_index i = x / SW_V, j = x % SW_V, st = (seq * H + h) * SW_K * SW_V + x;
  const int dd = SW_DECAY == 2 ? (int)i : 0;
  SW_SEGMENT(seq);
  (void)b;
  (void)hq;
  (void)dd;
  SW_T lam = SW_HAS_DHLAST ? dhlast[st] : (SW_T)0;
  for (sw_index c0 = (len + SW_C - 1) / SW_C - 1; c0 >= 0; --c0) {
    const sw_index sl = SW_BASE(seq) + c0, at = SW_LAMBDA + SW_EIDX(sl, i, j);
    const int n = SW_ROWS(c0 * SW_C);
    const SW_T e = ws[at];
    (void)n;
    ws[at] = lam;
    if (!SW_DECAY)
      lam += e;
    else if (lam == (SW_T)0 || SW_PN(sl, n - 1, dd) != 0)
      lam = e;
    else
      lam = (SW_T)((SW_ACC)lam * exp(SW_PG(sl, n - 1, dd)) + (SW_ACC)e);
  }
  if (SW_HAS_H0) dh0[st] = lam;
}
"""

#: The recurrent backward's ``SW_SEGMENT`` on chunk slots (:func:`slot_segment`): the "sequence" ``sl_`` is a chunk
#: slot, its steps the chunk's (an idle slot has none); ``@ROW@`` (the batch row), ``start``, ``len`` and ``hq`` as
#: the kernels use them.  ``len`` is
#: bounded by the chunk loaded from the scratch, not by the constant: where the compiler can prove that a
#: kernel's time-tile loops run at most once (chunk <= time_tile), PoCL (3.1 with LLVM 15, its default work-group
#: method) builds the keys kernel so that work-items of rows past K run the body of ``if (live)`` and write out
#: of bounds.  The recurrent keys kernel does the same given a sequence length bounded by ``time_tile`` in its
#: text.
SLOT_SEGMENT_TEXT = r"""
#undef SW_SEGMENT
#define SW_SEGMENT(sl_) \
  sw_index rs_ = 0; \
  if (SW_HAS_SEQLENS) { \
    sw_index lo_ = 0, hi_ = nseq - 1; \
    while (lo_ < hi_) { \
      const sw_index mid_ = (lo_ + hi_ + 1) / 2; \
      if (SW_BASE(mid_) <= (sl_)) lo_ = mid_; else hi_ = mid_ - 1; \
    } \
    rs_ = lo_; \
  } else { \
    rs_ = (sl_) / SW_NCH; \
  } \
  const sw_index @ROW@ = SW_HAS_SEQLENS ? 0 : rs_; \
  const sw_index s0_ = SW_HAS_SEQLENS ? cu_seqlens[rs_] : 0; \
  const sw_index l0_ = SW_HAS_SEQLENS ? cu_seqlens[rs_ + 1] - s0_ : T; \
  const sw_index c0_ = ((sl_) - SW_BASE(rs_)) * SW_C; \
  const sw_index cap_ = (sw_index)ws[SW_CAPAT]; \
  const sw_index len = c0_ < l0_ ? (l0_ - c0_ < cap_ ? l0_ - c0_ : cap_) : 0; \
  const sw_index start = @START@; \
  const sw_index hq = h / (H / Hq)
"""


def slot_segment(row: str = "b", reverse: bool = True) -> str:
    """:data:`SLOT_SEGMENT_TEXT` with the batch row named ``row``, for kernels with ``SW_REVERSE`` (``reverse``) or
    without."""
    start = "SW_REVERSE ? s0_ + l0_ - c0_ - len : s0_ + c0_" if reverse else "s0_ + c0_"
    return SLOT_SEGMENT_TEXT.replace("@ROW@", row).replace("@START@", start)


#: The matrix-state recurrent backward's (batch row ``b``, reversible).
SLOT_SEGMENT = slot_segment()


def plan_launches(f: MatrixStateFeatures, config: dict, sizes: dict, wg: int, ct: int, rt: int) -> tuple[list, int]:
    """``([(kernel, groups, work-items)], scratch elements)`` of the chunked backward (``wg``, ``ct``, ``rt``:
    the recurrent layout's workgroup, columns per column workgroup and rows per row workgroup)."""
    C, H, nseq = int(config["chunk"]), sizes["H"], sizes["nseq"]
    n = slots(f, sizes, C)
    kd = f.K if f.decay == "key" else 1
    states = n * H * -(-f.V // ct)
    launches = [("sw_matrix_state_chunk_prefix", n * H * -(-kd // wg), wg)] if f.decay != "none" else []
    launches += [("sw_matrix_state_chunk_local", states, wg),
                 ("sw_matrix_state_chunk_carry", nseq * H * -(-(f.K * f.V) // wg), wg),
                 ("sw_matrix_state_chunk_adjoint_local", states, wg),
                 ("sw_matrix_state_chunk_adjoint_carry", nseq * H * -(-(f.K * f.V) // wg), wg),
                 ("sw_matrix_state_chunk_bwd_keys", n * H * -(-f.K // rt), wg),
                 ("sw_matrix_state_chunk_bwd_values", states, wg)]
    if f.decay != "none":
        launches.append(("sw_matrix_state_chunk_bwd_decay", n * H * (-(-f.K // wg) if f.decay == "key" else 1), wg))
    ws = 2 * n * H * f.K * f.V + (3 * n * H * C * kd if f.decay != "none" else 0)
    ws += sizes["batch"] * sizes["T"] * H * f.K if f.decay == "scalar" else 0
    return launches, ws + 1
