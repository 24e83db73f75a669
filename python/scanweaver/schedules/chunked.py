"""``chunked``: reduce-then-scan over chunks of L.

1. ``chunked.reduce``: each chunk of ``chunk`` elements composes its pairs
   into one aggregate (A_c, U_c); chunks are independent.
2. ``chunked.scan``: a small sequential scan of the chunk aggregates, starting
   from h0, gives each chunk's carry-in state.
3. ``chunked.propagate``: each chunk replays h = A*h + U from its carry-in
   and writes h_t and y_t; chunks are independent again.
"""

from __future__ import annotations

from ..ir.stages import ScheduleOp
from .base import BOTH, DIAGONAL, Schedule, Tunable, positive, register


@register
class Chunked(Schedule):
    """Reduce, scan of aggregates, propagate."""

    name = "chunked"
    description = "split L into chunks: local reduce, scan of chunk aggregates, carry fix-up"
    implementations = {"numpy": BOTH, "c": BOTH, "julia": DIAGONAL, "mlir": DIAGONAL}
    tunables = (
        Tunable("chunk", 2048, (256, 512, 1024, 2048, 4096, 8192, 16384),
                "elements of L per chunk", positive),
    )

    def ops(self, config):
        c = ("chunk", config["chunk"])
        return (
            ScheduleOp("chunked.reduce", (c,)),
            ScheduleOp("chunked.scan", (c,)),
            ScheduleOp("chunked.propagate", (c,)),
        )
