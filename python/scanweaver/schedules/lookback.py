"""``lookback``: single-pass scan with decoupled look-back (Merrill & Garland, 2016).

Each workgroup takes a ticket from a global counter (so tiles start in order),
scans one tile of ``workgroup_size * items_per_thread`` elements as in
``hybrid``, publishes its aggregate with status ``A`` (aggregate ready), then
looks back over its predecessors: it composes aggregates until it meets a
tile with status ``P`` (inclusive prefix ready), whose state gives the
carry-in.  It publishes its own inclusive state (status ``P``) and replays
its items from the carry-in.  Reads and writes every element once.

Forward progress: a tile only waits on tiles with smaller tickets, which
have already started; that is enough on NVIDIA GPUs (and on PoCL's CPU
threads), but OpenCL does not promise it between workgroups in general.

Ops: ``lookback.tile_reduce`` (tile aggregates), ``lookback.look_back``
(carry-in from the nearest published prefix; the interpreter treats the
``lag`` nearest predecessors as still running, so the aggregate path is
exercised), ``lookback.replay``.
"""

from __future__ import annotations

import dataclasses

from ..ir.stages import ScheduleOp
from .base import DIAGONAL, ITEMS_PER_THREAD, WORKGROUP_SIZE, Schedule, register

#: Predecessors the interpreter treats as not yet having published a prefix.
INTERPRETER_LAG = 3


@register
class Lookback(Schedule):
    """One pass: tile scan, look-back over predecessors' aggregates, replay."""

    name = "lookback"
    kinds = DIAGONAL
    implementations = {"numpy": DIAGONAL, "opencl": DIAGONAL, "cuda": DIAGONAL}
    description = "single pass: tiles in ticket order, decoupled look-back for the carry-in"
    tunables = (
        WORKGROUP_SIZE,
        dataclasses.replace(ITEMS_PER_THREAD, default=8),
    )

    def ops(self, config):
        t = ("tile", config["workgroup_size"] * config["items_per_thread"])
        return (
            ScheduleOp("lookback.tile_reduce", (t,)),
            ScheduleOp("lookback.look_back", (("lag", INTERPRETER_LAG),)),
            ScheduleOp("lookback.replay", (t,)),
        )
