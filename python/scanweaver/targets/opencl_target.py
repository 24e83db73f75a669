"""OpenCL C: strings for :class:`~.gpu.GPURenderer` (OpenCL 1.2, any device).

No subgroup shuffles are assumed (``cl_khr_subgroup_shuffle_relative`` is
optional), so workgroup scans run in local memory.  Look-back flags use
32-bit global atomics (core since OpenCL 1.1).
"""

from __future__ import annotations

from .gpu import GPURenderer, register_target


@register_target
class OpenCLRenderer(GPURenderer):
    """OpenCL C strings."""

    target = "opencl"
    kernel_prefix = "__kernel"
    global_prefix = "__global "
    local_prefix = "__local"
    local_ptr_prefix = "__local"
    function_prefix = "inline "
    device_prefix = "inline"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE)"
    code_for_local_id = "get_local_id(0)"
    code_for_group_id = "get_group_id(0)"
    index_type = "long"
    f32_suffix_math = False
    global_fence = "mem_fence(CLK_GLOBAL_MEM_FENCE)"
    atomic_ticket = "atomic_inc({p})"
    flag_load = "atomic_or({p}, 0)"
    flag_store = "atomic_xchg({p}, {v})"

    def preamble_for(self, dtype: str) -> str:
        return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable" if dtype == "float64" else ""
