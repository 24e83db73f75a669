"""The ``cpu`` backend under Kernel Tuner ``lang="C"``.

Each schedule's C unit is rendered with ``kernel_tuner=True`` (its tunables
read Kernel Tuner's bare-name ``#define`` s, and ``sw_scan_timed`` runs the
whole scan, every phase of the schedule, and returns its own time in ms).
The units are written as ``.c`` files next to Kernel Tuner's cache; the
kernel Kernel Tuner compiles is a small ``.c`` dispatcher that includes the
unit of the configuration's schedule (``sw_schedule_index``), so the schedule
family is a tunable and the code is compiled as C by the same compiler and
flags the runtime uses (:mod:`scanweaver.runtime.toolchain`: ``-O3``,
``-march=native``, ``-fopenmp`` when accepted), given to Kernel Tuner
explicitly since it adds no optimisation flags of its own.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ...passes import lower
from ..problem import TuneProblem
from ..space import SearchSpace
from .base import KernelSpec, KernelTunerTarget, abi_arguments, register

#: The dispatcher Kernel Tuner compiles.  Its comment names two things on purpose, because Kernel
#: Tuner looks for them as text in the kernel it is given: ``extern "C"`` (without it, a ``.c`` kernel
#: is wrapped in ``extern "C" {``, which is C++ only; the units declare it themselves), and
#: ``#pragma omp`` (with it, Kernel Tuner never unloads the library: unloading an OpenMP library
#: crashes the process).
DISPATCH_HEAD = ('/* scanweaver tuning dispatcher: the included units declare extern "C" for C++ '
                 'and use OpenMP (#pragma omp). */\n')


@register
class CTarget(KernelTunerTarget):
    """Emitted C, timed by its own ``sw_scan_timed`` (Kernel Tuner's C convention)."""

    backend = "cpu"
    lang = "C"
    requires = ("kernel_tuner",)
    timing = "host clock inside the C function (omp_get_wtime), median of repeated calls"

    def schedules(self, backend_schedules):
        from ...targets.c_source import C_SCHEDULES

        return tuple(s for s in backend_schedules if s in C_SCHEDULES)

    def owners(self, schedules: tuple[str, ...], names: list[str]) -> dict[str, tuple[str, ...]]:
        """Backend tunable name -> schedules whose C body reads it."""
        from ...targets.c_source import C_SCHEDULES

        return {n: tuple(s for s in schedules if n in C_SCHEDULES[s].reads) for n in names}

    def compiler(self) -> tuple[str, list[str]]:
        """The runtime's compiler and flags, as Kernel Tuner's ``compiler``/``compiler_options``."""
        from ...runtime.toolchain import find_toolchain

        tc = find_toolchain()
        libs = [f for f in tc.flags if f.startswith(("-l", "-L"))]  # e.g. Homebrew's libomp on macOS
        return tc.command[0], [*tc.command[1:], *tc.compile_flags, *libs, "-lm"]

    def kernel(self, problem: TuneProblem, space: SearchSpace, inputs: dict[str, np.ndarray],
               workdir: Path) -> KernelSpec:
        from ...runtime import get_backend
        from ...targets.c_target import CRenderer

        be = get_backend(problem.backend)
        scan = problem.recurrence.scan_ir(problem.dtype, problem.features)
        units = {}
        for sched in space.schedules:
            cfg = space.split(space.join(sched, {}))[1]
            stages = lower(scan, sched, cfg, be.extra_tunables)
            units[sched] = CRenderer().render(stages, kernel_tuner=True)
        dispatch, digest, compiler, options = self._dispatcher(
            workdir / "src-", {f"{sched}.c": text for sched, text in units.items()}, "sw_schedule_index",
            list(range(len(units))))
        order = list(units)
        return KernelSpec(
            lang=self.lang, kernel_name="sw_scan_timed", kernel_source=str(dispatch), problem_size=problem.lanes,
            arguments=abi_arguments(problem, inputs), output=len(problem.stages.affine.inputs),
            defines={"sw_schedule_index": lambda p: order.index(space.schedule_of(p))},
            compiler=compiler, compiler_options=options, fingerprint=digest,
        )

    def _dispatcher(self, prefix: Path, units: dict[str, str], macro: str, values: list):
        """Writes the C ``units`` (file name -> text) into a folder named by ``prefix`` and their digest, and a
        ``dispatch.c`` including the unit whose value of ``macro`` (a Kernel Tuner tunable) is in ``values``.

        Returns:
            ``(dispatch.c, digest, compiler, options)``.
        """
        compiler, options = self.compiler()
        digest = hashlib.sha256("\0".join([*units.values(), compiler, *options]).encode()).hexdigest()[:12]
        src = prefix.with_name(prefix.name + digest)
        src.mkdir(parents=True, exist_ok=True)
        lines = [DISPATCH_HEAD]
        for i, ((name, text), value) in enumerate(zip(units.items(), values, strict=True)):
            unit = src / name
            if not unit.exists() or unit.read_text() != text:
                unit.write_text(text)
            lines.append(f"#{'if' if i == 0 else 'elif'} {macro} == {value}\n#include \"{unit}\"")
        lines.append(f"#else\n#error unknown {macro}\n#endif\n")
        dispatch = src / "dispatch.c"
        dispatch.write_text("\n".join(lines))
        return dispatch, digest, compiler, options

    def fused_kernel(self, problem, space: SearchSpace, inputs: dict[str, np.ndarray], workdir: Path) -> KernelSpec:
        """A fused operation's forward (:mod:`scanweaver.tuning.fused`): one C unit per ``width`` (it shapes the
        generated vector code), a dispatcher on ``width``, and the unit's ``*_timed`` entry point."""
        from ...fused import REGISTRY as FUSED
        from ...targets.fused import kernel_for
        from ..fused import fused_arguments

        op, kernel = FUSED.get(problem.op), kernel_for("c", problem.op)
        units = {}
        for width in space.params["width"]:
            cfg = {**space.pinned, "width": width}
            units[width] = kernel.render(None, op.call("forward", problem.features, cfg), kernel_tuner=True)
        dispatch, digest, compiler, options = self._dispatcher(
            workdir / f"src-{problem.op}-", {f"width{width}.c": text for width, text in units.items()}, "width",
            list(units))
        args, out = fused_arguments(problem, inputs)
        return KernelSpec(lang=self.lang, kernel_name=f"{kernel.entry('forward')}_timed", kernel_source=str(dispatch),
                          problem_size=problem.lanes, arguments=args, output=out, compiler=compiler,
                          compiler_options=options, fingerprint=digest)
