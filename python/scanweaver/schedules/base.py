"""Schedules: how an associative scan over affine pairs is split into parallel work.

One :class:`Schedule` subclass per schedule family, found through
:data:`REGISTRY`.  Each declares its tunables (the same names are the
keywords ``selective_scan`` accepts and the keys of Kernel Tuner search
spaces) and the ops it lowers to.  The NumPy interpreter in
:mod:`scanweaver.targets.reference` defines what every op means.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar
from collections.abc import Callable

from ..errors import ScanInputError
from ..ir.stages import ScheduleOp


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


def positive(value: object) -> str | None:
    """Rule: a positive int."""
    return None if value >= 1 else "it must be >= 1"


def power_of_two(value: object) -> str | None:
    """Rule: a positive power of two."""
    return None if value >= 1 and value & (value - 1) == 0 else "it must be a power of two >= 1"


def non_negative(value: object) -> str | None:
    """Rule: zero or more."""
    return None if value >= 0 else "it must be >= 0"


class Schedule(ABC):
    """A schedule family: its tunables and its op sequence."""

    name: ClassVar[str]
    description: ClassVar[str]
    tunables: ClassVar[tuple[Tunable, ...]] = ()
    #: transition kinds the schedule's ops handle
    kinds: ClassVar[tuple[str, ...]] = ("diagonal", "dense")

    @abstractmethod
    def ops(self, config: dict[str, object]) -> tuple[ScheduleOp, ...]:
        """The ops this schedule lowers to for a validated ``config``."""

    def defaults(self) -> dict[str, object]:
        """Every tunable at its default."""
        return {t.name: t.default for t in self.tunables}


REGISTRY: dict[str, Schedule] = {}


def register(cls: type[Schedule]) -> type[Schedule]:
    """Class decorator adding a schedule to :data:`REGISTRY`."""
    REGISTRY[cls.name] = cls()
    return cls


def get_schedule(name: str) -> Schedule:
    """The registered schedule ``name``, or a clear error listing the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ScanInputError(
            f"schedule: unknown schedule {name!r}; known schedules: {', '.join(sorted(REGISTRY))}"
        ) from None
