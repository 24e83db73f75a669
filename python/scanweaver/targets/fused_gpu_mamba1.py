"""GPU rendering (OpenCL, CUDA and any :class:`~.gpu.GPURenderer`) of the fused Mamba-1 forward and backward.

The structure of ``mamba_ssm``'s CUDA kernel, written in the C-family
renderer's macros: one workgroup per (batch, channel); the workgroup walks L
in chunks of ``workgroup_size * items_per_thread`` steps, each work-item
holding ``items_per_thread`` consecutive steps in registers (u, dt, dt*u and
the partial y).  For every state n it builds its items' pairs
``(exp(dt*A[d,n]), dt*u*B_t[n])``, and the workgroup scan of ``hybrid``
(:func:`~.gpu.GPURenderer.group_scan`: warp shuffles where the target has
them, local memory otherwise) gives each work-item its prefix within the
chunk; the replay from the chunk's carry-in (one value per n, the same in
every work-item, carried from chunk to chunk) adds ``C_t[n] * h_t[n]`` to
y.  Only u, delta, z, B, C are read and y written.

Kernel (ABI of :meth:`~scanweaver.fused.mamba1.Mamba1.params`, then nothing else)::

    sw_mamba1_forward(u, delta, A, B, C, D, z, delta_bias, h0, reset, y, hlast,
                      batch, dim, L, groups_b, groups_c)    /* sizes are 64-bit ints */

launched as ``batch * dim`` workgroups of ``workgroup_size`` work-items
(:func:`plan`); arrays a call does not use may be any small buffer.  The
backward (:mod:`.mamba1_gpu_backward`) takes the backward ABI and a scratch
buffer ``ws``, and its outputs must be zero when it starts.
"""

from __future__ import annotations

from ..fused import REGISTRY as FUSED
from ..fused.mamba1 import Mamba1Features
from .fused import KERNELS, FusedKernel
from .fused_c_mamba1 import feature_defines
from .gpu import PAIR, Launch, Plan
from .mamba1_gpu_backward import BODY as BACKWARD
from .mamba1_gpu_backward import PRELUDE as BACKWARD_PRELUDE

#: Bytes of private N-state arrays one workgroup may hold (work-items x arrays x N x element size).  PoCL's
#: CPU driver keeps a workgroup's private arrays on one worker thread's stack; measured there at 1024
#: work-items, the forward ran with N = 1024 (4 MiB) and crashed with N = 4096 (16 MiB), the backward
#: crashed with N = 1024 (20 MiB).  GPUs spill such arrays to local memory, also a bounded resource.
PRIVATE_BUDGET = 2 * 2**20
#: Private arrays of N values per work-item: the forward's carry; the backward's carry, G, dA, dB, dC.
PRIVATE_ARRAYS = {"forward": 1, "backward": 5}
#: The smallest workgroup the fused kernels take (the ``workgroup_size`` rule's lower bound).
MIN_WORKGROUP = 32

BODY = r"""
#define SW_IPT SW_ITEMS_PER_THREAD
#define SW_CHUNK ((sw_index)SW_TPL * SW_IPT)

SW_KERNEL void sw_mamba1_forward(@PARAMS@) {
  SW_LOCAL sw_pair sm[SW_WORKGROUP_SIZE];
  const int lid = SW_LID;
  const sw_index ch = SW_GROUP, b = ch / dim, d = ch % dim, row = ch * L;
  SW_GLOBAL const SW_T* Bp = SW_B_FIXED ? B + d * SW_N : B + (b * groups_b + d / (dim / groups_b)) * SW_N * L;
  SW_GLOBAL const SW_T* Cp = SW_C_FIXED ? C + d * SW_N : C + (b * groups_c + d / (dim / groups_c)) * SW_N * L;
  SW_T carry[SW_N];
  for (int n = 0; n < SW_N; ++n) carry[n] = SW_HAS_H0 ? h0[ch * SW_N + n] : (SW_T)0;
  const SW_T Dd = SW_HAS_D ? D[d] : (SW_T)0, bias = SW_HAS_BIAS ? delta_bias[d] : (SW_T)0;
  for (sw_index t0 = 0; t0 < L; t0 += SW_CHUNK) {
    const sw_index s0 = t0 + (sw_index)lid * SW_IPT;
    SW_T dt[SW_IPT], uu[SW_IPT], yacc[SW_IPT];
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {
      const sw_index t = s0 + k;
      SW_T v = (SW_T)0, x = (SW_T)0;
      if (t < L) {
        v = delta[row + t] + bias;
        if (SW_SOFTPLUS) v = sw_softplus(v);
        x = u[row + t];
      }
      dt[k] = v;
      uu[k] = x;
      yacc[k] = (SW_T)0;
    }
    for (int n = 0; n < SW_N; ++n) {
      const SW_T an = A[d * SW_N + n];
      sw_pair e[SW_IPT];
      sw_pair agg = sw_identity();
#pragma unroll
      for (int k = 0; k < SW_IPT; ++k) {
        const sw_index t = s0 + k;
        if (t < L) {
          SW_T a = @EXP@(dt[k] * an);
          if (SW_HAS_RESET && reset[t]) a = (SW_T)0;
          e[k] = sw_pair_make(a, dt[k] * uu[k] * (SW_B_FIXED ? Bp[n] : Bp[n * L + t]));
        } else {
          e[k] = sw_identity();
        }
        agg = sw_compose(e[k], agg);
      }
      sw_pair excl, total;
      sw_group_scan(agg, &excl, &total, sm, lid);
      SW_T hs = sw_carry(excl.a, excl.u, carry[n]);
#pragma unroll
      for (int k = 0; k < SW_IPT; ++k) {
        const sw_index t = s0 + k;
        hs = e[k].a * hs + e[k].u;
        if (t < L) yacc[k] += (SW_C_FIXED ? Cp[n] : Cp[n * L + t]) * hs;
      }
      carry[n] = sw_carry(total.a, total.u, carry[n]);
    }
#pragma unroll
    for (int k = 0; k < SW_IPT; ++k) {
      const sw_index t = s0 + k;
      if (t < L) {
        SW_T v = yacc[k] + Dd * uu[k];
        if (SW_HAS_Z) v *= sw_silu(z[row + t]);
        y[row + t] = v;
      }
    }
  }
  if (lid == 0)
    for (int n = 0; n < SW_N; ++n) hlast[ch * SW_N + n] = carry[n];
}
"""


#: ABI names that are C keywords, and the identifiers kernels use for them (matrix_state's ``do``).
C_NAMES = {"do": "do_"}


def params(r, call) -> str:
    """The kernel's parameter list in the operation's ABI order, in the target's spelling.

    Integer arrays (``int64`` offsets) take the target's index type; names that are C keywords
    are spelled as :data:`C_NAMES` says.
    """
    T, g = r.ctype(call.features.dtype), r.global_prefix
    out = []
    for p in FUSED.get(call.op).params(call.part):
        name = C_NAMES.get(p.name, p.name)
        if p.kind == "int":
            out.append(f"const {r.index_type} {name}")
        else:
            ctype = {"uint8": r.byte_type, "int64": r.index_type}.get(p.dtype, T)
            const = "const " if p.kind == "in" else ""
            out.append(f"{g}{const}{ctype}* restrict {name}")
    return ", ".join(out)


def render(r, call) -> str:
    """Kernel source of ``call`` for the GPU target renderer ``r``."""
    f: Mamba1Features = call.features
    cfg = call.params
    tunables = "\n".join(
        f"#ifndef {name}\n#define {name} {cfg[name]}\n#endif\n#define SW_{name.upper()} ({name})"
        for name in ("workgroup_size", "items_per_thread"))
    text = BODY if call.part == "forward" else BACKWARD
    body = text.replace("@PARAMS@", params(r, call)).replace("@EXP@", r.math_fn("exp", f.dtype))
    parts = [f"/* scanweaver {r.target} fused kernel: mamba1 {call.part}, {f.dtype}, N={f.N} */",
             r.preamble_for(f.dtype), f"#define SW_T {r.ctype(f.dtype)}",
             f"#define SW_DOUBLE {int(f.dtype == 'float64')}", feature_defines(f), tunables,
             "#define SW_TPL SW_WORKGROUP_SIZE", "\n".join(r.gpu_macros()), r.helpers(f.dtype), PAIR,
             r.group_scan(), BACKWARD_PRELUDE if call.part == "backward" else "", body]
    return "\n".join(p for p in parts if p) + "\n"


def plan(call, sizes: dict) -> Plan:
    """``batch * dim`` workgroups of ``workgroup_size`` work-items; the backward's scratch ``ws`` holds a
    checkpoint per chunk and state."""
    cfg = call.params
    wg, chunk = cfg["workgroup_size"], cfg["workgroup_size"] * cfg["items_per_thread"]
    groups = sizes["batch"] * sizes["dim"]
    ws = groups * -(-sizes["L"] // chunk) * call.features.N if call.part == "backward" else 0
    return Plan((Launch(f"sw_mamba1_{call.part}", groups, wg),), ws=ws)


def fits(part: str, features: Mamba1Features, config: dict | None) -> str | None:
    """Why the private arrays of ``part`` exceed :data:`PRIVATE_BUDGET` (``config=None``: at the smallest
    workgroup), else ``None``."""
    wg = MIN_WORKGROUP if config is None else int(config["workgroup_size"])
    item = 8 if features.dtype == "float64" else 4
    need = wg * PRIVATE_ARRAYS[part] * features.N * item
    if need <= PRIVATE_BUDGET:
        return None
    most = PRIVATE_BUDGET // (MIN_WORKGROUP * PRIVATE_ARRAYS[part] * item)
    return (f"the fused GPU {part} kernel keeps {PRIVATE_ARRAYS[part]} array(s) of N = {features.N} {features.dtype} "
            f"states per work-item: {need} bytes for workgroup_size={wg}, over its budget of {PRIVATE_BUDGET}; "
            f"take a smaller workgroup_size (N up to {most} at {MIN_WORKGROUP}), backend='cpu', or fused=False")


KERNELS.register(FusedKernel("mamba1", "gpu", ("forward", "backward"), render, lambda part: f"sw_mamba1_{part}",
                             plan, fits=fits))
