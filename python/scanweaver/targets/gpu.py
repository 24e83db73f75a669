"""GPU kernels from the schedule ops: one renderer for every C-family GPU target.

:class:`GPURenderer` extends :class:`~.cstyle.CStyleRenderer` with the text
every GPU kernel shares (feature and tunable defines, element macros, the
affine pair type, the workgroup scan); targets (:mod:`.opencl`,
:mod:`.cuda`, later HIP) subclass it and override strings only.  Each
schedule's kernels and launch geometry are a :class:`GPUSchedule` found
through :data:`SCHEDULES` (registered by the ``gpu_*`` modules of this
package, :mod:`.gpu_kernels` and :mod:`.gpu_multiblock`).

Kernel contract (every schedule, every GPU target; Kernel Tuner relies on it):

* Arguments, in order: ``in_<operand>...`` (``(lanes, L)`` row-major),
  ``y``, ``h0``, ``hlast``, ``reset`` (uint8), ``nlanes``, ``L`` (64-bit
  ints), then ``ws`` (scratch in the scan dtype) and ``wsi`` (scratch ints);
  buffers a call does not use may be any small allocation.
* Tunables are ``#ifndef``-guarded ``#define`` s of their bare names
  (``workgroup_size``, ``items_per_thread``, ``lanes_per_group``,
  ``tiles_per_block``), so Kernel Tuner's ``#define name value`` overrides
  them; the sequential schedule also reads ``workgroup_size``.
* Launch geometry is :func:`launch_plan`: kernels in launch order with the
  number of workgroups (1-D) and work-items per workgroup, plus the scratch
  sizes (``wsi`` must be zeroed before a plan that says so).  For Kernel
  Tuner: ``block_size_names=["workgroup_size"]``, ``problem_size`` = the
  number of workgroups times the block size, ``grid_div_x=["workgroup_size"]``.

Example:
    >>> import scanweaver
    >>> from scanweaver.targets.gpu import emit_source, launch_plan
    >>> @scanweaver.recurrence
    ... def ema(h, a, x):
    ...     return a * h + x
    >>> stages = ema.lower(backend="numpy", schedule="hybrid")
    >>> "sw_hybrid" in emit_source(stages, "opencl")
    True
    >>> launch_plan("hybrid", stages.schedule.config, lanes=4, L=1000).launches[0].groups
    4
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Callable

from ..errors import ScanInputError
from ..registry import Discovery, Registry
from ..ir import Stages
from .base import TARGETS, source_name
from .cstyle import CStyleRenderer, DenseMixin


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its name, workgroups (1-D grid) and work-items per workgroup."""

    kernel: str
    groups: int
    block: int


@dataclass(frozen=True)
class Plan:
    """The launches of one scan and the scratch they need.

    Attributes:
        launches: kernels in launch order.
        ws: elements of the scan-dtype scratch buffer ``ws``.
        wsi: ints in the scratch buffer ``wsi``.
        zero_wsi: ``wsi`` must be zero when the first kernel starts.
    """

    launches: tuple[Launch, ...]
    ws: int = 0
    wsi: int = 0
    zero_wsi: bool = False


@dataclass(frozen=True)
class GPUSchedule:
    """How one schedule becomes GPU kernels.

    Attributes:
        defines: extra ``#define`` lines (after the tunables) for a config.
        body: kernel text for a renderer and stages.
        plan: launch plan for ``(config, lanes, L)``.
    """

    defines: Callable[[dict], str]
    body: Callable[[GPURenderer, Stages], str]
    plan: Callable[[dict, int, int], Plan]


#: Schedule name -> its GPU kernels (from the ``gpu_*`` modules of this package).
SCHEDULES: Registry[GPUSchedule] = Registry("GPU schedule", (Discovery("scanweaver.targets", ("gpu_*",)),))


def register_target(cls: type[GPURenderer]) -> type[GPURenderer]:
    """Class decorator adding a GPU target renderer to :data:`~scanweaver.targets.TARGETS`."""
    return TARGETS.register(cls)


PAIR = """typedef struct { SW_T a; SW_T u; } sw_pair;
SW_DEVICE sw_pair sw_pair_make(SW_T a, SW_T u) { sw_pair p; p.a = a; p.u = u; return p; }
SW_DEVICE sw_pair sw_identity(void) { return sw_pair_make((SW_T)1, (SW_T)0); }
/* (A2, U2) o (A1, U1) = (A2*A1, A2*U1 + U2): later after earlier.  A zero factor keeps the product zero and a
   zero U1 gives U2 (sw_carry) even where the other side's product has overflowed: inf * 0 would be NaN. */
SW_DEVICE sw_pair sw_compose(sw_pair later, sw_pair earlier) {
  const SW_T a = (later.a == (SW_T)0 || earlier.a == (SW_T)0) ? (SW_T)0 : later.a * earlier.a;
  return sw_pair_make(a, sw_carry(later.a, later.u, earlier.u));
}"""

# Inclusive Hillis-Steele scan in local memory over the SW_TPL work-items of each lane.
LOCAL_SCAN = """SW_DEVICE void sw_group_scan(sw_pair agg, sw_pair* excl, sw_pair* total, SW_LOCAL_PTR sw_pair* sm,
                              const int lid) {
  const int r = lid % SW_TPL;
  sm[lid] = agg;
  SW_BARRIER();
  for (int d = 1; d < SW_TPL; d <<= 1) {
    sw_pair v = sm[lid];
    if (r >= d) v = sw_compose(v, sm[lid - d]);
    SW_BARRIER();
    sm[lid] = v;
    SW_BARRIER();
  }
  *total = sm[lid - r + SW_TPL - 1];
  *excl = r > 0 ? sm[lid - 1] : sw_identity();
  SW_BARRIER();
}"""

# Subgroup (warp) scan with shuffles, then a scan of subgroup totals in local memory.
SHUFFLE_SCAN = """SW_DEVICE void sw_group_scan(sw_pair agg, sw_pair* excl, sw_pair* total, SW_LOCAL_PTR sw_pair* sm,
                              const int lid) {
  const int lw = lid % SW_WARP_W;
  sw_pair inc = agg;
#pragma unroll
  for (int d = 1; d < SW_WARP_W; d <<= 1) {
    const SW_T pa = SW_SHUP(inc.a, d), pu = SW_SHUP(inc.u, d);
    if (lw >= d) inc = sw_compose(inc, sw_pair_make(pa, pu));
  }
  const SW_T ea = SW_SHUP(inc.a, 1), eu = SW_SHUP(inc.u, 1);
  const sw_pair ex = lw > 0 ? sw_pair_make(ea, eu) : sw_identity();
#if SW_TPL > SW_WARP_W
  const int nw = SW_TPL / SW_WARP_W, wi = (lid % SW_TPL) / SW_WARP_W, base = (lid / SW_TPL) * nw;
  if (lw == SW_WARP_W - 1) sm[base + wi] = inc;
  SW_BARRIER();
  sw_pair pre = sw_identity(), acc = sw_identity();
  for (int j = 0; j < nw; ++j) {
    if (j == wi) pre = acc;
    acc = sw_compose(sm[base + j], acc);
  }
  SW_BARRIER();
  *excl = sw_compose(ex, pre);
  *total = acc;
#else
  *excl = ex;
  *total = sw_pair_make(SW_SHIDX(inc.a, SW_WARP_W - 1), SW_SHIDX(inc.u, SW_WARP_W - 1));
#endif
}"""


def dense_sequential_body(r: GPURenderer, stages: Stages) -> str:
    """``sw_sequential`` over dense k x k transitions: one work-item per lane, state in registers."""
    dt = stages.affine.dtype
    pair = "\n".join("    " + line for line in r.dense_element(stages, "i", dt))
    out = r.dense_output(stages, "i", "h", "hp", dt)
    return f"""SW_KERNEL void sw_sequential({r.gpu_params(stages)}) {{
  const sw_index lane = SW_GROUP * SW_WORKGROUP_SIZE + SW_LID;
  if (lane >= nlanes) return;
  const sw_index base = lane * L;
  SW_T h[SW_K], hp[SW_K], A[SW_K * SW_K], U[SW_K];
  for (int q = 0; q < SW_K; ++q) h[q] = SW_HAS_H0 ? h0[lane * SW_K + q] : (SW_T)0;
  for (sw_index s = 0; s < L; ++s) {{
    const sw_index i = SW_IDX(base, s);
{pair}
    for (int q = 0; q < SW_K; ++q) hp[q] = h[q];
    for (int q = 0; q < SW_K; ++q) {{
      SW_T acc = U[q];
      for (int c = 0; c < SW_K; ++c) acc += A[q * SW_K + c] * hp[c];
      h[q] = acc;
    }}
    y[i] = {out};
  }}
  if (SW_RETURN_STATE) for (int q = 0; q < SW_K; ++q) hlast[lane * SW_K + q] = h[q];
}}"""


#: Largest dense state the GPU targets keep in registers.
MAX_DENSE_STATE = 8
#: log2 of the shared-memory banks (32 four-byte banks on NVIDIA and AMD GPUs): ``SW_PAD`` skips one
#: word per bank row so that a warp reading with a stride of a power of two hits distinct banks.
BANKS_LOG2 = 5


class GPURenderer(DenseMixin, CStyleRenderer):
    """The GPU side of the C-family renderer; targets override the strings."""

    #: every GPU target renders the fused operations of the ``gpu`` family (:mod:`.fused`)
    family = "gpu"

    @classmethod
    def implements(cls, schedule: str, kind: str) -> bool:
        """True when ``schedule`` has GPU kernels for ``kind`` transitions (dense: ``sequential`` only)."""
        return schedule in SCHEDULES and (kind == "diagonal" or schedule == "sequential")

    def gpu_macros(self) -> list[str]:
        """Target macros the shared kernel text is written in."""
        bounds = self.launch_bounds.format(n="SW_WORKGROUP_SIZE")
        lines = [
            f"#define SW_KERNEL {self.kernel_prefix} {bounds}".rstrip(),
            f"#define SW_GLOBAL {self.global_prefix}",
            f"#define SW_LOCAL {self.local_prefix}",
            f"#define SW_LOCAL_PTR {self.local_ptr_prefix}",
            f"#define SW_DEVICE {self.device_prefix}",
            f"#define SW_BARRIER() {self.barrier}",
            f"#define SW_LID ((int)({self.code_for_local_id}))",
            f"#define SW_GROUP ((sw_index)({self.code_for_group_id}))",
            f"#define SW_FENCE() {self.global_fence}",
            f"#define SW_TICKET(p) {self.atomic_ticket.format(p='p')}",
            f"#define SW_FLAG_LOAD(p) {self.flag_load.format(p='p')}",
            f"#define SW_FLAG_STORE(p, v) {self.flag_store.format(p='p', v='v')}",
            f"typedef {self.index_type} sw_index;",
            f"typedef {self.u64_type} sw_u64;",
            f"#define SW_WORD_LOAD(p) {self.word_load.format(p='p')}",
            f"#define SW_WORD_STORE(p, v) {self.word_store.format(p='p', v='v')}",
            f"#define SW_F2U(v) {self.float_bits.format(v='v')}",
            f"#define SW_U2F(v) {self.bits_float.format(v='v')}",
            f"/* one padding slot per {1 << BANKS_LOG2} shared-memory words: strided accesses fall in distinct "
            "banks */",
            f"#define SW_PAD(j) ((j) + ((j) >> {BANKS_LOG2}))",
        ]
        if self.warp_size:
            lines += [
                f"#define SW_WARP_W (SW_TPL < {self.warp_size} ? SW_TPL : {self.warp_size})",
                f"#define SW_SHUP(v, d) {self.shuffle_up.format(v='v', d='d', w='SW_WARP_W')}",
                f"#define SW_SHIDX(v, s) {self.shuffle_idx.format(v='v', src='s', w='SW_WARP_W')}",
            ]
        return lines

    def element_macros(self, stages: Stages) -> list[str]:
        """``SW_A(i)``, ``SW_U(i)``, ``SW_Y(i, h, hp)`` and ``SW_IDX(base, s)`` (scan position -> index)."""
        dt = stages.affine.dtype
        A, U = self.element(stages, "(i)", dt)
        Y = self.output(stages, "(i)", "(h)", "(hp)", dt)
        return [
            "#define SW_IDX(base, s) ((base) + (SW_REVERSE ? (L - 1 - (s)) : (s)))",
            f"#define SW_A(i) ({A})",
            f"#define SW_U(i) ({U})",
            f"#define SW_Y(i, h, hp) ({Y})",
        ]

    def gpu_params(self, stages: Stages) -> str:
        """The kernel parameter list: the C-family ABI plus the scratch buffers."""
        T, g = self.ctype(stages.affine.dtype), self.global_prefix
        return ", ".join([*self.params(stages), f"{g}{T}* restrict ws", f"{g}int* restrict wsi"])

    def group_scan(self) -> str:
        """The workgroup scan: subgroup shuffles where the target has them, else local memory."""
        return SHUFFLE_SCAN if self.warp_size else LOCAL_SCAN

    def render(self, stages: Stages) -> str:
        """Complete kernel source for ``stages`` (its schedule chooses the kernels)."""
        if stages.schedule is None:
            raise ScanInputError(f"{self.target} emitter: stages have no schedule; lower with schedule=...")
        spec = SCHEDULES.get(stages.schedule.schedule, None)
        if spec is None:
            raise ScanInputError(f"{self.target} emitter: schedule {stages.schedule.schedule!r} has no GPU kernels; "
                                 f"GPU schedules: {', '.join(SCHEDULES.names())}")
        dense = stages.affine.kind == "dense"
        if dense and (stages.schedule.schedule != "sequential" or stages.affine.state_size > MAX_DENSE_STATE):
            raise ScanInputError(
                f"{self.target} emitter: dense transitions run with schedule 'sequential' and a state of at most "
                f"{MAX_DENSE_STATE}; got schedule {stages.schedule.schedule!r}, state {stages.affine.state_size}"
            )
        features = self.feature_defines(dataclasses.replace(stages, schedule=None))
        if dense:
            features += f"\n#define SW_K {stages.affine.state_size}"
        parts = [
            f"/* scanweaver {self.target} kernels: schedule {stages.schedule.schedule}, "
            f"recurrence {source_name(stages.affine.name)} */",
            self.preamble_for(stages.affine.dtype),
            features,
            self.guarded_tunable_defines(stages),
            spec.defines(stages.schedule.config),
            "\n".join(self.gpu_macros()),
            "" if dense else "\n".join(self.element_macros(stages)),
            "#define SW_IDX(base, s) ((base) + (SW_REVERSE ? (L - 1 - (s)) : (s)))" if dense else "",
            self.helpers(stages.affine.dtype),
            "" if dense else PAIR,
            dense_sequential_body(self, stages) if dense else spec.body(self, stages),
        ]
        return "\n".join(p for p in parts if p) + "\n"

    def preamble_for(self, dtype: str) -> str:
        """Target preamble lines for ``dtype`` (extensions, compatibility macros)."""
        return self.preamble


def emit_source(stages: Stages, target: str) -> str:
    """Kernel source for lowered ``stages`` on GPU ``target`` (``opencl``, ``cuda``); needs no device.

    Args:
        stages: stages lowered with a GPU schedule.
        target: a GPU key of :data:`~scanweaver.targets.TARGETS`.

    Raises:
        ScanInputError: for an unknown target or a schedule without GPU kernels.
    """
    gpu = [name for name, cls in TARGETS.items() if issubclass(cls, GPURenderer)]
    if target not in gpu:
        raise ScanInputError(f"emit_source: unknown GPU target {target!r}; known: {', '.join(gpu)}")
    return TARGETS.get(target)().render(stages)


def launch_plan(schedule: str, config: dict, lanes: int, L: int) -> Plan:
    """Launch geometry and scratch sizes of ``schedule`` for ``lanes`` sequences of length ``L``."""
    if schedule not in SCHEDULES:
        raise ScanInputError(f"launch_plan: schedule {schedule!r} has no GPU kernels; "
                             f"GPU schedules: {', '.join(SCHEDULES.names())}")
    return SCHEDULES[schedule].plan(config, lanes, L)


def kernel_names(schedule: str, config: dict) -> tuple[str, ...]:
    """Kernel function names of ``schedule``, in launch order."""
    return tuple(x.kernel for x in launch_plan(schedule, config, 1, 1).launches)
