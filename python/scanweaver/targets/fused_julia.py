"""The ``julia`` family of fused operations: ScanWeaver.jl's fused kernels.

The kernels live in the Julia package (``src/mamba/``, ``src/matrix/``); each part's entry
point takes the ABI's buffers by address and is called by
:class:`scanweaver.julia.backend.JuliaBackend` (its ``RUNNERS``).  There is no source to
render here: a rendering is its entry points.

Example:
    >>> from scanweaver.targets.fused import kernel_for
    >>> kernel_for("julia", "matrix_state").entry("backward")
    'ScanWeaver.host_matrix_backward!'
"""

from __future__ import annotations

from ..fused.base import PARTS
from .fused import KERNELS, FusedKernel


def _entries(forward: str, backward: str):
    names = {"forward": forward, "backward": backward}
    return lambda part: f"ScanWeaver.{names[part]}"


KERNELS.register(FusedKernel("mamba1", "julia", PARTS, entry=_entries("host_mamba_scan!", "host_mamba_backward!")))
KERNELS.register(FusedKernel("matrix_state", "julia", PARTS,
                             entry=_entries("host_matrix_state!", "host_matrix_backward!")))
