"""``hybrid``: items per thread, a subgroup (warp) scan, a workgroup scan of warp aggregates.

The CUB / Mamba form of a block scan.  A tile holds
``threads_per_lane * items_per_thread`` consecutive elements of one lane:

1. ``hybrid.thread_reduce``: each work-item composes its ``items_per_thread``
   consecutive elements (a warp reads consecutive t of one lane);
2. ``hybrid.subgroup_scan``: an inclusive scan of those aggregates inside
   subgroups of ``width`` work-items (warp shuffles where the target has them);
3. ``hybrid.group_scan``: the subgroup totals are scanned in local memory,
   giving every work-item its exclusive prefix and every tile its total;
4. ``hybrid.tile_carry``: tiles of one lane are chained from h0;
5. ``hybrid.replay``: each work-item replays h = A*h + U over its items from
   its carry-in, so y_t and h_{t-1} are exact at every boundary.

``lanes_per_group`` maps several lanes to one workgroup (each gets
``workgroup_size / lanes_per_group`` work-items); 1 maps a lane to a whole
workgroup.  Merrill & Garland (2016), "Single-pass parallel prefix scan with
decoupled look-back" (block-scan part).
"""

from __future__ import annotations

from ..errors import ScanInputError
from ..ir.stages import ScheduleOp
from .base import DIAGONAL, ITEMS_PER_THREAD, WORKGROUP_SIZE, Schedule, Tunable, power_of_two_between, register

#: Work-items per subgroup scan: the NVIDIA warp; targets without shuffles scan the same groups in local memory.
SUBGROUP_WIDTH = 32


def _lanes_rule(value) -> str | None:
    return power_of_two_between(1, 1024)(value)


def threads_per_lane(config: dict, api: str = "hybrid") -> int:
    """``workgroup_size / lanes_per_group``, checked to be a whole power of two."""
    wg, lpg = config["workgroup_size"], config.get("lanes_per_group", 1)
    if lpg > wg:
        raise ScanInputError(f"{api}: lanes_per_group={lpg} exceeds workgroup_size={wg}; "
                             "each lane needs at least one work-item")
    return wg // lpg


@register
class Hybrid(Schedule):
    """Sequential items per thread, subgroup scan, workgroup scan of subgroup totals."""

    name = "hybrid"
    kinds = DIAGONAL
    implementations = {"numpy": DIAGONAL, "opencl": DIAGONAL, "cuda": DIAGONAL, "julia": DIAGONAL}
    description = "items_per_thread in registers, subgroup (warp) scan, workgroup scan of warp totals"
    tunables = (
        WORKGROUP_SIZE,
        ITEMS_PER_THREAD,
        Tunable("lanes_per_group", 1, (1, 2, 4, 8, 16, 32),
                "lanes sharing one workgroup (1: a lane per workgroup)", _lanes_rule),
    )

    def ops(self, config):
        tpl = threads_per_lane(config)
        ipt = config["items_per_thread"]
        return (
            ScheduleOp("hybrid.thread_reduce", (("items_per_thread", ipt), ("threads_per_lane", tpl))),
            ScheduleOp("hybrid.subgroup_scan", (("width", min(SUBGROUP_WIDTH, tpl)),)),
            ScheduleOp("hybrid.group_scan"),
            ScheduleOp("hybrid.tile_carry"),
            ScheduleOp("hybrid.replay"),
        )
