"""Schedule families, one module each, found through :data:`~.base.REGISTRY`."""

from .base import REGISTRY, Schedule, Tunable, get_schedule, register, schedules_for

__all__ = ["REGISTRY", "Schedule", "Tunable", "get_schedule", "register", "schedules_for"]
