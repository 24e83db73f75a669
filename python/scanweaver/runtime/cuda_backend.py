"""The ``cuda`` backend: the CUDA C kernels through CuPy (NVRTC at run time; no nvcc needed).

CuPy is imported on first use.  The device is CuPy's current device
(``CUDA_VISIBLE_DEVICES`` or ``cupy.cuda.Device(i).use()`` choose it).
Inputs may be NumPy arrays or CuPy arrays (used without copies; ``y`` then
comes back as a CuPy array).  Launches are timed with CUDA events:
:attr:`CUDABackend.last_ms` is the device time of the last scan.  Compiled
modules are cached per source.

Example:
    >>> import cupy as cp, scanweaver  # doctest: +SKIP
    >>> a = cp.random.rand(8, 1536, 4096, dtype=cp.float32)  # doctest: +SKIP
    >>> y = scanweaver.selective_scan(a, a, a, a, backend="cuda")  # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np

from ..errors import CompileError, ScanInputError
from ..targets.gpu import Plan
from .base import Availability, register
from .gpu_base import GPUBackend

#: Largest grid (workgroups) of a 1-D CUDA launch.
MAX_GRID_X = 2**31 - 1


@register
class CUDABackend(GPUBackend):
    """CUDA C kernels on NVIDIA GPUs through CuPy."""

    name = "cuda"
    target = "cuda"
    auto_priority = 20
    multi_block = "lookback"

    def __init__(self) -> None:
        self._modules: dict[object, object] = {}
        self.last_ms = 0.0

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

    def function(self, source: str, name: str):
        """Kernel ``name`` of the module compiled from ``source`` (modules and kernels are cached)."""
        import cupy

        key = (source, name)
        if key not in self._modules:
            mod = self._modules.get(source)
            if mod is None:
                try:
                    mod = cupy.RawModule(code=source)
                    mod.compile()
                except cupy.cuda.compiler.CompileException as exc:
                    raise CompileError(f"cuda: NVRTC failed:\n{exc}") from None
                self._modules[source] = mod
            self._modules[key] = mod.get_function(name)
        return self._modules[key]

    def is_device_array(self, value: object) -> bool:
        import cupy

        return isinstance(value, cupy.ndarray)

    def to_device(self, value):
        import cupy

        if isinstance(value, cupy.ndarray):
            if not value.flags.c_contiguous:
                raise ScanInputError("cuda: device arrays must be C-contiguous (use cupy.ascontiguousarray)")
            return value
        return cupy.asarray(np.ascontiguousarray(value))

    def empty(self, n: int, dtype: np.dtype, zero: bool = False):
        import cupy

        return (cupy.zeros if zero else cupy.empty)((n,), dtype)

    def to_host(self, value) -> np.ndarray:
        return value.get()

    def launch(self, source: str, plan: Plan, args: list) -> float:
        import cupy

        kernels = [self.function(source, step.kernel) for step in plan.launches]
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for step, kernel in zip(plan.launches, kernels, strict=True):
            if step.groups > MAX_GRID_X:
                raise ScanInputError(f"cuda: {step.kernel} needs {step.groups} blocks, more than CUDA's "
                                     f"{MAX_GRID_X}; raise items_per_thread or workgroup_size")
            kernel((step.groups,), (step.block,), tuple(args))
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end)
