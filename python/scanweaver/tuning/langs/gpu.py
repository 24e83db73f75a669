"""What the GPU targets (``opencl``, ``cuda``) share under Kernel Tuner.

Kernel Tuner times one kernel launch per configuration and does not reset
buffers between its timed runs, so only schedules whose launch plan is a
single kernel that needs no zeroed scratch can be tuned (``sequential``,
``blelloch``, ``hybrid`` today; ``reduce_then_scan`` launches three kernels
and ``lookback`` needs zeroed tickets).  The schedule family is a tunable
over those: the kernel source is generated per configuration, and each
schedule's entry point is renamed to one name (``sw_tuned``) with a
``#define`` so Kernel Tuner launches the same name throughout.  Tunables a
schedule does not own are ``#undef``-ed, so its kernels use their own
defaults exactly as at run time.  Launch geometry is the schedule's
:func:`~scanweaver.targets.gpu.launch_plan`: ``problem_size`` = workgroups x
work-items, ``grid_div_x = ["workgroup_size"]``.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from ...passes import lower
from ..problem import TuneProblem
from ..space import SearchSpace
from .base import KernelSpec, KernelTunerTarget, abi_arguments

KERNEL_NAME = "sw_tuned"


def single_launch(schedule: str, lanes: int = 4, L: int = 1000) -> bool:
    """True when ``schedule``'s GPU plan is one kernel that needs no zeroed scratch."""
    from ...schedules import get_schedule
    from ...targets.gpu import SCHEDULES, launch_plan

    if schedule not in SCHEDULES:
        return False
    plan = launch_plan(schedule, get_schedule(schedule).defaults(), lanes, L)
    return len(plan.launches) == 1 and not plan.zero_wsi


class GPUTarget(KernelTunerTarget):
    """A C-family GPU backend (subclasses give ``lang``, the emitter target and device limits)."""

    #: emitter target of :func:`scanweaver.targets.gpu.emit_source`
    emitter: str = ""

    def schedules(self, backend_schedules):
        return tuple(s for s in backend_schedules if single_launch(s))

    def pins(self, schedules):
        """``sequential`` runs ``SEQUENTIAL_WORKGROUP`` work-items per group; launch it so."""
        from ...targets.gpu_kernels import SEQUENTIAL_WORKGROUP

        return {"workgroup_size": SEQUENTIAL_WORKGROUP}

    def kernel(self, problem: TuneProblem, space: SearchSpace, inputs: dict[str, np.ndarray],
               workdir: Path) -> KernelSpec:
        from ...runtime import REGISTRY
        from ...targets.gpu import emit_source, launch_plan

        extra = REGISTRY[problem.backend].extra_tunables
        scan = problem.recurrence.scan_ir(problem.dtype, problem.features)

        def split(p: dict) -> tuple[str, dict]:
            return space.split({k: p[k] for k in space.params})

        @functools.cache
        def source_of(sched: str, cfg: tuple) -> str:
            stages = lower(scan, sched, dict(cfg), extra)
            text = emit_source(stages, self.emitter)
            entry = launch_plan(sched, stages.schedule.config, problem.lanes, problem.L).launches[0].kernel
            undef = "".join(f"#undef {n}\n" for n, owners in space.owners.items() if sched not in owners)
            return f"{undef}#define {entry} {KERNEL_NAME}\n{text}"

        def source(p: dict) -> str:
            sched, cfg = split(p)
            return source_of(sched, tuple(sorted(cfg.items())))

        def size(p: dict) -> int:
            sched, cfg = split(p)
            full = lower(scan, sched, cfg, extra).schedule.config
            launch = launch_plan(sched, full, problem.lanes, problem.L).launches[0]
            return launch.groups * launch.block

        fp = hashlib.sha256("\0".join(source_of(s, tuple(sorted(space.split(space.join(s, {}))[1].items())))
                                      for s in space.schedules).encode()).hexdigest()[:12]
        plans = [launch_plan(*split(p), problem.lanes, problem.L) for p in space.configs()]
        args = abi_arguments(problem, inputs)
        args += [np.zeros(max([1, *(pl.ws for pl in plans)]), problem.dtype),
                 np.zeros(max([1, *(pl.wsi for pl in plans)]), np.int32)]
        has_wg = "workgroup_size" in space.params
        return KernelSpec(
            lang=self.lang, kernel_name=KERNEL_NAME, kernel_source=source, problem_size=size, arguments=args,
            output=len(problem.stages.affine.inputs), grid_div_x=["workgroup_size"] if has_wg else None,
            block_size_names=["workgroup_size"] if has_wg else None, fingerprint=fp,
        )

    def fused_values(self, given: dict[str, tuple]) -> tuple[dict[str, tuple], dict[str, object]]:
        """Kernel Tuner times one kernel: the recurrent forward's.  The chunked form (four launches and a
        scratch buffer) is not searched: ``algorithm`` stays ``recurrent`` (``chunk`` then shapes nothing)."""
        return given, {"algorithm": "recurrent", "chunk": 64}

    def fused_kernel(self, problem, space: SearchSpace, inputs: dict[str, np.ndarray], workdir: Path) -> KernelSpec:
        """A fused operation's forward (:mod:`scanweaver.tuning.fused`): one kernel, as many workgroups of
        ``workgroup_size`` work-items as the rendering's plan launches, the source rendered per configuration."""
        from ...fused import REGISTRY as FUSED
        from ...targets import TARGETS
        from ...targets.fused import kernel_for
        from ..fused import fused_arguments

        op, kernel = FUSED.get(problem.op), kernel_for(self.emitter, problem.op)
        renderer = TARGETS.get(self.emitter)()

        def source(p: dict) -> str:
            cfg = {k: p[k] for k in space.params}
            return kernel.render(renderer, op.call("forward", problem.features, cfg))

        fp = hashlib.sha256(source({k: v[0] for k, v in space.params.items()}).encode()).hexdigest()[:12]
        args, out = fused_arguments(problem, inputs)
        def size(p: dict) -> int:  # work-items of the forward's one launch
            cfg = {k: p[k] for k in space.params}
            launch = kernel.plan(op.call("forward", problem.features, cfg), problem.sizes).launches[0]
            return launch.groups * launch.block

        return KernelSpec(lang=self.lang, kernel_name=kernel.entry("forward"), kernel_source=source,
                          problem_size=size, arguments=args, output=out,
                          grid_div_x=["workgroup_size"], block_size_names=["workgroup_size"], fingerprint=fp)
