"""The ``cuda`` backend under Kernel Tuner ``lang="cupy"`` (NVRTC), timed by CUDA events.

The device is CuPy's current device, as at run time.
"""

from __future__ import annotations

from ..problem import TuneProblem
from ..space import Limits
from .base import register
from .gpu import GPUTarget


@register
class CUDATarget(GPUTarget):
    """CUDA C kernels compiled by CuPy's NVRTC, timed by CUDA events."""

    backend = "cuda"
    lang = "cupy"
    emitter = "cuda"
    requires = ("kernel_tuner", "cupy")
    install = "pip install scanweaver[tune,cuda]"
    timing = "CUDA events (one launch), median of repeated launches"

    def device_options(self) -> dict:
        import cupy

        return {"device": int(cupy.cuda.Device().id)}

    def limits(self, problem: TuneProblem) -> Limits:
        import cupy

        attrs = cupy.cuda.Device().attributes
        return Limits(lanes=problem.lanes, L=problem.L, dtype=problem.dtype,
                      max_workgroup=int(attrs["MaxThreadsPerBlock"]),
                      local_mem=int(attrs["MaxSharedMemoryPerBlock"]))
