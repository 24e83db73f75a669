"""The ``cuda`` backend: the CUDA C kernels through CuPy (NVRTC at run time; no nvcc needed).

CuPy is imported on first use.  The device is the operands' device (CuPy's
current device for NumPy operands; ``CUDA_VISIBLE_DEVICES`` or
``cupy.cuda.Device(i).use()`` choose it).  Operands may be NumPy arrays or
CUDA device arrays: CuPy arrays, PyTorch CUDA tensors (through DLPack), and
anything with ``__dlpack__`` or ``__cuda_array_interface__`` (as CuPy views);
non-contiguous ones are copied once on the device.  For device operands the
call is asynchronous: kernels are queued on the caller's stream (CuPy's
current stream; PyTorch's current stream for PyTorch tensors) with scratch
from CuPy's memory pool, nothing waits for them, and ``y`` comes back in the
caller's array type (PyTorch tensors for PyTorch tensors, else CuPy arrays),
or is written into a device ``out=``.  CUDA events are recorded only when
:attr:`CUDABackend.timing` is set; :attr:`CUDABackend.last_ms` is then the
device time of the last scan; where :attr:`~.gpu_base.GPUBackend.kernel_log` is a
list, every launch appends each kernel's name and device time to it (events
between the kernels).  Compiled kernels are cached per device and source;
before its first launch each one's resources (registers, shared memory, the
driver's largest block) are checked against the launch
(:mod:`scanweaver.targets.launch_limits`), so a configuration that cannot
launch is refused with the reason instead of ``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``.

Example:
    >>> import cupy as cp, scanweaver  # doctest: +SKIP
    >>> a = cp.random.rand(8, 1536, 4096, dtype=cp.float32)  # doctest: +SKIP
    >>> y = scanweaver.selective_scan(a, a, a, a)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..errors import CompileError, ScanInputError
from ..targets.gpu import Plan
from ..targets.launch_limits import DeviceLimits, KernelResources, why_not_launchable
from .base import Availability, DeviceCall, register
from .device_plan import FAMILIES, Family
from .gpu_base import GPUBackend

#: Largest grid (workgroups) of a 1-D CUDA launch.
MAX_GRID_X = 2**31 - 1


def _cuda_stream_of(tensor):
    """PyTorch's current stream on ``tensor``'s device, as a CuPy stream (nothing is synchronised)."""
    import cupy
    import torch

    ts = torch.cuda.current_stream(tensor.device)
    try:
        return cupy.cuda.Stream.from_external(ts)
    except (AttributeError, TypeError):  # CuPy < 14 or a PyTorch without the CUDA stream protocol
        return cupy.cuda.ExternalStream(ts.cuda_stream, tensor.device.index)


def _to_cupy(api: str, name: str, value, writable: bool):
    import cupy

    if isinstance(value, cupy.ndarray):
        arr = value
    elif type(value).__module__.split(".")[0] == "torch":
        arr = cupy.from_dlpack(value.detach())
    elif hasattr(value, "__cuda_array_interface__"):
        arr = cupy.asarray(value)
    elif hasattr(value, "__dlpack__"):
        arr = cupy.from_dlpack(value)
    else:
        raise ScanInputError(f"{api}: {name} ({type(value).__name__}) is not a CUDA device array")
    if not arr.flags.c_contiguous:
        if writable:
            raise ScanInputError(f"{api}: {name} must be C-contiguous to be written into; pass a contiguous buffer")
        arr = cupy.ascontiguousarray(arr)  # one copy, on the device
    return arr


@register
class CUDABackend(GPUBackend):
    """CUDA C kernels on NVIDIA GPUs through CuPy."""

    name = "cuda"
    array_modules = ("cupy",)
    target = "cuda"
    auto_priority = 20
    #: reduce_then_scan measured 2.6x the serial look-back on one sequence of 2^26 (H200); the warp-wide
    #: look-back becomes the default once it measures faster.
    multi_block = "reduce_then_scan"

    def __init__(self) -> None:
        self._functions: dict[tuple, tuple[object, KernelResources]] = {}
        self._checked: set[tuple] = set()
        self._limits: dict[int, DeviceLimits] = {}
        #: record CUDA events around each scan (and wait for them) so that :attr:`last_ms` is its device time
        self.timing = False
        self.last_ms = float("nan")

    @classmethod
    def probe(cls) -> Availability:
        try:
            import cupy
        except ImportError:
            return Availability(False, "cupy is not installed (pip install cupy-cuda12x)")
        except Exception as exc:  # a broken CUDA install can fail at import
            return Availability(False, f"cupy failed to import: {type(exc).__name__}: {exc}")
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return Availability(False, f"no CUDA driver or device: {exc}")
        if count == 0:
            return Availability(False, "no CUDA device found")
        dev = cupy.cuda.Device()
        props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return Availability(True, device=f"{name} (CUDA device {dev.id}, sm_{dev.compute_capability})")

    @classmethod
    def adopt_call(cls, api, values, writable=False):
        """CuPy views of CuPy, PyTorch (DLPack) and ``__cuda_array_interface__`` arrays, on the caller's stream."""
        import cupy

        first = next(iter(values.values()))
        torch_in = type(first).__module__.split(".")[0] == "torch"
        call = DeviceCall(wrap=lambda v: v)
        if torch_in:
            import torch

            call = DeviceCall(wrap=torch.from_dlpack, stream=_cuda_stream_of(first))
        device = getattr(first, "device", None)
        index = getattr(device, "index", getattr(device, "id", None))
        with cupy.cuda.Device(index if isinstance(index, int) else cupy.cuda.Device().id), call.context():
            native = {n: _to_cupy(api, n, v, writable) for n, v in values.items()}
        return native, call

    def function(self, source: str, name: str):
        """Kernel ``name`` of the module compiled from ``source`` and its resources (cached per device)."""
        import cupy

        key = (cupy.cuda.Device().id, source, name)
        hit = self._functions.get(key)
        if hit is None:
            try:
                kernel = cupy.RawModule(code=source).get_function(name)
                res = KernelResources(registers=int(kernel.num_regs), shared=int(kernel.shared_size_bytes),
                                      local=int(kernel.local_size_bytes),
                                      max_threads=int(kernel.max_threads_per_block))
            except cupy.cuda.compiler.CompileException as exc:
                raise CompileError(f"cuda: NVRTC failed:\n{exc}") from None
            hit = self._functions[key] = (kernel, res)
        return hit

    def device_limits(self) -> DeviceLimits:
        """The current device's per-block limits (read once per device)."""
        import cupy

        dev = cupy.cuda.Device().id
        if dev not in self._limits:
            self._limits[dev] = self._read_limits()
        return self._limits[dev]

    @staticmethod
    def _read_limits() -> DeviceLimits:
        import cupy

        attrs = cupy.cuda.Device().attributes
        return DeviceLimits(threads_per_block=int(attrs["MaxThreadsPerBlock"]),
                            registers_per_block=int(attrs["MaxRegistersPerBlock"]),
                            shared_per_block=int(attrs["MaxSharedMemoryPerBlock"]))

    def is_device_array(self, value: object) -> bool:
        import cupy

        return isinstance(value, cupy.ndarray)

    def to_device(self, value):
        import cupy

        if isinstance(value, cupy.ndarray):
            return value if value.flags.c_contiguous else cupy.ascontiguousarray(value)
        return cupy.asarray(np.ascontiguousarray(value))

    def empty(self, n: int, dtype: np.dtype, zero: bool = False):
        import cupy

        return (cupy.zeros if zero else cupy.empty)((n,), dtype)  # CuPy's pool, on the current stream

    def to_host(self, value) -> np.ndarray:
        return value.get()

    def planned_kernel(self, source: str, step, stages=None):
        """The compiled kernel of launch ``step``, checked once against the device's limits before its first
        launch (a configuration that cannot launch is refused with the reason)."""
        import cupy

        if step.groups > MAX_GRID_X:
            raise ScanInputError(f"cuda: {step.kernel} needs {step.groups} blocks, more than CUDA's "
                                 f"{MAX_GRID_X}; raise items_per_thread or workgroup_size")
        kernel, res = self.function(source, step.kernel)
        key = (cupy.cuda.Device().id, source, step.kernel, step.block)
        if key not in self._checked and stages is not None:
            sched = stages.schedule
            why = why_not_launchable(sched.schedule, sched.config, stages.affine.dtype, res, self.device_limits())
            if why:
                raise ScanInputError(f"cuda: cannot launch {step.kernel}: {why}")
            self._checked.add(key)
        return kernel

    def launch(self, source: str, plan: Plan, args: list, stages=None) -> float | None:
        import cupy

        kernels = [self.planned_kernel(source, step, stages) for step in plan.launches]
        log = self.kernel_log
        marks = [cupy.cuda.Event() for _ in range(len(kernels) + 1)] if self.timing or log is not None else []
        if marks:
            marks[0].record()
        for i, (step, kernel) in enumerate(zip(plan.launches, kernels, strict=True)):
            kernel((step.groups,), (step.block,), tuple(args))  # on the current stream
            if log is not None:
                marks[i + 1].record()
        if not marks:
            return None
        marks[-1].record()
        marks[-1].synchronize()
        if log is not None:
            log.extend((step.kernel, cupy.cuda.get_elapsed_time(marks[i], marks[i + 1]))
                       for i, step in enumerate(plan.launches))
        return cupy.cuda.get_elapsed_time(marks[0], marks[-1]) if self.timing else None

    # ---- planned calls (scanweaver.runtime.device_plan) ------------------------------------------------

    def plan_scratch(self, sizes: dict[str, tuple[int, np.dtype]], stream) -> dict[str, object]:
        """A device plan's own buffers (``name -> (elements, dtype)``), allocated on its launch stream."""
        with stream if stream is not None else contextlib.nullcontext():
            return {k: self.empty(n, dtype) for k, (n, dtype) in sizes.items()}

    def launch_planned(self, kernels, args: tuple, stream, zeros: tuple = ()) -> None:
        """Launches a device plan's kernels on ``stream`` (``None``: CuPy's current one), after zeroing the
        ``(pointer, bytes)`` ranges of ``zeros`` there; nothing waits for them."""
        import cupy

        with stream if stream is not None else contextlib.nullcontext():
            handle = cupy.cuda.get_current_stream().ptr
            for ptr, nbytes in zeros:
                cupy.cuda.runtime.memsetAsync(ptr, 0, nbytes, handle)
            for kernel, groups, block in kernels:
                kernel((groups,), (block,), args)


def _cupy_device(value) -> int:
    return int(value.device.id)


def _current_cupy_stream(value, device: int) -> int:
    import cupy

    try:
        return int(cupy.cuda.get_current_stream(device).ptr)
    except TypeError:  # a CuPy whose get_current_stream takes no device: the current device's
        return int(cupy.cuda.get_current_stream().ptr)


def _cupy_empty(shape: tuple, dtype: np.dtype, device: int, stream):
    import cupy

    with cupy.cuda.Device(device), stream if stream is not None else contextlib.nullcontext():
        return cupy.empty(shape, dtype)


def _torch_device(value) -> int:
    return int(value.get_device())


def _torch_stream(value, device: int) -> int:
    import torch

    return int(torch.cuda.current_stream(device).cuda_stream)


def _torch_empty(shape: tuple, dtype: np.dtype, device: int, stream):
    import torch

    return torch.empty(shape, dtype=torch.float32 if dtype == np.float32 else torch.float64, device=f"cuda:{device}")


def _current_device(value) -> int:
    import cupy

    return int(cupy.cuda.Device().id)


def _cupy_module():
    import cupy

    return cupy


FAMILIES["cupy"] = Family(_cupy_device, _current_cupy_stream, lambda value, device: None, _cupy_empty, _cupy_module)
FAMILIES["torch"] = Family(_torch_device, _torch_stream, lambda value, device: _cuda_stream_of(value), _torch_empty)
FAMILIES[""] = Family(_current_device, _current_cupy_stream, lambda value, device: None, _cupy_empty)
