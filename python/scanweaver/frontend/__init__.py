"""Front end: symbolic tracing of step functions into stage ``scan``."""

from .symbolic import Sym, sigmoid, silu, softplus
from .trace import trace

__all__ = ["Sym", "sigmoid", "silu", "softplus", "trace"]
