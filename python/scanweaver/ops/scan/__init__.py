"""The ``scan`` operation: :func:`selective_scan` and the ``scan`` kernel pair of every compiled recurrence."""

from __future__ import annotations

from . import grad as _grad  # noqa: F401  (registers the scan kernel pair)
from .api import SELECTIVE, SELECTIVE_NO_C, selective_scan

__all__ = ["SELECTIVE", "SELECTIVE_NO_C", "selective_scan"]
