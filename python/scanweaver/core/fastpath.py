"""Repeated calls at the speed of the kernel: call plans cached per signature.

Everything a scan call decides from its *signature* (operand shapes, strides
and dtypes; h0/reset/out given or not; reverse, return_state; backend,
schedule and config arguments; the tuned-store entry) is resolved once, on the
first call, by the full path with all its checks, and kept as a :class:`Plan`.
A later call with the same signature finds the plan by a cheap key and does
only what depends on the data: allocate ``y`` (or take ``out``) and run the
compiled kernel.  On the ``cpu`` backend the kernel is called through the
checked trampoline of :mod:`scanweaver.runtime.fastcall`, which verifies every
buffer's size, alignment and writability in C before the call.  A call whose
arrays do not match a plan simply takes the full path, with its clear errors.
Calls on CUDA device arrays keep a
:class:`~scanweaver.runtime.device_plan.DevicePlan` the same way, keyed also by
the device and the caller's stream: a repeated call checks the pointers and
launches the cached kernels on that stream without waiting.  The fused
operations key their own plans the same way (:class:`PlanCache`,
:func:`signature`, :func:`hashable`): Mamba-1 keeps its resolved forward
(:class:`scanweaver.ops.mamba1.kernels.ForwardPlan`), the delta-rule family
what the runner resolved (:class:`~scanweaver.calls.runner.FusedPlan`).

The caches' locks are renewed in a forked child, whose plans stay valid (its
kernels are in its memory, capped to one thread by
:mod:`scanweaver.runtime.forksafe`).

A plan that used the tuned-configuration store records the store file's
stamp; when another process writes the store, the next call sees the change
and re-resolves.

:func:`plan` hands out a plan explicitly, for hot loops that want to skip
even the key lookup (:meth:`Plan.__call__` still checks its arguments).

Example:
    >>> import numpy as np, scanweaver
    >>> a = np.full((2, 8), 0.5, np.float32); b = x = c = np.ones_like(a)
    >>> p = scanweaver.plan(scanweaver.selective_scan, (2, 8), np.float32, with_c=True)
    >>> bool(np.allclose(p(a, b, x, c), scanweaver.selective_scan(a, b, x, c)))
    True
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ScanInputError
from ..ir import Stages
from ..runtime import device_plan
from ..runtime.call_plan import CallPlan
from ..runtime.device_plan import DevicePlan, PlanMismatch
from ..runtime.host_pool import POOL, POOL_MIN_BYTES, output
from ..schedules.base import tunables_key
from ..tuning import store

#: Plans kept per recurrence (least recently built ones are dropped first).
MAX_PLANS = 64


class PlanCache(dict):
    """Plans by call key, at most :data:`MAX_PLANS` of them (the oldest inserted is dropped first).

    Lookups are plain ``dict.get`` (atomic under the GIL); :meth:`put` holds a lock, so that threads
    inserting past the cap never evict the same plan twice nor iterate a dict another thread grows.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        _caches[id(self)] = self

    def put(self, key: tuple, plan: object) -> None:
        """Keeps ``plan`` under ``key``, dropping the oldest plans beyond :data:`MAX_PLANS`."""
        with self._lock:
            self.pop(key, None)
            while len(self) >= MAX_PLANS:
                del self[next(iter(self))]
            self[key] = plan


#: Every plan cache of the process by id (their locks are renewed in a forked child).
_caches: weakref.WeakValueDictionary[int, PlanCache] = weakref.WeakValueDictionary()


def _new_locks_in_child() -> None:
    """A forked child takes new locks for its plan caches: one another thread of the parent held at the fork would
    stay held in the child for ever (the plans themselves stay valid there: the kernels are in its memory)."""
    for cache in list(_caches.values()):
        cache._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_locks_in_child)


#: "No result from the fast path": the full path runs.
MISS = object()


def hashable(flags: tuple) -> tuple | None:
    """``flags`` (a call's arguments beside its arrays, part of its plan key), or ``None`` when one is not
    hashable (then the call takes the full path)."""
    try:
        hash(flags)
    except TypeError:
        return None
    return flags


def flags(reverse, return_state, backend, schedule, config, tunables: dict) -> tuple | None:
    """The hashable arguments of a call (part of its plan key), or ``None`` when one is not hashable."""
    cfg = tunables_key(config) if isinstance(config, dict) else config
    return hashable((bool(reverse), bool(return_state), backend, schedule, cfg, tunables_key(tunables)))


def signature(values: tuple, flags: tuple | None) -> tuple | None:
    """The plan key of NumPy arrays, Python floats and NumPy scalars (or ``None`` for absent optional ones)
    and hashable ``flags``; ``None`` when a value is none of these (then the call takes the full path).  A
    scalar's key is its type, not its value: the kernel reads it as an operand (see :class:`Plan`)."""
    if flags is None:
        return None
    parts: list[Any] = [flags]
    for v in values:
        t = type(v)
        if v is None:
            parts.append(None)
        elif t is np.ndarray:
            parts.append((v.shape, v.strides, v.dtype))
        elif t is float or isinstance(v, np.generic):
            parts.append(t)
        else:
            return None
    return tuple(parts)


def call_key(args: tuple, h0: object, reset: object, out: object, flags: tuple | None) -> tuple | None:
    """The plan key of a call, or ``None`` when the call cannot use a plan.

    Only NumPy arrays given positionally (and ``h0``, ``reset``, ``out`` as
    NumPy arrays or ``None``) have keys; ``flags`` holds the remaining
    hashable arguments.
    """
    if any(v is None for v in args):
        return None
    return signature((*args, h0, reset, out), flags)


def device_call_key(args: tuple, h0: object, reset: object, out: object, flags: tuple | None
                    ) -> tuple[tuple | None, tuple]:
    """The plan key of a call on CUDA device arrays and their interfaces, or ``(None, ())`` (see
    :func:`scanweaver.runtime.device_plan.call_key`)."""
    if any(v is None for v in args):
        return None, ()
    return device_plan.call_key((*args, h0, reset, out), flags)


def build_device(rec, backend, stages: Stages, arrays, info, values: tuple, return_state: bool,
                 from_store: bool) -> DevicePlan | None:
    """A :class:`~scanweaver.runtime.device_plan.DevicePlan` for a device call that just ran the full path,
    or ``None`` when it does not qualify."""
    _, views = device_plan.call_key(values, ())
    if not views:
        return None
    return device_plan.build(rec, backend, stages, arrays, info, values, views, return_state, from_store,
                             store_stamp=_store_stamp() if from_store else None, stamp_of=_store_stamp)


def _store_stamp() -> object:
    return store.stamp()


@dataclass
class Plan(CallPlan):
    """A scan call on host arrays resolved for one signature: the lowered stages and the kernel.

    The fields of :class:`~scanweaver.runtime.call_plan.CallPlan`, and:

    Attributes:
        stages: the lowered stages it runs.
        invoke: ``invoke(buffers, lanes, L)`` for the ``cpu`` kernel, or ``None`` (the
            backend's ``run`` is used).
        layouts: per operand, how the kernel reads it: ``full`` (the plan's shape), ``scalar`` (one
            value: a Python float, a NumPy scalar or a one-element array, converted on each call) or ``lane`` (one value
            per lane: an array of shape ``(..., 1)``); empty when every operand is ``full``.
    """

    stages: Stages
    invoke: Callable[[tuple, int, int], int] | None
    layouts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        #: ``y`` comes from the host pool: large enough that fresh pages would cost more than the pool
        self.pooled = self.lanes * self.L * self.dtype.itemsize >= POOL_MIN_BYTES
        #: the operand whose address the pooled ``y`` is placed against (a full one)
        self.first_full = next((i for i, layout in enumerate(self.layouts) if layout == "full"), 0)

    def _small(self, operands: tuple) -> tuple:
        """The operands as the kernel reads them: scalars as one element, per-lane ones as ``lanes``."""
        dtype = self.dtype
        return tuple(v if layout == "full" else np.asarray(v, dtype=dtype).reshape(1) if layout == "scalar"
                     else np.ascontiguousarray(v, dtype=dtype).reshape(self.lanes)
                     for v, layout in zip(operands, self.layouts, strict=True))

    def run(self, operands: tuple, h0, reset, out):
        """Runs on arrays already known to match the plan (by key or by :meth:`check`)."""
        if self.layouts:
            operands = self._small(operands)
        if out is not None:
            if self.invoke is None:  # (the cpu trampoline checks overlaps itself, in C)
                try:
                    self.check_out_overlap(operands, h0, reset, out)
                except ScanInputError as exc:
                    raise PlanMismatch(str(exc)) from None
            y = out
        elif self.pooled:
            y = output(self.shape, self.dtype, operands[self.first_full].ctypes.data, POOL)
        else:
            y = np.empty(self.shape, self.dtype)
        h_last = np.empty(self.state_shape, self.dtype) if self.return_state or self.invoke is None else None
        if self.invoke is not None:
            try:
                rc = self.invoke((*operands, y, h0, h_last, reset), self.lanes, self.L)
            except (ValueError, BufferError) as exc:  # checked before the kernel ran: nothing was written
                raise PlanMismatch(str(exc)) from None
            if rc != 0:
                raise MemoryError(f"{self.info.stages.affine.name}: the kernel could not allocate its scratch "
                                  f"memory (status {rc})")
        else:
            from ..runtime.base import ScanArrays

            lanes, L = self.lanes, self.L
            layouts = self.layouts or ("full",) * len(self.names)
            arrays = ScanArrays(
                inputs={n: v.reshape(lanes, L) if layout == "full" else  # small ones: the stride-0 views
                        np.broadcast_to(v.reshape(-1, 1), (lanes, L))   # of arrays.prepare
                        for n, v, layout in zip(self.names, operands, layouts, strict=True)},
                layouts={n: layout for n, layout in zip(self.names, layouts, strict=True) if layout != "full"},
                h0=None if h0 is None else h0.reshape((lanes, *self.state_shape[len(self.shape) - 1:])),
                reset=None if reset is None else reset.reshape(lanes, L).view(np.uint8),
                batch_shape=self.shape[:-1], dtype=self.dtype, out=y.reshape(lanes, L))
            ky, kh = self.backend.run(self.stages, arrays)
            ky = np.asarray(ky)
            if not np.shares_memory(ky, y):
                y[...] = ky.reshape(self.shape)
            assert h_last is not None  # allocated whenever the backend's run is used
            h_last[...] = np.asarray(kh).reshape(self.state_shape)
        return (y, h_last) if self.return_state else y

    def check_out_overlap(self, operands: tuple, h0, reset, out) -> None:
        """The full path's ``out=`` checks beyond shape and dtype: :class:`ScanInputError` when ``out`` is
        read-only or misaligned, or shares memory with an operand, ``h0`` or ``reset``."""
        from ..arrays import check_overlap

        api = f"plan({self.info.stages.affine.name})"
        if not (out.flags.writeable and out.flags.aligned):
            raise ScanInputError(f"{api}: out must be writeable and aligned")
        check_overlap(api, out,
                      {**{f"operand {n}": v for n, v in zip(self.names, operands, strict=True)}, "h0": h0,
                       "reset": reset})

    def check(self, operands: tuple, h0, reset, out) -> None:
        """Raises :class:`ScanInputError` naming the first argument that does not match the plan."""
        api = f"plan({self.info.stages.affine.name})"
        if len(operands) != len(self.names):
            raise ScanInputError(f"{api}: takes {len(self.names)} operands ({', '.join(self.names)}), "
                                 f"got {len(operands)}")
        want: list[tuple[str, Any, tuple[int, ...] | None, np.dtype | None]] = [
            (n, v, self.shape, self.dtype) for n, v in zip(self.names, operands, strict=True)]
        want.append(("h0", h0, self.state_shape, self.dtype) if self.has_h0 else ("h0", h0, None, None))
        want.append(("reset", reset, self.shape, np.dtype(bool)) if self.has_reset else ("reset", reset, None, None))
        if out is not None:
            want.append(("out", out, self.shape, self.dtype))
        for name, v, shape, dtype in want:
            if shape is None:
                if v is not None:
                    raise ScanInputError(f"{api}: this plan was built without {name}; got one (build a plan with "
                                         f"{name}, or call the recurrence)")
                continue
            if type(v) is not np.ndarray:
                raise ScanInputError(f"{api}: {name} must be a NumPy array, got {type(v).__name__}")
            if v.shape != shape or v.dtype != dtype or not v.flags.c_contiguous:
                raise ScanInputError(
                    f"{api}: {name} has shape {v.shape}, dtype {v.dtype}"
                    f"{'' if v.flags.c_contiguous else ', not C-contiguous'}; this plan takes C-contiguous "
                    f"{dtype} arrays of shape {shape} (build another plan, or call the recurrence)")
        if out is not None:
            self.check_out_overlap(operands, h0, reset, out)

    def __call__(self, *operands, h0=None, reset=None, out=None):
        """Runs the planned scan on ``operands`` (checked against the plan first).

        Returns:
            ``y``, or ``(y, h_last)`` for a plan built with ``return_state=True``.
        """
        self.check(operands, h0, reset, out)
        if not self.fresh():
            raise ScanInputError(f"plan({self.info.stages.affine.name}): the tuned-configuration store changed "
                                 "since this plan was built; build the plan again to use the new configuration")
        try:
            return self.run(operands, h0, reset, out)
        except PlanMismatch as exc:
            raise ScanInputError(f"plan({self.info.stages.affine.name}): {exc} (arguments are, in order, the "
                                 f"operands {', '.join(self.names)}, then y, h0, h_last, reset); pass aligned "
                                 "arrays, or call the recurrence, which copies them") from None


def fast_invoker(backend, stages: Stages, lanes: int, L: int):
    """The backend's checked direct-call function for ``stages``, or ``None``."""
    make = getattr(backend, "fast_invoker", None)
    return make(stages, lanes, L) if make is not None else None


def build(rec, backend, stages: Stages, arrays, info, operands: dict, h0, reset, out, return_state: bool,
          from_store: bool) -> Plan | None:
    """A plan for a call that just ran through the full path, or ``None`` when its arrays do not qualify.

    The arrays qualify when every one is a C-contiguous NumPy array already in the scan's dtype and
    shape (no conversion, no half-precision output), or an operand the kernel reads small (a Python
    float or one-element array as one value, a ``(..., 1)`` array as one value per lane), ``reset`` is
    boolean, and the problem is not empty.
    """
    dtype = np.dtype(arrays.dtype)
    shape = (*arrays.batch_shape, arrays.L)
    if arrays.lanes == 0 or arrays.L == 0 or (arrays.out_dtype is not None and arrays.out_dtype != dtype):
        return None
    state = arrays.batch_shape if rec.state_size == 1 else (*arrays.batch_shape, rec.state_size)

    def ok(v, want_shape, want_dtype) -> bool:
        return (type(v) is np.ndarray and v.shape == want_shape and v.dtype == want_dtype
                and v.flags.c_contiguous)

    layouts = tuple(arrays.layouts.get(n, "full") for n in rec.inputs)
    if layouts != tuple(stages.affine.features.layout(n) for n in rec.inputs):
        return None  # the backend reads broadcast operands materialised: no plan copies them per call

    def small_ok(v, layout: str) -> bool:
        if layout == "scalar":
            return type(v) is float or isinstance(v, np.generic) or (type(v) is np.ndarray and v.size == 1)
        return type(v) is np.ndarray and v.shape == (*shape[:-1], 1)  # lane

    if not all(ok(operands[n], shape, dtype) if layout == "full" else small_ok(operands[n], layout)
               for n, layout in zip(rec.inputs, layouts, strict=True)):
        return None
    if (h0 is not None and not ok(h0, state, dtype)) or (reset is not None and not ok(reset, shape, np.dtype(bool))):
        return None
    if out is not None and not ok(out, shape, dtype):
        return None
    return Plan(names=tuple(rec.inputs), shape=shape, dtype=dtype, state_shape=tuple(state),
                has_h0=h0 is not None, has_reset=reset is not None, return_state=return_state, info=info,
                backend=backend, stages=stages, invoke=fast_invoker(backend, stages, arrays.lanes, arrays.L),
                from_store=from_store, store_stamp=_store_stamp() if from_store else None, stamp_of=_store_stamp,
                layouts=() if set(layouts) == {"full"} else layouts)
