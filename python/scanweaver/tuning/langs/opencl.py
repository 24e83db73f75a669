"""The ``opencl`` backend under Kernel Tuner ``lang="OpenCL"``, timed by OpenCL profiling events.

The device is the one the runtime uses (:func:`scanweaver.runtime.opencl_backend.select_device`,
``SCANWEAVER_OPENCL_DEVICE``), given to Kernel Tuner as platform and device indices.
"""

from __future__ import annotations

from ..problem import TuneProblem
from ..space import Limits
from .base import register
from .gpu import GPUTarget


def _device_indices() -> tuple[int, int, object]:
    import pyopencl as cl

    from ...runtime.opencl_backend import select_device

    p, d = select_device()
    platforms = cl.get_platforms()
    pi = next(i for i, q in enumerate(platforms) if q.int_ptr == p.int_ptr)
    di = next(i for i, e in enumerate(platforms[pi].get_devices()) if e.int_ptr == d.int_ptr)
    return pi, di, d


@register
class OpenCLTarget(GPUTarget):
    """OpenCL C kernels (PoCL on CPUs here), timed by profiling events."""

    backend = "opencl"
    lang = "OpenCL"
    emitter = "opencl"
    requires = ("kernel_tuner", "pyopencl")
    install = "pip install scanweaver[tune,opencl]"
    timing = "OpenCL profiling events (one launch), median of repeated launches"

    def device_options(self) -> dict:
        pi, di, _ = _device_indices()
        return {"platform": pi, "device": di}

    def limits(self, problem: TuneProblem) -> Limits:
        _, _, d = _device_indices()
        return Limits(lanes=problem.lanes, L=problem.L, dtype=problem.dtype,
                      max_workgroup=int(d.max_work_group_size), local_mem=int(d.local_mem_size),
                      target="opencl")
