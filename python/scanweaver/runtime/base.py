"""The backend interface: one abstract base, implementations found through a registry.

A backend turns lowered :class:`~scanweaver.passes.Stages` into something it
can run (emitting and compiling kernel source where it has a target) and runs
it on prepared :class:`ScanArrays`.  Capabilities are data on the class.
"""

from __future__ import annotations

import contextlib
import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import BackendUnavailable
from ..fused import FusedCall, fused_for
from ..ir import Stages
from ..registry import Discovery, Registry
from ..schedules import Tunable, schedules_for


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run here, and why not.

    Attributes:
        ok: the backend can run.
        reason: why not (empty when ``ok``), with the command that fixes it.
        device: the device it runs on, e.g. ``AMD EPYC 7B13 (2 threads)``.
    """

    ok: bool
    reason: str = ""
    device: str = ""


@dataclass
class DeviceCall:
    """How a call on a caller's device arrays runs and hands its results back.

    Attributes:
        wrap: turns a result in the backend's own array type into the caller's (e.g. a
            PyTorch tensor through DLPack); identity for the backend's own arrays.
        stream: the stream to launch on, in the backend's own type (PyTorch's current
            stream for PyTorch tensors), or ``None`` for the library's current stream.
        out: the caller's ``out=`` object, returned as it is.
    """

    wrap: Callable[[Any], Any]
    stream: Any = None
    out: Any = None

    def context(self) -> contextlib.AbstractContextManager:
        """Makes :attr:`stream` current (where it is a context manager, as CuPy streams are)."""
        return self.stream if self.stream is not None else contextlib.nullcontext()


@dataclass
class ScanArrays:
    """Operands prepared for a backend: 2-D, C-contiguous, one dtype.

    Attributes:
        inputs: operand name -> ``(lanes, L)`` array in ``dtype``.
        h0: initial state ``(lanes,)`` or ``None``.
        reset: ``(lanes, L)`` uint8 mask (1 = a segment starts) or ``None``.
        batch_shape: the leading shape ``(...)`` the caller used.
        dtype: accumulation dtype of the scan (one of the backend's ``dtypes``).
        out_dtype: the dtype ``y`` is returned in (float16/bfloat16 inputs accumulate
            in float32 and come back in their own dtype); ``None`` means ``dtype``.
        out: a caller's ``(lanes, L)`` output buffer in ``dtype`` that a backend may
            write ``y`` into directly (a device array for device operands), or ``None``.
        device: for device operands, how the call runs and returns (see :class:`DeviceCall`).
        layouts: operand name -> ``scalar`` or ``lane`` for operands kept small (read-only
            stride-0 views of one value, or of one value per lane); the others are full arrays.
    """

    inputs: dict[str, np.ndarray]
    h0: np.ndarray | None
    reset: np.ndarray | None
    batch_shape: tuple[int, ...]
    dtype: np.dtype
    out_dtype: np.dtype | None = None
    out: np.ndarray | None = None
    device: DeviceCall | None = None
    layouts: dict[str, str] = field(default_factory=dict)

    def materialised(self) -> ScanArrays:
        """These arrays with every operand full and C-contiguous (for kernels that read no broadcasts)."""
        if not self.layouts:
            return self
        inputs = {n: np.ascontiguousarray(v) if n in self.layouts else v for n, v in self.inputs.items()}
        return dataclasses.replace(self, inputs=inputs, layouts={})

    @property
    def lanes(self) -> int:
        """Number of independent sequences."""
        return math.prod(self.batch_shape)

    @property
    def L(self) -> int:
        """Sequence length."""
        return next(iter(self.inputs.values())).shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes a scan must read and write (inputs, masks, outputs, states)."""
        total = sum(a.nbytes for a in self.inputs.values()) + self.lanes * self.L * self.dtype.itemsize
        if self.reset is not None:
            total += self.reset.nbytes
        return total


@dataclass
class Cotangents:
    """What a backward pass reads beyond the forward's :class:`ScanArrays`, and where it writes.

    Attributes:
        dy: dL/dy, ``(lanes, L)`` in the scan's dtype.
        grads: forward operand name -> a writeable ``(lanes, L)`` buffer for dL/d operand
            (one per name of the adjoint's ``wrt``).
        dh_last: dL/dh_L (the final state's cotangent), ``(lanes,)`` or ``(lanes, k)``, or ``None``.
        states: the forward's states h_t in time order when it saved them, else ``None``.
        dh0: a writeable buffer for dL/dh0, shaped like h0, or ``None``.
    """

    dy: np.ndarray
    grads: dict[str, np.ndarray]
    dh_last: np.ndarray | None = None
    states: np.ndarray | None = None
    dh0: np.ndarray | None = None


class _TargetSchedules:
    """``Backend.schedules``: the schedules that list the backend's target, read from the registry."""

    def __get__(self, obj: object, owner: type) -> tuple[str, ...]:
        return schedules_for(owner.target)


class _TargetFused:
    """``Backend.fused``: the fused operations the backend's target renders, read from the registry."""

    def __get__(self, obj: object, owner: type) -> tuple[str, ...]:
        return fused_for(owner.target)


class Backend(ABC):
    """A runtime backend.

    Class attributes:
        name: the ``backend=`` keyword value.
        target: the target it runs (a key of :data:`scanweaver.targets.TARGETS`; ``numpy`` is
            the interpreter).
        schedules: schedules it can run: those whose ``implementations`` list its target
            (derived, never written by hand).
        fused: fused operations (:mod:`scanweaver.fused`) it runs: those whose
            ``implementations`` list its target (derived as well).
        extra_tunables: backend tunables beyond the schedule's (e.g. ``threads``).
        auto_priority: preference for ``backend="auto"``; higher wins, negative never.
        dtypes: accumulation dtypes it runs (float16/bfloat16 are widened to float32
            before a backend sees them).
    """

    name: ClassVar[str]
    target: ClassVar[str]
    extra_tunables: ClassVar[tuple[Tunable, ...]] = ()
    schedules: ClassVar[tuple[str, ...]] = _TargetSchedules()  # type: ignore[assignment]
    fused: ClassVar[tuple[str, ...]] = _TargetFused()  # type: ignore[assignment]
    auto_priority: ClassVar[int] = -1
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float64")
    #: kernels read scalar and per-lane operands in place (:attr:`ScanArrays.layouts`); else they are materialised
    broadcast_operands: ClassVar[bool] = False
    #: top-level modules whose array types this backend takes without copies (``cupy`` for ``cuda``)
    array_modules: ClassVar[tuple[str, ...]] = ()
    #: transition kinds it runs (``dense``: k x k matrices, see :class:`~scanweaver.ir.stages.AffineScanIR`)
    kinds: ClassVar[tuple[str, ...]] = ("diagonal",)

    @classmethod
    @abstractmethod
    def probe(cls) -> Availability:
        """Checks, without side effects on failure, whether the backend can run."""

    @classmethod
    def availability(cls) -> Availability:
        """:meth:`probe`, cached for the process."""
        return _cached_probe(cls)

    def details(self) -> dict[str, object]:
        """Facts worth showing in ``scanweaver devices`` (compiler flags, measured cut-offs ...)."""
        return {}

    def default_schedule(self, lanes: int, L: int) -> str:
        """The schedule used when the caller and the tuned store give none."""
        return self.schedules[0]

    def default_schedule_for(self, kind: str, lanes: int, L: int, tunables: Mapping[str, object] | None = None) -> str:
        """The default schedule for a transition ``kind`` (``diagonal`` or ``dense``); ``tunables`` are the
        caller's (a backend whose best schedule depends on one, such as ``julia``'s ``device``, reads it)."""
        return self.default_schedule(lanes, L)

    def default_config(self, schedule: str, lanes: int, L: int, dtype: str) -> dict[str, object]:
        """Documented defaults for the tunables of ``schedule`` on this backend."""
        return {}

    def emit(self, stages: Stages) -> Stages:
        """Returns ``stages`` with the kernel source filled in (the interpreter has none)."""
        return stages

    @abstractmethod
    def run(self, stages: Stages, arrays: ScanArrays) -> tuple[np.ndarray, np.ndarray]:
        """Runs the lowered scan; returns ``y (lanes, L)`` and ``h_last (lanes,)``."""

    def fused_defaults(self, op: str, features: object, sizes: dict[str, int]) -> dict[str, object]:
        """Documented defaults of a fused operation's tunables on this backend (beyond the declared ones)."""
        return {}

    def run_fused(self, call: FusedCall, arrays: dict[str, object], sizes: dict[str, int]) -> None:
        """Runs one part of a fused operation, writing its ``out`` arrays in place.

        Args:
            call: the operation, part, features and resolved tunables.
            arrays: parameter name -> array (``None`` for NULL), in the backend's array type.
            sizes: the operation's ``int`` parameters.

        Raises:
            BackendUnavailable: the backend has no rendering of this operation.
        """
        raise BackendUnavailable(f"backend {self.name!r} does not run the fused {call.op} kernel "
                                 f"(it runs: {', '.join(self.fused) or 'none'})")

    def backward(self, adjoint, arrays: ScanArrays, cot: Cotangents) -> None:
        """Runs stage ``adjoint`` (:class:`~scanweaver.ir.adjoint.AdjointIR`) of a scan this backend ran.

        Fills ``cot.grads`` and ``cot.dh0``.  The default composes the backend's
        own scans (:func:`scanweaver.runtime.adjoint.generic_backward`); a
        backend with a fused backward kernel overrides it.
        """
        from .adjoint import generic_backward

        generic_backward(self, adjoint, arrays, cot)


@functools.cache
def _cached_probe(cls: type[Backend]) -> Availability:
    try:
        return cls.probe()
    except Exception as exc:  # a probe must never take the caller down
        return Availability(False, f"probe failed: {type(exc).__name__}: {exc}")


#: Backend name -> class.  Backends live in modules named ``*_backend`` in this package
#: (and ``scanweaver.julia.backend``); they are imported on the first lookup.
REGISTRY: Registry[type[Backend]] = Registry(
    "backend",
    (Discovery("scanweaver.runtime", ("*_backend",)), Discovery("scanweaver.julia", ("backend",))),
    describe="or 'auto'",
)


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator adding a backend to :data:`REGISTRY`."""
    REGISTRY.add(cls.name, cls)
    return cls


_instances: dict[str, Backend] = {}


def get_backend(name: str, require_available: bool = True) -> Backend:
    """The backend ``name``, or :class:`BackendUnavailable` saying why it cannot run.

    With ``require_available=False`` an instance is returned even where the
    backend cannot run, for emitting kernel source without a device.

    Raises:
        UnknownPluginError: for a name no backend has (the message lists them).
    """
    cls = REGISTRY.get(name)
    avail = cls.availability()
    if not avail.ok and require_available:
        raise BackendUnavailable(f"backend {name!r} is unavailable: {avail.reason}")
    if name not in _instances:
        _instances[name] = cls()
    return _instances[name]
