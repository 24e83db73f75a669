"""GPU rendering (OpenCL, CUDA and any :class:`~.gpu.GPURenderer`) of the fused ``delta_rule`` (DeltaNet).

The columns of the delta rule's state evolve independently: column j obeys
``s <- s + k_t u_t[j]`` with ``u_t[j] = beta_t (v_t[j] - s . k_t)``.  So the
forward is :mod:`.fused_gpu_matrix_state`'s layout: one workgroup per
(sequence, head, tile of ``workgroup_size`` columns), work-item j keeping
column j (K values) in registers, q, k and beta of ``time_tile`` steps staged
in local memory.

The backward runs three kernels and needs ``2 * batch * T * H * V`` values of
scratch ``ws`` (the plan's): *deltas* (the forward's grid) writes
``r_t = v_t - S_{t-1}^T k_t``; *values* (the same grid, in reverse) carries
G's column j through ``G <- G + q_t do_t[j]``, ``du_t[j] = G . k_t``, ``G <- G -
beta_t k_t du_t[j]``, writing dv, du (to ``ws``) and dh0; *keys* (one
workgroup per (sequence, head), work-item i = row i) rebuilds row i of S from
the stored deltas (``S[i] += k_t[i] u_t``, forward for dq, then subtracted in
reverse: no checkpoints, a rounding error that grows linearly in T, never
exponentially), carries row i of G, and writes ``dq_t[i] = S_t[i] . do_t``,
``dk_t[i] = G'_t[i] . u_t - beta_t S_{t-1}[i] . du_t`` and (work-item 0)
``dbeta_t = du_t . r_t``.  Every output element has one writer: no atomics.

Kernels (ABI of :meth:`~scanweaver.fused.delta_rule.DeltaRule.params`; ``do``
spelled ``do_``; the backward's kernels take ``ws`` last)::

    sw_delta_rule_forward(q, k, v, beta, h0, cu_seqlens, o, hlast, batch, T, H, nseq)
"""

from __future__ import annotations

from ..errors import ScanInputError
from ..fused.delta_rule import DeltaRuleFeatures
from .fused import KERNELS, FusedKernel
from .fused_gpu_mamba1 import params
from .fused_gpu_matrix_state import LOCAL_BUDGET, MAX_K, columns_per_group
from .launch_limits import ITEMSIZE, SM90

PRELUDE = r"""
#define SW_WG SW_WORKGROUP_SIZE
#define SW_TT SW_TIME_TILE
#define SW_NVT ((SW_V + SW_WG - 1) / SW_WG)
#define SW_SEGMENT(seq) \
  const sw_index bi = SW_HAS_SEQLENS ? 0 : (seq); \
  const sw_index start = SW_HAS_SEQLENS ? cu_seqlens[seq] : 0; \
  const sw_index len = SW_HAS_SEQLENS ? cu_seqlens[(seq) + 1] - start : T
#define SW_QK(t) (((bi * T + (t)) * H + h) * SW_K)
#define SW_VO(t) (((bi * T + (t)) * H + h) * SW_V)
#define SW_BT(t) ((bi * T + (t)) * H + h)
#define SW_TILE_LEN(s0) ((int)(len - (s0) < SW_TT ? len - (s0) : SW_TT))
/* the column work-item: its sequence, head and state column j (element (i, j) at st + i * SW_V) */
#define SW_COLUMN() \
  const int lid = SW_LID; \
  const sw_index grp = SW_GROUP, vt = grp % SW_NVT, seq = grp / SW_NVT / H, h = grp / SW_NVT % H; \
  const sw_index j = vt * SW_WG + lid; \
  const int live = j < SW_V; \
  SW_SEGMENT(seq); \
  const sw_index st = (seq * H + h) * SW_K * SW_V + j
/* q, k and beta of the n steps from s0 into local memory */
#define SW_STAGE(s0, n) do { \
  for (int e = lid; e < (n) * SW_K; e += SW_WG) { \
    const sw_index t_ = start + (s0) + e / SW_K; \
    sq[e] = q[SW_QK(t_) + e % SW_K]; \
    sk[e] = k[SW_QK(t_) + e % SW_K]; \
  } \
  for (int e = lid; e < (n); e += SW_WG) sb[e] = beta[SW_BT(start + (s0) + e)]; \
} while (0)
"""

#: The forward sweep over state columns; @NAME@ and @EXTRA@ (a parameter), @OUT@ (per step, with the delta
#: ``r`` and the readout ``acc``) and @END@ (after the last step) make the forward and the backward's deltas.
COLUMNS = r"""
SW_KERNEL void @NAME@(@PARAMS@@EXTRA@) {
  SW_LOCAL SW_T sq[SW_TT * SW_K];
  SW_LOCAL SW_T sk[SW_TT * SW_K];
  SW_LOCAL SW_T sb[SW_TT];
  SW_COLUMN();
  SW_T s[SW_K];
#pragma unroll
  for (int i = 0; i < SW_K; ++i) s[i] = (SW_HAS_H0 && live) ? h0[st + i * SW_V] : (SW_T)0;
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE(s0, n);
    SW_BARRIER();
    if (!live) continue;
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = start + s0 + tt;
      SW_T p = (SW_T)0, acc = (SW_T)0;
#pragma unroll
      for (int i = 0; i < SW_K; ++i) p += sk[tt * SW_K + i] * s[i];
      const SW_T r = v[SW_VO(t) + j] - p, uj = sb[tt] * r;
#pragma unroll
      for (int i = 0; i < SW_K; ++i) {
        s[i] += sk[tt * SW_K + i] * uj;
        acc += sq[tt * SW_K + i] * s[i];
      }
      @OUT@
    }
  }
  @END@
}
"""

FORWARD_OUT = "o[SW_VO(t) + j] = acc;"
FORWARD_END = """if (live) {
#pragma unroll
    for (int i = 0; i < SW_K; ++i) hlast[st + i * SW_V] = s[i];
  }"""

BACKWARD = r"""
SW_KERNEL void sw_delta_rule_bwd_values(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T sq[SW_TT * SW_K];
  SW_LOCAL SW_T sk[SW_TT * SW_K];
  SW_LOCAL SW_T sb[SW_TT];
  SW_COLUMN();
  SW_GLOBAL SW_T* wdu = ws + batch * T * H * SW_V;
  SW_T G[SW_K];
#pragma unroll
  for (int i = 0; i < SW_K; ++i) G[i] = (SW_HAS_DHLAST && live) ? dhlast[st + i * SW_V] : (SW_T)0;
  for (sw_index c = (len + SW_TT - 1) / SW_TT - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    SW_STAGE(s0, n);
    SW_BARRIER();
    if (!live) continue;
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = start + s0 + tt;
      const SW_T dj = do_[SW_VO(t) + j];
      SW_T du = (SW_T)0;
#pragma unroll
      for (int i = 0; i < SW_K; ++i) {
        G[i] += sq[tt * SW_K + i] * dj;
        du += G[i] * sk[tt * SW_K + i];
      }
#pragma unroll
      for (int i = 0; i < SW_K; ++i) G[i] -= sb[tt] * sk[tt * SW_K + i] * du;
      dv[SW_VO(t) + j] = sb[tt] * du;
      wdu[SW_VO(t) + j] = du;
    }
  }
  if (SW_HAS_H0 && live) {
#pragma unroll
    for (int i = 0; i < SW_K; ++i) dh0[st + i * SW_V] = G[i];
  }
}

SW_KERNEL_ROWS void sw_delta_rule_bwd_keys(@PARAMS@, SW_GLOBAL SW_T* restrict ws) {
  SW_LOCAL SW_T su[SW_TT * SW_V];
  SW_LOCAL SW_T sdo[SW_TT * SW_V];
  SW_LOCAL SW_T sdu[SW_TT * SW_V];
  SW_LOCAL SW_T sr[SW_TT * SW_V];
  const int i = SW_LID;
  const sw_index grp = SW_GROUP, seq = grp / H, h = grp % H;
  SW_SEGMENT(seq);
  SW_GLOBAL const SW_T* wr = ws;
  SW_GLOBAL const SW_T* wdu = ws + batch * T * H * SW_V;
  const sw_index st = ((seq * H + h) * SW_K + i) * SW_V;
  SW_T S[SW_V], G[SW_V];
#pragma unroll
  for (int j = 0; j < SW_V; ++j) S[j] = SW_HAS_H0 ? h0[st + j] : (SW_T)0;
  /* 1. forward: S_t's row i from the deltas; dq */
  for (sw_index s0 = 0; s0 < len; s0 += SW_TT) {
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    for (int e = i; e < n * SW_V; e += SW_K) {
      const sw_index t = start + s0 + e / SW_V;
      su[e] = beta[SW_BT(t)] * wr[SW_VO(t) + e % SW_V];
      sdo[e] = do_[SW_VO(t) + e % SW_V];
    }
    SW_BARRIER();
    for (int tt = 0; tt < n; ++tt) {
      const sw_index t = start + s0 + tt;
      const SW_T ki = k[SW_QK(t) + i];
      SW_T acc = (SW_T)0;
#pragma unroll
      for (int j = 0; j < SW_V; ++j) {
        S[j] += ki * su[tt * SW_V + j];
        acc += S[j] * sdo[tt * SW_V + j];
      }
      dq[SW_QK(t) + i] = acc;
    }
  }
  /* 2. reverse: S_{t-1} = S_t - k_t u_t^T; G's row i; dk, dbeta */
#pragma unroll
  for (int j = 0; j < SW_V; ++j) G[j] = SW_HAS_DHLAST ? dhlast[st + j] : (SW_T)0;
  for (sw_index c = (len + SW_TT - 1) / SW_TT - 1; c >= 0; --c) {
    const sw_index s0 = c * SW_TT;
    const int n = SW_TILE_LEN(s0);
    SW_BARRIER();
    for (int e = i; e < n * SW_V; e += SW_K) {
      const sw_index t = start + s0 + e / SW_V;
      sr[e] = wr[SW_VO(t) + e % SW_V];
      su[e] = beta[SW_BT(t)] * sr[e];
      sdo[e] = do_[SW_VO(t) + e % SW_V];
      sdu[e] = wdu[SW_VO(t) + e % SW_V];
    }
    SW_BARRIER();
    for (int tt = n - 1; tt >= 0; --tt) {
      const sw_index t = start + s0 + tt;
      const SW_T qi = q[SW_QK(t) + i], ki = k[SW_QK(t) + i], bt = beta[SW_BT(t)];
      SW_T gu = (SW_T)0, sdu_ = (SW_T)0;
#pragma unroll
      for (int j = 0; j < SW_V; ++j) {
        const SW_T uj = su[tt * SW_V + j], duj = sdu[tt * SW_V + j];
        G[j] += qi * sdo[tt * SW_V + j];
        gu += G[j] * uj;
        S[j] -= ki * uj;
        sdu_ += S[j] * duj;
        G[j] -= bt * ki * duj;
      }
      dk[SW_QK(t) + i] = gu - bt * sdu_;
      if (i == 0) {
        SW_T db = (SW_T)0;
        for (int j = 0; j < SW_V; ++j) db += sdu[tt * SW_V + j] * sr[tt * SW_V + j];
        dbeta[SW_BT(t)] = db;
      }
    }
  }
}
"""


def render(r, call) -> str:
    """Kernel source of ``call`` (forward: one kernel; backward: deltas, values and keys)."""
    f: DeltaRuleFeatures = call.features
    cfg = call.params
    tunables = "\n".join(
        f"#ifndef {name}\n#define {name} {cfg[name]}\n#endif\n#define SW_{name.upper()} ({name})"
        for name in ("workgroup_size", "time_tile"))
    rows = f"#define SW_KERNEL_ROWS {r.kernel_prefix} {r.launch_bounds.format(n='SW_K')}".rstrip()
    if call.part == "forward":
        body = COLUMNS.replace("@NAME@", "sw_delta_rule_forward").replace("@EXTRA@", "")
        body = body.replace("@OUT@", FORWARD_OUT).replace("@END@", FORWARD_END)
    else:
        deltas = COLUMNS.replace("@NAME@", "sw_delta_rule_bwd_deltas")
        deltas = deltas.replace("@EXTRA@", f", {r.global_prefix}{r.ctype(f.dtype)}* restrict ws")
        body = deltas.replace("@OUT@", "ws[SW_VO(t) + j] = r;").replace("@END@", "") + BACKWARD
    defines = [f"#define SW_K {f.K}", f"#define SW_V {f.V}", f"#define SW_HAS_H0 {int(f.has_h0)}",
               f"#define SW_HAS_SEQLENS {int(f.has_seqlens)}", f"#define SW_HAS_DHLAST {int(f.has_dhlast)}"]
    parts = [f"/* scanweaver {r.target} fused kernel: delta_rule {call.part}, {f.dtype}, K={f.K}, V={f.V} */",
             r.preamble_for(f.dtype), f"#define SW_T {r.ctype(f.dtype)}", "\n".join(defines), tunables,
             "\n".join(r.gpu_macros()), rows, PRELUDE, body.replace("@PARAMS@", params(r, call))]
    return "\n".join(p for p in parts if p) + "\n"


def local_bytes(part: str, features: DeltaRuleFeatures, time_tile: int) -> int:
    """Static local (shared) memory of the largest kernel of ``part``, in bytes (the kernels' declarations)."""
    item = ITEMSIZE[features.dtype]
    columns = (2 * time_tile * features.K + time_tile) * item
    return columns if part == "forward" else max(columns, 4 * time_tile * features.V * item)


def plan(call, sizes: dict):
    """Forward: ``nseq * H * ceil(V / workgroup_size)`` workgroups; backward: deltas and values on that
    grid, then keys on ``nseq * H`` workgroups of K work-items, with ``2 * batch * T * H * V`` of ``ws``.

    Raises:
        ScanInputError: K over the keys kernel's limit, or local memory over a workgroup's 48 KiB.
    """
    from .gpu import Launch, Plan

    f: DeltaRuleFeatures = call.features
    if f.gate != "none" or f.form != "delta" or f.l2norm or f.dtype not in ("float32", "float64") \
            or sizes["Hq"] != sizes["H"]:
        raise ScanInputError(f"delta_rule {call.part}: the GPU kernels run DeltaNet only (gate none, form delta, "
                             f"no l2norm, Hq = H, float32 or float64); got gate {f.gate}, form {f.form}, "
                             f"l2norm {f.l2norm}, {f.dtype}, Hq = {sizes['Hq']}, H = {sizes['H']}")
    wg, tt = call.params["workgroup_size"], call.params["time_tile"]
    need = local_bytes(call.part, f, tt)
    if need > SM90.shared_per_block:
        raise ScanInputError(f"delta_rule {call.part}: time_tile={tt} with K={f.K}, V={f.V} in {f.dtype} needs "
                             f"{need} bytes of local memory per workgroup, over {SM90.shared_per_block}; "
                             "lower time_tile")
    heads = sizes["nseq"] * sizes["H"]
    columns = heads * -(-f.V // wg)
    if call.part == "forward":
        return Plan((Launch("sw_delta_rule_forward", columns, wg),))
    if f.K > MAX_K:
        raise ScanInputError(f"delta_rule backward: K={f.K} state rows exceed {MAX_K} work-items per workgroup")
    ws = 2 * sizes["batch"] * sizes["T"] * sizes["H"] * f.V
    return Plan((Launch("sw_delta_rule_bwd_deltas", columns, wg), Launch("sw_delta_rule_bwd_values", columns, wg),
                 Launch("sw_delta_rule_bwd_keys", heads, f.K)), ws=ws)


def defaults(features: DeltaRuleFeatures, sizes: dict) -> dict[str, int]:
    """As the matrix-state kernels' (:func:`.fused_gpu_matrix_state.defaults`): ``workgroup_size`` by V and
    the number of heads, ``time_tile`` 16 halved until local memory fits
    :data:`~.fused_gpu_matrix_state.LOCAL_BUDGET`."""
    tt = 16
    while tt > 1 and local_bytes("backward", features, tt) > LOCAL_BUDGET:
        tt //= 2
    return {"workgroup_size": columns_per_group(features.V, sizes), "time_tile": tt}


KERNELS.register(FusedKernel("delta_rule", "gpu", ("forward", "backward"), render,
                             lambda part: f"sw_delta_rule_{part if part == 'forward' else 'bwd_deltas'}", plan,
                             defaults=defaults))
