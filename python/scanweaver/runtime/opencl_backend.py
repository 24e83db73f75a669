"""The ``opencl`` backend: the OpenCL C kernels through PyOpenCL, on any OpenCL device.

PyOpenCL is imported on first use.  Device choice: the environment variable
``SCANWEAVER_OPENCL_DEVICE`` holds ``P:D`` (platform and device indices, as
``clinfo -l`` lists them) or a case-insensitive part of the device or
platform name; without it the first GPU is used, else the first device.
Inputs may be NumPy arrays or ``pyopencl.array.Array`` s of this backend's
context (used without copies; ``y`` then comes back as a device array).
Kernels run on a profiling queue: :attr:`OpenCLBackend.last_ms` is the
device time of the last scan.  Built programs are cached per source.

Example:
    >>> import numpy as np, scanweaver
    >>> a = np.full((2, 5), 0.5, np.float32); b = np.ones((2, 5), np.float32)
    >>> y = scanweaver.selective_scan(a, b, b, backend="opencl")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from .. import environment

from ..errors import BackendUnavailable, CompileError, ScanInputError
from ..targets.gpu import Plan
from ..targets.launch_limits import DeviceLimits
from .base import Availability, register
from .gpu_base import GPUBackend

ENV_DEVICE = "SCANWEAVER_OPENCL_DEVICE"

#: True once this process asked OpenCL for its platforms: the ICD loader has loaded the platform's runtime
#: (PoCL starts its device threads then), so a child forked from here cannot use OpenCL.
_started = False
#: Set in a child forked after OpenCL started in its parent: why OpenCL cannot run there.
_forked: str | None = None


def _after_fork_in_child() -> None:
    """OpenCL does not survive ``fork``: the child inherits the runtime's state but not its threads, and its
    first transfer waits forever for them (PoCL; a new context in the child does too).  So the child refuses
    the backend with one clear error: ``auto`` passes it over, ``backend="opencl"`` raises."""
    global _forked
    if _started:
        _forked = (f"opencl: process {os.getpid()} was forked after OpenCL started in its parent, and OpenCL "
                   "does not survive fork (its next transfer would wait forever); start worker processes with "
                   "the 'spawn' or 'forkserver' method (multiprocessing.set_start_method('spawn')), or use "
                   "another backend in forked workers")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def refuse_if_forked() -> None:
    """Raises :class:`BackendUnavailable` in a process forked after OpenCL started in its parent."""
    if _forked is not None:
        raise BackendUnavailable(_forked)


def select_device():
    """The ``(platform, device)`` to use; raises :class:`BackendUnavailable` saying why none fits."""
    global _started
    refuse_if_forked()
    import pyopencl as cl

    _started = True
    try:
        platforms = cl.get_platforms()
    except cl.Error as exc:
        raise BackendUnavailable(f"opencl: no OpenCL platform ({exc}); install an ICD such as pocl-opencl-icd "
                                 "or pip install pocl-binary-distribution") from None
    pairs = [(p, d) for p in platforms for d in p.get_devices()]
    if not pairs:
        raise BackendUnavailable("opencl: OpenCL platforms exist but expose no device")
    spec = environment.text(ENV_DEVICE)
    if not spec:
        gpus = [(p, d) for p, d in pairs if d.type & cl.device_type.GPU]
        return (gpus or pairs)[0]
    if ":" in spec and all(part.isdecimal() for part in spec.split(":", 1)):
        pi, di = (int(v) for v in spec.split(":", 1))
        try:
            p = platforms[pi]
            return p, p.get_devices()[di]
        except IndexError:
            raise BackendUnavailable(f"opencl: {ENV_DEVICE}={spec!r} names no device; `clinfo -l` lists them") from None
    for p, d in pairs:
        if spec.lower() in d.name.lower() or spec.lower() in p.name.lower():
            return p, d
    names = ", ".join(f"{p.name}: {d.name}" for p, d in pairs)
    raise BackendUnavailable(f"opencl: {ENV_DEVICE}={spec!r} matches no device; devices: {names}")


#: Apple's OpenCL (macOS): frozen at 1.2 and deprecated since macOS 10.14 in favour of Metal.
APPLE_NOTE = ("Apple's OpenCL 1.2, deprecated since macOS 10.14 in favour of Metal "
              "(ScanWeaver.jl runs Metal: backend='julia', device='metal')")


def limits(platform, device) -> dict[str, object]:
    """What bounds the kernels on ``device``: OpenCL version, float64, largest workgroup, local memory."""
    ext = device.extensions.split()
    fp64 = "cl_khr_fp64" in ext or "cl_amd_fp64" in ext
    out: dict[str, object] = {"opencl": device.version.strip(), "float64": fp64,
                              "max_workgroup": int(device.max_work_group_size),
                              "local_memory_kib": int(device.local_mem_size) // 1024}
    if platform.name.strip() == "Apple":
        out["note"] = APPLE_NOTE + ("" if fp64 else "; no float64 on this device: run float64 on the cpu backend")
    return out


@register
class OpenCLBackend(GPUBackend):
    """OpenCL C kernels on any OpenCL device (PoCL on CPUs in CI)."""

    name = "opencl"
    array_modules = ("pyopencl",)
    target = "opencl"
    auto_priority = 5
    multi_block = "reduce_then_scan"

    def __init__(self) -> None:
        self._queue = None
        self._programs: dict[object, object] = {}
        self.last_ms = 0.0

    @classmethod
    def probe(cls) -> Availability:
        try:
            import pyopencl  # noqa: F401
        except ImportError:
            return Availability(False, "pyopencl is not installed (pip install pyopencl)")
        try:
            p, d = select_device()
        except BackendUnavailable as exc:
            return Availability(False, str(exc))
        if "Portable Computing Language" in p.name and not shutil.which("ld"):
            # PoCL links every kernel with the system linker and aborts the process when it is missing.
            return Availability(False, "PoCL needs a linker (ld, from binutils) on PATH to build kernels")
        note = "; " + APPLE_NOTE if p.name.strip() == "Apple" else ""
        return Availability(True, device=f"{d.name.strip()} ({p.name.strip()}, OpenCL{note})")

    @classmethod
    def availability(cls) -> Availability:
        """:meth:`probe`, cached for the process; unavailable in a child forked after OpenCL started."""
        if _forked is not None:
            return Availability(False, _forked)
        return super().availability()

    def details(self) -> dict[str, object]:
        return limits(*select_device())

    @property
    def queue(self):
        """The profiling command queue (created on first use; refused in a child forked after OpenCL started)."""
        refuse_if_forked()
        if self._queue is None:
            import pyopencl as cl

            _, dev = select_device()
            ctx = cl.Context([dev])
            self._queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        return self._queue

    def kernel(self, source: str, name: str):
        """Kernel ``name`` of the program built from ``source`` (programs and kernels are cached)."""
        import pyopencl as cl

        key = (source, name)
        if key not in self._programs:
            prog = self._programs.get(source)
            if prog is None:
                try:
                    prog = cl.Program(self.queue.context, source).build()
                except cl.RuntimeError as exc:
                    raise CompileError(f"opencl: kernel build failed on {self.queue.device.name}:\n{exc}") from None
                self._programs[source] = prog
            self._programs[key] = cl.Kernel(prog, name)
        return self._programs[key]

    def device_limits(self) -> DeviceLimits:
        dev = self.queue.device
        return DeviceLimits(threads_per_block=int(dev.max_work_group_size), shared_per_block=int(dev.local_mem_size))

    def is_device_array(self, value: object) -> bool:
        import pyopencl.array as cla

        return isinstance(value, cla.Array)

    def to_device(self, value):
        import pyopencl.array as cla

        if isinstance(value, cla.Array):
            if value.context != self.queue.context:
                raise ScanInputError("opencl: a pyopencl array belongs to another context; create it with "
                                     "scanweaver.runtime.get_backend('opencl').queue")
            return value
        return cla.to_device(self.queue, np.ascontiguousarray(value))

    def empty(self, n: int, dtype: np.dtype, zero: bool = False):
        import pyopencl.array as cla

        return (cla.zeros if zero else cla.empty)(self.queue, (n,), dtype)

    def to_host(self, value) -> np.ndarray:
        return value.get()

    @classmethod
    def adopt_call(cls, api, values, writable=False):
        for name, v in values.items():
            if not v.flags.c_contiguous:
                raise ScanInputError(f"{api}: device array {name} must be C-contiguous (copy it on the device first)")
        return super().adopt_call(api, values, writable)

    def launch(self, source: str, plan: Plan, args: list, stages=None) -> float:
        import pyopencl as cl

        if args[0].dtype == np.float64 and not self.queue.device.double_fp_config:
            raise ScanInputError(f"opencl: device {self.queue.device.name} has no float64; pass float32 arrays")
        bufs = [a.data if hasattr(a, "data") and not isinstance(a, np.generic) else a for a in args]
        events = []
        for step in plan.launches:
            kernel = self.kernel(source, step.kernel)
            limit = kernel.get_work_group_info(cl.kernel_work_group_info.WORK_GROUP_SIZE, self.queue.device)
            if step.block > limit:
                raise ScanInputError(f"opencl: workgroup_size={step.block} exceeds {limit}, the limit of "
                                     f"{step.kernel} on {self.queue.device.name}; choose a smaller workgroup_size")
            kernel.set_args(*bufs)
            events.append(cl.enqueue_nd_range_kernel(self.queue, kernel, (step.groups * step.block,),
                                                     (step.block,)))
        events[-1].wait()
        times = [(e.profile.end - e.profile.start) * 1e-6 for e in events]
        if self.kernel_log is not None:
            self.kernel_log.extend(zip((step.kernel for step in plan.launches), times, strict=True))
        return sum(times)
