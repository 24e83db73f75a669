"""Exception types raised by ScanWeaver.

Every error message starts with the name of the API that raised it and says
what was wrong and what to do instead.
"""

from __future__ import annotations


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
