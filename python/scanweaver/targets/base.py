"""The target registry: every target that implements schedules, keyed by target name.

A target is a class with a ``target`` name and a class method
``implements(schedule, kind) -> bool`` (the schedule has a rendering or an
implementation there for transitions of ``kind``).  Targets live in modules
named ``*_target`` in this package, plus the NumPy interpreter
(:mod:`.reference`, target ``numpy``) and ScanWeaver.jl
(:mod:`scanweaver.julia.backend`, target ``julia``); they are imported on the
first lookup.  Each schedule declares which targets implement it
(:attr:`scanweaver.schedules.Schedule.implementations`); ``test/test_registry.py``
checks the declaration against :meth:`implements` both ways.

Example:
    >>> from scanweaver.targets import TARGETS
    >>> TARGETS.get("c").implements("chunked", "dense"), TARGETS.get("cuda").implements("chunked", "diagonal")
    (True, False)
"""

from __future__ import annotations

import re

from ..registry import Discovery, Registry


def source_name(name: object) -> str:
    """``name`` as emitted source may show it (in comments): letters, digits and ``_ . -`` only, anything else
    becomes ``_``, so no name can close a comment or inject code (names are checked in the front end too)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", str(name))[:128]

#: Target name -> target class (renderers, the interpreter, ScanWeaver.jl).
TARGETS: Registry[type] = Registry(
    "target",
    (Discovery("scanweaver.targets", ("*_target", "reference")), Discovery("scanweaver.julia", ("backend",))),
    key="target",
)
