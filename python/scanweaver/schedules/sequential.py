"""``sequential``: one lane at a time, t = 0 .. L-1 (the naive baseline)."""

from __future__ import annotations

from ..ir.stages import ScheduleOp
from .base import BOTH, DIAGONAL, Schedule, register


@register
class Sequential(Schedule):
    """h = A_t * h + U_t in a loop per lane; lanes run in parallel."""

    name = "sequential"
    description = "one loop over L per lane (the naive baseline); lanes in parallel"
    tunables = ()
    implementations = {"numpy": BOTH, "c": BOTH, "opencl": BOTH, "cuda": BOTH, "julia": DIAGONAL, "mlir": DIAGONAL}

    def ops(self, config):
        return (ScheduleOp("sequential.scan"),)
