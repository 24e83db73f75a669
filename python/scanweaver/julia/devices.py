"""Julia devices: which KernelAbstractions backends can run, and why not.

One :class:`JuliaDevice` per ``device=`` value; the GPU ones need their Julia
package (CUDA.jl, AMDGPU.jl, oneAPI.jl, Metal.jl) in the Julia environment
juliapkg manages, and ScanWeaver.jl's package extension for it loads with it.
"""

from __future__ import annotations

import glob
import platform
import shutil
from dataclasses import dataclass
from collections.abc import Callable

from ..errors import BackendUnavailable
from . import session


def _has_nvidia() -> bool:
    return shutil.which("nvidia-smi") is not None


def _has_rocm() -> bool:
    return shutil.which("rocm-smi") is not None or bool(glob.glob("/dev/kfd"))


def _has_intel_gpu() -> bool:
    return bool(glob.glob("/dev/dri/renderD*"))


def _is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


#: Dtypes of a device whose KernelAbstractions backend has no Float64.
NARROW_DTYPES = ("float32", "complex64")


@dataclass(frozen=True)
class JuliaDevice:
    """A ``device=`` value of the julia backend.

    Attributes:
        name: the ``device=`` keyword value (``cuda``, ``amdgpu`` ...).
        package: the Julia package providing its arrays (``None`` for ``cpu``).
        uuid: that package's UUID (for the install command).
        hardware: a cheap check that the hardware is present, for messages.
        kernel_tuner: the Kernel Tuner Julia backend name (its ``compiler_options``).
        dtypes: the dtypes it runs as far as is known without starting Julia:
            ``float64``/``complex128`` only where the GPU package's
            ``KernelAbstractions.supports_float64`` says yes (oneAPI.jl and
            Metal.jl say no). Once Julia runs, :func:`runtime_dtypes` asks
            ScanWeaver.jl instead (``ScanWeaver.device_dtypes``).
    """

    name: str
    package: str | None
    uuid: str | None
    hardware: Callable[[], bool]
    kernel_tuner: str
    dtypes: tuple[str, ...] = ("float32", "float64", "complex64", "complex128")

    @property
    def install_command(self) -> str:
        """The shell command that adds the device's Julia package to juliapkg's environment."""
        return (f"python -c \"import juliapkg; juliapkg.add('{self.package}', '{self.uuid}'); "
                "juliapkg.resolve()\"")


DEVICES: dict[str, JuliaDevice] = {d.name: d for d in (
    JuliaDevice("cpu", None, None, lambda: True, "cpu"),
    JuliaDevice("cuda", "CUDA", "052768ef-5323-5732-b1bb-66c8b64840ba", _has_nvidia, "cuda"),
    JuliaDevice("amdgpu", "AMDGPU", "21141c5a-9bdb-4563-92ae-f87d6854732e", _has_rocm, "amd"),
    JuliaDevice("oneapi", "oneAPI", "8f75cd03-7ff8-4ecb-9b8f-daf728133b1b", _has_intel_gpu, "intel",
                NARROW_DTYPES),
    JuliaDevice("metal", "Metal", "dde4c033-4e86-420c-a63e-0dd931031962", _is_apple_silicon, "metal",
                NARROW_DTYPES),
)}

_ready: dict[str, str] = {}
_dtypes: dict[str, tuple[str, ...]] = {}


def runtime_dtypes(name: str) -> tuple[str, ...]:
    """The dtypes device ``name`` runs: ScanWeaver.jl's answer once :func:`activate` has asked, else the table's."""
    return _dtypes.get(name, DEVICES[name].dtypes)


def activate(name: str) -> str:
    """Starts Julia and loads ``name``'s package; returns the device description.

    Raises:
        BackendUnavailable: Julia cannot start, the package is not installed
            (with the command that installs it), or the device is not functional.
    """
    session.refuse_if_forked()  # a device made ready in the parent is not ready in a forked child
    if name in _ready:
        return _ready[name]
    dev = DEVICES[name]
    with session.exclusive():
        jl = session.main()
        if dev.package is not None:
            if not bool(jl.seval(f'Base.find_package("{dev.package}") !== nothing')):
                raise BackendUnavailable(
                    f"julia backend: device={name!r} needs {dev.package}.jl in the Julia environment; "
                    f"run `{dev.install_command}`"
                )
            try:
                jl.seval(f"import {dev.package}")
            except Exception as exc:
                raise BackendUnavailable(f"julia backend: loading {dev.package}.jl failed: {exc}") from exc
        ok, detail = jl.seval("ScanWeaver.device_status")(name)
        if not bool(ok):
            raise BackendUnavailable(f"julia backend: device={name!r} is unavailable: {detail}")
        _dtypes[name] = tuple(str(d) for d in jl.seval("ScanWeaver.device_dtypes")(name))
        detail = str(detail)
    _ready[name] = detail
    return _ready[name]


def _static_reason(dev: JuliaDevice) -> str:
    hw = "hardware found" if dev.hardware() else "no hardware found"
    return (f"not checked until Julia starts ({hw}); needs {dev.package}.jl "
            f"(`{dev.install_command}`)")


def julia_devices(start: bool = False) -> list[dict]:
    """Each Julia device backend and whether it can run, for ``scanweaver devices``.

    Args:
        start: start Julia (if it is not running) and load each GPU package to
            check it; otherwise answer in milliseconds from what is known
            without Julia.

    Returns:
        One ``{"name", "ok", "reason"}`` dict per device (``cpu``, ``cuda``,
        ``amdgpu``, ``oneapi``, ``metal``).

    Example:
        >>> from scanweaver.julia import julia_devices
        >>> [d["name"] for d in julia_devices()]
        ['cpu', 'cuda', 'amdgpu', 'oneapi', 'metal']
    """
    ok, detail = session.probe()
    out = []
    for name, dev in DEVICES.items():
        if not ok:
            out.append({"name": name, "ok": False, "reason": detail})
        elif start or session.running() or name in _ready:
            try:
                out.append({"name": name, "ok": True, "reason": activate(name)})
            except BackendUnavailable as exc:
                out.append({"name": name, "ok": False, "reason": str(exc)})
        elif dev.package is None:
            out.append({"name": name, "ok": True, "reason": f"KernelAbstractions CPU via {detail}"})
        else:
            out.append({"name": name, "ok": False, "reason": _static_reason(dev)})
    return out
