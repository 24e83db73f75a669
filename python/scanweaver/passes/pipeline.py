"""The named lowering pipeline: scan -> affine_scan -> assoc_scan -> schedule -> kernel."""

from __future__ import annotations

from ..ir.lowered import Stages
from ..ir.stages import AffineScanIR, AssocScanIR, ScanIR
from .decompose_assoc import decompose_assoc
from .materialize_schedule import materialize_schedule
from .normalize_affine import normalize_affine


def lower_front(scan: ScanIR) -> tuple[AffineScanIR, AssocScanIR]:
    """Runs the target-independent passes."""
    affine = normalize_affine(scan)
    return affine, decompose_assoc(affine)


def lower(scan: ScanIR, schedule: str | None = None, config: dict | None = None, extra: tuple = ()) -> Stages:
    """Lowers stage ``scan`` through ``schedule`` (kernel text is added by a target)."""
    affine, assoc = lower_front(scan)
    sched = materialize_schedule(assoc, schedule, config, extra) if schedule else None
    return Stages(scan=scan, affine=affine, assoc=assoc, schedule=sched)
