"""Fused operations: whole computations around a scan, compiled as one kernel per part.

A schedule (:mod:`scanweaver.schedules`) splits any affine scan into parallel
work; a *fused operation* is one fixed computation (Mamba-1's selective scan:
the gate, the input, the scan, the contraction with C, the skip and the
output gate) rendered as one kernel per *part* (``forward``, ``backward``),
so that nothing but the operation's inputs and outputs ever touches memory.

One :class:`FusedOp` subclass per operation, one module per operation in this
package, found through :data:`REGISTRY`.  An operation is declared once: its
kernel parameters per part (:class:`Param`, the ABI every target renders),
its tunables per target family, and ``implementations``, the targets that
render each part.  Renderings live in ``scanweaver/targets/fused_*.py`` and
backends run them (:meth:`scanweaver.runtime.base.Backend.run_fused`);
``test/test_registry.py`` checks ``implementations`` against the renderings
both ways, as it does for schedules.

Example:
    >>> from scanweaver.fused import REGISTRY
    >>> op = REGISTRY.get("mamba1")
    >>> [p.name for p in op.params("forward")][:3], op.runs_on("c", "backward")
    (['u', 'delta', 'A'], True)
"""

from __future__ import annotations

import dataclasses
import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import ScanInputError
from ..registry import Discovery, Registry
from ..schedules.base import Tunable, resolve_tunables

#: The parts a fused operation may have.
PARTS = ("forward", "backward")


@dataclass(frozen=True)
class Param:
    """One kernel parameter, in ABI order.

    Attributes:
        name: the argument's name (the same in every target's kernel).
        kind: ``in`` (read), ``out`` (written, every element), or ``int`` (a 64-bit size).
        optional: may be NULL: an input that a feature of the call switches on, or an
            output the caller need not ask for.
        dtype: the element type when it is not the call's dtype (``uint8`` masks).
    """

    name: str
    kind: str
    optional: bool = False
    dtype: str = ""


@dataclass(frozen=True)
class FusedCall:
    """One compiled variant of a fused operation: hashable, so it keys kernel caches.

    Attributes:
        op: the operation's name.
        part: ``forward`` or ``backward``.
        features: the operation's compile-time features (a frozen dataclass of the op).
        config: tunable name -> value, as ``(name, value)`` pairs sorted by name.
    """

    op: str
    part: str
    features: Any
    config: tuple[tuple[str, object], ...]

    @property
    def params(self) -> dict[str, object]:
        """The tunables as a dict."""
        return dict(self.config)


class FusedOp(ABC):
    """A fused operation: its ABI per part, its tunables per target family and where it is rendered.

    Class attributes:
        name: registry key (``mamba1``).
        description: one line for listings.
        parts: the parts it has (a subset of :data:`PARTS`).
        tunables: target family (``c``, ``gpu``) -> typed tunables; the same names are
            keyword arguments of the public entry point and Kernel Tuner search-space keys.
        implementations: target name -> the parts that target renders, e.g.
            ``{"numpy": PARTS, "c": PARTS, "opencl": ("forward",)}``.
        chunked_from: the algorithm rule of :meth:`algorithm` (where measured -> part -> thresholds).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    parts: ClassVar[tuple[str, ...]] = PARTS
    tunables: ClassVar[dict[str, tuple[Tunable, ...]]] = {}
    implementations: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: Where it was measured (a target, ``c`` or ``cuda``, or a target family) -> part -> ``((steps, state),
    #: ...)``: the chunked form is the default of ``part`` on those kernels (where they have one, an
    #: ``algorithm`` tunable with a ``chunked`` value) when some entry holds: at least ``steps`` steps per
    #: sequence and ``K * V >= state``, and, for an entry ``(steps, state, condition)``, the named shape
    #: condition of :meth:`condition`.  Kernels and parts not named keep the tunable's declared default (a rule
    #: measured on CUDA says nothing of OpenCL on a CPU).  Operations set their own from measurements.
    chunked_from: ClassVar[dict[str, dict[str, tuple[tuple[Any, ...], ...]]]] = {}
    #: Family -> the parts whose kernels have the chunked form, where only some do: the family's other parts run
    #: the recurrence whatever ``algorithm`` says, and their config says so (:meth:`settle`).
    chunked_parts: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: Tunables only the backward reads: a tune (which measures the forward) leaves them at their defaults.
    backward_only: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def params(self, part: str) -> tuple[Param, ...]:
        """The kernel parameters of ``part``, in ABI order (pointers, then ``int`` sizes)."""

    @abstractmethod
    def shapes(self, part: str, features: Any, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
        """Array parameter name -> its shape for ``features`` and the ``int`` parameters ``sizes``."""

    @abstractmethod
    def reference(self, part: str, features: Any, arrays: dict[str, Any], sizes: dict[str, int]) -> None:
        """Runs ``part`` in NumPy (the ``numpy`` target), writing the ``out`` arrays in place."""

    def enabled(self, name: str, features: Any) -> bool:
        """True when parameter ``name`` is used by a kernel with ``features`` (else it is passed as NULL)."""
        return True

    def arguments(self, part: str, features: Any, arrays: dict[str, Any], sizes: dict[str, int],
                  api: str) -> list:
        """The kernel arguments of ``part`` in ABI order, every array checked against the ABI.

        Arrays are NumPy arrays (``None`` for NULL), or for a GPU backend its own device arrays
        (``__cuda_array_interface__``: checked by their attributes); ``int`` parameters come from ``sizes``.
        Checked before any kernel sees a pointer: the dtype (``features.dtype``, or the
        parameter's own), the shape from :meth:`shapes`, C-contiguity and alignment, and that
        every input a feature switches on is given.

        Raises:
            ScanInputError: naming the parameter, what it got and what it needs.
        """
        out: list = []
        for p, enabled, shape, want in self.layout(part, features, tuple(sorted(sizes.items()))):
            if p.kind == "int":
                out.append(int(sizes[p.name]))
                continue
            arr = arrays.get(p.name)
            if not enabled:
                out.append(None)
                continue
            if arr is None:
                if p.kind == "in" or not p.optional:
                    raise ScanInputError(f"{api}: the {self.name} {part} kernel needs {p.name} {shape}, got none")
                out.append(None)
                continue
            if type(arr) is np.ndarray and arr.dtype == want and arr.shape == shape and arr.flags.c_contiguous \
                    and arr.flags.aligned and (p.kind == "in" or arr.flags.writeable):
                out.append(arr)  # the common case, checked at once
                continue
            if not isinstance(arr, np.ndarray) and hasattr(arr, "__cuda_array_interface__"):
                _check_device(api, p, arr, shape, want)  # a GPU backend's own device array, used in place
                out.append(arr)
                continue
            if not isinstance(arr, np.ndarray):
                raise ScanInputError(f"{api}: {p.name} must be a NumPy array, got {type(arr).__name__}")
            if arr.dtype != want:
                raise ScanInputError(f"{api}: {p.name} has dtype {arr.dtype}; the kernel was built for {want}")
            if arr.shape != shape:
                raise ScanInputError(f"{api}: {p.name} has shape {arr.shape}; it needs {shape}")
            if not (arr.flags.c_contiguous and arr.flags.aligned) or (p.kind == "out" and not arr.flags.writeable):
                raise ScanInputError(f"{api}: {p.name} must be a C-contiguous, aligned"
                                     f"{', writeable' if p.kind == 'out' else ''} array")
            out.append(arr)
        return out

    def layout(self, part: str, features: Any, sizes: tuple) -> list:
        """``(param, enabled, shape, dtype)`` per parameter of ``part`` (memoised per features and sizes)."""
        key = (part, features, sizes)
        memo = self.__dict__.setdefault("_layouts", {})
        if key not in memo:
            shapes = self.shapes(part, features, dict(sizes))
            if len(memo) > 256:
                memo.clear()
            memo[key] = [(p, self.enabled(p.name, features), tuple(shapes.get(p.name, ())),
                          np.dtype(p.dtype or features.dtype)) for p in self.params(part)]
        return memo[key]

    def work(self, features: Any, sizes: dict[str, int]) -> int:
        """Elements of state updated by one forward call (what the CPU's one-thread cut-off compares):
        ``batch * dim * L * N`` for a per-channel state; operations with other shapes override it."""
        return sizes.get("batch", 1) * sizes.get("dim", 1) * sizes.get("L", 1) * getattr(features, "N", 1)

    def problem(self, features: Any, sizes: dict[str, int]) -> tuple[int, int]:
        """``(lanes, L)``: the problem size the tuned store keys this call by (independent sequences times
        channels or heads, and their length)."""
        lanes = sizes.get("nseq", sizes.get("batch", 1)) * sizes.get("H", sizes.get("dim", 1))
        return lanes, sizes.get("T", sizes.get("L", 1))

    def steps(self, sizes: dict[str, int]) -> int:
        """Mean steps per sequence of a call (``T`` or ``L``, over the packed sequences where there are several
        in a row): what the algorithm rule compares with :attr:`chunked_from`."""
        T, batch = sizes.get("T", sizes.get("L", 1)), sizes.get("batch", 1)
        return T * batch // max(1, sizes.get("nseq", batch))

    def chunked_of(self, family: str, features: Any = None) -> tuple[str, ...] | None:
        """The parts of ``family``'s kernels that have the chunked form for a call with ``features`` (``None``:
        every part): :attr:`chunked_parts`; an operation whose forms differ narrows it by ``features``."""
        return self.chunked_parts.get(family)

    def chooses(self, family: str, part: str | None = None, features: Any = None) -> bool:
        """True when the kernels of ``family`` (of its ``part``, if given, for ``features``, if given) have an
        ``algorithm`` tunable with a ``chunked`` value (:meth:`chunked_of` names the parts where only some have the
        form)."""
        parts = self.chunked_of(family, features)
        if part is not None and parts is not None and part not in parts:
            return False
        return any(t.name == "algorithm" and "chunked" in t.values for t in self.tunables_for(family))

    def settle(self, family: str, part: str, config: dict, features: Any = None) -> dict:
        """``config`` with the algorithm that runs: the ``algorithm`` tunable's declared default where
        ``family``'s ``part`` has no chunked form (for ``features``: :meth:`chunked_of`), else ``config``
        itself."""
        if "algorithm" not in config or self.chooses(family, part, features):
            return config
        return {**config, "algorithm": next(t.default for t in self.tunables_for(family) if t.name == "algorithm")}

    def algorithm(self, family: str, part: str, features: Any, sizes: dict[str, int],
                  target: str | None = None) -> str | None:
        """The default algorithm of ``part`` on ``family``'s kernels (``target``'s, where given): ``chunked``
        where :attr:`chunked_from` says so for this shape (steps per sequence and the state's ``K * V`` at least
        one entry of the thresholds measured on ``target``, or else on ``family``), else the ``algorithm``
        tunable's declared default; ``None`` where ``family``'s kernels have no chunked form."""
        if not self.chooses(family):
            return None
        steps, state = self.steps(sizes), getattr(features, "K", 1) * getattr(features, "V", 1)
        measured = (target and self.chunked_from.get(target)) or self.chunked_from.get(family) or {}
        rules = measured.get(part, ())
        if self.chooses(family, part, features) and any(steps >= e[0] and state >= e[1] and
                                              all(self.condition(c, features, sizes) for c in e[2:]) for e in rules):
            return "chunked"
        return str(next(t.default for t in self.tunables_for(family) if t.name == "algorithm"))

    def condition(self, name: str, features: Any, sizes: dict[str, int]) -> bool:
        """Whether the shape condition ``name`` of a :attr:`chunked_from` entry holds for a call; an operation
        that names conditions in its rule defines them."""
        raise ScanInputError(f"{self.name}: the algorithm rule names the condition {name!r}, which the operation "
                             "does not define")

    def defaults(self, family: str, part: str, features: Any, sizes: dict[str, int], backend: dict[str, object],
                 hints: dict[str, object] | None = None,
                 target: str | None = None) -> tuple[dict[str, object], bool]:
        """The defaults of a call before the tuned store and the caller's tunables: ``backend`` (the backend's
        defaults by shape), with the algorithm of :meth:`algorithm` (for ``target``'s kernels), then ``hints``
        (``{"chunk": n}``, from fla's and mamba-ssm's ``chunk_size``): where ``family``'s kernels have a
        ``chunk`` tunable whose rule takes ``n``, it becomes ``chunk``, and where they have a chunked form,
        ``algorithm`` is ``chunked``; a hint they cannot take (or given to a part without the chunked form) is
        dropped.  Returns ``(defaults, whether a hint was taken)``.

        Example:
            >>> from scanweaver.fused import REGISTRY
            >>> from scanweaver.fused.matrix_state import MatrixStateFeatures
            >>> op, f = REGISTRY.get("matrix_state"), MatrixStateFeatures("float32", 64, 64)
            >>> op.defaults("c", "forward", f, {"batch": 1, "T": 16, "H": 1, "Hq": 1, "nseq": 1}, {},
            ...             {"chunk": 32})
            ({'algorithm': 'chunked', 'chunk': 32}, True)
        """
        cfg = dict(backend)
        alg = self.algorithm(family, part, features, sizes, target)
        if alg is not None:
            cfg["algorithm"] = alg
        chunk = (hints or {}).get("chunk")
        tun = next((t for t in self.tunables_for(family) if t.name == "chunk"), None)
        if chunk is None or tun is None or (tun.rule is not None and tun.rule(chunk)) or \
                (alg is not None and not self.chooses(family, part, features)):
            return cfg, False
        cfg["chunk"] = chunk
        if alg is not None:
            cfg["algorithm"] = "chunked"
        return cfg, True

    def runs_on(self, target: str, part: str | None = None) -> bool:
        """True when ``target`` renders this operation (its ``part``, if given)."""
        parts = self.implementations.get(target)
        return parts is not None and (part is None or part in parts)

    def tunables_for(self, family: str) -> tuple[Tunable, ...]:
        """The tunables of a target family (``c``, ``gpu``); none for the others."""
        return self.tunables.get(family, ())

    def resolve(self, family: str, given: dict[str, object], defaults: dict[str, object], api: str) -> dict:
        """Validated tunables: ``given`` over ``defaults`` over the declared defaults.

        Raises:
            ScanInputError: an unknown tunable for this family, or an invalid value.
        """
        return resolve_tunables(self.tunables_for(family), given, defaults, api,
                                f"the fused {self.name} kernel on {family} targets")

    def signature(self, features: Any) -> str:
        """A stable key of the operation and its features but the dtype (the tuned store's ``signature``)."""
        memo = self.__dict__.setdefault("_signatures", {})
        if features not in memo:
            fields = {k: v for k, v in dataclasses.asdict(features).items() if k != "dtype"}
            text = ",".join(f"{k}={v}" for k, v in sorted(fields.items()))
            memo[features] = f"{self.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
        return memo[features]

    def call(self, part: str, features: Any, config: dict[str, object]) -> FusedCall:
        """The :class:`FusedCall` of ``part`` with ``features`` and a resolved ``config``."""
        if part not in self.parts:
            raise ScanInputError(f"{self.name}: unknown part {part!r}; it has {', '.join(self.parts)}")
        return FusedCall(self.name, part, features, tuple(sorted(config.items())))


#: Operation name -> :class:`FusedOp` instance (every module of this package but ``base`` registers its own).
REGISTRY: Registry[FusedOp] = Registry("fused operation", (Discovery("scanweaver.fused"),))


def register(cls: type[FusedOp]) -> type[FusedOp]:
    """Class decorator adding (an instance of) a fused operation to :data:`REGISTRY`."""
    REGISTRY.add(cls.name, cls())
    return cls


def fused_for(target: str) -> tuple[str, ...]:
    """Names of the fused operations ``target`` renders (any part), sorted."""
    return tuple(n for n, op in REGISTRY.items() if op.runs_on(target))


def _check_device(api: str, p: Any, arr: Any, shape: tuple, want: np.dtype) -> None:
    """The checks of :meth:`FusedOp.arguments` on a device array (dtype, shape, C order), by its attributes."""
    if np.dtype(arr.dtype) != want:
        raise ScanInputError(f"{api}: {p.name} has dtype {arr.dtype}; the kernel was built for {want}")
    if tuple(arr.shape) != tuple(shape):
        raise ScanInputError(f"{api}: {p.name} has shape {tuple(arr.shape)}; it needs {shape}")
    if not arr.flags.c_contiguous:
        raise ScanInputError(f"{api}: {p.name} must be a C-contiguous device array")
