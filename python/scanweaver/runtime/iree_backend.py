"""The ``iree`` backend: MLIR modules from :mod:`scanweaver.targets.mlir_target`, compiled and run by IREE.

``iree.compiler`` turns the module into a VM flatbuffer for the ``device``
tunable (``llvm-cpu`` by default; ``cuda``, ``rocm``, ``vulkan``, ``metal``
where the runtime has the driver and a device; see :mod:`.iree_devices`),
and ``iree.runtime`` runs it on NumPy arrays.  Compiled modules are cached
on disk like the C kernels (named by the SHA-256 of the module text, the
compile options and IREE's version, under ``<cache>/iree``) and once per
process in memory.  On ``llvm-cpu`` the operands are imported without a copy
(``import_host_allocation``) and ``y`` comes back as a view of the module's
result buffer.  Install with ``pip install scanweaver[iree]``; nothing of
IREE is imported before a module is compiled or run.

Example:
    >>> import numpy as np, scanweaver
    >>> a = np.full((2, 5), 0.5, np.float32); b = np.ones_like(a); x = np.ones_like(a)
    >>> scanweaver.selective_scan(a, b, x, backend="iree")[0].tolist()  # doctest: +SKIP
    [1.0, 1.5, 1.75, 1.875, 1.9375]
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

from ..errors import BackendUnavailable, CompileError, ScanInputError
from ..ir import Stages
from ..schedules import Tunable
from ..targets.mlir_target import ENTRY, MLIRRenderer
from .base import Availability, Backend, ScanArrays, register
from .iree_devices import DEVICES, compile_flags
from .toolchain import cache_dir

INSTALL = "pip install scanweaver[iree]  (iree-base-compiler and iree-base-runtime)"
#: Lanes from which the default schedule is ``sequential`` (lanes fill the cores); fewer run ``chunked``.
MANY_LANES = 64


def _device_rule(value: object) -> str | None:
    return None if value in DEVICES else f"it must be one of {', '.join(DEVICES)}"


def _missing() -> str:
    missing = [m for m in ("iree.compiler", "iree.runtime") if _find(m) is None]
    return f"{', '.join(missing)} not installed ({INSTALL})" if missing else ""


def _find(module: str):
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def compile_module(source: str, device: str = "llvm-cpu", cache: Path | None = None) -> bytes:
    """The VM flatbuffer of MLIR ``source`` for ``device``, compiled once and kept in the cache directory.

    Raises:
        BackendUnavailable: IREE is not installed.
        ScanInputError: ``device`` is unknown.
        CompileError: ``iree-compile`` rejected the module (its first diagnostic, with a hint where one is known).
    """
    if device not in DEVICES:
        raise ScanInputError(f"iree backend: device={device!r} is unknown; known: {', '.join(DEVICES)}")
    reason = _missing()
    if reason:
        raise BackendUnavailable(f"iree backend: {reason}")
    import iree.compiler as ic

    flags = compile_flags(device)
    version = getattr(ic, "__version__", "") or _iree_version()
    key = hashlib.sha256("\0".join((source, *flags, version)).encode()).hexdigest()[:32]
    directory = cache if cache is not None else cache_dir() / "iree"
    path = directory / f"{key}-{device}.vmfb"
    if path.exists():
        return path.read_bytes()
    try:
        vmfb = ic.compile_str(source, extra_args=list(flags))
    except ic.CompilerToolError as exc:
        text = str(exc)
        hint = ("; IREE's llvm-cpu links no float64 sin or cos: use float32 or backend='cpu'"
                if "undefined symbol: sin" in text or "undefined symbol: cos" in text else "")
        diag = next((ln.strip() for ln in text.splitlines() if "error" in ln), text.splitlines()[0])
        raise CompileError(f"iree backend: iree-compile failed for device={device}: {diag}{hint}") from None
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(vmfb)
    os.replace(tmp, path)
    return vmfb


def _iree_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iree-base-compiler")
    except PackageNotFoundError:
        return "unknown"


class _Held:
    """A host view of a result buffer that keeps the buffer (its ``DeviceArray``) alive."""

    def __init__(self, host: np.ndarray, owner: object):
        self.__array_interface__ = host.__array_interface__
        self._host, self._owner = host, owner


@register
class IreeBackend(Backend):
    """MLIR through IREE: ``llvm-cpu`` here, GPU drivers where the runtime finds a device."""

    name = "iree"
    target = "mlir"
    kinds = ("diagonal",)
    auto_priority = -1  # never picked by backend="auto": the cpu backend is the host's fast path
    extra_tunables = (Tunable("device", "llvm-cpu", ("llvm-cpu",), "IREE device the module is compiled for and run on "
                              f"({', '.join(DEVICES)})", _device_rule),)

    def __init__(self) -> None:
        self._renderer = MLIRRenderer()
        self._functions: dict[tuple[str, str], tuple[object, object, bool]] = {}
        self._configs: dict[str, object] = {}
        self._lock = threading.Lock()

    @classmethod
    def probe(cls) -> Availability:
        reason = _missing()
        if reason:
            return Availability(False, reason)
        return Availability(True, device=f"IREE {_iree_version()} llvm-cpu (local-task)")

    def details(self) -> dict[str, object]:
        """IREE's runtime drivers and the devices each finds (``scanweaver devices``)."""
        import iree.runtime as rt

        out: dict[str, object] = {"compiler": f"iree-base-compiler {_iree_version()}"}
        for name in rt.query_available_drivers():
            try:
                found = rt.get_driver(name).query_available_devices()
                out[f"driver {name}"] = ", ".join(str(d.get("name", d)) for d in found) or "no device"
            except Exception as exc:  # a driver without its system library reports why
                out[f"driver {name}"] = f"unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"
        for dev in DEVICES.values():
            out[f"device={dev.name}"] = " ".join(compile_flags(dev.name)) + (f"  ({dev.note})" if dev.note else "")
        return out

    def default_schedule(self, lanes: int, L: int) -> str:
        """``sequential`` when lanes fill the cores, else ``chunked`` (chunks in parallel)."""
        return "sequential" if lanes >= MANY_LANES else "chunked"

    def emit(self, stages: Stages) -> Stages:
        return dataclasses.replace(stages, kernel=self._renderer.render(stages), target="mlir")

    def _config(self, driver: str):
        """The runtime configuration (instance and device) of ``driver``, created once per process."""
        import iree.runtime as rt

        with self._lock:
            cfg = self._configs.get(driver)
            if cfg is None:
                try:
                    cfg = rt.Config(driver)
                except Exception as exc:
                    raise BackendUnavailable(f"iree backend: driver {driver!r} has no device here "
                                             f"({type(exc).__name__}: {exc})") from None
                self._configs[driver] = cfg
        return cfg

    def function(self, stages: Stages):
        """``(entry function, runtime context, host memory?)`` of ``stages`` on its ``device`` (compiled once)."""
        if stages.kernel is None or stages.target != "mlir":
            stages = self.emit(stages)
        assert stages.schedule is not None and stages.kernel is not None
        device = str(stages.schedule.config.get("device", "llvm-cpu"))
        key = (stages.kernel, device)
        with self._lock:
            hit = self._functions.get(key)
        if hit is not None:
            return hit
        import iree.runtime as rt

        cfg = self._config(DEVICES[device].driver)  # no device for the driver: say so before compiling
        vmfb = compile_module(stages.kernel, device)
        ctx = rt.SystemContext(config=cfg)  # one context per module: every module is named ``module``
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, vmfb))
        hit = (ctx.modules.module[ENTRY], ctx, DEVICES[device].driver.startswith("local"))
        with self._lock:
            self._functions[key] = hit
        return hit

    def run(self, stages: Stages, arrays: ScanArrays):
        fn, ctx, host = self.function(stages)
        aff, feats = stages.affine, stages.affine.features
        dtype = np.dtype(aff.dtype)
        if np.dtype(arrays.dtype) != dtype:
            raise ScanInputError(f"iree backend: operands are {arrays.dtype}; the module was built for {dtype}")
        if feats.has_h0 and arrays.h0 is None or feats.has_reset and arrays.reset is None:
            raise ScanInputError("iree backend: the module reads h0 and reset as its features say; one is missing")
        args = [self._argument(ctx, arrays.inputs[n], dtype, host) for n in aff.inputs]
        if feats.has_h0:
            # a copy: the module's carried state starts in h0's buffer, and IREE updates it in place
            args.append(self._argument(ctx, np.array(arrays.h0, dtype, order="C"), dtype, host))
        if feats.has_reset:
            args.append(self._argument(ctx, np.ascontiguousarray(arrays.reset).view(np.int8), np.dtype(np.int8), host))
        y, h_last = fn(*args)  # type: ignore[operator]
        return np.asarray(_Held(y.to_host(), y)), np.array(h_last.to_host())

    @staticmethod
    def _argument(ctx, arr: np.ndarray, dtype: np.dtype, host: bool):
        import iree.runtime as rt

        if not isinstance(arr, np.ndarray) or arr.dtype != dtype or not arr.flags.c_contiguous:
            raise ScanInputError(f"iree backend: an operand must be a C-contiguous {dtype} array, got "
                                 f"{getattr(arr, 'dtype', type(arr).__name__)}")
        device = ctx.config.device
        if not host:
            return rt.asdevicearray(device, arr)
        if not arr.flags.writeable:  # the module only reads its operands; IREE imports writeable buffers only
            arr = _writeable_alias(arr)
        buf = device.allocator.import_host_allocation(arr, rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE,
                                                      rt.BufferUsage.DEFAULT)
        view = rt.HalBufferView(buf, arr.shape, rt.dtypes.map_dtype_to_hal_element_type(arr.dtype))
        return rt.DeviceArray(device, view)


def _writeable_alias(arr: np.ndarray) -> np.ndarray:
    """A writeable view of a read-only C-contiguous array's memory (the caller keeps ``arr`` alive)."""
    if arr.size == 0:
        return np.empty(arr.shape, arr.dtype)
    raw = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
    return np.frombuffer(raw, dtype=arr.dtype).reshape(arr.shape)
