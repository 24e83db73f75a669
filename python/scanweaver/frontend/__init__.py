"""Front end: symbolic tracing of step functions into stage ``scan``."""

from ..registry import Discovery, Registry
from .symbolic import Sym, sigmoid, silu, softplus
from .trace import trace

#: Recurrences known by name (``"selective_scan"`` ...), so that lower layers (tuning) can name
#: them without importing the API that defines them; :mod:`scanweaver.api` registers its own.
RECURRENCES: Registry = Registry("named recurrence", (Discovery("scanweaver", ("api",)),))

__all__ = ["RECURRENCES", "Sym", "sigmoid", "silu", "softplus", "trace"]
