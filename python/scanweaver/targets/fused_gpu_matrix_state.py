"""GPU rendering (OpenCL, CUDA and any :class:`~.gpu.GPURenderer`) of the fused ``matrix_state`` scan.

The recurrent form, written once in the C-family renderer's macros.  Forward:
one workgroup per (sequence, head, tile of ``workgroup_size`` state columns);
work-item ``j`` keeps column ``j`` of the K x V state in registers (K values)
while time advances, so the readout ``o_t[j] = sum_i q_t[i] S_t[i, j]`` is a
sum in registers.  q, k and the decays of ``time_tile`` steps are staged in
local memory per tile (every work-item reads all of them).  Only q, k, v, g
are read and o, hlast written.

The backward needs no stored states (:mod:`.matrix_state_gpu_backward`): a
*keys* kernel (one workgroup per (sequence, head), work-item ``i`` keeping row
``i`` of the state, then of its adjoint G) gives dq in a forward sweep and dk
in a reverse one, and dg from the identity ``dg_t = sum_{s >= t} (q_s dq_s -
k_s dk_s)`` (plus ``sum_v dhlast * hlast`` for every step; bonus readouts
shift the q term by one step); a *values* kernel (the forward's layout, run in
reverse) gives dv and dh0 from G's columns.

Kernels (ABI of :meth:`~scanweaver.fused.matrix_state.MatrixState.params`; the
parameter ``do`` is spelled ``do_``; sizes are 64-bit ints)::

    sw_matrix_state_forward(q, k, v, g, u, h0, cu_seqlens, o, hlast, batch, T, H, Hq, nseq)
    sw_matrix_state_bwd_keys / sw_matrix_state_bwd_values(q, k, v, g, u, h0, cu_seqlens, do_, dhlast,
                                                          dq, dk, dv, dg, du, dh0, batch, T, H, Hq, nseq)

launched as :func:`plan` says; the backward's outputs must be zero when it
starts (with groups, H > Hq, the heads of a group add into dq and dk with
atomics, and packed sequences add into du: those sums are not
bit-reproducible between runs; everything else is written once).
"""

from __future__ import annotations

from ..errors import ScanInputError
from ..fused.matrix_state import MatrixStateFeatures
from .fused import KERNELS, FusedKernel
from .fused_gpu_mamba1 import params
from .launch_limits import ITEMSIZE, SM90
from .mamba1_gpu_backward import ATOMIC_ADD
from .matrix_state_gpu_backward import KEYS, VALUES

#: Workgroups from which the GPU is busy enough that V is not split further (two per H200 multiprocessor).
BUSY_GROUPS = 264
#: Local memory the default ``time_tile`` keeps under (bytes), leaving room for the runtime's own.
LOCAL_BUDGET = 40 * 1024
#: Most state rows the keys kernel runs (one work-item per row of the state).
MAX_K = 1024
#: Longest loop over K (or V) a work-item runs fully unrolled, its row or column of the state in registers
#: (the register file holds no more: 255 per thread on NVIDIA).  Longer ones stay loops over private memory:
#: fully unrolled, K = 512 took 184 s to build on PoCL and K = 1024 did not finish in 120 s.
UNROLL_MAX = 128

#: Shared text: sizes, the sequence of a workgroup and the element offsets of step t.
PRELUDE = r"""
#define SW_WG SW_WORKGROUP_SIZE
#define SW_TT SW_TIME_TILE
#define SW_NVT ((SW_V + SW_WG - 1) / SW_WG)
/* sizes of the staged decays and bonus (one element where a feature is off: compilers drop them) */
#define SW_SD_LEN (SW_DECAY == 2 ? SW_TT * SW_K : SW_DECAY == 1 ? SW_TT : 1)
#define SW_SU_LEN (SW_BONUS ? SW_K : 1)
/* batch row, first step and length of sequence seq; hq: the q/k head of head h */
#define SW_SEGMENT(seq) \
  const sw_index b = SW_HAS_SEQLENS ? 0 : (seq); \
  const sw_index start = SW_HAS_SEQLENS ? cu_seqlens[seq] : 0; \
  const sw_index len = SW_HAS_SEQLENS ? cu_seqlens[(seq) + 1] - start : T; \
  const sw_index hq = h / (H / Hq)
/* the time index of the s-th step of the sequence (reverse: from its end) */
#define SW_STEP(s) (SW_REVERSE ? start + len - 1 - (s) : start + (s))
#define SW_QK(t) (((b * T + (t)) * Hq + hq) * SW_K)
#define SW_VO(t) (((b * T + (t)) * H + h) * SW_V)
#define SW_GS(t) ((b * T + (t)) * H + h)
#define SW_GK(t) (SW_GS(t) * SW_K)
#define SW_TILE_LEN(s0) ((int)(len - (s0) < SW_TT ? len - (s0) : SW_TT))
/* loops over the state's K rows (V columns): unrolled, the state in registers, up to SW_UNROLL_MAX */
#if SW_K <= SW_UNROLL_MAX
#define SW_UNROLL_K _Pragma("unroll")
#else
#define SW_UNROLL_K _Pragma("unroll 1")
#endif
#if SW_V <= SW_UNROLL_MAX
#define SW_UNROLL_V _Pragma("unroll")
#else
#define SW_UNROLL_V _Pragma("unroll 1")
#endif

/* q, k (and exp(g)) of the n steps from s0 into local memory, by the workgroup's nw work-items */
#define SW_STAGE_QK(s0, n, lid, nw) do { \
  for (int e = (lid); e < (n) * SW_K; e += (nw)) { \
    const int tt_ = e / SW_K, i_ = e % SW_K; \
    const sw_index t_ = SW_STEP((s0) + tt_); \
    sq[e] = q[SW_QK(t_) + i_]; \
    sk[e] = k[SW_QK(t_) + i_]; \
    if (SW_DECAY == 2) sd[e] = @EXP@(g[SW_GK(t_) + i_]); \
  } \
  if (SW_DECAY == 1) \
    for (int e = (lid); e < (n); e += (nw)) sd[e] = @EXP@(g[SW_GS(SW_STEP((s0) + e))]); \
} while (0)
/* the decay of state row i at staged step tt */
#define SW_DK(tt, i) (SW_DECAY == 2 ? sd[(tt) * SW_K + (i)] : SW_DECAY == 1 ? sd[tt] : (SW_T)1)
"""

FORWARD = r"""
SW_KERNEL void sw_matrix_state_forward(@PARAMS@) {
  SW_LOCAL SW_T sq[SW_TT * SW_K];
  SW_LOCAL SW_T sk[SW_TT * SW_K];
  SW_LOCAL SW_T sd[SW_SD_LEN];
  SW_LOCAL SW_T su[SW_SU_LEN];
  const int lid = SW_LID;
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, seq = grp / SW_NVT / H, h = grp / SW_NVT % H;
  const sw_index j = vt * SW_WG + lid;
  const int live = j < SW_V;
  SW_SEGMENT(seq);
  const sw_index st = (seq * H + h) * SW_K * SW_V + j; /* state element (i, j) at st + i * SW_V */
  SW_T s[SW_K];
SW_UNROLL_K
  for (int i = 0; i < SW_K; ++i) s[i] = (SW_HAS_H0 && live) ? h0[st + i * SW_V] : (SW_T)0;
  if (SW_BONUS)
    for (int i = lid; i < SW_K; i += SW_WG) su[i] = u[h * SW_K + i];
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_QK(s0, n, lid, SW_WG);
    SW_BARRIER();
    if (!live) continue;
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = SW_STEP(s0 + tt);
      const SW_T vj = v[SW_VO(t) + j];
      SW_T acc = (SW_T)0, bon = (SW_T)0;
SW_UNROLL_K
      for (int i = 0; i < SW_K; ++i) {
        const SW_T qi = sq[tt * SW_K + i], ki = sk[tt * SW_K + i];
        if (SW_BONUS) {
          acc += qi * s[i];
          bon += qi * su[i] * ki;
        }
        s[i] = SW_DK(tt, i) * s[i] + ki * vj;
        if (!SW_BONUS) acc += qi * s[i];
      }
      o[SW_VO(t) + j] = acc + bon * vj;
    }
  }
  if (live) {
SW_UNROLL_K
    for (int i = 0; i < SW_K; ++i) hlast[st + i * SW_V] = s[i];
  }
}
"""

_DECAY = {"none": 0, "scalar": 1, "key": 2}


def feature_defines(f: MatrixStateFeatures) -> str:
    """``#define`` lines of the compile-time features."""
    return "\n".join([
        f"#define SW_K {f.K}", f"#define SW_V {f.V}", f"#define SW_DECAY {_DECAY[f.decay]}",
        f"#define SW_BONUS {int(f.readout == 'bonus')}", f"#define SW_REVERSE {int(f.reverse)}",
        f"#define SW_HAS_H0 {int(f.has_h0)}", f"#define SW_HAS_SEQLENS {int(f.has_seqlens)}",
        f"#define SW_HAS_DHLAST {int(f.has_dhlast)}", f"#define SW_UNROLL_MAX {UNROLL_MAX}"])


def render(r, call) -> str:
    """Kernel source of ``call`` (forward: one kernel; backward: the keys and values kernels)."""
    f: MatrixStateFeatures = call.features
    cfg = call.params
    tunables = "\n".join(
        f"#ifndef {name}\n#define {name} {cfg[name]}\n#endif\n#define SW_{name.upper()} ({name})"
        for name in ("workgroup_size", "time_tile"))
    rows = f"#define SW_KERNEL_ROWS {r.kernel_prefix} {r.launch_bounds.format(n='SW_K')}".rstrip()
    body = FORWARD if call.part == "forward" else ATOMIC_ADD + KEYS + VALUES
    exp = r.math_fn("exp", f.dtype)
    parts = [f"/* scanweaver {r.target} fused kernel: matrix_state {call.part}, {f.dtype}, K={f.K}, V={f.V}, "
             f"decay {f.decay}, readout {f.readout} */",
             r.preamble_for(f.dtype), f"#define SW_T {r.ctype(f.dtype)}",
             f"#define SW_DOUBLE {int(f.dtype == 'float64')}", feature_defines(f), tunables,
             "\n".join(r.gpu_macros()), rows, PRELUDE.replace("@EXP@", exp),
             body.replace("@PARAMS@", params(r, call)).replace("@EXP@", exp)]
    return "\n".join(p for p in parts if p) + "\n"


def local_bytes(part: str, features: MatrixStateFeatures, time_tile: int) -> int:
    """Static local (shared) memory of the largest kernel of ``part``, in bytes (the kernels' declarations)."""
    K, V, item = features.K, features.V, ITEMSIZE[features.dtype]
    decays = {"none": 0, "scalar": time_tile, "key": time_tile * K}[features.decay]
    columns = (2 * time_tile * K + decays + (K if features.readout == "bonus" else 0)) * item
    if part == "forward":
        return columns
    return max(columns, (2 * time_tile * V + (time_tile * K if features.decay == "scalar" else 0)) * item)


def plan(call, sizes: dict):
    """Forward: ``nseq * H * ceil(V / workgroup_size)`` workgroups of ``workgroup_size``; backward: the keys
    kernel on ``nseq * H`` workgroups of K work-items, then the values kernel on the forward's grid.

    Raises:
        ScanInputError: K over :data:`MAX_K`, or local memory over a workgroup's 48 KiB.
    """
    from .gpu import Launch, Plan

    f: MatrixStateFeatures = call.features
    cfg = call.params
    wg, tt = cfg["workgroup_size"], cfg["time_tile"]
    need = local_bytes(call.part, f, tt)
    if need > SM90.shared_per_block:
        raise ScanInputError(f"matrix_state {call.part}: time_tile={tt} with K={f.K}, V={f.V} in {f.dtype} needs "
                             f"{need} bytes of local memory per workgroup, over {SM90.shared_per_block}; "
                             "lower time_tile")
    heads = sizes["nseq"] * sizes["H"]
    columns = Launch(f"sw_matrix_state_{'forward' if call.part == 'forward' else 'bwd_values'}",
                     heads * -(-f.V // wg), wg)
    if call.part == "forward":
        return Plan((columns,))
    if f.K > MAX_K:
        raise ScanInputError(f"matrix_state backward: K={f.K} state rows exceed {MAX_K} work-items per workgroup")
    return Plan((Launch("sw_matrix_state_bwd_keys", heads, f.K), columns))


def defaults(features: MatrixStateFeatures, sizes: dict) -> dict[str, int]:
    """``workgroup_size``: V rounded up to a power of two (8 to 128), halved down to 32 while the GPU would
    have fewer than :data:`BUSY_GROUPS` workgroups; ``time_tile``: 16, halved until local memory fits
    :data:`LOCAL_BUDGET`."""
    tt = 16
    while tt > 1 and local_bytes("backward", features, tt) > LOCAL_BUDGET:
        tt //= 2
    return {"workgroup_size": columns_per_group(features.V, sizes), "time_tile": tt}


def columns_per_group(V: int, sizes: dict) -> int:
    """The default ``workgroup_size`` of column kernels (see :func:`defaults`)."""
    wg = min(128, max(8, 1 << max(0, V - 1).bit_length()))
    heads = sizes.get("nseq", 1) * sizes.get("H", 1)
    while wg > 32 and heads * -(-V // wg) < BUSY_GROUPS:
        wg //= 2
    return wg


KERNELS.register(FusedKernel("matrix_state", "gpu", ("forward", "backward"), render,
                             lambda part: f"sw_matrix_state_{part if part == 'forward' else 'bwd_keys'}", plan,
                             defaults=defaults))
