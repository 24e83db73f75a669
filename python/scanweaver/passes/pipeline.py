"""The named lowering pipeline: scan -> affine_scan -> assoc_scan -> schedule -> kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import print_affine, print_assoc, print_scan, print_schedule
from ..ir.stages import AffineScanIR, AssocScanIR, ScanIR, ScheduleIR
from .decompose_assoc import decompose_assoc
from .materialize_schedule import materialize_schedule
from .normalize_affine import normalize_affine

STAGE_NAMES = ("scan", "affine_scan", "assoc_scan", "schedule", "kernel")


@dataclass(frozen=True)
class Stages:
    """Every stage of one lowering, as objects and as text.

    Attributes:
        scan, affine, assoc, schedule: the IR objects.
        kernel: target source text, or ``None`` for the NumPy interpreter.
        target: the kernel's target name (``c``, ``opencl``, ``cuda``, ``numpy``).
    """

    scan: ScanIR
    affine: AffineScanIR
    assoc: AssocScanIR
    schedule: ScheduleIR | None = None
    kernel: str | None = None
    target: str = "numpy"
    extras: tuple = field(default=())

    def text(self) -> dict[str, str]:
        """Stage name -> printed text, in pipeline order."""
        out = {
            "scan": print_scan(self.scan),
            "affine_scan": print_affine(self.affine),
            "assoc_scan": print_assoc(self.assoc),
        }
        if self.schedule is not None:
            out["schedule"] = print_schedule(self.schedule)
        if self.kernel is not None:
            out["kernel"] = self.kernel
        return out

    def __str__(self) -> str:
        return "\n\n".join(f"// -----// IR after {name} //----- //\n{body}" for name, body in self.text().items())


def lower_front(scan: ScanIR) -> tuple[AffineScanIR, AssocScanIR]:
    """Runs the target-independent passes."""
    affine = normalize_affine(scan)
    return affine, decompose_assoc(affine)


def lower(scan: ScanIR, schedule: str | None = None, config: dict | None = None, extra: tuple = ()) -> Stages:
    """Lowers stage ``scan`` through ``schedule`` (kernel text is added by a target)."""
    affine, assoc = lower_front(scan)
    sched = materialize_schedule(assoc, schedule, config, extra) if schedule else None
    return Stages(scan=scan, affine=affine, assoc=assoc, schedule=sched)
