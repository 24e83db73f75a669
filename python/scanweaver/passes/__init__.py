"""Lowering passes; :mod:`.pipeline` runs them in stage order."""

from .pipeline import lower, lower_front

__all__ = ["lower", "lower_front"]
