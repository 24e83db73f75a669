"""``reduce_then_scan``: three passes for long sequences with few lanes.

Each lane's L is cut into blocks of ``workgroup_size * items_per_thread *
tiles_per_block`` elements, one workgroup per block:

1. ``reduce_then_scan.reduce``: every block composes its elements into one
   aggregate pair (A_b, U_b) (tiles scanned as in ``hybrid``);
2. ``reduce_then_scan.scan_aggregates``: one workgroup per lane scans the
   block aggregates from h0, giving each block its carry-in state;
3. ``reduce_then_scan.scan``: every block scans its elements again from its
   carry-in and writes y.

Reads the transition operands twice (memory traffic about 1.6x a single
pass) but needs no inter-workgroup communication, so it runs on any device.
"""

from __future__ import annotations

from ..ir.stages import ScheduleOp
from .base import BOTH, DIAGONAL, ITEMS_PER_THREAD, WORKGROUP_SIZE, Schedule, Tunable, between, register


def block_elements(config: dict) -> int:
    """Elements of L per block."""
    return config["workgroup_size"] * config["items_per_thread"] * config["tiles_per_block"]


@register
class ReduceThenScan(Schedule):
    """Block reduce, scan of block aggregates, block scan with carry."""

    name = "reduce_then_scan"
    description = "three passes over blocks of L: reduce, scan of block aggregates, scan with carry-in"
    implementations = {"numpy": BOTH, "opencl": DIAGONAL, "cuda": DIAGONAL, "julia": DIAGONAL}
    tunables = (
        WORKGROUP_SIZE,
        ITEMS_PER_THREAD,
        Tunable("tiles_per_block", 4, (1, 2, 4, 8, 16, 32),
                "tiles (workgroup_size * items_per_thread elements) each block walks", between(1, 1024)),
    )

    def ops(self, config):
        b = ("block", block_elements(config))
        return (
            ScheduleOp("reduce_then_scan.reduce", (b,)),
            ScheduleOp("reduce_then_scan.scan_aggregates"),
            ScheduleOp("reduce_then_scan.scan", (b,)),
        )
