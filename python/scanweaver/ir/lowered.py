"""Every stage of one lowering in one object: :class:`Stages`.

A plain data container shared by passes, targets, runtime and tuning (it lives
in ``ir`` so that targets need not import the passes that fill it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .printer import print_affine, print_assoc, print_scan, print_schedule
from .stages import AffineScanIR, AssocScanIR, ScanIR, ScheduleIR

STAGE_NAMES = ("scan", "affine_scan", "assoc_scan", "schedule", "kernel", "mlir")


@dataclass(frozen=True)
class Stages:
    """Every stage of one lowering, as objects and as text.

    Attributes:
        scan, affine, assoc, schedule: the IR objects.
        kernel: target source text, or ``None`` for the NumPy interpreter; for the ``mlir``
            target it is printed as stage ``mlir`` (an MLIR module) instead of ``kernel``.
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
            out["mlir" if self.target == "mlir" else "kernel"] = self.kernel
        return out

    def __str__(self) -> str:
        return "\n\n".join(f"// -----// IR after {name} //----- //\n{body}" for name, body in self.text().items())
