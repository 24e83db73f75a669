"""Targets: the NumPy interpreter (the semantics) and the C-family renderers, found through :data:`TARGETS`."""

from .base import TARGETS

__all__ = ["TARGETS"]
