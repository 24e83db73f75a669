"""The ``numpy`` backend: the schedule interpreter, in the input's precision."""

from __future__ import annotations

import numpy as np

from ..fused import REGISTRY as FUSED
from ..ir import Stages
from ..targets import reference
from .base import Availability, Backend, ScanArrays, register


@register
class NumpyBackend(Backend):
    """Runs any schedule through the NumPy interpreter; always available."""

    name = "numpy"
    target = "numpy"
    auto_priority = 0
    kinds = ("diagonal", "dense")
    dtypes = ("float32", "float64", "complex64", "complex128")

    @classmethod
    def probe(cls) -> Availability:
        return Availability(True, device=f"NumPy {np.__version__} (host)")

    def default_schedule(self, lanes: int, L: int) -> str:
        return "sequential"

    def run(self, stages: Stages, arrays: ScanArrays):
        return reference.run(stages.affine, stages.schedule, arrays.inputs, arrays.h0, arrays.reset,
                             arrays.dtype)

    def run_fused(self, call, arrays, sizes) -> None:
        """Runs the fused operation's own NumPy definition (:meth:`~scanweaver.fused.FusedOp.reference`)."""
        op = FUSED.get(call.op)
        op.arguments(call.part, call.features, arrays, sizes, "numpy backend")
        op.reference(call.part, call.features, arrays, sizes)
