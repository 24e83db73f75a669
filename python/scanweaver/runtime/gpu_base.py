"""What the GPU backends (``opencl``, ``cuda``) share: defaults, emission and the launch sequence.

A subclass supplies the device primitives (allocate, upload, launch, read
back); :meth:`GPUBackend.run` is written once on top of them from the
schedule's :func:`~scanweaver.targets.gpu.launch_plan`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..fused import REGISTRY as FUSED
from ..fused import FusedCall
from ..ir import Stages
from ..errors import ScanInputError
from ..targets import TARGETS
from ..targets.fused import kernel_for
from ..targets.gpu import Plan, emit_source, launch_plan
from ..targets.launch_limits import DeviceLimits, why_not_launchable
from .base import Backend, DeviceCall, ScanArrays

#: Lanes from which one workgroup per lane (``hybrid``) fills a GPU; fewer lanes of long L use a multi-block schedule.
MIN_LANES_FOR_HYBRID = 256
#: L from which a multi-block schedule pays off when lanes are few.
LONG_L = 16384
#: Default work-items per workgroup of the tile schedules.
DEFAULT_WORKGROUP = 256
#: Work-items per channel of the fused Mamba-1 kernel for short sequences (``items_per_thread`` 8 covers
#: L = 256 in one chunk), and the most for long ones.
FUSED_MIN_WORKGROUP, FUSED_MAX_WORKGROUP = 32, 128


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 << max(0, int(n) - 1).bit_length()


def hybrid_config(lanes: int, L: int, dtype: str) -> dict[str, int]:
    """``hybrid`` defaults: enough work-items per lane to cover L in one tile, up to a workgroup.

    Short sequences share a workgroup (``lanes_per_group`` > 1) so that no
    work-item sits idle; float64 keeps half the items in registers.
    """
    ipt = 8 if dtype == "float32" else 4
    tpl = min(DEFAULT_WORKGROUP, max(32, next_pow2(-(-L // ipt))))
    return {"workgroup_size": DEFAULT_WORKGROUP, "items_per_thread": ipt, "lanes_per_group": DEFAULT_WORKGROUP // tpl}


class GPUBackend(Backend):
    """A backend that runs the GPU kernels of :mod:`scanweaver.targets.gpu`.

    Class attributes:
        multi_block: the schedule chosen for few lanes of long L.

    Attributes:
        kernel_log: ``None``, or a list to which every launch appends ``(kernel name, device ms)`` per kernel
            (each launch then waits for its kernels; ``bench/gpu_chunked.py`` reads where the time goes).
    """

    multi_block: ClassVar[str] = "reduce_then_scan"
    kinds = ("diagonal", "dense")
    kernel_log: list[tuple[str, float]] | None = None

    def default_schedule_for(self, kind: str, lanes: int, L: int, tunables: Mapping[str, object] | None = None) -> str:
        """Dense transitions run one work-item per lane (``sequential``)."""
        return "sequential" if kind == "dense" else self.default_schedule(lanes, L)

    def default_schedule(self, lanes: int, L: int) -> str:
        if lanes >= MIN_LANES_FOR_HYBRID or L < LONG_L:
            return "hybrid"
        return self.multi_block

    def default_config(self, schedule: str, lanes: int, L: int, dtype: str) -> dict[str, object]:
        return hybrid_config(lanes, L, dtype) if schedule == "hybrid" else {}

    def emit(self, stages: Stages) -> Stages:
        """Fills in the kernel source; needs no device (``scanweaver ir --target``)."""
        return dataclasses.replace(stages, kernel=emit_source(stages, self.target), target=self.target)

    # ---- device primitives ----------------------------------------------------------------------

    @classmethod
    def adopt_call(cls, api: str, values: dict[str, Any], writable: bool = False) -> tuple[dict[str, Any], DeviceCall]:
        """This backend's own arrays for a caller's device ``values``, and how the call runs and returns.

        The default takes the backend's own arrays as they are; ``writable``
        values (``out=``) must be usable in place.
        """
        return dict(values), DeviceCall(wrap=lambda v: v)

    def device_limits(self) -> DeviceLimits:
        """The device's per-block limits (threads, registers, shared memory)."""
        return DeviceLimits()

    @abstractmethod
    def is_device_array(self, value: object) -> bool:
        """True for this backend's own device arrays (used without copies)."""

    @abstractmethod
    def to_device(self, value: Any) -> Any:
        """A device array holding ``value`` (returned as is when already one)."""

    @abstractmethod
    def empty(self, n: int, dtype: np.dtype, zero: bool = False) -> Any:
        """A 1-D device array of ``n`` elements (zeroed when asked)."""

    @abstractmethod
    def launch(self, source: str, plan: Plan, args: list, stages: Stages) -> float | None:
        """Launches the plan's kernels in order on ``args``; returns device time in ms when timing, else ``None``."""

    @abstractmethod
    def to_host(self, value: Any) -> np.ndarray:
        """A NumPy copy of a device array."""

    # ---- the scan ---------------------------------------------------------------------------------

    def run(self, stages: Stages, arrays: ScanArrays):
        """Runs every kernel of the schedule; device arrays in give device arrays out (``out=`` written in place)."""
        if stages.kernel is None or stages.target != self.target:
            stages = self.emit(stages)
        lanes, L, dtype = arrays.lanes, arrays.L, np.dtype(arrays.dtype)
        plan = launch_plan(stages.schedule.schedule, stages.schedule.config, lanes, L)
        why = why_not_launchable(stages.schedule.schedule, stages.schedule.config, arrays.dtype.name,
                                 dev=self.device_limits(), target=self.target)
        if why:
            raise ScanInputError(f"{self.name}: {why}")
        on_device = arrays.device is not None or any(self.is_device_array(a) for a in arrays.inputs.values())
        context = arrays.device.context() if arrays.device is not None else contextlib.nullcontext()
        with context:
            ins = [self.to_device(arrays.inputs[n]) for n in stages.affine.inputs]
            out = arrays.out if arrays.out is not None and self.is_device_array(arrays.out) else None
            y = out.reshape(lanes * L) if out is not None else self.empty(lanes * L, dtype)
            hlast = self.empty(max(lanes, 1) * stages.affine.state_size, dtype)
            h0 = self.to_device(arrays.h0) if arrays.h0 is not None else self.empty(1, dtype)
            reset = self.to_device(arrays.reset) if arrays.reset is not None else self.empty(1, np.dtype(np.uint8))
            ws = self.empty(max(plan.ws, 1), dtype)
            wsi = self.empty(max(plan.wsi, 1), np.dtype(np.int32), zero=plan.zero_wsi)
            args = [*ins, y, h0, hlast, reset, np.int64(lanes), np.int64(L), ws, wsi]
            ms = self.launch(stages.kernel, plan, args, stages)
            self.last_ms = float("nan") if ms is None else ms
            y = y.reshape(lanes, L)
            if on_device:
                return y, hlast
            return self.to_host(y), self.to_host(hlast)

    # ---- fused operations ---------------------------------------------------------------------------

    def fused_defaults(self, op: str, features, sizes: dict[str, int]) -> dict[str, object]:
        """The rendering's defaults by shape where it has them; else (Mamba-1) enough work-items per channel
        to cover L in one chunk of 8 items each, 32 to 128, and few enough that the backward's private state
        arrays fit (:meth:`~scanweaver.targets.fused.FusedKernel.misfit`)."""
        kernel = kernel_for(self.target, op)
        if kernel is not None and kernel.defaults is not None:
            return kernel.defaults(features, sizes)
        wg = min(FUSED_MAX_WORKGROUP, max(FUSED_MIN_WORKGROUP, next_pow2(-(-sizes.get("L", 1) // 8))))
        while wg > FUSED_MIN_WORKGROUP and kernel is not None and \
                kernel.misfit("backward", features, {"workgroup_size": wg}):
            wg //= 2
        return {"workgroup_size": wg, "items_per_thread": 8}

    def run_fused(self, call: FusedCall, arrays: dict[str, object], sizes: dict[str, int]) -> None:
        """Runs the GPU rendering of ``call`` on checked arrays: NumPy ones (outputs copied back in place), or
        this backend's device arrays (inputs and outputs used in place, on the current stream, nothing waited for).

        Arrays a call does not use are passed as one-element buffers (kernels never read them); outputs the
        caller did not ask for get a full-size buffer that is discarded; outputs start at zero; a plan's
        ``ws`` scratch follows the operation's parameters.
        """
        kernel = kernel_for(self.target, call.op)
        if kernel is None or call.part not in kernel.parts:
            super().run_fused(call, arrays, sizes)
            return
        op = FUSED.get(call.op)
        checked = op.arguments(call.part, call.features, arrays, sizes, f"{self.name} backend")
        dtype = np.dtype(call.features.dtype)
        shapes = op.shapes(call.part, call.features, sizes)
        source = kernel.render(TARGETS.get(self.target)(), call)
        args, outs = [], []
        for p, a in zip(op.params(call.part), checked, strict=True):
            if p.kind == "int":
                args.append(np.int64(a))
            elif a is None and p.kind == "out" and op.enabled(p.name, call.features):
                # an output the caller did not ask for: GPU kernels write it anyway (a discarded buffer)
                args.append(self.empty(max(1, int(np.prod(shapes[p.name]))), np.dtype(p.dtype or dtype)))
            elif a is None:
                args.append(self.empty(1, np.dtype(p.dtype or dtype)))
            elif p.kind == "out" and self.is_device_array(a):  # the caller's device output, written in place
                if a.size:
                    a.fill(0)  # zeroed: kernels may add into their outputs (sums over workgroups)
                args.append(a if a.size else self.empty(1, a.dtype))
            elif p.kind == "out":  # zeroed: kernels may add into their outputs (sums over workgroups)
                dev = self.empty(max(a.size, 1), a.dtype, zero=True)
                args.append(dev)
                outs.append((a, dev))
            else:
                args.append(self.to_device(a if a.size else np.zeros(1, a.dtype)))
        if any(v <= 0 for k, v in sizes.items() if k in ("batch", "dim", "L")):
            return  # nothing to compute: the caller fills what an empty call leaves
        plan = kernel.plan(call, sizes)
        plan = dataclasses.replace(plan, launches=tuple(x for x in plan.launches if x.groups > 0))
        if plan.ws:
            args.append(self.empty(plan.ws, dtype))
        ms = self.launch(source, plan, args) if plan.launches else 0.0  # no workgroups: the outputs stay zero
        self.last_ms = float("nan") if ms is None else ms
        for host, dev in outs:
            if host.size:
                host[...] = self.to_host(dev)[: host.size].reshape(host.shape)
