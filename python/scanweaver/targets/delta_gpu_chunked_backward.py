"""The chunked backward of the fused ``delta_rule`` on the GPU (OpenCL, CUDA), both forms (DeltaNet, Gated
DeltaNet, KDA; RWKV-7).

Selected by ``algorithm="chunked"`` as the forward (:mod:`.delta_gpu_chunked`);
:mod:`.fused_gpu_delta_rule` renders it.  States are recomputed per chunk,
never stored per step, and the longest sequential walk is a chunk or a
sequence's chunks (one step per chunk), never the sequence's steps.  With the
chunk products of the forward (T, A, ``Kg = K o e^{G}``, ``Qg = Q o e^{G}``,
``Kd = K o e^{G_last - G}``), the adjoint ``dS`` of a chunk's end state maps to
its start state's by the transpose of the chunk's affine map::

    dU = A^T dO + Kd dS        dW = T^T dU        dS <- e^{G_last} o dS + Qg^T dO - Kg^T dW

(U = T W and W = V - Kg S_0; the columns of dS are independent, as the
state's).  The ``dplr`` form's (RWKV-7, the projections U = T (A' S_0 + L V),
``A' = a o e^{G_prev}``, read out by B and carried by ``Bd = b o e^{G_last - G}``)::

    dU = B^T dO + Bd dS        dW = T^T dU        dS <- e^{G_last} o dS + Qg^T dO + A'^T dW

Seven kernels:

1. the forward's ``sw_delta_chunk_prep`` (the products, into the scratch);
2. its ``sw_delta_chunk_state`` with no outputs, keeping each chunk's start
   state in the scratch;
3. ``sw_delta_chunk_adjoint``: per (sequence, value head, tile of value
   columns), the chunks from last to first, keeping each chunk's end adjoint
   ``L_c`` (``dhlast`` at the sequence's end) and writing ``dh0``; a chunk the
   forward leaves to the recurrence (growth, a reset, a NaN, a decay past the
   product form's range) runs the recurrent adjoint of its steps instead
   (``G += q do_j``, ``du = G . k``, ``G <- D (G - beta k du)``; dplr:
   ``G <- D G + a (b . G)``), which reads no state;
4. the recurrent backward's deltas, values, keys and qk kernels
   (:mod:`.delta_gpu_backward`) on the chunks as if each were a sequence of
   its own (:data:`SLOT_SEGMENT`), with the chunk's start state as h0 and
   ``L_c`` as dhlast, all chunks at once: each chunk is a genuine instance of
   the recurrence, so dq, dk, dv, dbeta and dg of every step are the recurrent
   backward's (dg's running sum restarts at each chunk from ``rows(L_c o
   S_end)``, the same quantity), and the chunks' dh0 are not written.

Scratch: the recurrent backward's (per token), then the forward's chunk
regions, the chunk-start states and the end adjoints (``slots * H * K * V``
each), and one element holding the chunk length (read by :data:`SLOT_SEGMENT`,
as :mod:`.matrix_gpu_chunked_backward`'s).

Example:
    >>> from scanweaver.fused.delta_rule import DeltaRuleFeatures
    >>> from scanweaver.targets.delta_gpu_chunked_backward import plan_launches
    >>> f = DeltaRuleFeatures("float32", 8, 8, gate="scalar")
    >>> sizes = {"batch": 1, "T": 64, "H": 2, "Hq": 2, "nseq": 1}
    >>> [(name, groups) for name, groups, _ in plan_launches(f, {"chunk": 16}, sizes, 8, 2, 8)]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('sw_delta_chunk_prep', 8), ('sw_delta_chunk_state', 2), ('sw_delta_chunk_adjoint', 2),
     ('sw_delta_rule_bwd_deltas', 8), ('sw_delta_rule_bwd_values', 8), ('sw_delta_rule_bwd_keys', 8),
     ('sw_delta_rule_bwd_qk', 16)]
"""

from __future__ import annotations

from ..fused.delta_rule import DeltaRuleFeatures
from . import delta_gpu_chunked as chunked
from .matrix_gpu_chunked_backward import slot_segment

__all__ = ["ADJOINT", "HOOKS", "SLOT_SEGMENT", "plan_launches", "recurrent_scratch", "scratch"]

#: The hooks of the chunk kernels and of the recurrent backward's kernels in the chunked backward (defined before
#: the kernels' text; the scratch's parts in the order of the module's docstring).
HOOKS = r"""
#define SW_RWS ((sw_index)batch * T * H * (2 * SW_V + (SW_GATE == 1 ? 4 : SW_GATE == 2 ? 3 : 2) * SW_K))
#define SW_NSLOTS (SW_HAS_SEQLENS ? T / SW_C + nseq : batch * SW_NCH)
#define SW_CK0 SW_RWS
#define SW_S0OFF (SW_CK0 + (sw_index)SW_NSLOTS * H * SW_REGION)
#define SW_LOFF (SW_S0OFF + (sw_index)SW_NSLOTS * H * SW_K * SW_V)
#define SW_CAPAT (SW_LOFF + (sw_index)SW_NSLOTS * H * SW_K * SW_V)
#define SW_CK_OUT 0
#define SW_PREP_UNUSED (void)a, (void)b, (void)h0, (void)v
/* the state kernel keeps the state at each chunk's start (a barrier after: the recurrence of a chunk the product
 * form leaves to it runs on one work-item per column, over the rows the others store) */
#define SW_CHUNK_START(sl_) do { \
  if (live) \
    for (int i_ = r; i_ < SW_K; i_ += SW_NR) ws[SW_S0OFF + ((sl_) * H + h) * SW_K * SW_V + i_ * SW_V + j] = \
        ss[i_ * SW_CT + c]; \
  SW_BARRIER(); \
} while (0)
#define SW_H0_ON 1
#define SW_H0_AT(x) ws[SW_S0OFF + (x)]
#define SW_DHLAST_ON 1
#define SW_DHLAST_AT(x) ws[SW_LOFF + (x)]
#define SW_DH0_ON 0
"""

#: The adjoints' kernel (after the chunk kernels: their macros and SW_SEGMENT of a sequence).
ADJOINT = r"""
/* the planes the adjoint reads: delta: A and K o e^{G_last - G}, dS -= Kg^T dW; dplr: B (q against b) and
 * b o e^{G_last - G}, dS += (a o e^{G_prev})^T dW */
#if SW_DPLR
#define SW_ODO SW_OB
#define SW_ODR SW_OBR
#define SW_DSIGN 1
#else
#define SW_ODO SW_OA
#define SW_ODR SW_OKR
#define SW_DSIGN -1
#endif
SW_KERNEL_S void sw_delta_chunk_adjoint(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T ss[SW_K * SW_CT];
  SW_LOCAL SW_T sw[SW_C * SW_CT];
  SW_LOCAL SW_T su[SW_C * SW_CT];
  SW_TILE_ITEM();
  (void)a, (void)b, (void)v, (void)h0;
  if (grp == 0 && lid == 0) ws[SW_CAPAT] = (SW_T)SW_C;
  for (int i = r; i < SW_K; i += SW_NR)
    ss[i * SW_CT + c] = (SW_HAS_DHLAST && live) ? dhlast[st + i * SW_V] : (SW_T)0;
  for (sw_index cc = (len + SW_C - 1) / SW_C - 1; cc >= 0; --cc) {
    const sw_index c0 = cc * SW_C, sl = SW_BASE(seq) + cc;
    const int n = (int)(len - c0 < SW_C ? len - c0 : SW_C);
    const sw_index wb = SW_CK0 + (sl * H + h) * SW_REGION, lb = SW_LOFF + (sl * H + h) * SW_K * SW_V + j;
    const int plain = ws[wb + SW_OFL] != (SW_T)0;
    SW_BARRIER();
    if (live)
      for (int i = r; i < SW_K; i += SW_NR) ws[lb + i * SW_V] = ss[i * SW_CT + c];
    SW_BARRIER(); /* before one work-item per column runs the recurrence over the rows the others store */
    if (plain) {
      for (int i = r; i < n; i += SW_NR) sw[i * SW_CT + c] = live ? do_[SW_VO(start + c0 + i) + j] : (SW_T)0;
      SW_BARRIER();
      /* dU = A^T dO + (K o e^{G_last - G}) dS (dplr: B^T dO + (b o e^{G_last - G}) dS) */
      for (int i = r; i < n; i += SW_NR) {
        SW_T acc = (SW_T)0;
#pragma unroll 8
        for (int d = 0; d < SW_K; ++d) acc += ws[wb + SW_ODR + i * SW_K + d] * ss[d * SW_CT + c];
        for (int p = i; p < n; ++p) acc += ws[wb + SW_ODO + p * SW_C + i] * sw[p * SW_CT + c];
        su[i * SW_CT + c] = acc;
      }
      SW_BARRIER();
      /* dS <- e^{G_last} o dS + (Q o e^{G})^T dO (dU has read dS) */
      for (int d = r; d < SW_K; d += SW_NR) {
        SW_T acc = (SW_GATE ? ws[wb + SW_OEL + (SW_GATE == 2 ? d : 0)] : (SW_T)1) * ss[d * SW_CT + c];
        for (int p = 0; p < n; ++p) acc += ws[wb + SW_OQG + p * SW_K + d] * sw[p * SW_CT + c];
        ss[d * SW_CT + c] = acc;
      }
      SW_BARRIER();
      /* dW = T^T dU over dO (read for the last time above); no private array lives across a barrier: with one
       * (a row per m of SW_NRW), PoCL 3.1 (LLVM 15) built dh0 wrong in chunks shorter than a column's row groups */
      for (int i = r; i < n; i += SW_NR) {
        SW_T acc = (SW_T)0;
        for (int p = i; p < n; ++p) acc += ws[wb + SW_OT + p * SW_C + i] * su[p * SW_CT + c];
        sw[i * SW_CT + c] = acc;
      }
      SW_BARRIER();
      /* dS -= (K o e^{G})^T dW (dplr: dS += (a o e^{G_prev})^T dW) */
      for (int d = r; d < SW_K; d += SW_NR) {
        SW_T acc = (SW_T)0;
        for (int p = 0; p < n; ++p) acc += ws[wb + SW_OKG + p * SW_K + d] * sw[p * SW_CT + c];
        ss[d * SW_CT + c] += (SW_T)SW_DSIGN * acc;
      }
    } else if (r == 0) {
      /* the recurrent adjoint of the chunk's steps (the forward ran them by the recurrence) */
      for (int p = n - 1; p >= 0; --p) {
        const sw_index t = start + c0 + p;
        SW_CK_NORMS(t, nq, nk);
        const SW_T dj = live ? do_[SW_VO(t) + j] : (SW_T)0;
        SW_T du = (SW_T)0;
        for (int d = 0; d < SW_K; ++d) {
          const SW_T gv = ss[d * SW_CT + c] + q[SW_QK(t) + d] * nq * dj;
          ss[d * SW_CT + c] = gv;
          du += gv * (SW_DPLR ? b[SW_HK(t) + d] : k[SW_QK(t) + d] * nk);
        }
        for (int d = 0; d < SW_K; ++d) {
          const SW_T dk = SW_GATE == 2 ? @EXP@(g[SW_HK(t) + d]) : SW_GATE == 1 ? @EXP@(g[SW_BT(t)]) : (SW_T)1;
#if SW_DPLR
          /* G <- (D + b a^T)^T G = D G + a (b . G) */
          ss[d * SW_CT + c] = dk * ss[d * SW_CT + c] + a[SW_HK(t) + d] * du;
#else
          ss[d * SW_CT + c] = dk * (ss[d * SW_CT + c] - beta[SW_BT(t)] * k[SW_QK(t) + d] * nk * du);
#endif
        }
      }
    }
  }
  SW_BARRIER();
  if (SW_HAS_H0 && live)
    for (int i = r; i < SW_K; i += SW_NR) dh0[st + i * SW_V] = ss[i * SW_CT + c];
}
"""

#: The recurrent backward's ``SW_SEGMENT`` on chunk slots (after the chunk kernels), as the matrix state's
#: (:func:`~.matrix_gpu_chunked_backward.slot_segment`): batch row ``bi``, no reverse.
SLOT_SEGMENT = slot_segment("bi", reverse=False)


def recurrent_scratch(f: DeltaRuleFeatures, sizes: dict) -> int:
    """Elements of the recurrent backward's scratch (r and du per value, the per-row partials per key)."""
    return sizes["batch"] * sizes["T"] * sizes["H"] * (2 * f.V + {"scalar": 4, "key": 3}.get(f.gate, 2) * f.K)


def scratch(f: DeltaRuleFeatures, config: dict, sizes: dict) -> int:
    """Elements of the chunked backward's scratch ``ws`` (the parts of the module's docstring)."""
    C, H = int(config["chunk"]), sizes["H"]
    n = chunked.chunk_slots(f, sizes, C)
    return recurrent_scratch(f, sizes) + n * H * (chunked.region(f, C) + 2 * f.K * f.V) + 1


def plan_launches(f: DeltaRuleFeatures, config: dict, sizes: dict, wg: int, split: int,
                  row_items: int) -> list[tuple[str, int, int]]:
    """``[(kernel, workgroups, work-items)]``: the forward's two chunk kernels, the adjoints' kernel (over
    sequences x value heads x column tiles), the recurrent backward's deltas and values (chunk slots x value heads
    x tiles of ``wg`` columns, ``wg * split`` work-items), keys (chunk slots x value heads, ``row_items``) and qk
    (tokens x q/k heads in workgroups of ``wg``)."""
    C, H = int(config["chunk"]), sizes["H"]
    n = chunked.chunk_slots(f, sizes, C)
    prep, state = chunked.plan_launches(f, config, sizes)
    columns = n * H * -(-f.V // wg)
    return [prep, state, ("sw_delta_chunk_adjoint", state[1], state[2]),
            ("sw_delta_rule_bwd_deltas", columns, wg * split), ("sw_delta_rule_bwd_values", columns, wg * split),
            ("sw_delta_rule_bwd_keys", n * H, row_items),
            ("sw_delta_rule_bwd_qk", -(-sizes["batch"] * sizes["T"] * sizes["Hq"] // wg), wg)]
