"""A compiled recurrence: :class:`Recurrence`, a step function proved affine and ready to run on arrays.

``@scanweaver.recurrence`` (:mod:`scanweaver.api`) makes one; every call takes its plan
(:mod:`.fastpath`) or the full path (validate, resolve, lower, run), and framework arrays go to their
adapter through the one router (:mod:`scanweaver.calls.route`).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import uuid
import weakref
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from ..arrays import prepare
from ..calls import route
from ..checks import boolean
from ..errors import ScanInputError, api_boundary, unknown_keyword
from ..frontend import trace
from ..frontend.trace import recurrence_name
from ..ir import Stages
from ..ir.printer import print_affine
from ..ir.stages import Features, ScanIR
from ..passes import lower
from ..runtime import Backend, device_arrays, get_backend
from ..schedules.base import tunables_key
from . import fastpath
from .dispatch import check_dtype, check_kind, check_out, pick_backend, resolve

log = logging.getLogger("scanweaver")

#: Largest vector state a recurrence may declare (compiled targets unroll up to their own limit).
MAX_STATE = 64


@dataclass(frozen=True)
class CallInfo:
    """What the last call ran: backend, schedule, the tunables used and where they came from."""

    backend: str
    schedule: str
    config: dict
    source: str
    stages: Stages


class Recurrence:
    """A step function proved affine and ready to run on arrays.

    Create with :func:`recurrence`.  Calling it scans over the last axis of the
    operands (layout ``(..., L)``).

    Attributes:
        inputs: operand names, in call order.
        last: :class:`CallInfo` of the most recent call (``None`` before).
    """

    def __init__(self, step: Callable, name: str | None = None, broadcast: bool = True, state_size: int = 1):
        self.step = step
        self.name = recurrence_name(step, name)
        self.broadcast = broadcast
        if isinstance(state_size, bool) or not isinstance(state_size, int) or not 1 <= state_size <= MAX_STATE:
            raise ScanInputError(f"recurrence: state_size must be an int from 1 to {MAX_STATE}, got {state_size!r}")
        self.state_size = state_size
        self.kind = "diagonal" if state_size == 1 else "dense"
        scan = trace(step, name=self.name, state_size=state_size)
        self.inputs = scan.inputs
        lower(scan)  # proves affinity now: NotAffineError at decoration time
        self.last: CallInfo | None = None
        # Per-instance caches (a method-level lru_cache would keep every instance alive).
        self.scan_ir = functools.lru_cache(maxsize=64)(self._trace)
        self.signature = functools.lru_cache(maxsize=16)(self._signature)
        self._lowered = functools.lru_cache(maxsize=256)(self._lower_emit)
        self._plans = fastpath.PlanCache()
        functools.update_wrapper(self, step)
        self._token = uuid.uuid4().hex
        _RESTORED[self._token] = self

    def __reduce__(self):
        """Pickles as the step function and options (Dask and Ray send recurrences to their workers).

        Unpickling where an unpickled copy of the same recurrence already lives
        returns that copy, with its traced stages and compiled kernels.
        """
        return _restore, (self.step, self.name, self.broadcast, self.state_size, self._token)

    def __repr__(self) -> str:
        return f"<scanweaver.Recurrence {self.name}({', '.join(self.inputs)})>"

    def _trace(self, dtype: str, features: Features) -> ScanIR:
        """Stage ``scan`` for ``dtype`` and call-site ``features`` (cached per instance as :meth:`scan_ir`)."""
        return trace(self.step, name=self.name, dtype=dtype, features=features, state_size=self.state_size)

    def _signature(self, dtype: str = "float32") -> str:
        """A stable hash of the affine normal form (the tuned-store key), computed once per dtype."""
        text = print_affine(lower(self.scan_ir(dtype, Features())).affine)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _lower_emit(self, backend: Backend, dtype: str, features: Features, schedule: str, cfg: tuple) -> Stages:
        """``cfg``: :func:`~scanweaver.schedules.base.tunables_key` of the configuration (validated when lowered)."""
        config = {name: value for name, _, value in cfg}
        return backend.emit(lower(self.scan_ir(dtype, features), schedule, config, backend.extra_tunables))

    def lower(self, *, backend: str = "numpy", schedule: str = "auto", dtype: str = "float32",
              features: Features = Features(), lanes: int = 1, L: int = 1024, **tunables) -> Stages:
        """Every stage for one configuration, without running it (``scanweaver ir``).

        Works for backends that cannot run here too: emitting source needs no device.
        """
        be = pick_backend(backend) if backend == "auto" else get_backend(backend, require_available=False)
        sched, cfg, _ = resolve(self, be, schedule, "auto", tunables, dtype, lanes, L)
        return self._lowered(be, dtype, features, sched, tunables_key(cfg))

    def torch(self, *operands, **kwargs):
        """Runs on PyTorch tensors, with gradients: ``scanweaver.torch.apply`` (``scanweaver[torch]``)."""
        return route.adapter("torch").apply(self, *operands, **kwargs)

    def jax(self, *operands, **kwargs):
        """Runs on JAX arrays, with gradients: ``scanweaver.jax.apply`` (``scanweaver[jax]``)."""
        return route.adapter("jax").apply(self, *operands, **kwargs)

    def dask(self, *operands, **kwargs):
        """Runs over Dask arrays, lazily and chunked: ``scanweaver.dask.apply`` (``scanweaver[dask]``)."""
        return route.adapter("dask").apply(self, *operands, **kwargs)

    @property
    def stages(self) -> Stages:
        """The stages of the last call, or of a default float32 lowering before any call."""
        return self.last.stages if self.last else self.lower()

    @property
    def config(self) -> dict | None:
        """The tunables the last call used."""
        return self.last.config if self.last else None

    @api_boundary
    def __call__(self, *args, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
                 backend: str = "auto", schedule: str = "auto", config="auto", cu_seqlens=None, out=None,
                 **kwargs):
        """Runs the scan.

        Args:
            *args: operands in the order of :attr:`inputs` (or by name as keywords).
            h0: initial state, shape ``(...)``; zeros when omitted.
            reset: boolean mask ``(..., L)``; True starts a new segment (A_t = 0).
            reverse: scan from the end (t = L-1 down to 0).
            return_state: also return the final state (shape ``(...)``).
            backend: ``auto``, ``numpy``, ``cpu``, ``opencl``, ``cuda`` or ``julia``.
            schedule: ``auto`` or a schedule the backend supports.
            config: ``auto`` (tuned store, then defaults), ``default``, or a dict of tunables.
            cu_seqlens: offsets ``[0, ..., L]`` of sequences packed along L; each one
                after the first starts from zero (turned into resets; see
                :func:`scanweaver.arrays.seqlens_reset`).
            out: a C-contiguous array of the operands' shape and ``y``'s dtype to
                write ``y`` into (and return): NumPy for NumPy operands, a device array
                on the operands' device for device operands; saves allocating and
                first touching a fresh output on every call.
            **kwargs: operands by name, or tunables such as ``chunk=4096``.

        Returns:
            ``y`` with the operands' shape and dtype, or ``(y, h_last)``.  float16 and
            bfloat16 operands accumulate in float32; ``y`` comes back in their dtype,
            ``h_last`` stays float32 so that it can be passed back as ``h0`` losslessly.
        """
        return self._run(args, kwargs, h0, reset, reverse, return_state, backend, schedule, config, cu_seqlens, out)

    def _run(self, args: tuple, kwargs: dict, h0, reset, reverse, return_state, backend, schedule, config,
             cu_seqlens, out):
        """A call: from this signature's plan when there is one, else the full path (which keeps a plan)."""
        if reverse.__class__ is not bool or return_state.__class__ is not bool:
            boolean(self.name, "reverse", reverse)
            boolean(self.name, "return_state", return_state)
        key = None
        if cu_seqlens is None and len(args) == len(self.inputs):
            flags = fastpath.flags(reverse, return_state, backend, schedule, config, kwargs)
            result, key = self._fast(args, h0, reset, out, flags)
            if result is not fastpath.MISS:
                return result
        return self._call(args, kwargs, key, h0, reset, bool(reverse), bool(return_state), backend, schedule,
                          config, cu_seqlens, out)

    def _fast(self, args: tuple, h0, reset, out, flags: tuple | None):
        """``(result, key)`` from this signature's plan, or ``(fastpath.MISS, key)`` when the full path must run."""
        key = fastpath.call_key(args, h0, reset, out, flags)
        views: tuple = ()
        if key is None:
            key, views = fastpath.device_call_key(args, h0, reset, out, flags)
            if key is None:
                return fastpath.MISS, None
        plan = self._plans.get(key)
        if plan is not None and plan.fresh():
            try:
                if isinstance(plan, fastpath.DevicePlan):
                    result = plan.run(views, out)
                else:
                    result = plan.run(args, h0, reset, out)
            except fastpath.PlanMismatch:
                return fastpath.MISS, key  # e.g. misaligned memory: the full path copies it
            self.last = plan.info
            return result, key
        return fastpath.MISS, key

    def _call(self, args, kwargs, key, h0, reset, reverse, return_state, backend, schedule, config, cu_seqlens,
              out):
        """The full path: validate, resolve, lower, run; keeps a :class:`~.fastpath.Plan` under ``key``."""
        operands, tunables = self._bind(args, kwargs)
        front = route.framework(self.name, (*operands.values(), h0, reset))
        if front is not None:  # PyTorch or JAX arrays: their adapter, differentiable, their array type back
            return route.adapter(front).apply(self, *(operands[n] for n in self.inputs), h0=h0, reset=reset,
                                              reverse=reverse, return_state=return_state, backend=backend,
                                              schedule=schedule, config=config, cu_seqlens=cu_seqlens, out=out,
                                              **tunables)
        arrays = prepare(self.name, operands, h0, reset, broadcast=self.broadcast, cu_seqlens=cu_seqlens,
                         reverse=bool(reverse), state_size=self.state_size, keep_broadcast=True)
        dtype = arrays.dtype.name
        if out is not None:
            arrays.out = check_out(self.name, out, (*arrays.batch_shape, arrays.L), arrays,
                                   {**{f"operand {n}": v for n, v in operands.items()}, "h0": h0, "reset": reset})
        backend = device_arrays.backend_for(self.name, arrays, backend)
        be = pick_backend(backend, dtype, self.kind)
        check_dtype(self.name, be, dtype)
        check_kind(self.name, be, self.kind)
        if not be.broadcast_operands:
            arrays = arrays.materialised()
        sched, cfg, source = resolve(self, be, schedule, config, tunables, dtype, arrays.lanes, arrays.L)
        features = Features(reverse=bool(reverse), has_h0=h0 is not None, has_reset=arrays.reset is not None,
                            return_state=bool(return_state), operands=tuple(sorted(arrays.layouts.items())))
        stages = self._lowered(be, dtype, features, sched, tunables_key(cfg))
        assert stages.schedule is not None
        self.last = CallInfo(be.name, sched, stages.schedule.config, source, stages)
        log.debug("%s: backend=%s schedule=%s config=%s (%s)", self.name, be.name, sched, self.last.config, source)
        shape = (*arrays.batch_shape, arrays.L)
        state = arrays.batch_shape if self.state_size == 1 else (*arrays.batch_shape, self.state_size)
        if (arrays.L == 0 or arrays.lanes == 0) and device_arrays.on_device(arrays):
            y, h_last = device_arrays.empty_outputs(arrays, shape, state)
        elif arrays.L == 0 or arrays.lanes == 0:
            y = np.zeros(shape, arrays.dtype)
            h_last = arrays.h0.copy() if arrays.h0 is not None else np.zeros(state, arrays.dtype)
        else:
            y, h_last = be.run(stages, arrays)
        if device_arrays.on_device(arrays):
            if key is not None and key[1] == "cuda":
                self._keep(key, fastpath.build_device(self, be, stages, arrays, self.last, (*args, h0, reset, out),
                                                      return_state, from_store=config == "auto" and not tunables))
            return device_arrays.finish(arrays, y, h_last, shape, state, bool(return_state))
        y = np.asarray(y).reshape(shape).astype(arrays.out_dtype or arrays.dtype, copy=False)
        if out is not None:
            if not np.shares_memory(y, out):
                out[...] = y
            y = out
        if key is not None:
            self._keep(key, fastpath.build(self, be, stages, arrays, self.last, operands, h0, reset, out,
                                           return_state, from_store=config == "auto" and not tunables))
        if return_state:
            return y, np.asarray(h_last).reshape(state)
        return y

    def _keep(self, key: tuple, plan) -> None:
        """Keeps ``plan`` (unless ``None``) under ``key`` (the cache evicts under its lock)."""
        if plan is not None:
            self._plans.put(key, plan)

    def _bind(self, args: tuple, kwargs: dict):
        if len(args) > len(self.inputs):
            raise ScanInputError(f"{self.name}: takes {len(self.inputs)} operands ({', '.join(self.inputs)}), "
                                 f"got {len(args)}")
        operands = dict(zip(self.inputs, args, strict=False))
        tunables = {}
        for k, v in kwargs.items():
            if k in self.inputs:
                if k in operands:
                    raise ScanInputError(f"{self.name}: operand {k} given twice")
                operands[k] = v
            else:
                tunables[k] = v
        if tunables:
            known = call_tunables()
            for k in tunables:
                if k not in known:
                    raise ScanInputError(unknown_keyword(self.name, k, (*self.inputs, *CALL_PARAMETERS), known))
        missing = [n for n in self.inputs if n not in operands or operands[n] is None]
        if missing:
            raise ScanInputError(f"{self.name}: missing operand(s) {', '.join(missing)}; "
                                 f"needs {', '.join(self.inputs)}")
        return operands, tunables


#: The keywords of every recurrence call beside its operands and tunables.
CALL_PARAMETERS = ("h0", "reset", "reverse", "return_state", "backend", "schedule", "config", "cu_seqlens", "out")


@functools.lru_cache(maxsize=1)
def call_tunables() -> frozenset[str]:
    """Every tunable a recurrence call may pass: every schedule's and every backend's own."""
    from ..runtime import REGISTRY as BACKENDS
    from ..schedules import REGISTRY as SCHEDULES

    names = {t.name for s in SCHEDULES.values() for t in s.tunables}
    names.update(t.name for b in BACKENDS.values() for t in b.extra_tunables)
    return frozenset(names)


#: token -> recurrence, for :meth:`Recurrence.__reduce__`: every live one, plus the last few unpickled
_RESTORED: weakref.WeakValueDictionary[str, Recurrence] = weakref.WeakValueDictionary()
_RECENT: collections.OrderedDict[str, Recurrence] = collections.OrderedDict()
_RECENT_MAX = 32


def _restore(step: Callable, name: str, broadcast: bool, state_size: int, token: str) -> Recurrence:
    rec = _RESTORED.get(token)
    if rec is None:
        rec = Recurrence(step, name=name, broadcast=broadcast, state_size=state_size)
        del _RESTORED[rec._token]
        rec._token = token
        _RESTORED[token] = rec
    _RECENT[token] = rec  # unpickled copies stay alive between the tasks of one worker
    _RECENT.move_to_end(token)
    while len(_RECENT) > _RECENT_MAX:
        _RECENT.popitem(last=False)
    return rec
