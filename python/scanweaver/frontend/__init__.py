"""Front end: symbolic tracing of step functions into stage ``scan``."""

from ..registry import Discovery, Registry
from .symbolic import Sym, sigmoid, silu, softplus
from .trace import trace

#: Recurrences known by name (``"selective_scan"`` ...), so that lower layers (tuning) can name
#: them without importing the operations that define them (:mod:`scanweaver.ops.scan` registers its
#: own), and the framework adapters' ``scan`` pair finds the recurrence of a call by its key.
RECURRENCES: Registry = Registry("named recurrence", (Discovery("scanweaver.ops", ("scan",)),))

__all__ = ["RECURRENCES", "Sym", "sigmoid", "silu", "softplus", "trace"]
