"""GPU rendering (OpenCL, CUDA and any :class:`~.gpu.GPURenderer`) of the fused ``matrix_state`` scan.

The recurrent form, written once in the C-family renderer's macros, with the
K x V state of each (sequence, head) tiled over work-items so that no
work-item holds more than ``state_per_item`` state elements in registers
(nothing spills at K = V = 128 or K = 256, V = 512; :func:`layout` derives the
tiling):

* **column kernels** (the forward; the backward's *values*): one workgroup
  per (sequence, head, tile of ``CT`` state columns); the ``workgroup_size``
  work-items are ``CT`` columns times ``KS`` key slices, work-item (c, r)
  keeping keys ``r, r + KS, r + 2 KS ...`` (``KP`` of them) of column c.  Per
  step each work-item updates its keys and adds its part of the readout
  ``o_t[j] = sum_i q_t[i] S_t[i, j]`` in ``min(4, KP)`` independent
  accumulators; the parts meet in local memory (one row per step, key slice
  and column), and after each time tile the workgroup sums them over the key
  slices and writes the tile's outputs, consecutive work-items writing
  consecutive columns.  q, k, exp(g) and the tile's column of v (or do) are
  staged in local memory with coalesced loads, ``time_tile`` steps at a time.
* the backward's **keys** kernel (:mod:`.matrix_state_gpu_backward`): the same
  tiling transposed: rows times value slices.

With ``algorithm="chunked"`` the forward is the chunked (matmul) form of
:mod:`.matrix_gpu_chunked` instead (four kernels and a scratch ``ws``; its
chunk kernel of value columns uses the column tiling above), and the backward
that of :mod:`.matrix_gpu_chunked_backward` (the forward's chunk-state
kernels, two for the adjoints, then the keys, values and decay kernels below
on the chunks).

Kernels (ABI of :meth:`~scanweaver.fused.matrix_state.MatrixState.params`; the
parameter ``do`` is spelled ``do_``; sizes are 64-bit ints; the backward's
kernels take the plan's scratch ``ws`` last)::

    sw_matrix_state_forward(q, k, v, g, u, h0, cu_seqlens, o, hlast, batch, T, H, Hq, nseq)
    sw_matrix_state_chunk_prefix / _local / _carry / _output(the forward's parameters, ws)   (chunked)
    sw_matrix_state_chunk_prefix / _local / _carry / _adjoint_local / _adjoint_carry / _bwd_keys / _bwd_values /
        _bwd_decay(the backward's parameters)                                             (chunked backward)
    sw_matrix_state_bwd_keys / _bwd_values / _bwd_decay(q, k, v, g, u, h0, cu_seqlens, do_, dhlast,
                                                         dq, dk, dv, dg, du, dh0, batch, T, H, Hq, nseq, ws)

launched as :func:`plan` says; the backward's outputs must be zero when it
starts (with groups, H > Hq, the heads of a group add into dq and dk with
atomics, and packed sequences add into du: those sums are not
bit-reproducible between runs; everything else is written once).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScanInputError
from ..fused.matrix_state import MatrixStateFeatures
from .fused import KERNELS, FusedKernel
from .fused_gpu_mamba1 import params
from . import matrix_gpu_chunked as chunked
from . import matrix_gpu_chunked_backward as chunked_backward
from .launch_limits import ITEMSIZE, SM90
from .mamba1_gpu_backward import ATOMIC_ADD
from .matrix_state_gpu_backward import DECAY, KEYS, VALUES

#: Work-items from which the GPU is busy enough that the state is not split further (about half of an H200's
#: resident threads: 132 multiprocessors x 2048).
BUSY_ITEMS = 131072
#: Local memory the default ``time_tile`` keeps under (bytes), leaving room for the runtime's own.
LOCAL_BUDGET = 40 * 1024
#: Most state rows of the kernels that keep one state column per work-item (the delta rule's).
MAX_K = 1024
#: State elements per work-item by default (registers: float64 takes two each).
STATE_PER_ITEM = {"float32": 32, "float64": 16}
#: Fewest state elements per work-item the defaults split down to (below it the local-memory sums dominate).
MIN_STATE_PER_ITEM = 8
#: Independent partial sums of each readout (they break the chain of dependent adds).
ACCUMULATORS = 4
#: Registers per work-item the kernels are declared to need (as workgroups resident per multiprocessor of 64K
#: registers): ptxas's occupancy heuristic otherwise settles at 64 and spills a few bytes at K = 256.
REGISTERS = 128


def resident_blocks(wg: int) -> int:
    """Workgroups per multiprocessor that leave each work-item :data:`REGISTERS` registers (64K registers,
    allocated per warp of 32; at most 32 resident blocks)."""
    return max(1, min(32, 65536 // (REGISTERS * max(wg, 32))))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class Layout:
    """How the kernels of one configuration tile the K x V state over a workgroup.

    Attributes:
        wg: work-items per workgroup (every kernel).
        ks, kp, ct: column kernels: key slices, keys per work-item, state columns per workgroup.
        vs, vp, rt: keys kernel: value slices, values per work-item, state rows per workgroup.
    """

    wg: int
    ks: int
    kp: int
    ct: int
    vs: int
    vp: int
    rt: int


def layout(features: MatrixStateFeatures, config: dict) -> Layout:
    """The tiling of ``config`` (``workgroup_size``, ``state_per_item``) for ``features``' K and V."""
    wg, per = int(config["workgroup_size"]), int(config.get("state_per_item", STATE_PER_ITEM[features.dtype]))
    ks = min(wg, _pow2_at_least(-(-features.K // per)))
    vs = min(wg, _pow2_at_least(-(-features.V // per)))
    return Layout(wg, ks, -(-features.K // ks), wg // ks, vs, -(-features.V // vs), wg // vs)


#: Shared text: sizes, the sequence of a workgroup, the element offsets of step t, the staging of a time tile.
PRELUDE = r"""
#define SW_WG SW_WORKGROUP_SIZE
#define SW_TT SW_TIME_TILE
#define SW_NVT ((SW_V + SW_CT - 1) / SW_CT)
#define SW_NKT ((SW_K + SW_RT - 1) / SW_RT)
/* sizes of the staged decays and bonus (one element where a feature is off: compilers drop them) */
#define SW_SD_LEN (SW_DECAY == 2 ? SW_TT * SW_K : SW_DECAY == 1 ? SW_TT : 1)
#define SW_SU_LEN (SW_BONUS ? SW_K : 1)
/* the decay gradients' sums over time: double where the device has it */
#if SW_DOUBLE || !defined(__OPENCL_VERSION__) || defined(cl_khr_fp64)
#if defined(__OPENCL_VERSION__) && !SW_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#define SW_ACC double
#else
#define SW_ACC float
#endif
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

/* a column work-item: column c of the workgroup's tile vt, key slice r; state element (i, j) at st + i * SW_V */
#define SW_COLUMN_ITEM() \
  const int lid = SW_LID, c = lid % SW_CT, r = lid / SW_CT; \
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, seq = grp / SW_NVT / H, h = grp / SW_NVT % H; \
  const sw_index j = vt * SW_CT + c; \
  const int live = j < SW_V; \
  SW_SEGMENT(seq); \
  const sw_index st = (seq * H + h) * SW_K * SW_V + j
/* the key of a column work-item's slot m (a slot past K is idle: only when SW_KS * SW_KP > SW_K) */
#define SW_KEY(m) (r + SW_KS * (m))
#define SW_KEY_OK(m) (SW_KS * SW_KP == SW_K || SW_KEY(m) < SW_K)

/* q, k (and exp(g)) of the n steps from s0 into local memory, by the whole workgroup */
#define SW_STAGE_QK(s0, n) do { \
  for (int e = lid; e < (n) * SW_K; e += SW_WG) { \
    const int tt_ = e / SW_K, i_ = e % SW_K; \
    const sw_index t_ = SW_STEP((s0) + tt_); \
    sq[e] = q[SW_QK(t_) + i_]; \
    sk[e] = k[SW_QK(t_) + i_]; \
    if (SW_DECAY == 2) sd[e] = @EXP@(g[SW_GK(t_) + i_]); \
  } \
  if (SW_DECAY == 1) \
    for (int e = lid; e < (n); e += SW_WG) sd[e] = @EXP@(g[SW_GS(SW_STEP((s0) + e))]); \
} while (0)
/* the workgroup's columns of x (v or do) of the n steps from s0 into sx */
#define SW_STAGE_COLUMNS(x, s0, n) do { \
  for (int e = lid; e < (n) * SW_CT; e += SW_WG) { \
    const sw_index jj_ = vt * SW_CT + e % SW_CT; \
    sx[e] = jj_ < SW_V ? x[SW_VO(SW_STEP((s0) + e / SW_CT)) + jj_] : (SW_T)0; \
  } \
} while (0)
/* out[t, j] = the sum over key slices of red, for the tile's n steps and the workgroup's columns */
#define SW_REDUCE_COLUMNS(out, s0, n) do { \
  for (int e = lid; e < (n) * SW_CT; e += SW_WG) { \
    const int tt_ = e / SW_CT, cc_ = e % SW_CT; \
    const sw_index jj_ = vt * SW_CT + cc_; \
    if (jj_ < SW_V) { \
      SW_T x_ = (SW_T)0; \
      for (int p_ = 0; p_ < SW_KS; ++p_) x_ += red[(tt_ * SW_KS + p_) * SW_CT + cc_]; \
      out[SW_VO(SW_STEP((s0) + tt_)) + jj_] = x_; \
    } \
  } \
} while (0)
/* the decay of state row i at staged step tt */
#define SW_DK(tt, i) (SW_DECAY == 2 ? sd[(tt) * SW_K + (i)] : SW_DECAY == 1 ? sd[tt] : (SW_T)1)
/* out = the sum of split accumulators a[0 .. na) */
#define SW_ACC_SUM(out, a, na) do { \
  out = a[0]; \
  for (int a_ = 1; a_ < (na); ++a_) out += a[a_]; \
} while (0)
/* local memory of a column kernel */
#define SW_COLUMN_LOCALS() \
  SW_LOCAL SW_T sq[SW_TT * SW_K]; \
  SW_LOCAL SW_T sk[SW_TT * SW_K]; \
  SW_LOCAL SW_T sd[SW_SD_LEN]; \
  SW_LOCAL SW_T su[SW_SU_LEN]; \
  SW_LOCAL SW_T sx[SW_TT * SW_CT]; \
  SW_LOCAL SW_T red[SW_TT * SW_KS * SW_CT]
"""

FORWARD = r"""
SW_KERNEL_TILED void sw_matrix_state_forward(@PARAMS@) {
  SW_COLUMN_LOCALS();
  SW_COLUMN_ITEM();
  SW_T s[SW_KP];
#pragma unroll
  for (int m = 0; m < SW_KP; ++m)
    s[m] = (SW_HAS_H0 && live && SW_KEY_OK(m)) ? h0[st + SW_KEY(m) * SW_V] : (SW_T)0;
  if (SW_BONUS)
    for (int i = lid; i < SW_K; i += SW_WG) su[i] = u[h * SW_K + i];
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE_QK(s0, n);
    SW_STAGE_COLUMNS(v, s0, n);
    SW_BARRIER();
    if (live)
      for (int tt = 0; tt < n; ++tt) {
        const SW_T vj = sx[tt * SW_CT + c];
        SW_T acc[SW_NACC];
#pragma unroll
        for (int a = 0; a < SW_NACC; ++a) acc[a] = (SW_T)0;
        SW_T bon = (SW_T)0;
#pragma unroll
        for (int m = 0; m < SW_KP; ++m) {
          if (SW_KEY_OK(m)) {
            const int i = SW_KEY(m);
            const SW_T qi = sq[tt * SW_K + i], ki = sk[tt * SW_K + i];
            if (SW_BONUS) {
              acc[m % SW_NACC] += qi * s[m];
              bon += qi * su[i] * ki;
            }
            s[m] = SW_DK(tt, i) * s[m] + ki * vj;
            if (!SW_BONUS) acc[m % SW_NACC] += qi * s[m];
          }
        }
        SW_T sum;
        SW_ACC_SUM(sum, acc, SW_NACC);
        red[(tt * SW_KS + r) * SW_CT + c] = sum + bon * vj;
      }
    SW_BARRIER();
    SW_REDUCE_COLUMNS(o, s0, n);
  }
  if (live) {
#pragma unroll
    for (int m = 0; m < SW_KP; ++m)
      if (SW_KEY_OK(m)) hlast[st + SW_KEY(m) * SW_V] = s[m];
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
        f"#define SW_HAS_DHLAST {int(f.has_dhlast)}"])


def layout_defines(lay: Layout) -> str:
    """``#define`` lines of the tiling (:class:`Layout`)."""
    return "\n".join([f"#define SW_KS {lay.ks}", f"#define SW_KP {lay.kp}", f"#define SW_CT {lay.ct}",
                      f"#define SW_VS {lay.vs}", f"#define SW_VP {lay.vp}", f"#define SW_RT {lay.rt}",
                      f"#define SW_NACC {min(ACCUMULATORS, lay.kp)}", f"#define SW_NACC_V {min(ACCUMULATORS, lay.vp)}"])


def is_chunked(call) -> bool:
    """True when ``call`` runs the chunked form (``algorithm="chunked"``: :mod:`.matrix_gpu_chunked`,
    :mod:`.matrix_gpu_chunked_backward`)."""
    return call.params.get("algorithm") == "chunked"


def render(r, call) -> str:
    """Kernel source of ``call`` (forward: one kernel, or the chunked form's four; backward: the keys, values and
    decay kernels, or the chunked form's eight)."""
    f: MatrixStateFeatures = call.features
    cfg = call.params
    tunables = "\n".join(
        f"#ifndef {name}\n#define {name} {cfg[name]}\n#endif\n#define SW_{name.upper()} ({name})"
        for name in ("workgroup_size", "time_tile"))
    chunk = is_chunked(call)
    ws = f", {r.global_prefix}{r.ctype(f.dtype)}* restrict ws" if call.part == "backward" or chunk else ""
    lay = layout(f, cfg)
    bounds = r.launch_bounds_blocks.format(n="SW_WG", blocks=resident_blocks(lay.wg)) \
        if r.launch_bounds_blocks else r.launch_bounds.format(n="SW_WG")
    body = chunked.CHUNKED if chunk else FORWARD if call.part == "forward" else ATOMIC_ADD + KEYS + VALUES + DECAY
    if chunk and call.part == "backward":
        body = (chunked_backward.HOOKS + chunked.STATES + chunked_backward.ADJOINT + chunked_backward.SLOT_SEGMENT
                + ATOMIC_ADD + KEYS.replace("sw_matrix_state_bwd_", "sw_matrix_state_chunk_bwd_")
                + (VALUES + DECAY).replace("sw_matrix_state_bwd_", "sw_matrix_state_chunk_bwd_"))
    extra = ""
    if chunk:
        # two resident workgroups of the output kernel in float32 (at most 128 registers: its 256 work-items' 132
        # left one per SM); one in float64, where its scores' exponentials need more (ptxas would spill at 128)
        blocks3 = 2 if f.dtype != "float64" else 1
        bounds3 = r.launch_bounds_blocks.format(n="SW_WG3", blocks=blocks3) if r.launch_bounds_blocks \
            else r.launch_bounds.format(n="SW_WG3")
        extra = chunked.defines(f, cfg) + f"\n#define SW_KERNEL_WG3 {r.kernel_prefix} {bounds3}"
    exp = r.math_fn("exp", f.dtype)
    parts = [f"/* scanweaver {r.target} fused kernel: matrix_state {call.part}, {f.dtype}, K={f.K}, V={f.V}, "
             f"decay {f.decay}, readout {f.readout} */",
             r.preamble_for(f.dtype), f"#define SW_T {r.ctype(f.dtype)}",
             f"#define SW_DOUBLE {int(f.dtype == 'float64')}", feature_defines(f), tunables,
             layout_defines(lay), extra, "\n".join(r.gpu_macros()),
             f"#define SW_KERNEL_TILED {r.kernel_prefix} {bounds}",
             PRELUDE.replace("@EXP@", exp),
             body.replace("@PARAMS@", params(r, call) + ws).replace("@EXP@", exp)]
    return "\n".join(p for p in parts if p) + "\n"


def local_bytes(part: str, features: MatrixStateFeatures, config: dict) -> int:
    """Static local (shared) memory of the largest kernel of ``part``, in bytes (the kernels' declarations; the
    one-element arrays of switched-off features are left out: compilers drop them)."""
    K, V, item, tt = features.K, features.V, ITEMSIZE[features.dtype], int(config["time_tile"])
    lay = layout(features, config)
    if part == "forward" and config.get("algorithm") == "chunked":
        return chunked.local_bytes(features, config, lay.ct)
    if config.get("algorithm") == "chunked":
        return max((tt * K + tt * lay.ct) * item, local_bytes(part, features, {**config, "algorithm": "recurrent"}))
    decays = {"none": 0, "scalar": tt, "key": tt * K}[features.decay]
    bonus = features.readout == "bonus"
    columns = (2 * tt * K + decays + (K if bonus else 0) + tt * lay.ct + tt * lay.ks * lay.ct) * item
    if part == "forward":
        return columns
    row_decays = {"none": 0, "scalar": tt, "key": tt * lay.rt}[features.decay]
    keys = (2 * tt * V + 2 * tt * lay.rt + row_decays + tt * lay.vs * lay.rt + (tt * lay.vs if bonus else 0)
            + lay.rt) * item
    decay = lay.wg * 8 if features.decay == "scalar" else 0
    return max(columns, keys, decay)


def plan(call, sizes: dict):
    """Forward: ``nseq * H * ceil(V / CT)`` workgroups; backward: the keys kernel on ``nseq * H * ceil(K / RT)``,
    the values kernel on the forward's grid, then (with decays) the decay kernel, with ``batch * T * H * K``
    scratch for a scalar decay's per-row terms; every workgroup has ``workgroup_size`` work-items.  The chunked
    forms: :func:`.matrix_gpu_chunked.plan_launches`, :func:`.matrix_gpu_chunked_backward.plan_launches`.

    Raises:
        ScanInputError: local memory over a workgroup's 48 KiB.
    """
    from .gpu import Launch, Plan

    f: MatrixStateFeatures = call.features
    cfg = call.params
    lay = layout(f, cfg)
    need = local_bytes(call.part, f, cfg)
    if need > SM90.shared_per_block:
        what = f"chunk={cfg['chunk']}, " if is_chunked(call) else ""
        raise ScanInputError(f"matrix_state {call.part}: {what}time_tile={cfg['time_tile']} with K={f.K}, V={f.V} "
                             f"in {f.dtype} needs {need} bytes of local memory per workgroup, over "
                             f"{SM90.shared_per_block}; lower {'chunk or ' if what else ''}time_tile")
    heads = sizes["nseq"] * sizes["H"]
    columns = -(-f.V // lay.ct)
    if is_chunked(call):
        launches, ws = chunked.plan_launches(f, cfg, sizes, lay.wg, lay.ct) if call.part == "forward" else \
            chunked_backward.plan_launches(f, cfg, sizes, lay.wg, lay.ct, lay.rt)
        return Plan(tuple(Launch(*x) for x in launches), ws=ws)
    if call.part == "forward":
        return Plan((Launch("sw_matrix_state_forward", heads * columns, lay.wg),))
    launches = [Launch("sw_matrix_state_bwd_keys", heads * -(-f.K // lay.rt), lay.wg),
                Launch("sw_matrix_state_bwd_values", heads * columns, lay.wg)]
    if f.decay != "none":
        launches.append(Launch("sw_matrix_state_bwd_decay", heads * (-(-f.K // lay.wg) if f.decay == "key" else 1),
                               lay.wg))
    ws = sizes["batch"] * sizes["T"] * sizes["H"] * f.K if f.decay == "scalar" else 1
    return Plan(tuple(launches), ws=max(ws, 1))


def defaults(features: MatrixStateFeatures, sizes: dict) -> dict[str, int]:
    """``state_per_item``: :data:`STATE_PER_ITEM`, halved (down to :data:`MIN_STATE_PER_ITEM`) while the
    kernels would have fewer than :data:`BUSY_ITEMS` work-items; ``workgroup_size``: the work-items of one
    column tile of the state (or of one row tile), 32 to 256; ``time_tile``: 16, halved until local memory
    fits :data:`LOCAL_BUDGET`."""
    heads = sizes.get("nseq", 1) * sizes.get("H", 1)
    per = STATE_PER_ITEM[features.dtype]
    while per > MIN_STATE_PER_ITEM and heads * features.V * -(-features.K // per) < BUSY_ITEMS:
        per //= 2
    lay = layout(features, {"workgroup_size": 1024, "state_per_item": per})
    wg = min(256, max(32, _pow2_at_least(max(lay.ks * features.V, lay.vs * features.K))))
    tt = 16
    cfg = {"workgroup_size": wg, "state_per_item": per, "time_tile": tt}
    while tt > 1 and local_bytes("backward", features, cfg) > LOCAL_BUDGET:
        tt //= 2
        cfg["time_tile"] = tt
    return cfg


def columns_per_group(V: int, sizes: dict) -> int:
    """The default ``workgroup_size`` of kernels that keep one state column per work-item (the delta rule's):
    V rounded up to a power of two (8 to 128), halved down to 32 while the GPU would have fewer than 264
    workgroups (two per H200 multiprocessor)."""
    wg = min(128, max(8, 1 << max(0, V - 1).bit_length()))
    heads = sizes.get("nseq", 1) * sizes.get("H", 1)
    while wg > 32 and heads * -(-V // wg) < 264:
        wg //= 2
    return wg


KERNELS.register(FusedKernel("matrix_state", "gpu", ("forward", "backward"), render,
                             lambda part: f"sw_matrix_state_{part if part == 'forward' else 'bwd_keys'}", plan,
                             defaults=defaults))
