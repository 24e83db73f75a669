"""Repeated scan calls on CUDA device arrays at the cost of a launch: the device side of the call plans.

A call on device arrays (CuPy arrays, PyTorch CUDA tensors that need no
gradient, other ``__cuda_array_interface__`` producers) runs the full path
once; :func:`build` then keeps a :class:`DevicePlan` under a key of
:func:`call_key`: the arrays' library, shapes, strides and dtypes, the device
and the caller's current stream, and the call's flags.  A later call with the
same key reads each array's pointer from its ``__cuda_array_interface__``,
checks it the way the CPU trampoline (:mod:`scanweaver.runtime.fastcall`)
checks host buffers (size, element alignment, writability of ``out=``, no
overlap of a written buffer with another), allocates ``y`` in the caller's
array type on the caller's stream and launches the cached kernels there: no
synchronisation, no host round trip, scratch reused from the plan (calls on
one stream run in order, so reuse is safe).

Each array library is a :class:`Family` in :data:`FAMILIES` (the ``cuda``
backend registers CuPy, PyTorch and the fallback for other producers): how
to read an array's device and the current stream, how to allocate a
result of the caller's type, and (:func:`array_module`) the array module that
computes on its arrays where they are.  The libraries are never imported here.

Example:
    >>> from scanweaver.runtime.device_plan import interface
    >>> class Stand:
    ...     __cuda_array_interface__ = {"data": (4096, False), "shape": (2, 8), "strides": None,
    ...                                 "typestr": "<f4", "version": 3}
    >>> interface(Stand())
    (4096, False, (2, 8), None, '<f4')
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ScanInputError
from ..ir import Stages
from ..targets.gpu import launch_plan
from .call_plan import CallPlan


class PlanMismatch(Exception):
    """Arrays with the plan's key that its kernel cannot take as they are (e.g. misaligned memory)."""


@dataclass(frozen=True)
class Family:
    """How the device arrays of one library meet a planned call.

    Attributes:
        device: ``device(value)`` -> the array's CUDA device index.
        stream: ``stream(value, device)`` -> the handle of the caller's current stream there
            (what the library launches its own work on).
        launch_stream: ``launch_stream(value, device)`` -> the stream object kernels are launched
            on (a context manager), or ``None`` when CuPy's current stream is the caller's.
        empty: ``empty(shape, dtype, device, stream)`` -> a result array of the caller's type,
            allocated on the caller's stream.
        module: ``module()`` -> the library's array module (NumPy's functions on its arrays, computed
            where they are: CuPy), for operations that compute around their kernels on the caller's
            device; ``None`` for libraries whose arrays are converted first (PyTorch tensors become
            CuPy views).
    """

    device: Callable[[Any], int]
    stream: Callable[[Any, int], int]
    launch_stream: Callable[[Any, int], Any]
    empty: Callable[[tuple, np.dtype, int, Any], Any]
    module: Callable[[], Any] | None = None


#: Top-level module of a device array's type -> its :class:`Family`; ``""`` is the fallback for other
#: ``__cuda_array_interface__`` producers.
FAMILIES: dict[str, Family] = {}
#: Array modules whose arrays go to a differentiable front end instead (never planned here).
FRONT_ENDS = ("jax", "jaxlib")


def array_module(value: object) -> Any | None:
    """The array module of device array ``value``'s library (CuPy for CuPy arrays), or ``None`` (host data,
    or a library whose arrays are converted before they are computed on)."""
    if value is None or isinstance(value, (np.ndarray, np.generic)):
        return None
    fam = FAMILIES.get(type(value).__module__.split(".")[0])
    return None if fam is None or fam.module is None else fam.module()


def interface(value: object) -> tuple[int, bool, tuple, tuple | None, str] | None:
    """``(pointer, readonly, shape, strides, typestr)`` of a ``__cuda_array_interface__`` array, else ``None``
    (also for a PyTorch tensor that needs a gradient, which refuses the protocol)."""
    try:
        cai = value.__cuda_array_interface__  # type: ignore[attr-defined]
        ptr, readonly = cai["data"]
        strides = cai.get("strides")
        return int(ptr), bool(readonly), tuple(cai["shape"]), None if strides is None else tuple(strides), \
            cai["typestr"]
    except Exception:
        return None


def family_of(value: object) -> tuple[str, Family] | None:
    """The name and :class:`Family` of a device array's library, or ``None``."""
    module = type(value).__module__.split(".")[0]
    if module in FRONT_ENDS:
        return None
    fam = FAMILIES.get(module)
    if fam is None:
        fam, module = FAMILIES.get(""), ""
    return None if fam is None else (module, fam)


def call_key(values: tuple, flags: tuple | None) -> tuple[tuple | None, tuple]:
    """The plan key of a call on device arrays, and the arrays' interfaces (``None`` for absent ones).

    ``values`` are the operands, then ``h0``, ``reset`` and ``out`` (``None`` when absent).  The key
    holds ``flags``, the library, the device, the caller's current stream and every array's shape,
    strides and typestr; it is ``None`` when some value is not a device array of one library on one
    device (then the call takes the full path).
    """
    first = values[0]
    if flags is None or isinstance(first, np.ndarray) or not hasattr(type(first), "__cuda_array_interface__") \
            and not hasattr(first, "__cuda_array_interface__"):
        return None, ()
    found = family_of(first)
    if found is None:
        return None, ()
    module, fam = found
    try:
        device = fam.device(first)
    except Exception:
        return None, ()
    parts: list[Any] = [flags, "cuda", module, device]
    views = []
    for v in values:
        if v is None:
            parts.append(None)
            views.append(None)
            continue
        view = interface(v)
        if view is None or type(v).__module__.split(".")[0] != (module or type(v).__module__.split(".")[0]):
            return None, ()
        if v is not first and fam.device(v) != device:
            return None, ()
        parts.append(view[2:])
        views.append(view)
    parts.append(fam.stream(first, device))
    return tuple(parts), tuple(views)


def contiguous(view, itemsize: int) -> bool:
    """True when an interface's strides are C order (``None`` means C order)."""
    strides = view[3]
    if strides is None:
        return True
    step = itemsize
    for n, s in zip(reversed(view[2]), reversed(strides), strict=True):
        if n > 1 and s != step:
            return False
        step *= n
    return True


def span(view) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` a C-contiguous interface covers."""
    n = int(np.prod(view[2], dtype=np.int64)) * np.dtype(view[4]).itemsize
    return view[0], view[0] + n


def overlapping(written, others) -> int | None:
    """The index of the first of ``others`` (interfaces or ``None``) whose bytes overlap ``written``'s."""
    lo, hi = span(written)
    for i, o in enumerate(others):
        if o is not None and lo < hi:
            lo2, hi2 = span(o)
            if lo2 < hi2 and lo < hi2 and lo2 < hi:
                return i
    return None


@dataclass
class DevicePlan(CallPlan):
    """A device scan call resolved for one key: the kernels, their launches and the plan's scratch.

    The fields of :class:`~scanweaver.runtime.call_plan.CallPlan`, with ``backend`` the ``cuda``
    backend (``launch_planned``, ``planned_kernel``, ``empty``, ``timing``), and:

    Attributes:
        family: the caller's array library; device: the CUDA device; stream: the launch stream
            object (``None``: CuPy's current one).
        kernels: ``(kernel, groups, block)`` per launch, in order.
        scratch: the plan's own device buffers: ``ws``, ``wsi``, ``hlast`` (when no state is returned)
            and one-element stand-ins for an absent ``h0``/``reset``.
        zero_wsi: ``wsi`` is zeroed (on the stream) before every call.
        order: per kernel operand (the lowered stages' order), its position among the call's operands.
        itemsizes: the element size of each of the call's arrays (operands, h0, reset, out; fixed by the key).
    """

    family: Family
    device: int
    stream: Any
    kernels: tuple[tuple[Any, int, int], ...]
    scratch: dict[str, Any] = field(default_factory=dict)
    zero_wsi: bool = False
    order: tuple[int, ...] = ()
    itemsizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        self._ptr = {k: span(interface(v))[0] for k, v in self.scratch.items()}  # type: ignore[arg-type]
        self._wsi_bytes = span(interface(self.scratch["wsi"]))[1] - self._ptr["wsi"] if "wsi" in self.scratch else 0

    def _checked(self, views: tuple) -> None:
        """The trampoline's checks on the call's interfaces (shapes, strides and dtypes matched by the key)."""
        n = len(self.names)
        for i, (view, itemsize) in enumerate(zip(views, self.itemsizes or (1,) * len(views), strict=True)):
            if view is not None and view[0] % itemsize:
                raise PlanMismatch(f"buffer {i} is not aligned to {itemsize} bytes")
        out = views[n + 2]
        if out is not None:
            if out[1]:
                raise ScanInputError(f"{self.info.stages.affine.name}: out is read-only; pass a writable device "
                                     "array")
            hit = overlapping(out, views[: n + 2])
            if hit is not None:
                name = (*self.names, "h0", "reset")[hit]
                raise ScanInputError(f"{self.info.stages.affine.name}: out overlaps {name} in device memory; "
                                     "pass a separate output buffer")

    def run(self, views: tuple, out: object):
        """Launches the planned kernels for a call whose key matched; ``views`` as from :func:`call_key`."""
        if getattr(self.backend, "timing", False):
            raise PlanMismatch("timing is on: the full path records the events")
        self._checked(views)
        n = len(self.names)
        y = out if out is not None else self.family.empty(self.shape, self.dtype, self.device, self.stream)
        hl = self.family.empty(self.state_shape, self.dtype, self.device, self.stream) if self.return_state else None
        y_ptr = views[n + 2][0] if out is not None else interface(y)[0]  # type: ignore[index]
        h_ptr = interface(hl)[0] if hl is not None else self._ptr["hlast"]  # type: ignore[index]
        h0, reset = views[n], views[n + 1]
        ptr = np.uint64
        ins = (ptr(views[i][0]) for i in (self.order or range(n)))
        h0_ptr = h0[0] if h0 is not None else self._ptr["h0"]
        reset_ptr = reset[0] if reset is not None else self._ptr["reset"]
        args = (*ins, ptr(y_ptr), ptr(h0_ptr), ptr(h_ptr), ptr(reset_ptr), np.int64(self.lanes), np.int64(self.L),
                ptr(self._ptr["ws"]), ptr(self._ptr["wsi"]))
        zeros = ((self._ptr["wsi"], self._wsi_bytes),) if self.zero_wsi else ()
        self.backend.launch_planned(self.kernels, args, self.stream, zeros)
        return (y, hl) if self.return_state else y


def build(rec, backend, stages: Stages, arrays, info, values: tuple, key_views: tuple, return_state: bool,
          from_store: bool, store_stamp: object = None, stamp_of: Callable[[], object] | None = None
          ) -> DevicePlan | None:
    """A plan for a device call that just ran through the full path, or ``None`` when it does not qualify.

    It qualifies on a backend with planned launches (``cuda``) when every array was C-contiguous in
    the scan's dtype (no device copy per call), ``h0`` and ``reset`` (bool or uint8) were device arrays
    too, no operand was broadcast and the problem is not empty.
    """
    if getattr(backend, "launch_planned", None) is None or getattr(backend, "timing", False):
        return None
    dtype = np.dtype(arrays.dtype)
    if arrays.lanes == 0 or arrays.L == 0 or arrays.layouts or arrays.out_dtype not in (None, dtype):
        return None
    n = len(rec.inputs)
    for i, view in enumerate(key_views):
        if view is None:
            continue
        vdt = np.dtype(view[4])
        want = (np.dtype(np.bool_), np.dtype(np.uint8)) if i == n + 1 else (dtype,)
        if vdt not in want or not contiguous(view, vdt.itemsize):
            return None
    found = family_of(values[0])
    if found is None:
        return None
    fam = found[1]
    device = fam.device(values[0])
    if stages.kernel is None or stages.target != backend.target:
        stages = backend.emit(stages)
    sched = stages.schedule
    plan = launch_plan(sched.schedule, sched.config, arrays.lanes, arrays.L)
    stream = fam.launch_stream(values[0], device)
    kernels = tuple((backend.planned_kernel(stages.kernel, step, stages), step.groups, step.block)
                    for step in plan.launches)
    state = arrays.batch_shape if rec.state_size == 1 else (*arrays.batch_shape, rec.state_size)
    scratch = backend.plan_scratch({"ws": (max(plan.ws, 1), dtype), "wsi": (max(plan.wsi, 1), np.dtype(np.int32)),
                                    "h0": (1, dtype), "reset": (1, np.dtype(np.uint8)),
                                    "hlast": (max(arrays.lanes, 1) * rec.state_size, dtype)}, stream)
    return DevicePlan(names=tuple(rec.inputs), shape=(*arrays.batch_shape, arrays.L), dtype=dtype,
                      state_shape=tuple(state), has_h0=key_views[n] is not None,
                      has_reset=key_views[n + 1] is not None, return_state=return_state, info=info,
                      backend=backend, family=fam, device=device, stream=stream, kernels=kernels, scratch=scratch,
                      zero_wsi=plan.zero_wsi, from_store=from_store, store_stamp=store_stamp, stamp_of=stamp_of,
                      order=tuple(rec.inputs.index(name) for name in stages.affine.inputs),
                      itemsizes=tuple(1 if v is None else np.dtype(v[4]).itemsize for v in key_views))
