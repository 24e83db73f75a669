"""The ``julia`` family of fused operations: ScanWeaver.jl's fused Mamba-1 forward kernel.

The kernel lives in the Julia package (``src/mamba/``); its entry point is
``ScanWeaver.host_mamba_scan!``, which :class:`scanweaver.julia.backend.JuliaBackend`
calls with the ABI's buffers.  There is no source to render here.
"""

from __future__ import annotations

from .fused import KERNELS, FusedKernel

KERNELS.register(FusedKernel("mamba1", "julia", ("forward",), entry=lambda part: "ScanWeaver.host_mamba_scan!"))
