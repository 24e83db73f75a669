"""Schedule families; importing this package registers them all."""

from . import blelloch, chunked, hybrid, lookback, reduce_then_scan, sequential  # noqa: F401  (registration)
from .base import REGISTRY, Schedule, Tunable, get_schedule, register

__all__ = ["REGISTRY", "Schedule", "Tunable", "get_schedule", "register"]
