"""Fused operations (one kernel per part around a scan), found through :data:`REGISTRY`."""

from .base import PARTS, REGISTRY, FusedCall, FusedOp, Param, fused_for, register

__all__ = ["PARTS", "REGISTRY", "FusedCall", "FusedOp", "Param", "fused_for", "register"]
