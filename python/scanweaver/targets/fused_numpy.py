"""The ``numpy`` family of every fused operation: its own NumPy definition (:meth:`FusedOp.reference`)."""

from __future__ import annotations

from ..fused import REGISTRY as FUSED
from .fused import KERNELS, FusedKernel

for _name, _op in FUSED.items():
    KERNELS.register(FusedKernel(_name, "numpy", _op.parts))
