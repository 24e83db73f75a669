"""OpenCL C: strings for :class:`~.gpu.GPURenderer` (OpenCL 1.2, any device).

No subgroup shuffles are assumed (``cl_khr_subgroup_shuffle_relative`` is
optional), so workgroup scans run in local memory and the look-back's
window vote and reduction are emulated in local memory by the whole
workgroup.  Look-back status words use 64-bit global atomics
(``cl_khr_int64_base_atomics``); every kernel requires the work-group size
it was compiled for (``reqd_work_group_size``).
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
    launch_bounds = "__attribute__((reqd_work_group_size({n}, 1, 1)))"
    u64_type = "ulong"
    word_load = "atom_add((volatile __global ulong*)({p}), 0UL)"
    word_store = "atom_xchg((volatile __global ulong*)({p}), (ulong)({v}))"
    float_bits = "as_uint({v})"
    bits_float = "as_float({v})"

    def preamble_for(self, dtype: str) -> str:
        lines = ["#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable"]
        if dtype == "float64":
            lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
        return "\n".join(lines)
