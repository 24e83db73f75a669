"""GPU rendering (OpenCL, CUDA and any :class:`~.gpu.GPURenderer`) of the fused ``delta_rule`` (every gate and form).

The columns of the state evolve independently given the step's vectors:
column j obeys ``s <- d o s + x X_j (+ y v_j)`` with ``X_j = beta (v_j - a . s)``
(delta; ``a = d o k``) or ``X_j = a . s`` (dplr).  Forward: one workgroup per
(sequence, value head, tile of ``workgroup_size`` columns) of ``workgroup_size
* key_split`` work-items; the ``key_split`` work-items of column j keep
``K / key_split`` of its rows in registers (16 values at K = 128 by default:
no spills), and a workgroup sum in local memory joins their two dots per step,
the readout ``q . s`` and the next step's projection ``a_{t+1} . s`` (one sum
per step, the projection accumulated during the update as in the C kernel).
q, the update columns, the projections, the decays and beta of ``time_tile``
steps (and the next one) are staged in local memory, normalised there when
``l2norm`` is on.

With ``algorithm="chunked"`` the ``delta`` form runs the chunked WY form
instead: the forward of :mod:`.delta_gpu_chunked` (two kernels and a scratch
``ws``), the backward of :mod:`.delta_gpu_chunked_backward` (those two without
outputs, the adjoints' carry, and the backward's four kernels below on the
chunks); the ``dplr`` form (RWKV-7) both as well.

The backward (:mod:`.delta_gpu_backward`) is every form's (DeltaNet, Gated
DeltaNet, KDA, RWKV-7; every gate, ``l2norm``, q/k heads shared by value
heads); its *deltas* kernel is this forward sweep writing ``r_t = v_t - p_t``
(``dplr``: ``p_t``) to the scratch.

Kernels (ABI of :meth:`~scanweaver.fused.delta_rule.DeltaRule.params`; ``do`` spelled ``do_``)::

    sw_delta_rule_forward(q, k, v, g, beta, a, b, h0, cu_seqlens, o, hlast, batch, T, H, Hq, nseq)
    sw_delta_chunk_prep / sw_delta_chunk_state(the forward's parameters, ws)                   (chunked)
    sw_delta_chunk_adjoint(the backward's parameters, ws)                                      (chunked backward)
"""

from __future__ import annotations

from ..errors import ScanInputError
from ..fused.delta_rule import GATES, DeltaRuleFeatures
from . import delta_gpu_chunked as chunked
from . import delta_gpu_chunked_backward as chunked_backward
from .delta_gpu_backward import BACKWARD, MACROS
from .fused import KERNELS, FusedKernel
from .fused_gpu_mamba1 import params
from .fused_gpu_matrix_state import LOCAL_BUDGET, columns_per_group, resident_blocks
from .launch_limits import ITEMSIZE, SM90

#: State rows a work-item keeps in registers by default (``key_split`` = K / this, rounded up to a power of two):
#: at 32, ptxas (CUDA 13, sm_90) held the float32 scalar-gate kernel to 72 registers and spilled; at 16 no
#: configuration of the four families spills at K = V = 128 (test/test_gpu_delta.py).
ROWS_PER_ITEM = 16
#: Most work-items of one workgroup (CUDA's and most OpenCL devices' limit).
MAX_ITEMS = 1024
#: Most work-items of the backward's keys kernel (K rows x :func:`row_split` slices of the columns): ptxas (CUDA 13,
#: sm_90, K = V = 128) spilled 4 to 12 bytes at 1024 in float32 (64 registers a work-item), none at 512 (108 to 128
#: registers); in float64 12 to 32 bytes at 512, none at 256 (254 to 255 registers).
ROW_ITEMS = {"float32": 512, "float64": 256}

PRELUDE = r"""
#define SW_WG SW_WORKGROUP_SIZE
#define SW_R SW_KEY_SPLIT
#define SW_ITEMS (SW_WG * SW_R)
#define SW_KR ((SW_K + SW_R - 1) / SW_R)
#define SW_TT SW_TIME_TILE
#define SW_NVT ((SW_V + SW_WG - 1) / SW_WG)
/* sizes of the staged k of dplr and of the decays (one element where a feature is off) */
#define SW_SY_LEN (SW_DPLR ? (SW_TT + 1) * SW_K : 1)
#define SW_SD_LEN (SW_GATE == 2 ? (SW_TT + 1) * SW_K : SW_TT + 1)
#define SW_SEGMENT(seq) \
  const sw_index bi = SW_HAS_SEQLENS ? 0 : (seq); \
  const sw_index start = SW_HAS_SEQLENS ? cu_seqlens[seq] : 0; \
  const sw_index len = SW_HAS_SEQLENS ? cu_seqlens[(seq) + 1] - start : T; \
  const sw_index hq = h / (H / Hq)
#define SW_QK(t) (((bi * T + (t)) * Hq + hq) * SW_K)
#define SW_HK(t) (((bi * T + (t)) * H + h) * SW_K)
#define SW_VO(t) (((bi * T + (t)) * H + h) * SW_V)
#define SW_BT(t) ((bi * T + (t)) * H + h)
#define SW_TILE_LEN(s0) ((int)(len - (s0) < SW_TT ? len - (s0) : SW_TT))
/* a column work-item: lane c of key slice r; column j of value tile vt of (seq, h); state element (i, j) at
 * st + i * SW_V */
#define SW_COLUMN_ITEM() \
  const int lid = SW_LID, c = lid % SW_WG, r = lid / SW_WG; \
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, seq = grp / SW_NVT / H, h = grp / SW_NVT % H; \
  const sw_index j = vt * SW_WG + c; \
  const int live = j < SW_V; \
  SW_SEGMENT(seq); \
  const sw_index st = (seq * H + h) * SW_K * SW_V + j
/* the decay of row i at staged step tt */
#define SW_DK(tt, i) (SW_GATE == 2 ? sd[(tt) * SW_K + (i)] : SW_GATE == 1 ? sd[tt] : (SW_T)1)
/* x and y summed over the n work-items r_ * stride + j (r_ < n) of a workgroup of `items` (local memory red of
 * 2 * items; every work-item gets the sums) */
#define SW_SUM2_OVER(x, y, n, items, stride, j) do { \
  red[lid] = (x); red[(items) + lid] = (y); \
  SW_BARRIER(); \
  (x) = (SW_T)0; (y) = (SW_T)0; \
  for (int r_ = 0; r_ < (n); ++r_) { (x) += red[r_ * (stride) + (j)]; (y) += red[(items) + r_ * (stride) + (j)]; } \
  SW_BARRIER(); \
} while (0)
/* sums over the SW_R work-items of column c */
#if SW_R > 1
#define SW_SUM2(x, y) SW_SUM2_OVER(x, y, SW_R, SW_ITEMS, SW_WG, c)
#else
#define SW_SUM2(x, y) ((void)0)
#endif
/* the m staged steps from s0 (the tile's n and the next one when there is one): q, the update column x (delta:
 * k; dplr: b), y (dplr: k), the projection a (delta: d o k; dplr: a), decays, beta; rows from m on project to 0 */
#define SW_STAGE_ALL(s0, m) do { \
  for (int e = lid; e < (SW_TT + 1) * SW_K; e += SW_ITEMS) { \
    const int tt_ = e / SW_K, i_ = e % SW_K; \
    if (tt_ < (m)) { \
      const sw_index t_ = start + (s0) + tt_; \
      sq[e] = q[SW_QK(t_) + i_]; \
      if (SW_DPLR) { sy[e] = k[SW_QK(t_) + i_]; sx[e] = b[SW_HK(t_) + i_]; sa[e] = a[SW_HK(t_) + i_]; } \
      else sx[e] = k[SW_QK(t_) + i_]; \
      if (SW_GATE == 2) sd[e] = @EXP@(g[SW_HK(t_) + i_]); \
    } else { \
      sa[e] = (SW_T)0; \
    } \
  } \
  for (int e = lid; e < (m); e += SW_ITEMS) { \
    if (SW_GATE == 1) sd[e] = @EXP@(g[SW_BT(start + (s0) + e)]); \
    if (!SW_DPLR) sb[e] = beta[SW_BT(start + (s0) + e)]; \
  } \
  SW_BARRIER(); \
  if (SW_L2) { \
    for (int e = lid; e < (m); e += SW_ITEMS) { \
      SW_T nq = (SW_T)0, nk = (SW_T)0; \
      for (int i_ = 0; i_ < SW_K; ++i_) { \
        nq += sq[e * SW_K + i_] * sq[e * SW_K + i_]; \
        nk += SW_KN[e * SW_K + i_] * SW_KN[e * SW_K + i_]; \
      } \
      sn[2 * e] = (SW_T)1 / @SQRT@(nq + (SW_T)1e-6); \
      sn[2 * e + 1] = (SW_T)1 / @SQRT@(nk + (SW_T)1e-6); \
    } \
    SW_BARRIER(); \
    for (int e = lid; e < (m) * SW_K; e += SW_ITEMS) { \
      sq[e] *= sn[2 * (e / SW_K)]; \
      SW_KN[e] *= sn[2 * (e / SW_K) + 1]; \
    } \
    SW_BARRIER(); \
  } \
  /* a second barrier after the normalisation: without it PoCL 3.1 (LLVM 15) staged wrong projections for gate \
   * none with key_split > 1 (the forward and the backward off by O(1) after the first tile) */ \
  SW_BARRIER(); \
  if (!SW_DPLR) \
    for (int e = lid; e < (m) * SW_K; e += SW_ITEMS) sa[e] = SW_DK(e / SW_K, e % SW_K) * sx[e]; \
} while (0)
#define SW_KN (SW_DPLR ? sy : sx)
/* where a sequence's initial state is read, its final state's adjoint read and its initial state's written (the
 * chunked backward runs the recurrent kernels on chunks, with states and adjoints of its own) */
#ifndef SW_H0_AT
#define SW_H0_ON SW_HAS_H0
#define SW_H0_AT(x) h0[x]
#define SW_DHLAST_ON SW_HAS_DHLAST
#define SW_DHLAST_AT(x) dhlast[x]
#define SW_DH0_ON SW_HAS_H0
#endif
"""

#: The forward sweep; @NAME@ and @EXTRA@ (a parameter), @OUT@ (per step, with the projection ``p`` of the step,
#: the readout ``acc`` and ``vj``) and @END@ (after the last step) make the forward and the backward's deltas.
COLUMNS = r"""
SW_KERNEL_DR void @NAME@(@PARAMS@@EXTRA@) {
  SW_LOCAL SW_T sq[(SW_TT + 1) * SW_K];
  SW_LOCAL SW_T sx[(SW_TT + 1) * SW_K];
  SW_LOCAL SW_T sa[(SW_TT + 1) * SW_K];
  SW_LOCAL SW_T sy[SW_SY_LEN];
  SW_LOCAL SW_T sd[SW_SD_LEN];
  SW_LOCAL SW_T sb[SW_TT + 1];
  SW_LOCAL SW_T sn[2 * (SW_TT + 1)];
  SW_LOCAL SW_T red[2 * SW_ITEMS];
  SW_COLUMN_ITEM();
  SW_T s[SW_KR];
#pragma unroll
  for (int ii = 0; ii < SW_KR; ++ii) {
    const int i = r * SW_KR + ii;
    s[ii] = (SW_H0_ON && live && i < SW_K) ? SW_H0_AT(st + i * SW_V) : (SW_T)0;
  }
  (void)red, (void)sy, (void)sn, (void)sb;
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0), m = n + (s0 + n < len ? 1 : 0);
    SW_BARRIER();
    SW_STAGE_ALL(s0, m);
    SW_BARRIER();
    SW_T p = (SW_T)0, p2 = (SW_T)0;
#pragma unroll
    for (int ii = 0; ii < SW_KR; ++ii) {
      const int i = r * SW_KR + ii;
      if (i < SW_K) p += sa[i] * s[ii];
    }
    SW_SUM2(p, p2);
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = start + s0 + tt;
      const SW_T vj = live ? v[SW_VO(t) + j] : (SW_T)0;
      const SW_T X = SW_DPLR ? p : sb[tt] * (vj - p);
      SW_T acc = (SW_T)0, pn = (SW_T)0;
#pragma unroll
      for (int ii = 0; ii < SW_KR; ++ii) {
        const int i = r * SW_KR + ii;
        if (i < SW_K) {
          SW_T sv = SW_DK(tt, i) * s[ii] + sx[tt * SW_K + i] * X;
          if (SW_DPLR) sv += sy[tt * SW_K + i] * vj;
          s[ii] = sv;
          acc += sq[tt * SW_K + i] * sv;
          pn += sa[(tt + 1) * SW_K + i] * sv;
        }
      }
      SW_SUM2(acc, pn);
      @OUT@
      p = pn;
    }
  }
  @END@
}
"""

FORWARD_OUT = "if (r == 0 && live) o[SW_VO(t) + j] = acc;"
FORWARD_END = """if (live) {
#pragma unroll
    for (int ii = 0; ii < SW_KR; ++ii) {
      const int i = r * SW_KR + ii;
      if (i < SW_K) hlast[st + i * SW_V] = s[ii];
    }
  }"""
DELTAS_OUT = "if (r == 0 && live) ws[SW_VO(t) + j] = SW_DPLR ? p : vj - p;"


def render(r, call) -> str:
    """Kernel source of ``call`` (forward: one kernel; backward: deltas, values, keys and qk)."""
    f: DeltaRuleFeatures = call.features
    _check_dtype(call)
    cfg = call.params
    tunables = "\n".join(
        f"#ifndef {name}\n#define {name} {cfg[name]}\n#endif\n#define SW_{name.upper()} ({name})"
        for name in ("workgroup_size", "time_tile", "key_split"))
    kernels = [f"#define SW_KERNEL_ROWS {r.kernel_prefix} {r.launch_bounds.format(n='SW_RITEMS')}".rstrip(),
               f"#define SW_KERNEL_DR {r.kernel_prefix} {r.launch_bounds.format(n='SW_ITEMS')}".rstrip()]
    if is_chunked(call):
        deltas = COLUMNS.replace("@NAME@", "sw_delta_rule_bwd_deltas")
        deltas = deltas.replace("@EXTRA@", f", {r.global_prefix}{r.ctype(f.state_dtype)}* restrict ws")
        body = chunked.CHUNKED if call.part == "forward" else (
            MACROS + chunked.CHUNKED + chunked_backward.ADJOINT + chunked_backward.SLOT_SEGMENT
            + deltas.replace("@OUT@", DELTAS_OUT).replace("@END@", "") + BACKWARD)
        if call.part == "backward" and r.launch_bounds_blocks:
            # on the chunk slots ptxas settled the deltas and values kernels at 64 registers and spilled (K = V =
            # 128, float32): declared for 128 registers a work-item, as the matrix-state kernels are
            items = cfg["workgroup_size"] * cfg["key_split"]
            kernels[1] = f"#define SW_KERNEL_DR {r.kernel_prefix} " + \
                r.launch_bounds_blocks.format(n="SW_ITEMS", blocks=resident_blocks(items))
        # two resident workgroups (up to 128 registers each): with the plain bound ptxas settled at 64 and spilled
        kernels += [chunked.FORWARD_HOOKS if call.part == "forward" else chunked_backward.HOOKS,
                    chunked.defines(f, cfg)] + [
            f"#define SW_KERNEL_{x} {r.kernel_prefix} " + (r.launch_bounds_blocks.format(n=f"SW_WG{x}", blocks=2)
                                                          if r.launch_bounds_blocks else
                                                          r.launch_bounds.format(n=f"SW_WG{x}")) for x in "PS"]
    elif call.part == "forward":
        body = COLUMNS.replace("@NAME@", "sw_delta_rule_forward").replace("@EXTRA@", "")
        body = body.replace("@OUT@", FORWARD_OUT).replace("@END@", FORWARD_END)
    else:
        deltas = COLUMNS.replace("@NAME@", "sw_delta_rule_bwd_deltas")
        deltas = deltas.replace("@EXTRA@", f", {r.global_prefix}{r.ctype(f.state_dtype)}* restrict ws")
        body = MACROS + deltas.replace("@OUT@", DELTAS_OUT).replace("@END@", "") + BACKWARD
    defines = [f"#define SW_K {f.K}", f"#define SW_V {f.V}", f"#define SW_GATE {GATES.index(f.gate)}",
               f"#define SW_DPLR {int(f.form == 'dplr')}", f"#define SW_L2 {int(f.l2norm)}",
               f"#define SW_HAS_H0 {int(f.has_h0)}", f"#define SW_HAS_SEQLENS {int(f.has_seqlens)}",
               f"#define SW_HAS_DHLAST {int(f.has_dhlast)}", f"#define SW_CS {row_split(f, cfg['key_split'])}"]
    text = (PRELUDE + body.replace("@PARAMS@", params(r, call))).replace("@EXP@", r.math_fn("exp", f.state_dtype))
    text = text.replace("@SQRT@", r.math_fn("sqrt", f.state_dtype))
    parts = [f"/* scanweaver {r.target} fused kernel: delta_rule {call.part}, {f.dtype}, K={f.K}, V={f.V}, "
             f"gate {f.gate}, form {f.form}, l2norm {int(f.l2norm)} */",
             r.preamble_for(f.state_dtype), f"#define SW_T {r.ctype(f.state_dtype)}", "\n".join(defines), tunables,
             "\n".join(r.gpu_macros()), *kernels, text]
    return "\n".join(p for p in parts if p) + "\n"


def is_chunked(call) -> bool:
    """True when ``call`` runs the chunked WY form (:mod:`.delta_gpu_chunked`, :mod:`.delta_gpu_chunked_backward`)."""
    return call.params.get("algorithm") == "chunked"


def _check_dtype(call) -> None:
    if call.features.dtype not in ("float32", "float64"):
        raise ScanInputError(f"delta_rule {call.part}: the GPU kernels store float32 or float64, got "
                             f"{call.features.dtype} (convert the operands to float32)")


def row_split(features: DeltaRuleFeatures, key_split: int) -> int:
    """Work-items per state row of the backward's keys kernel: ``key_split``, halved while the K rows' would pass
    :data:`ROW_ITEMS`."""
    split, most = key_split, ROW_ITEMS[features.state_dtype]
    while split > 1 and features.K * split > most:
        split //= 2
    return split


def local_bytes(part: str, features: DeltaRuleFeatures, config: dict) -> int:
    """Static local (shared) memory of the largest kernel of ``part``, in bytes (the kernels' declarations)."""
    f, tt, items = features, config["time_tile"], config["workgroup_size"] * config["key_split"]
    rows = (tt + 1) * f.K
    count = 3 * rows + (rows if f.form == "dplr" else 1) + (rows if f.gate == "key" else tt + 1) \
        + 3 * (tt + 1) + 2 * items
    size = ITEMSIZE[f.state_dtype]
    if part == "forward":
        return count * size
    dplr = f.form == "dplr"
    values = (4 if dplr else 2) * tt * f.K + (tt * f.K if f.gate == "key" else tt) + 3 * tt + 2 * items
    keys = (4 if dplr else 3) * tt * f.V + 3 * tt + 2 * f.K * row_split(f, config["key_split"])
    return max(count, values, keys) * size


def plan(call, sizes: dict):
    """Forward: ``nseq * H * ceil(V / workgroup_size)`` workgroups of ``workgroup_size * key_split``; backward
    (form ``delta``): deltas and values on that grid, keys on ``nseq * H`` workgroups of ``K *``
    :func:`row_split` work-items, qk on ``batch * T * Hq`` work-items in workgroups of ``workgroup_size``, with
    ``2 * batch * T * H * V + (2, 3 or 4: gate none, key, scalar) * batch * T * H * K`` of ``ws``.

    Raises:
        ScanInputError: a dtype or form these kernels do not run, too many work-items, or local memory over
            a workgroup's 48 KiB.
    """
    from .gpu import Launch, Plan

    f: DeltaRuleFeatures = call.features
    wg, tt, split = call.params["workgroup_size"], call.params["time_tile"], call.params["key_split"]
    _check_dtype(call)
    chunk = is_chunked(call)
    if chunk:  # the chunked kernels' own limits; the forward's are those alone
        need = chunked.local_bytes(f, call.params)
        if need > SM90.shared_per_block:
            raise ScanInputError(f"delta_rule {call.part}: chunk={call.params['chunk']} with K={f.K}, V={f.V} in "
                                 f"{f.dtype} needs {need} bytes of local memory per workgroup, over "
                                 f"{SM90.shared_per_block}; lower chunk")
        if call.part == "forward":
            return Plan(tuple(Launch(*x) for x in chunked.plan_launches(f, call.params, sizes)),
                        ws=chunked.scratch(f, call.params, sizes))
    if wg * split > MAX_ITEMS:
        raise ScanInputError(f"delta_rule {call.part}: workgroup_size={wg} x key_split={split} work-items exceed "
                             f"{MAX_ITEMS} per workgroup")
    need = local_bytes(call.part, f, call.params)
    if need > SM90.shared_per_block:
        way = "lower time_tile" if tt > 1 else ("K is too large for these kernels' local memory: use "
                                                "backend='cpu'" + (" or algorithm='chunked'" if f.form == "delta"
                                                                   and call.part == "forward" else ""))
        raise ScanInputError(f"delta_rule {call.part}: time_tile={tt} with K={f.K}, V={f.V} in {f.dtype} needs "
                             f"{need} bytes of local memory per workgroup, over {SM90.shared_per_block}; {way}")
    heads = sizes["nseq"] * sizes["H"]
    columns = heads * -(-f.V // wg)
    if call.part == "forward":
        return Plan((Launch("sw_delta_rule_forward", columns, wg * split),))
    if f.K > MAX_ITEMS:
        raise ScanInputError(f"delta_rule backward: K={f.K} state rows exceed {MAX_ITEMS} work-items per workgroup")
    if chunk:  # the recurrent backward's kernels run on the chunks: their limits above hold too
        launches = chunked_backward.plan_launches(f, call.params, sizes, wg, split, f.K * row_split(f, split))
        return Plan(tuple(Launch(*x) for x in launches), ws=chunked_backward.scratch(f, call.params, sizes))
    tokens = sizes["batch"] * sizes["T"]
    ws = chunked_backward.recurrent_scratch(f, sizes)
    return Plan((Launch("sw_delta_rule_bwd_deltas", columns, wg * split),
                 Launch("sw_delta_rule_bwd_values", columns, wg * split),
                 Launch("sw_delta_rule_bwd_keys", heads, f.K * row_split(f, split)),
                 Launch("sw_delta_rule_bwd_qk", -(-tokens * sizes["Hq"] // wg), wg)), ws=ws)


def defaults(features: DeltaRuleFeatures, sizes: dict) -> dict[str, int]:
    """``workgroup_size`` as the matrix-state kernels' (:func:`.fused_gpu_matrix_state.columns_per_group`),
    ``key_split`` so that a work-item keeps at most :data:`ROWS_PER_ITEM` rows, ``time_tile`` 16 halved until
    local memory fits :data:`~.fused_gpu_matrix_state.LOCAL_BUDGET`."""
    wg = columns_per_group(features.V, sizes)
    split = min(64, 1 << max(0, -(-features.K // ROWS_PER_ITEM) - 1).bit_length())  # the tunable's largest
    while wg * split > MAX_ITEMS and wg > 8:
        wg //= 2
    if features.K == 1 and features.l2norm:
        # PoCL (3.1, LLVM 15, AVX-512) built the recurrent kernels wrong at K = 1 with the L2 norm from 16 columns a
        # workgroup (o off by O(1)); the text reads right, and 8 columns are exact
        wg = min(wg, 8)
    cfg = {"workgroup_size": wg, "key_split": split, "time_tile": 16}
    while cfg["time_tile"] > 1 and local_bytes("backward", features, cfg) > LOCAL_BUDGET:
        cfg["time_tile"] //= 2
    return cfg


def fits(part: str, features: DeltaRuleFeatures, config: dict | None = None) -> str | None:
    """Why these kernels cannot run ``part`` with ``features``, else ``None`` (the runner's ``auto`` passes over
    them then, and a backward falls back to a backend that runs it): half storage."""
    if features.dtype not in ("float32", "float64"):
        return (f"the GPU kernels store float32 or float64; the operands (q, k, v and the gates) are {features.dtype}: "
                "convert them to float32, or use backend='cpu' or 'numpy' (which store float16 and bfloat16 as given) "
                "or 'auto'")
    return None


KERNELS.register(FusedKernel("delta_rule", "gpu", ("forward", "backward"), render,
                             lambda part: f"sw_delta_rule_{part if part == 'forward' else 'bwd_deltas'}", plan,
                             defaults=defaults, fits=fits))
