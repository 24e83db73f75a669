"""Pass ``materialize_schedule``: pick a schedule and fix its tunables."""

from __future__ import annotations

from ..errors import ScanInputError
from ..ir.stages import AssocScanIR, ScheduleIR
from ..ir.verifier import verify_schedule
from ..schedules import REGISTRY, get_schedule
from ..schedules.base import resolve_tunables


def resolve_config(schedule: str, config: dict[str, object] | None, api: str = "schedule",
                   extra: tuple = ()) -> dict[str, object]:
    """Validates ``config`` against the schedule's tunables (plus ``extra`` ones).

    Unknown keywords are an error that lists the accepted ones; missing ones
    take their defaults.
    """
    sched = get_schedule(schedule)
    return resolve_tunables((*sched.tunables, *extra), dict(config or {}), {}, api, f"schedule {schedule!r}")


def materialize_schedule(ir: AssocScanIR, schedule: str, config: dict[str, object] | None = None,
                         extra: tuple = ()) -> ScheduleIR:
    """Returns stage ``schedule`` for ``ir`` with validated tunables."""
    cfg = resolve_config(schedule, config, extra=extra)
    sched = get_schedule(schedule)
    if ir.affine.kind not in sched.kinds:
        raise ScanInputError(
            f"schedule: {schedule!r} does not support {ir.affine.kind} transitions (state size "
            f"{ir.affine.state_size}); schedules that do: "
            + ", ".join(sorted(n for n, s in REGISTRY.items() if ir.affine.kind in s.kinds))
        )
    ops = sched.ops(cfg)
    out = ScheduleIR(assoc=ir, schedule=schedule, params=tuple(sorted(cfg.items())), ops=ops)
    verify_schedule(out, tuple(o.name for o in ops))
    return out


__all__ = ["materialize_schedule", "resolve_config", "ScanInputError"]
