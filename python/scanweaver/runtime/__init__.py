"""Runtime backends behind one interface (:class:`~.base.Backend`), found through :data:`REGISTRY`."""

from __future__ import annotations

from .base import REGISTRY, Availability, Backend, ScanArrays, get_backend, register

__all__ = ["REGISTRY", "Availability", "Backend", "ScanArrays", "get_backend", "register"]
