"""The host CPU as the C backend sees it: name, cores and vector instruction set, on Linux, macOS and Windows.

Linux reads ``/proc/cpuinfo``; macOS asks ``sysctl`` (``machdep.cpu.brand_string``, ``hw.logicalcpu``,
and the performance/efficiency split ``hw.perflevel0/1.logicalcpu`` of Apple Silicon); elsewhere
:mod:`platform` answers.  The vector instruction set is what the C compiler targets with the kernel
flags (its predefined macros), which is what the kernels are built for.

Example:
    >>> from scanweaver.runtime.host import Host, cpu_model
    >>> Host.current().system in ("Linux", "Darwin", "Windows") or True
    True
    >>> isinstance(cpu_model(), str)
    True
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: Instruction sets named in reports, widest first: (predefined macro, name).
ISAS = (("__AVX512F__", "AVX-512"), ("__AVX2__", "AVX2"), ("__AVX__", "AVX"), ("__ARM_FEATURE_SVE", "SVE"),
        ("__ARM_NEON", "NEON"), ("__SSE2__", "SSE2"))


@dataclass(frozen=True)
class Host:
    """The operating system and machine kernels are built for.

    Attributes:
        system: ``platform.system()``: ``Linux``, ``Darwin`` (macOS) or ``Windows``.
        machine: ``platform.machine()``: ``x86_64``/``AMD64``, ``arm64`` (macOS) or ``aarch64`` (Linux).
    """

    system: str
    machine: str

    @staticmethod
    def current() -> Host:
        """This process's host."""
        return Host(platform.system(), platform.machine())

    @property
    def macos(self) -> bool:
        """True on macOS."""
        return self.system == "Darwin"

    @property
    def windows(self) -> bool:
        """True on Windows."""
        return self.system == "Windows"

    @property
    def arm64(self) -> bool:
        """True on 64-bit Arm (Apple Silicon, Graviton, Grace, ...)."""
        return self.machine.lower() in ("arm64", "aarch64")

    @property
    def library_suffix(self) -> str:
        """File suffix of a shared library: ``.dylib``, ``.dll`` or ``.so``."""
        return ".dylib" if self.macos else ".dll" if self.windows else ".so"


def sysctl(name: str) -> str | None:
    """The value of a macOS ``sysctl`` key, or ``None`` where there is none (or no ``sysctl``)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        proc = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=10)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return None


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def cpu_model(host: Host | None = None) -> str:
    """A readable CPU name, e.g. ``AMD EPYC`` or ``Apple M2``."""
    host = host or Host.current()
    if host.macos:
        brand = sysctl("machdep.cpu.brand_string")
        if brand:
            return brand
    for line in _cpuinfo():
        if line.startswith(("model name", "Model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or host.machine or "CPU"


def cpu_threads(host: Host | None = None) -> int:
    """Cores this process may run on (logical CPUs; every core of Apple Silicon, performance and efficiency)."""
    host = host or Host.current()
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    if host.macos:
        with contextlib.suppress(TypeError, ValueError):
            return int(sysctl("hw.logicalcpu") or "")
    return os.cpu_count() or 1


def core_kinds(host: Host | None = None) -> str:
    """Apple Silicon's split of cores, e.g. ``4 performance + 4 efficiency``; empty elsewhere."""
    host = host or Host.current()
    if not host.macos:
        return ""
    perf, eff = sysctl("hw.perflevel0.logicalcpu"), sysctl("hw.perflevel1.logicalcpu")
    return f"{perf} performance + {eff} efficiency" if perf and eff else ""


def cpu_flags() -> str:
    """The CPU's feature flags (Linux), part of compiled-kernel cache keys: ``-march=native`` objects
    run only on the same kind of CPU."""
    return next((line for line in _cpuinfo() if line.startswith(("flags", "Features"))), "")


def isa_of(macros: dict[str, str]) -> str:
    """The widest instruction set named in a compiler's predefined ``macros`` (``generic`` when none)."""
    return next((name for macro, name in ISAS if macro in macros), "generic")
