"""How one backend's kernels are handed to Kernel Tuner: one abstract base, one file per backend.

A :class:`KernelTunerTarget` knows the Kernel Tuner ``lang`` of its backend,
which schedule families can be timed as one Kernel Tuner kernel, the
device limits that shape the search space, and how to build the kernel
source, arguments and launch geometry (:class:`KernelSpec`).  Targets are
found through :data:`TARGETS`, keyed by backend name: every module of this
package but ``base`` and ``gpu`` (shared by the GPU targets) defines one.
"""

from __future__ import annotations

import contextlib
import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from ...errors import ScanInputError
from ...registry import Discovery, Registry
from ..problem import TuneProblem
from ..space import Limits, SearchSpace


@dataclass
class KernelSpec:
    """Everything ``kernel_tuner.tune_kernel`` needs besides the search space.

    Attributes:
        lang: Kernel Tuner language (``C``, ``OpenCL``, ``cupy``, ``julia``).
        kernel_name: the entry point Kernel Tuner calls or launches.
        kernel_source: source text, a file path, or a callable ``params -> source``.
        problem_size: Kernel Tuner ``problem_size`` (launch geometry).
        arguments: kernel arguments, NumPy arrays and scalars in ABI order.
        output: index of ``y`` in ``arguments`` (checked against the oracle).
        defines: extra preprocessor defines: name -> value or ``params -> value``.
        define_tunables: pass the numeric tunables as ``#define name value``.
        grid_div_x, grid_div_y: Kernel Tuner grid divisors.
        block_size_names: tunables that give the work-group shape.
        compiler, compiler_options: compiler and flags (``lang="C"``; Julia backend for Julia).
        device_options: further ``tune_kernel`` keywords selecting the device (``platform=``, ``device=``).
        fingerprint: text that changes whenever the generated kernels change
            (part of the Kernel Tuner cache file name).
        exclusive: a context manager factory held around the whole tune (the julia backend's
            one-thread-in-Julia lock: Kernel Tuner calls Julia itself).
    """

    lang: str
    kernel_name: str
    kernel_source: object
    problem_size: object
    arguments: list
    output: int
    defines: dict[str, object] = field(default_factory=dict)
    define_tunables: bool = True
    grid_div_x: list | None = None
    grid_div_y: list | None = None
    block_size_names: list | None = None
    compiler: str | None = None
    compiler_options: list | None = None
    device_options: dict = field(default_factory=dict)
    fingerprint: str = ""
    exclusive: Callable[[], AbstractContextManager] = contextlib.nullcontext


class KernelTunerTarget(ABC):
    """A backend as Kernel Tuner sees it.

    Class attributes:
        backend: the ScanWeaver backend name.
        lang: the Kernel Tuner ``lang``.
        requires: Python modules Kernel Tuner needs for ``lang``.
        install: the command that installs them.
        timing: how a configuration is timed, in words (reports and docs).
    """

    backend: ClassVar[str]
    lang: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    install: ClassVar[str] = "pip install scanweaver[tune]"
    timing: ClassVar[str] = ""

    def unavailable(self) -> str | None:
        """Why this backend cannot be tuned here, or ``None``."""
        from ...runtime import REGISTRY

        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            return f"Python module(s) {', '.join(missing)} not installed ({self.install})"
        cls = REGISTRY.get(self.backend, None)
        if cls is None:
            return f"backend {self.backend!r} is not part of this installation"
        avail = cls.availability()
        return None if avail.ok else avail.reason

    def schedules(self, backend_schedules: tuple[str, ...]) -> tuple[str, ...]:
        """The schedule families Kernel Tuner can time as one kernel (default: all)."""
        return tuple(backend_schedules)

    def owners(self, schedules: tuple[str, ...], names: list[str]) -> dict[str, tuple[str, ...]]:
        """Backend tunable name -> the schedules whose kernels read it (default: all of them)."""
        return {n: tuple(schedules) for n in names}

    def pins(self, schedules: tuple[str, ...]) -> dict[str, object]:
        """Values tunables keep under schedules that do not own them (see :func:`build_space`)."""
        return {}

    def limits(self, problem: TuneProblem) -> Limits:
        """Problem and device limits for :func:`~scanweaver.tuning.space.build_space`."""
        return Limits(lanes=problem.lanes, L=problem.L, dtype=problem.dtype)

    def as_lanes(self, y, problem: TuneProblem) -> np.ndarray:
        """The kernel's ``y`` argument as read back, viewed as ``(lanes, L)``."""
        return np.asarray(y).reshape(problem.lanes, problem.L)

    def answer_layout(self, answer: np.ndarray) -> np.ndarray:
        """The oracle ``y`` ``(lanes, L)`` laid out like the kernel's ``y`` argument."""
        return answer.ravel()

    def device_options(self) -> dict:
        """Extra ``tune_kernel`` keywords that select the runtime's device (``platform=``, ``device=``)."""
        return {}

    def select_device(self, device: str | None) -> None:
        """Tunes on ``device`` (``scanweaver tune --device``); backends without a device choice refuse one."""
        if device is not None:
            raise ScanInputError(f"tune: backend {self.backend!r} has no device choice (got device={device!r}); "
                                 "--device selects the julia backend's KernelAbstractions device")

    def fused_values(self, given: dict[str, tuple]) -> tuple[dict[str, tuple], dict[str, object]]:
        """A fused operation's candidate values this target narrows (``given`` wins), and tunables it fixes
        itself instead of searching them (name -> value)."""
        return given, {}

    def fused_answer(self, answer: np.ndarray) -> np.ndarray:
        """The oracle ``y`` of a fused operation laid out like the kernel's ``y`` argument."""
        return answer.ravel()

    def fused_result(self, y, shape: tuple[int, ...]) -> np.ndarray:
        """The kernel's ``y`` argument as read back, in the oracle's ``shape``."""
        return np.asarray(y).reshape(shape)

    @abstractmethod
    def kernel(self, problem: TuneProblem, space: SearchSpace, inputs: dict[str, np.ndarray],
               workdir: Path) -> KernelSpec:
        """The kernel, arguments and geometry for ``space`` on ``inputs`` (needs no device)."""


def abi_arguments(problem: TuneProblem, inputs: dict[str, np.ndarray], index_type=np.int64) -> list:
    """Arguments in the C-family kernel ABI: ``in_<name>..., y, h0, hlast, reset, nlanes, L``.

    Optional buffers are full-sized even when their feature is off (zeros), so
    a kernel that touches one anyway can never write past an allocation.
    """
    dt = np.dtype(problem.dtype)
    lanes, L = problem.lanes, problem.L
    h0 = problem.h0()
    reset = problem.reset()
    return [
        *(np.ascontiguousarray(inputs[n]).ravel() for n in problem.stages.affine.inputs),
        np.zeros(lanes * L, dt),
        h0 if h0 is not None else np.zeros(lanes, dt),
        np.zeros(lanes, dt),
        reset.ravel() if reset is not None else np.zeros(lanes * L, np.uint8),
        index_type(lanes),
        index_type(L),
    ]


#: Backend name -> its Kernel Tuner target class.
TARGETS: Registry[type[KernelTunerTarget]] = Registry(
    "Kernel Tuner target", (Discovery("scanweaver.tuning.langs", exclude=("base", "gpu")),), key="backend")


def register(cls: type[KernelTunerTarget]) -> type[KernelTunerTarget]:
    """Class decorator adding a target to :data:`TARGETS`."""
    return TARGETS.register(cls)


def get_target(backend: str) -> KernelTunerTarget:
    """The Kernel Tuner target of ``backend``, or a clear error naming the tunable backends."""
    cls = TARGETS.get(backend, None)
    if cls is None:
        raise ScanInputError(f"tune: backend {backend!r} cannot be tuned; tunable backends: "
                             f"{', '.join(TARGETS.names())}")
    return cls()
