"""Validation of tuned-store entries as read from a file: every field's type and range.

A store file is shared (``$SCANWEAVER_TUNED`` on a network file system) and
written by many processes and versions, so nothing in it is trusted: an entry
whose field has the wrong type or an impossible value is skipped (the store
reports it once with a warning) instead of breaking every call that reads it.

Example:
    >>> from scanweaver.tuning.store_check import entry_problem
    >>> entry_problem({"backend": "cpu", "lanes": "8"})
    "field 'device' is missing"
    >>> entry_problem({"backend": "cpu", "device": "d", "signature": "s", "dtype": "float32", "lanes": "8",
    ...                "L": 4, "schedule": "chunked", "config": {}, "time_ms": 1.0})
    "field 'lanes' is '8' (str); it needs an int >= 1"
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: Largest lanes or L an entry may record (a problem size, not a typo or an overflow).
MAX_SIZE = 1 << 48


def _text(v: object) -> bool:
    return isinstance(v, str) and len(v) <= 4096


def _size(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SIZE


def _time(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _config(v: object) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and (isinstance(x, (str, bool)) or (isinstance(x, (int, float)) and math.isfinite(x)))
        for k, x in v.items())


def _versions(v: object) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in v.items())


#: field -> (required, check, what it needs)
FIELDS: dict[str, tuple[bool, Callable[[object], bool], str]] = {
    "backend": (True, _text, "a string"),
    "device": (True, _text, "a string"),
    "signature": (True, _text, "a string"),
    "dtype": (True, _text, "a string"),
    "lanes": (True, _size, "an int >= 1"),
    "L": (True, _size, "an int >= 1"),
    "schedule": (True, _text, "a string"),
    "config": (True, _config, "an object of tunable names to numbers, booleans or strings"),
    "time_ms": (True, _time, "a finite number >= 0"),
    "default_ms": (False, lambda v: v is None or _time(v), "null or a finite number >= 0"),
    "strategy": (False, _text, "a string"),
    "kt_cache": (False, _text, "a string"),
    "created": (False, lambda v: _time(v), "a finite number >= 0 (Unix time)"),
    "host": (False, _text, "a string"),
    "user": (False, _text, "a string"),
    "versions": (False, _versions, "an object of package names to version strings"),
    "partial": (False, _text, "a string"),
}


def entry_problem(d: object) -> str | None:
    """Why ``d`` (one item of a store's ``entries``) is not a valid entry, or ``None`` when it is."""
    if not isinstance(d, dict):
        return f"an entry is {type(d).__name__}, not an object"
    for name, (required, check, need) in FIELDS.items():
        if name not in d:
            if required:
                return f"field {name!r} is missing"
            continue
        if not check(d[name]):
            return f"field {name!r} is {d[name]!r:.60} ({type(d[name]).__name__}); it needs {need}"
    return None
