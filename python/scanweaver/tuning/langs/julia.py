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
kernel's ``Val`` parameters.  ``hybrid`` (the Python schedule also has
``lanes_per_group``, which the Julia kernel fixes at 1) and the multi-launch
``reduce_then_scan`` are not; the ``device`` keyword is not a tunable but
the device being tuned (``SCANWEAVER_JULIA_DEVICE``, default ``cuda``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...errors import BackendUnavailable
from ..problem import TuneProblem
from ..space import SearchSpace
from .base import KernelSpec, KernelTunerTarget, register

#: Python schedules whose tunables are the Julia kernel's Val parameters, in order.
JULIA_TUNABLE = ("blelloch",)


def julia_device() -> str:
    """The Julia device to tune (``SCANWEAVER_JULIA_DEVICE``, default ``cuda``)."""
    return os.environ.get("SCANWEAVER_JULIA_DEVICE", "cuda")


@register
class JuliaTarget(KernelTunerTarget):
    """ScanWeaver.jl kernels through Kernel Tuner's Julia backend (juliacall)."""

    backend = "julia"
    lang = "julia"
    requires = ("kernel_tuner", "juliacall")
    install = "pip install scanweaver[tune,julia]"
    timing = "Kernel Tuner's Julia observer (device events; host clock on oneAPI/CPU), JIT warm-up excluded"

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
        kt = kernel_tuner_problem(space.schedules[0], problem.dtype, julia_device(), lanes=problem.lanes)
        if tuple(space.params) != tuple(kt["tunable_order"]):
            raise BackendUnavailable(f"tune: julia kernel Val parameters {kt['tunable_order']} do not match the "
                                     f"search space {tuple(space.params)}")
        args = kernel_tuner_arguments(inputs["a"], inputs["b"], inputs["x"], inputs["c"], problem.h0(),
                                      problem.reset(), problem.features.reverse, problem.dtype)
        return KernelSpec(
            lang=self.lang, kernel_name=kt["kernel_name"], kernel_source=kt["kernel_source"],
            problem_size=kt["problem_size"], arguments=args, output=0, define_tunables=False,
            grid_div_x=kt["grid_div_x"], block_size_names=kt["block_size_names"],
            compiler_options=list(kt["compiler_options"]), fingerprint=julia_device(),
        )

    def as_lanes(self, y, problem: TuneProblem) -> np.ndarray:
        return np.asarray(y).reshape(problem.L, problem.lanes, order="F").T

    def answer_layout(self, answer: np.ndarray) -> np.ndarray:
        """The oracle ``y`` as the kernel writes it: ``(L, lanes)`` column-major, raveled in memory order."""
        return np.asfortranarray(answer.T)
