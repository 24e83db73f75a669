"""The ``julia`` backend under Kernel Tuner ``lang="julia"``: ScanWeaver.jl kernels, ``Val`` tunables.

:func:`scanweaver.julia.kernels.kernel_tuner_problem` gives a schedule's
Julia kernel source, entry point, launch geometry and the Kernel Tuner name
of the device; :func:`~scanweaver.julia.kernels.kernel_tuner_arguments` the
arguments (``(L, lanes)`` column-major views, ``y`` first).  Kernel Tuner
passes the tunables to the kernel as ``Val`` arguments in ``tune_params``
order (compile-time constants) and excludes the JIT warm-up launch from the
timings.  The device (Kernel Tuner's ``compiler_options``) is passed
explicitly: Kernel Tuner's own detection can pick oneAPI by mistake on Linux.

Tuned here: ``blelloch``, whose Python tunables are exactly the Julia
kernel's ``Val`` parameters, and the fused Mamba-1 forward (``mamba_scan!``,
``Val(workgroupsize)``, ``Val(chunk)``).  ``hybrid`` (the Python schedule also has
``lanes_per_group``, which the Julia kernel fixes at 1) and the multi-launch
``reduce_then_scan`` are not; the ``device`` keyword is not a tunable but
the device being tuned (``scanweaver tune --device``, else ``SCANWEAVER_JULIA_DEVICE``,
default ``cuda``).  Kernel Tuner's Julia backend wants ``tune_params`` and
``strategy_options`` as lists of pairs (:func:`~scanweaver.tuning.session.kernel_tuner_inputs`)
and hands every scalar argument over as a 0-dimensional array, which the Julia
launchers accept for their flags (``ScanWeaver.launch_flag``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import environment

from ...errors import BackendUnavailable, ScanInputError
from ..problem import TuneProblem
from ..space import SearchSpace
from .base import KernelSpec, KernelTunerTarget, register

#: Python schedules whose tunables are the Julia kernel's Val parameters, in order.
JULIA_TUNABLE = ("blelloch",)


def _julia_exclusive():
    """One Python thread in Julia at a time, Kernel Tuner's calls included
    (:func:`scanweaver.julia.session.exclusive`)."""
    from ...julia import session

    return session.exclusive()


def julia_device() -> str:
    """The Julia device to tune (``SCANWEAVER_JULIA_DEVICE``, default ``cuda``)."""
    return environment.text("SCANWEAVER_JULIA_DEVICE", "cuda")


@register
class JuliaTarget(KernelTunerTarget):
    """ScanWeaver.jl kernels through Kernel Tuner's Julia backend (juliacall)."""

    backend = "julia"
    lang = "julia"
    requires = ("kernel_tuner", "juliacall")
    install = "pip install scanweaver[tune,julia]"
    timing = "Kernel Tuner's Julia observer (device events; host clock on oneAPI/CPU), JIT warm-up excluded"

    device: str | None = None

    def select_device(self, device: str | None) -> None:
        from ...julia.devices import DEVICES

        if device is not None and device not in DEVICES:
            raise ScanInputError(f"tune: unknown julia device {device!r}; known: {', '.join(DEVICES)}")
        self.device = device

    def tuned_device(self) -> str:
        """The device being tuned: the selected one, else ``SCANWEAVER_JULIA_DEVICE``, else ``cuda``."""
        return self.device or julia_device()

    def unavailable(self) -> str | None:
        """Also why the tuned device cannot run here (its package missing, or not functional), so that a tune
        stops before it starts with the device named and what to install, not with Kernel Tuner's own error
        from inside the tune."""
        why = super().unavailable()
        if why is not None:
            return why
        from ...julia import devices

        try:
            devices.activate(self.tuned_device())
        except BackendUnavailable as exc:
            return str(exc)
        return None

    def schedules(self, backend_schedules):
        return tuple(s for s in backend_schedules if s in JULIA_TUNABLE)

    def owners(self, schedules, names):
        return {n: () for n in names}  # ``device`` selects what is tuned; it is not searched

    def kernel(self, problem: TuneProblem, space: SearchSpace, inputs: dict[str, np.ndarray],
               workdir: Path) -> KernelSpec:
        from ...julia.kernels import kernel_tuner_arguments, kernel_tuner_problem

        if problem.recurrence.name != "selective_scan" or len(space.schedules) != 1:
            raise BackendUnavailable("tune: the julia backend tunes the selective scan (with c), "
                                     "one schedule at a time")
        kt = kernel_tuner_problem(space.schedules[0], problem.dtype, self.tuned_device(), lanes=problem.lanes)
        if tuple(space.params) != tuple(kt["tunable_order"]):
            raise BackendUnavailable(f"tune: julia kernel Val parameters {kt['tunable_order']} do not match the "
                                     f"search space {tuple(space.params)}")
        args = kernel_tuner_arguments(inputs["a"], inputs["b"], inputs["x"], inputs["c"], problem.h0(),
                                      problem.reset(), problem.features.reverse, problem.dtype)
        return KernelSpec(
            lang=self.lang, kernel_name=kt["kernel_name"], kernel_source=kt["kernel_source"],
            problem_size=kt["problem_size"], arguments=args, output=0, define_tunables=False,
            grid_div_x=kt["grid_div_x"], block_size_names=kt["block_size_names"],
            compiler_options=list(kt["compiler_options"]), fingerprint=self.tuned_device(),
            exclusive=_julia_exclusive,
        )

    def fused_values(self, given: dict[str, tuple]) -> tuple[dict[str, tuple], dict[str, object]]:
        """The device is chosen, not searched; ``chunk`` 0 ("from the shape") is no ``Val`` a launch can take."""
        from ...fused import REGISTRY as FUSED

        chunks = next(t.values for t in FUSED.get("mamba1").tunables_for("julia") if t.name == "chunk")
        return {"chunk": tuple(c for c in chunks if c > 0), **given}, {"device": self.tuned_device()}

    def fused_kernel(self, problem, space: SearchSpace, inputs: dict[str, np.ndarray], workdir: Path) -> KernelSpec:
        """The fused Mamba-1 forward: ScanWeaver.jl's ``mamba_scan!`` launcher, ``(L, D, batch)`` views."""
        from ...julia.kernels import MAMBA, kernel_tuner_problem, mamba_kernel_tuner_arguments

        if problem.op != "mamba1":
            raise BackendUnavailable(f"tune: the julia backend has no fused {problem.op} kernel")
        if tuple(space.params) != MAMBA.tunables:
            raise BackendUnavailable(f"tune: julia Mamba launcher Val parameters {MAMBA.tunables} do not match "
                                     f"the search space {tuple(space.params)}")
        device = self.tuned_device()
        kt = kernel_tuner_problem("sequential", problem.dtype, device, lanes=problem.lanes)
        return KernelSpec(
            lang=self.lang, kernel_name=MAMBA.entry, kernel_source=f"using KernelAbstractions\nusing ScanWeaver: "
            f"{MAMBA.entry}\n", problem_size=(problem.lanes,), arguments=mamba_kernel_tuner_arguments(
                problem.shape, inputs, problem.dtype, softplus=problem.features.softplus),
            output=0, define_tunables=False, grid_div_x=["workgroup_size"], block_size_names=["workgroup_size"],
            compiler_options=list(kt["compiler_options"]), fingerprint=f"mamba1:{device}",
            exclusive=_julia_exclusive,
        )

    def fused_answer(self, answer: np.ndarray) -> np.ndarray:
        return np.asfortranarray(answer.T)

    def fused_result(self, y, shape: tuple[int, ...]) -> np.ndarray:
        return np.asarray(y).T.reshape(shape)

    def as_lanes(self, y, problem: TuneProblem) -> np.ndarray:
        return np.asarray(y).reshape(problem.L, problem.lanes, order="F").T

    def answer_layout(self, answer: np.ndarray) -> np.ndarray:
        """The oracle ``y`` as the kernel writes it: ``(L, lanes)`` column-major, raveled in memory order."""
        return np.asfortranarray(answer.T)
