"""Lowering passes; :mod:`.pipeline` names the stages."""

from .pipeline import STAGE_NAMES, Stages, lower, lower_front

__all__ = ["STAGE_NAMES", "Stages", "lower", "lower_front"]
