"""ScanWeaver's IR: expressions, the stage dataclasses, printer and verifiers."""

from .expr import Expr
from .lowered import STAGE_NAMES, Stages
from .printer import print_affine, print_assoc, print_scan, print_schedule
from .stages import (
    AffineScanIR,
    AssocScanIR,
    Features,
    OutputForm,
    ScanIR,
    ScheduleIR,
    ScheduleOp,
)

__all__ = [
    "STAGE_NAMES",
    "Stages",
    "AffineScanIR",
    "AssocScanIR",
    "Expr",
    "Features",
    "OutputForm",
    "ScanIR",
    "ScheduleIR",
    "ScheduleOp",
    "print_affine",
    "print_assoc",
    "print_scan",
    "print_schedule",
]
