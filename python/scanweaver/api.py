"""The public entry points: ``@recurrence`` and ``selective_scan``."""

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

from . import fastpath, frameworks
from .arrays import prepare
from .errors import api_boundary, ScanInputError
from .frontend import RECURRENCES, trace
from .frontend.trace import recurrence_name
from .ir.printer import print_affine
from .ir.stages import Features, ScanIR
from .passes import lower
from .ir import Stages
from .dispatch import check_dtype, check_kind, check_out, pick_backend, resolve
from .runtime import Backend, device_arrays, get_backend

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
        return backend.emit(lower(self.scan_ir(dtype, features), schedule, dict(cfg), backend.extra_tunables))

    def lower(self, *, backend: str = "numpy", schedule: str = "auto", dtype: str = "float32",
              features: Features = Features(), lanes: int = 1, L: int = 1024, **tunables) -> Stages:
        """Every stage for one configuration, without running it (``scanweaver ir``).

        Works for backends that cannot run here too: emitting source needs no device.
        """
        be = pick_backend(backend) if backend == "auto" else get_backend(backend, require_available=False)
        sched, cfg, _ = resolve(self, be, schedule, "auto", tunables, dtype, lanes, L)
        return self._lowered(be, dtype, features, sched, tuple(sorted(cfg.items())))

    def torch(self, *operands, **kwargs):
        """Runs on PyTorch tensors, with gradients: :func:`scanweaver.torch.apply` (``scanweaver[torch]``)."""
        from . import torch as sw_torch

        return sw_torch.apply(self, *operands, **kwargs)

    def jax(self, *operands, **kwargs):
        """Runs on JAX arrays, with gradients: :func:`scanweaver.jax.apply` (``scanweaver[jax]``)."""
        from . import jax as sw_jax

        return sw_jax.apply(self, *operands, **kwargs)

    def dask(self, *operands, **kwargs):
        """Runs over Dask arrays, lazily and chunked: :func:`scanweaver.dask.apply` (``scanweaver[dask]``)."""
        from . import dask as sw_dask

        return sw_dask.apply(self, *operands, **kwargs)

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
        """The full path: validate, resolve, lower, run; keeps a :class:`~scanweaver.fastpath.Plan` under ``key``."""
        operands, tunables = self._bind(args, kwargs)
        front = frameworks.framework((*operands.values(), h0, reset))
        if front is not None:  # PyTorch or JAX arrays: their differentiable front end, their array type back
            return frameworks.run(front, self, operands, tunables, out=out, h0=h0, reset=reset, reverse=reverse,
                                  return_state=return_state, backend=backend, schedule=schedule, config=config,
                                  cu_seqlens=cu_seqlens)
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
        stages = self._lowered(be, dtype, features, sched, tuple(sorted(cfg.items())))
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
        missing = [n for n in self.inputs if n not in operands or operands[n] is None]
        if missing:
            raise ScanInputError(f"{self.name}: missing operand(s) {', '.join(missing)}; "
                                 f"needs {', '.join(self.inputs)}")
        return operands, tunables


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


@api_boundary
def recurrence(step: Callable | None = None, *, name: str | None = None, broadcast: bool = True,
               state_size: int = 1, state_shape: tuple[str, str] | None = None):
    """Compiles a step function ``step(h, *operands)`` into a :class:`Recurrence`.

    The step is traced with symbolic values and proved affine in ``h``
    (h' = A*h + U); it may return ``h_next`` or ``(h_next, y)``.  Operators
    ``+ - * /``, unary minus, and NumPy functions of terms free of ``h``
    (``np.exp``, ``np.log1p``, :func:`scanweaver.sigmoid` ...) are allowed.

    Args:
        step: the step function.
        name: name used in IR and messages (defaults to the function's).
        broadcast: broadcast operands to a common shape (else require equal shapes).
        state_size: k > 1 makes ``h`` a vector of k components (dense k x k
            transitions such as second-order filters); ``h0`` and the returned
            state then have shape ``(..., k)``.
        state_shape: two axis names such as ``("K", "V")`` make the state a matrix per head
            (Mamba-2, GLA, RetNet, RWKV-6): ``step(S, *operands)`` returns ``(S_new, readout)``,
            and the result is a :class:`scanweaver.matrix.recurrence.MatrixRecurrence` that runs
            on the fused ``matrix_state`` operation (see the README's matrix-state section).

    Raises:
        NotAffineError: quoting the sub-expression that is not affine in ``h``.

    Example:
        >>> import numpy as np, scanweaver
        >>> @scanweaver.recurrence
        ... def ema(h, alpha, x):
        ...     return alpha * h + (1 - alpha) * x
        >>> ema(np.full(4, 0.5), np.ones(4), backend="numpy").tolist()
        [0.5, 0.75, 0.875, 0.9375]
    """
    if state_shape is not None:
        from .matrix.recurrence import MatrixRecurrence

        if step is None:
            return lambda fn: MatrixRecurrence(fn, state_shape, name)
        return MatrixRecurrence(step, state_shape, name)
    if step is None:
        return lambda fn: Recurrence(fn, name=name, broadcast=broadcast, state_size=state_size)
    return Recurrence(step, name=name, broadcast=broadcast, state_size=state_size)


def _selective(h, a, b, x, c):
    h = a * h + b * x
    return h, c * h


def _selective_noc(h, a, b, x):
    return a * h + b * x


SELECTIVE = Recurrence(_selective, name="selective_scan", broadcast=False)
SELECTIVE_NO_C = Recurrence(_selective_noc, name="selective_scan_h", broadcast=False)
RECURRENCES.add("selective_scan", SELECTIVE)
RECURRENCES.add("selective_scan_h", SELECTIVE_NO_C)


@api_boundary
def selective_scan(a, b, x, c=None, *, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
                   backend: str = "auto", schedule: str = "auto", config="auto", cu_seqlens=None, out=None,
                   **tunables):
    """The selective scan h_t = a_t*h_{t-1} + b_t*x_t, y_t = c_t*h_t over the last axis.

    Operands share one layout ``(..., L)`` (the paper's ``(B, D, L)``), in
    float32 or float64 (float16/bfloat16 accumulate in float32; complex on
    backends that list it in ``dtypes``); y = h when ``c`` is None.  Runs the best stored tuned
    configuration for this device and problem size when there is one.

    Args:
        a, b, x: operands of shape ``(..., L)``.
        c: output projection of shape ``(..., L)``, or None.
        h0: initial state of shape ``(...)``.
        reset: boolean mask ``(..., L)``; True at t starts a new segment.
        reverse: scan from t = L-1 down to 0.
        return_state: also return h_L (h_0 of the reversed scan).
        cu_seqlens: offsets ``[0, ..., L]`` of sequences packed along L (varlen batches).
        out: a preallocated C-contiguous output of shape ``(..., L)`` (see :meth:`Recurrence.__call__`).
        backend: ``auto``, ``numpy``, ``cpu``, ``opencl``, ``cuda`` or ``julia``.
        schedule: ``auto`` or a schedule name (``sequential``, ``chunked`` ...).
        config: ``auto``, ``default`` or a dict of tunables.
        **tunables: schedule tunables such as ``chunk=4096`` or ``threads=2``.

    Returns:
        ``y`` of shape ``(..., L)``, or ``(y, h_last)`` with ``return_state``.

    Example:
        >>> import numpy as np, scanweaver
        >>> a = np.full((1, 4), 0.5); b = np.ones((1, 4)); x = np.ones((1, 4))
        >>> scanweaver.selective_scan(a, b, x, backend="numpy").tolist()
        [[1.0, 1.5, 1.75, 1.875]]
    """
    rec = SELECTIVE_NO_C if c is None else SELECTIVE
    return rec._run((a, b, x) if c is None else (a, b, x, c), tunables, h0, reset, reverse, return_state, backend,
                    schedule, config, cu_seqlens, out)


#: The recurrence :func:`selective_scan` runs (with ``c``), for APIs that take either.
selective_scan.recurrence = SELECTIVE  # type: ignore[attr-defined]
