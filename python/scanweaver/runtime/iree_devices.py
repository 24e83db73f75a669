"""IREE devices: the compile options and runtime driver of each ``device=`` of the ``iree`` backend.

One table, :data:`DEVICES`, read by the backend (compile and run), by
``scanweaver devices`` and by the compile-only tests of the GPU targets.
GPU architectures can be overridden by environment variables
(``SCANWEAVER_IREE_CUDA_TARGET``, ``SCANWEAVER_IREE_ROCM_TARGET``,
``SCANWEAVER_IREE_VULKAN_TARGET``).

Example:
    >>> DEVICES["llvm-cpu"].driver
    'local-task'
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import environment


@dataclass(frozen=True)
class IreeDevice:
    """One ``device=`` value.

    Attributes:
        name: the ``device=`` keyword value.
        driver: the IREE runtime driver that runs its modules.
        flags: ``iree-compile`` options that select the target (``arch_env`` may override one).
        arch_env: environment variable naming the GPU architecture, or ``""``.
        arch_flag: the option the architecture goes into (``--iree-cuda-target`` ...).
        arch_default: the architecture compiled for when the variable is unset.
        note: why that default.
    """

    name: str
    driver: str
    flags: tuple[str, ...]
    arch_env: str = ""
    arch_flag: str = ""
    arch_default: str = ""
    note: str = ""

    def compile_flags(self) -> tuple[str, ...]:
        """The ``iree-compile`` options for this device (architecture from the environment or the default)."""
        if not self.arch_flag:
            return self.flags
        arch = (environment.text(self.arch_env) if self.arch_env else "") or self.arch_default
        return (*self.flags, f"{self.arch_flag}={arch}")


#: ``device=`` value -> compile options and driver.
DEVICES: dict[str, IreeDevice] = {d.name: d for d in (
    IreeDevice("llvm-cpu", "local-task", ("--iree-hal-target-device=local",
                                          "--iree-hal-local-target-device-backends=llvm-cpu",
                                          "--iree-llvmcpu-target-cpu=host")),
    IreeDevice("cuda", "cuda", ("--iree-hal-target-device=cuda",), "SCANWEAVER_IREE_CUDA_TARGET",
               "--iree-cuda-target", "sm_80",
               "PTX for sm_80, JIT-compiled by the driver on newer GPUs (IREE 3.13 rejects sm_90: "
               "'missing GPU target')"),
    IreeDevice("rocm", "hip", ("--iree-hal-target-device=hip",), "SCANWEAVER_IREE_ROCM_TARGET",
               "--iree-rocm-target", "gfx942", "MI300"),
    IreeDevice("vulkan", "vulkan", ("--iree-hal-target-device=vulkan",), "SCANWEAVER_IREE_VULKAN_TARGET",
               "--iree-vulkan-target", "", "IREE's baseline SPIR-V target unless an architecture is named"),
    IreeDevice("metal", "metal", ("--iree-hal-target-device=metal",)),
)}


#: Options every module is compiled with: IREE demotes float64 to float32 unless told not to.
COMMON_FLAGS = ("--iree-input-demote-f64-to-f32=false",
                #  the carried state of a scan whose first step reads its initial state starts as tensor.empty
                "--iree-global-opt-enable-warn-on-uninitialized-values=false")


def compile_flags(device: str) -> tuple[str, ...]:
    """``iree-compile`` options of ``device`` (the vulkan architecture only when one is named)."""
    dev = DEVICES[device]
    if dev.arch_flag and not ((environment.text(dev.arch_env) if dev.arch_env else "") or dev.arch_default):
        return (*COMMON_FLAGS, *dev.flags)
    return (*COMMON_FLAGS, *dev.compile_flags())
