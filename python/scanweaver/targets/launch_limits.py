"""Which GPU kernel configurations can launch: shared memory, registers and block size against the device.

Every GPU kernel declares its launch bounds (``__launch_bounds__(workgroup_size)``
on CUDA, ``reqd_work_group_size`` on OpenCL), so the compiler budgets registers
for the block it is launched with and spills rather than fail the launch.
What can still stop a configuration is static shared memory (the tile
transpose holds ``workgroup_size * items_per_thread`` pairs) and, where a
compiler ignores the bound, registers.  :func:`shared_bytes` gives the exact
static shared memory of a schedule's kernels (checked against ptxas's reports
in ``test/data/ptxas_sm90.json``); :func:`why_not_launchable` says why a
configuration cannot launch, from that formula or from the resources a
compiled function reports (CuPy's ``RawKernel.num_regs``,
``shared_size_bytes``, ``max_threads_per_block``).  The tuning search spaces
exclude what it rejects before anything runs, and the ``cuda`` backend checks
each compiled function before its first launch.

Example:
    >>> from scanweaver.targets.launch_limits import why_not_launchable
    >>> why_not_launchable("hybrid", {"workgroup_size": 256, "items_per_thread": 8}, "float32") is None
    True
    >>> "shared memory" in why_not_launchable("lookback", {"workgroup_size": 1024, "items_per_thread": 8},
    ...                                       "float64")
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from .gpu import BANKS_LOG2

ITEMSIZE = {"float32": 4, "float64": 8, "float16": 4, "bfloat16": 4}  # half types accumulate in float32
#: Threads per warp, the unit registers are allocated in.
WARP = 32


@dataclass(frozen=True)
class DeviceLimits:
    """What one thread block may use (defaults: NVIDIA compute capability 9.0, static shared memory).

    Attributes:
        threads_per_block: largest block.
        registers_per_block: 32-bit registers of one block.
        registers_per_thread: most registers one thread may address.
        register_unit: registers are allocated per warp in multiples of this.
        shared_per_block: bytes of static shared (local) memory one block may declare.
    """

    threads_per_block: int = 1024
    registers_per_block: int = 65536
    registers_per_thread: int = 255
    register_unit: int = 256
    shared_per_block: int = 48 * 1024


SM90 = DeviceLimits()


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel uses (ptxas ``-v``, or the CUDA function attributes).

    Attributes:
        registers: registers per thread.
        shared: static shared memory per block, bytes.
        local: local memory (spills and stack) per thread, bytes.
        max_threads: the driver's largest launchable block for this function, when known.
    """

    registers: int
    shared: int
    local: int = 0
    max_threads: int | None = None


def pad(n: int) -> int:
    """``SW_PAD(n)``: ``n`` words plus one padding word per bank row."""
    return n + (n >> BANKS_LOG2)


def block_size(schedule: str, config: dict) -> int:
    """Work-items per workgroup of every kernel of ``schedule`` under ``config``."""
    from .gpu_kernels import SEQUENTIAL_WORKGROUP

    return int(config.get("workgroup_size", SEQUENTIAL_WORKGROUP))


def shared_bytes(schedule: str, config: dict, dtype: str, target: str = "cuda") -> int:
    """Static shared (local) memory per workgroup of the largest kernel of ``schedule``, in bytes.

    Mirrors the kernels' declarations: the workgroup scan's ``workgroup_size``
    pairs, the tile transpose's two padded arrays of ``workgroup_size *
    items_per_thread`` values, the look-back's ticket and carry (and, on
    targets without warp votes, its emulation buffers).
    """
    t = ITEMSIZE[dtype]
    wg = block_size(schedule, config)
    if schedule == "sequential":
        return 0
    if schedule == "blelloch":
        return 2 * pad(2 * wg) * t
    tile = 2 * wg * t + 2 * pad(wg * int(config.get("items_per_thread", 1))) * t
    if schedule == "lookback":
        tile += 2 * t  # the int ticket, then the carry at its own alignment (4 + 4 or 4 + 4 padding + 8)
        if target != "cuda":
            from .gpu_multiblock import LOOKBACK_WINDOW

            tile += LOOKBACK_WINDOW * (4 + t)
    return tile


def max_threads(res: KernelResources, dev: DeviceLimits = SM90) -> int:
    """The largest block ``res`` can launch with: registers are allocated per warp in ``register_unit`` steps."""
    if res.max_threads is not None:
        return res.max_threads
    per_warp = -(-res.registers * WARP // dev.register_unit) * dev.register_unit
    warps = dev.registers_per_block // per_warp if per_warp else dev.threads_per_block // WARP
    return min(dev.threads_per_block, warps * WARP)


def why_not_launchable(schedule: str, config: dict, dtype: str, res: KernelResources | None = None,
                       dev: DeviceLimits = SM90, target: str = "cuda") -> str | None:
    """Why ``schedule`` with ``config`` in ``dtype`` cannot launch on ``dev``, or ``None`` when it can.

    Args:
        schedule, config, dtype: the configuration (``config`` holds the schedule's tunables).
        res: the compiled kernel's resources, when known; else shared memory comes from
            :func:`shared_bytes` and registers are assumed bounded by the launch bounds.
        dev: the device's per-block limits.
        target: ``cuda`` or ``opencl`` (their shared-memory layouts differ slightly).
    """
    block = block_size(schedule, config)
    cfg = ", ".join(f"{k}={v}" for k, v in sorted(config.items()))
    if block > dev.threads_per_block:
        return f"{schedule} ({cfg}): workgroup_size {block} exceeds the device's {dev.threads_per_block}"
    shared = res.shared if res is not None else shared_bytes(schedule, config, dtype, target)
    if shared > dev.shared_per_block:
        return (f"{schedule} ({cfg}) in {dtype} needs {shared} bytes of shared memory per workgroup, over the "
                f"device's {dev.shared_per_block}; lower workgroup_size * items_per_thread")
    if res is not None:
        fit = max_threads(res, dev)
        if block > fit:
            return (f"{schedule} ({cfg}) in {dtype} uses {res.registers} registers per thread: at most {fit} "
                    f"work-items per workgroup launch, not {block}")
    return None
