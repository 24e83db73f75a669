"""Schedules: how an associative scan over affine pairs is split into parallel work.

One :class:`Schedule` subclass per schedule family, one module per family in
this package, found through :data:`REGISTRY` (every module here but ``base``
is imported on the first lookup).  A schedule is declared once: its tunables
(the same names are the keywords ``selective_scan`` accepts and the keys of
Kernel Tuner search spaces), the ops it lowers to, and the table of the
targets that implement it (:attr:`Schedule.implementations`).  The NumPy
interpreter in :mod:`scanweaver.targets.reference` defines what every op
means; ``test/test_registry.py`` fails when a claimed implementation is
missing or an implementation is not claimed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import ScanInputError
from ..ir.stages import ScheduleOp
from ..registry import Discovery, Registry


@dataclass(frozen=True)
class Tunable:
    """A typed, validated tuning parameter.

    Attributes:
        name: keyword name, also the Kernel Tuner search-space key.
        default: value used when the caller and the tuned store give none.
        values: candidate values for search spaces.
        doc: one line saying what it controls.
        rule: returns an explanation when a value is invalid, else ``None``.
    """

    name: str
    default: object
    values: tuple
    doc: str
    rule: Callable[[object], str | None] | None = None

    def check(self, value: object, api: str) -> object:
        """Returns ``value`` if valid, else raises :class:`ScanInputError`."""
        want = type(self.default)
        if want is int and (isinstance(value, bool) or not isinstance(value, int)):
            try:
                import numpy as np

                if isinstance(value, np.integer):
                    value = int(value)
                else:
                    raise TypeError
            except TypeError:
                raise ScanInputError(
                    f"{api}: {self.name} must be an int, got {value!r} ({type(value).__name__}); {self.doc}"
                ) from None
        if want is str and not isinstance(value, str):
            raise ScanInputError(f"{api}: {self.name} must be a str, got {value!r}; {self.doc}")
        problem = self.rule(value) if self.rule else None
        if problem:
            raise ScanInputError(f"{api}: {self.name}={value!r} is invalid: {problem}")
        return value

    def problem(self, value: object) -> str | None:
        """Why :meth:`check` refuses ``value`` (its type, then :attr:`rule`), or ``None``: the filter of search-space
        candidates, which a rule alone cannot be (``chunk=abc`` reached ``1 <= 'abc'``)."""
        try:
            self.check(value, "tunable")
        except ScanInputError as exc:
            return str(exc).removeprefix("tunable: ")
        return None


def resolve_tunables(declared, given: dict, defaults: dict, api: str, what: str) -> dict:
    """The one tunable validator: ``given`` over ``defaults`` over each declared tunable's own default, every
    value checked by its :class:`Tunable` (``defaults`` naming undeclared tunables are ignored).

    Args:
        declared: the :class:`Tunable` s of the kernel or schedule.
        given: the caller's tunables.
        defaults: documented defaults (a backend's, or a tuned store entry).
        api: the public call's name (messages start with it).
        what: what the tunables belong to, for the message (``schedule 'chunked'``).

    Raises:
        ScanInputError: an unknown tunable (naming the accepted ones), or a value its rule refuses.
    """
    table = {t.name: t for t in declared}
    unknown = sorted(set(given) - set(table))
    if unknown:
        raise ScanInputError(f"{api}: unknown tunable(s) {', '.join(unknown)} for {what}; accepted: "
                             f"{', '.join(sorted(table)) or 'none'}")
    merged = {n: t.default for n, t in table.items()}
    merged.update({k: v for k, v in defaults.items() if k in table})
    merged.update(given)
    return {n: table[n].check(v, api) for n, v in merged.items()}



def tunables_key(given: dict) -> tuple:
    """A call's tunables as part of a memo key: each value with its type, so that one :class:`Tunable.check`
    refuses (``True``, ``3.0``) never finds the entry of one it accepted (``1``, ``3``), which compare and hash
    equal to them.

    Example:
        >>> tunables_key({"threads": 1}) == tunables_key({"threads": True})
        False
    """
    return tuple(sorted((k, type(v).__qualname__, v) for k, v in given.items()))

#: The most OpenMP threads a ``threads`` tunable may ask for (the C kernels also clamp it to
#: a small multiple of the processor count; a runtime that cannot create the threads ends the process).
MAX_THREADS = 1024
#: Upper bound of the length-like integer tunables (``chunk`` of L, steps per work-item): every integer
#: tunable becomes a C ``#define`` or a Julia ``Val``, and a value past the compiler's integer types is
#: truncated (2**64 to 0, a division by zero) rather than refused.
MAX_LENGTH = 2**24


def between(lo: int, hi: int) -> Callable[[Any], str | None]:
    """Rule: an int from ``lo`` to ``hi`` (every integer tunable has an upper bound)."""

    def rule(value: Any) -> str | None:
        return None if lo <= value <= hi else f"it must be between {lo} and {hi}"

    return rule


def positive(value: Any) -> str | None:
    """Rule: a positive int, at most :data:`MAX_LENGTH`."""
    return between(1, MAX_LENGTH)(value)


def threads_rule(value: Any) -> str | None:
    """Rule for ``threads``: 0 (every core) to :data:`MAX_THREADS`."""
    return between(0, MAX_THREADS)(value)


def power_of_two_between(lo: int, hi: int) -> Callable[[Any], str | None]:
    """Rule: a power of two from ``lo`` to ``hi`` (both powers of two); the message names the range allowed."""

    def rule(value: Any) -> str | None:
        if not lo <= value <= hi or value & (value - 1):
            return f"it must be a power of two from {lo} to {hi}"
        return None

    return rule


def non_negative(value: Any) -> str | None:
    """Rule: zero to :data:`MAX_LENGTH`."""
    return between(0, MAX_LENGTH)(value)


def workgroup_rule(value: Any) -> str | None:
    """Rule shared by the GPU schedules: a power of two from 32 to 1024."""
    return power_of_two_between(32, 1024)(value)


def items_rule(value: Any) -> str | None:
    """Rule for ``items_per_thread``: 1 .. 64 (they live in registers)."""
    return positive(value) or (None if value <= 64 else "it must be <= 64 (items are kept in registers)")


#: Work-items per workgroup, shared by every GPU schedule (the Kernel Tuner block-size name).
WORKGROUP_SIZE = Tunable("workgroup_size", 256, (64, 128, 256, 512, 1024), "work-items per workgroup",
                         workgroup_rule)
#: Consecutive elements one work-item keeps in registers, shared by the tiled GPU schedules.
ITEMS_PER_THREAD = Tunable("items_per_thread", 8, (1, 2, 4, 8, 16, 32), "consecutive elements each work-item scans",
                           items_rule)

BOTH = ("diagonal", "dense")
DIAGONAL = ("diagonal",)


class Schedule(ABC):
    """A schedule family: its tunables, its op sequence and which targets implement it.

    Class attributes:
        name: the ``schedule=`` keyword value.
        description: one line for listings.
        tunables: typed, validated tunables (defaults, search-space values, rules).
        kinds: transition kinds the schedule's ops handle (the interpreter runs them all).
        implementations: target name -> the transition kinds that target implements,
            e.g. ``{"numpy": BOTH, "c": BOTH, "cuda": DIAGONAL}``.  Targets are the
            keys of :data:`scanweaver.targets.TARGETS` (``numpy`` is the interpreter);
            a backend runs the schedules its target implements.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    tunables: ClassVar[tuple[Tunable, ...]] = ()
    kinds: ClassVar[tuple[str, ...]] = BOTH
    implementations: ClassVar[dict[str, tuple[str, ...]]] = {}

    @abstractmethod
    def ops(self, config: dict[str, object]) -> tuple[ScheduleOp, ...]:
        """The ops this schedule lowers to for a validated ``config``."""

    def defaults(self) -> dict[str, object]:
        """Every tunable at its default."""
        return {t.name: t.default for t in self.tunables}

    def runs_on(self, target: str, kind: str | None = None) -> bool:
        """True when ``target`` implements this schedule (for transitions of ``kind``, if given)."""
        kinds = self.implementations.get(target)
        return kinds is not None and (kind is None or kind in kinds)


#: Schedule name -> :class:`Schedule` instance (every module of this package registers its own).
REGISTRY: Registry[Schedule] = Registry("schedule", (Discovery("scanweaver.schedules"),))


def register(cls: type[Schedule]) -> type[Schedule]:
    """Class decorator adding (an instance of) a schedule to :data:`REGISTRY`."""
    REGISTRY.add(cls.name, cls())
    return cls


def get_schedule(name: str) -> Schedule:
    """The registered schedule ``name``, or a clear error listing the known ones."""
    return REGISTRY.get(name)


def schedules_for(target: str) -> tuple[str, ...]:
    """Names of the schedules ``target`` implements, sorted."""
    return tuple(n for n, s in REGISTRY.items() if s.runs_on(target))
