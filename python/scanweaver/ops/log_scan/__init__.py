"""The ``log_scan`` operation: h_t = exp(log_a_t) * h_{t-1} + x_t, computed in log space (NumPy)."""

from __future__ import annotations

from .api import log_scan

__all__ = ["log_scan"]
