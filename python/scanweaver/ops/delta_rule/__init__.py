"""The delta-rule family: DeltaNet's :func:`delta_rule` (fla's ``chunk_delta_rule`` semantics)."""

from __future__ import annotations

from .api import delta_rule

__all__ = ["delta_rule"]
