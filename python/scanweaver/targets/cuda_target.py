"""CUDA C: strings for :class:`~.gpu.GPURenderer` (NVRTC through CuPy, or nvcc).

Warp shuffles (``__shfl_up_sync``) scan each warp; warp totals are scanned
in shared memory; the look-back votes and reduces across a warp
(``__ballot_sync``, ``__shfl_down_sync``).  Every kernel declares
``__launch_bounds__(workgroup_size)``, so ptxas budgets registers for the
block size it is launched with.  Kernels are ``extern "C"`` so their names survive
compilation (CuPy ``RawModule.get_function``, Kernel Tuner ``lang="cupy"``).
NVRTC includes no headers, so the preamble defines what the kernels need.
"""

from __future__ import annotations

from .gpu import GPURenderer, register_target

PREAMBLE = """#define restrict __restrict__
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif"""


@register_target
class CUDARenderer(GPURenderer):
    """CUDA C strings."""

    target = "cuda"
    kernel_prefix = 'extern "C" __global__'
    global_prefix = ""
    local_prefix = "__shared__"
    local_ptr_prefix = ""
    function_prefix = "__device__ inline "
    device_prefix = "__device__ inline"
    barrier = "__syncthreads()"
    code_for_local_id = "threadIdx.x"
    code_for_group_id = "blockIdx.x"
    index_type = "long long"
    f32_suffix_math = True
    warp_size = 32
    shuffle_up = "__shfl_up_sync(0xffffffffu, {v}, {d}, {w})"
    shuffle_idx = "__shfl_sync(0xffffffffu, {v}, {src}, {w})"
    global_fence = "__threadfence()"
    atomic_ticket = "atomicAdd((int*)({p}), 1)"
    flag_load = "(*({p}))"
    flag_store = "atomicExch((int*)({p}), {v})"
    preamble = PREAMBLE
    launch_bounds = "__launch_bounds__({n})"
    launch_bounds_blocks = "__launch_bounds__({n}, {blocks})"
    u64_type = "unsigned long long"
    word_load = "(*(volatile unsigned long long*)({p}))"
    word_store = "atomicExch((unsigned long long*)({p}), (unsigned long long)({v}))"
    float_bits = "__float_as_uint({v})"
    bits_float = "__uint_as_float({v})"
    ballot = "__ballot_sync(0xffffffffu, {p})"
    shuffle_down = "__shfl_down_sync(0xffffffffu, {v}, {d})"
    find_first_set = "__ffs({v})"
