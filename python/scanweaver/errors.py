"""Exception types raised by ScanWeaver.

Every error message starts with the name of the API that raised it and says
what was wrong and what to do instead.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from . import environment

P = ParamSpec("P")
R = TypeVar("R")


class ScanWeaverError(Exception):
    """Base class of every error ScanWeaver raises on purpose."""


class ScanInputError(ScanWeaverError, ValueError):
    """An argument has the wrong shape, dtype or value."""


class NotAffineError(ScanWeaverError):
    """A step function is not affine in its state.

    The message quotes the offending sub-expression, e.g. ``(h * h)``.
    """


class VerificationError(ScanWeaverError):
    """An IR verifier rejected a stage; the message names the pass and the node."""


class CompileError(ScanWeaverError):
    """Emitted kernel source failed to compile; the message carries the compiler log."""


class BackendUnavailable(ScanWeaverError):
    """A backend cannot run on this machine; the message says why and how to fix it."""


class UnknownPluginError(ScanInputError):
    """A schedule, backend, target or other plug-in name is not registered; the message lists the known ones."""


def unknown_keyword(api: str, key: str, parameters, tunables) -> str:
    """The message for keyword ``key`` of call ``api`` that is neither one of its ``parameters`` nor of its
    ``tunables``, naming both lists and the nearest name.

    Example:
        >>> msg = unknown_keyword("scan", "revers", ["reverse", "h0"], ["chunk"])
        >>> msg.split("; ")[-1]
        "did you mean 'reverse'?"
    """
    import difflib

    parameters, tunables = list(parameters), sorted(tunables)
    near = difflib.get_close_matches(str(key), parameters + tunables, n=1)
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return (f"{api}: unknown keyword {key!r}: it is neither a parameter ({', '.join(parameters)}) nor a tunable "
            f"({', '.join(tunables) or 'none'}){hint}")


#: Set to ``full`` (or ``off``) to see ScanWeaver's own frames in the tracebacks of its errors.
TRACEBACK_ENV = "SCANWEAVER_TRACEBACK"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the frames of ScanWeaver's own modules (the caller's frames stay)."""
    kept = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def api_boundary(fn: Callable[P, R]) -> Callable[P, R]:
    """Marks a public entry point: a :class:`ScanWeaverError` leaving it shows the caller's frames only.

    As in JAX, the internal frames between the call and the ``raise`` are
    hidden, so the traceback ends at the user's line and the message; set
    ``SCANWEAVER_TRACEBACK=full`` to keep them (for debugging ScanWeaver).
    Other exceptions (bugs) always keep their full traceback.

    Example:
        >>> @api_boundary
        ... def area(w):
        ...     if w < 0:
        ...         raise ScanInputError(f"area: w must be >= 0, got {w}")
        ...     return w * w
        >>> area(3)
        9
    """

    @functools.wraps(fn)
    def boundary(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ScanWeaverError as exc:
            if environment.choice(TRACEBACK_ENV, ("full", "off", "0"), "hidden") != "hidden":
                raise
            hidden = not getattr(exc, "_scanweaver_filtered", False)
            exc._scanweaver_filtered = True  # type: ignore[attr-defined]
            name = getattr(fn, "__name__", "")
            if (hidden and isinstance(exc, UnknownPluginError) and name and exc.args and isinstance(exc.args[0], str)
                    and not exc.args[0].startswith(f"{name}:")):
                # a registry names the argument ("schedule: unknown schedule 'x'"), not the call that took it
                exc.args = (f"{name}: {exc.args[0]}", *exc.args[1:])
            if hidden and hasattr(exc, "add_note"):
                exc.add_note(f"(ScanWeaver's internal frames are hidden; set {TRACEBACK_ENV}=full to show them)")
            raise exc.with_traceback(_user_frames(exc.__traceback__))

    return boundary
