"""``blelloch``: the work-efficient tree scan per block (the paper's GPU path).

A block of ``2 * workgroup_size`` elements is scanned in place:
``blelloch.up`` builds partial aggregates up a binary tree, ``blelloch.root``
takes the block total and puts the identity at the root, ``blelloch.down``
pushes exclusive prefixes down the tree.  ``blelloch.carry`` chains block
totals along L (from h0) and ``blelloch.apply`` turns each exclusive prefix
into h_t.  Blelloch (1990), "Prefix sums and their applications".
"""

from __future__ import annotations

import dataclasses

from ..ir.stages import ScheduleOp
from .base import BOTH, DIAGONAL, WORKGROUP_SIZE, Schedule, power_of_two_between, register


def _wg_rule(value):
    return power_of_two_between(1, 1024)(value)


@register
class Blelloch(Schedule):
    """Up-sweep, root, down-sweep in a block; carries chained across blocks."""

    name = "blelloch"
    description = "Blelloch up-sweep/root/down-sweep over affine pairs in blocks of 2*workgroup_size"
    implementations = {"numpy": BOTH, "opencl": DIAGONAL, "cuda": DIAGONAL, "julia": DIAGONAL, "mlir": DIAGONAL}
    tunables = (
        dataclasses.replace(WORKGROUP_SIZE, values=(32, 64, 128, 256, 512, 1024), rule=_wg_rule,
                            doc="work-items per workgroup; a block holds 2*workgroup_size elements"),
    )

    def ops(self, config):
        b = ("block", 2 * config["workgroup_size"])
        return (
            ScheduleOp("blelloch.up", (b,)),
            ScheduleOp("blelloch.root", (b,)),
            ScheduleOp("blelloch.down", (b,)),
            ScheduleOp("blelloch.carry", (b,)),
            ScheduleOp("blelloch.apply", (b,)),
        )
