"""Pass ``decompose_assoc``: the affine normal form as an associative scan over pairs."""

from __future__ import annotations

from ..ir.stages import AffineScanIR, AssocScanIR
from ..ir.verifier import verify_assoc


def decompose_assoc(ir: AffineScanIR) -> AssocScanIR:
    """Returns stage ``assoc_scan``: elements (A_t, U_t) under affine composition."""
    assoc = AssocScanIR(affine=ir)
    verify_assoc(assoc)
    return assoc
