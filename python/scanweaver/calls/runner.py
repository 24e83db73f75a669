"""The one runner of every fused operation: which backend, which tunables, what ran, and one kind of failure.

Every operation built on a fused kernel (:mod:`scanweaver.fused`: ``mamba1``,
``matrix_state``, ``delta_rule``) runs its parts through here:

* :func:`backend_for` picks the backend: the one named by ``backend=``, or with
  ``auto`` the best available backend that renders the part for the dtype (and
  whose rendering fits the call's features).  A named backend without that
  rendering raises :class:`~scanweaver.errors.BackendUnavailable` naming the
  backends that have one; with ``fallback=True`` (a backward on a backend that
  renders only the forward, or whose rendering does not fit the call's features)
  the best backend that has it runs instead, and :class:`FusedInfo` says so.
  Backends are ranked by the accumulation dtype (``features.state_dtype`` where
  the operation has one: float16/bfloat16 storage runs where float32 does).
* :func:`resolve` gives the tunables: the call's, else the tuned store's entry
  for this device and problem size, else the call's hints (``chunk_size``: the
  chunked algorithm with that chunk), else the backend's documented defaults
  with the algorithm the operation's measured rule picks for the shape;
  resolved once per signature and kept until a tuned store changes.
* :func:`run` runs one part and records what ran in :data:`last` (per
  operation) and :data:`LAST` (the most recent call of any).
* :func:`plan_of` keeps what one call resolved as a :class:`FusedPlan`, which a
  repeated call of the same signature launches directly (the operations cache
  them per signature with :class:`scanweaver.core.fastpath.PlanCache`).

Example:
    >>> import numpy as np
    >>> from scanweaver.calls import runner
    >>> be = runner.backend_for("mamba1", "forward", "numpy", np.dtype(np.float64), api="demo")
    >>> be.name
    'numpy'
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BackendUnavailable, ScanInputError
from ..fused import REGISTRY as FUSED
from ..fused.base import FusedCall
from ..runtime import REGISTRY as BACKENDS
from ..runtime import Backend, get_backend
from ..schedules.base import tunables_key
from ..tuning import store


@dataclass(frozen=True)
class FusedInfo:
    """What one fused call ran.

    Attributes:
        backend: the backend's name.
        part: ``forward`` or ``backward``.
        config: the tunables it ran with (``algorithm`` among them where the kernel has several).
        source: where they came from: ``explicit`` (the call's), ``tuned`` (the store's), ``hint`` (the
            call's ``chunk_size`` over the defaults) or ``default`` (the defaults and the algorithm rule).
        op: the fused operation.
        fallback: why another backend than the one asked for ran (``""`` when none did).
    """

    backend: str
    part: str
    config: dict
    source: str
    op: str = ""
    fallback: str = ""

    @property
    def algorithm(self) -> str:
        """The kernel's algorithm (``recurrent``, ``chunked`` ...), or ``""`` for kernels with one."""
        return str(self.config.get("algorithm", ""))


#: Fused operation -> :class:`FusedInfo` of its most recent call in this process.
last: dict[str, FusedInfo] = {}
#: The most recent fused call of any operation (``None`` before the first).
LAST: FusedInfo | None = None
_order: dict[str, int] = {}
_counter = itertools.count()
_lock = threading.Lock()


def _new_lock_in_child() -> None:
    """A forked child takes a new lock: one another thread of the parent held at the fork would stay held in the
    child for ever, and its first fused call would hang."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def renders(op: str, part: str) -> list[str]:
    """Names of the backends that render ``part`` of fused operation ``op``, sorted."""
    fused = FUSED.get(op)
    return sorted(n for n, c in BACKENDS.items() if fused.runs_on(c.target, part))


def misfit(be: Backend, op: str, part: str, features: Any, config: dict | None = None) -> str | None:
    """Why ``be``'s rendering of ``part`` cannot run ``features`` (with ``config``; ``None``: with any), else
    ``None`` (e.g. the GPU kernels' private arrays of N states)."""
    from ..targets.fused import kernel_for

    kernel = kernel_for(be.target, op)
    return kernel.misfit(part, features, config) if kernel is not None and hasattr(kernel, "misfit") else None


def best(op: str, part: str, dtype: np.dtype, features: Any = None) -> Backend | None:
    """The best available backend (by ``auto`` priority) that renders ``part`` for ``dtype`` and fits
    ``features``, or ``None``."""
    fused = FUSED.get(op)
    ranked = sorted((c for _, c in BACKENDS.items() if c.auto_priority >= 0 and fused.runs_on(c.target, part)
                     and np.dtype(dtype).name in c.dtypes), key=lambda c: -c.auto_priority)
    for cls in ranked:
        if not cls.availability().ok:
            continue
        be = get_backend(cls.name)
        if features is None or misfit(be, op, part, features) is None:
            return be
    return None


def backend_for(op: str, part: str, backend: str, dtype: np.dtype, *, api: str, features: Any = None,
                fallback: bool = False) -> Backend:
    """The backend that runs ``part`` of ``op`` for ``backend=`` (see the module docstring).

    Raises:
        BackendUnavailable: no backend can: the message names the backends that render the part.
    """
    if backend == "auto":
        be = best(op, part, dtype, features)
        if be is None:
            raise BackendUnavailable(f"{api}: no available backend renders the fused {op} {part} kernel for "
                                     f"{np.dtype(dtype).name}; backends with one: {', '.join(renders(op, part))}")
        return be
    cls = BACKENDS.get(backend)  # unknown names: the registry's error, naming the known ones
    if FUSED.get(op).runs_on(cls.target, part):
        be = get_backend(backend)
        if not (fallback and features is not None and misfit(be, op, part, features) is not None):
            return be
    if fallback:
        other = best(op, part, dtype, features)
        if other is not None:
            return other
    raise BackendUnavailable(f"{api}: backend {backend!r} has no fused {op} {part} kernel; backends with one: "
                             f"{', '.join(renders(op, part))} (or backend='auto')")


@dataclass
class _Memo:
    """Resolved tunables per call signature, until a tuned store changes (``stamp``)."""

    stamp: object = None
    entries: dict = field(default_factory=dict)


_memo = _Memo()


def resolve(be: Backend, op: str, part: str, features: Any, sizes: dict[str, int], tunables: dict, *,
            api: str, hints: dict | None = None) -> tuple[dict, str]:
    """``(config, source)`` of a call, validated by the operation's declared tunables.

    Over the declared defaults, in this order, each over the last:

    1. the backend's defaults by shape, with the algorithm of the operation's rule
       (:meth:`~scanweaver.fused.FusedOp.algorithm`: ``chunked`` from the measured thresholds on, where the
       kernel has an ``algorithm`` tunable with a chunked form): ``default``;
    2. ``hints`` (``{"chunk": n}``, fla's and mamba-ssm's ``chunk_size``): ``chunk = n`` and the chunked
       algorithm where the kernel has them (:meth:`~scanweaver.fused.FusedOp.defaults`): ``hint``;
    3. the tuned store's entry for this device and problem size, when the call gives no tunables: ``tuned``
       (tunes measure the forward: the entry's ``algorithm`` is the forward's; the backward keeps that of 1-2);
    4. ``tunables``, the call's own: ``explicit`` (the store is not read: the call chose).

    Raises:
        ScanInputError: an unknown tunable for the backend's family, or a value its rule refuses.
    """
    from ..targets.fused import family_of

    try:
        key = (be.name, op, part, features, tuple(sorted(sizes.items())), tunables_key(tunables),
               tuple(sorted((hints or {}).items())))
        hash(key)
    except TypeError:
        key = None
    stamp = store.stamp()
    with _lock:
        if _memo.stamp != stamp:
            _memo.stamp, _memo.entries = stamp, {}
        hit = _memo.entries.get(key) if key is not None else None
    if hit is not None:
        return dict(hit[0]), hit[1]
    fused = FUSED.get(op)
    family = family_of(be.target)
    defaults, hinted = fused.defaults(family, part, features, sizes, be.fused_defaults(op, features, sizes), hints,
                                      be.target)
    source = "explicit" if tunables else "hint" if hinted else "default"
    if not tunables and fused.tunables_for(family):
        lanes, L = fused.problem(features, sizes)
        entry = store.lookup(backend=be.name, device=be.availability().device, signature=fused.signature(features),
                             dtype=features.dtype, lanes=lanes, L=L)
        if entry is not None and entry[0] == store.FUSED_PREFIX + op:
            tuned = {k: v for k, v in dict(entry[1]).items() if part == "forward" or k != "algorithm"}
            defaults, source = {**defaults, **tuned}, "tuned"
    cfg = fused.settle(family, part, fused.resolve(family, tunables, defaults, api), features)
    reason = misfit(be, op, part, features, cfg)
    if reason:
        raise ScanInputError(f"{api}: {reason}")
    if key is not None:
        with _lock:
            if len(_memo.entries) > 512:
                _memo.entries.clear()
            _memo.entries[key] = (dict(cfg), source)
    return cfg, source


def record(info: FusedInfo) -> FusedInfo:
    """Records ``info`` as what the last call of its operation (and of any) ran."""
    global LAST
    with _lock:
        last[info.op] = info
        _order[info.op] = next(_counter)
        LAST = info
    return info


def latest(*ops: str) -> FusedInfo | None:
    """The most recent call's report among fused operations ``ops`` (``None`` before any)."""
    known = [op for op in ops if op in last]
    return last[max(known, key=lambda op: _order[op])] if known else None


def run(op: str, part: str, features: Any, arrays: dict[str, Any], sizes: dict[str, int], *, backend: str = "auto",
        tunables: dict | None = None, api: str, fallback: bool = False, hints: dict | None = None) -> FusedInfo:
    """Runs ``part`` of fused operation ``op`` on ``arrays`` (its ``out`` arrays are written in place).

    Args:
        op: the fused operation's name.
        part: ``forward`` or ``backward``.
        features: the operation's compile-time features for this call.
        arrays: kernel parameter name -> array (``None`` for NULL).
        sizes: the kernel's ``int`` parameters.
        backend: ``auto`` or a backend name.
        tunables: the call's tunables (``{}``: the store's, else the defaults).
        api: the public call's name (errors start with it).
        fallback: run on the best backend that has the part when ``backend`` has none, or none that fits.
        hints: ``{"chunk": n}`` (``chunk_size``): the chunked algorithm with chunks of n where the backend
            has it, unless the tuned store or the call's tunables say otherwise (:func:`resolve`).

    Returns:
        what ran (also in :data:`last`).
    """
    dtype = np.dtype(getattr(features, "state_dtype", features.dtype))  # half storage runs where float32 does
    be = backend_for(op, part, backend, dtype, api=api, features=features, fallback=fallback)
    given = dict(tunables or {})
    why = ""
    if backend not in ("auto", be.name):
        asked = get_backend(backend) if FUSED.get(op).runs_on(BACKENDS.get(backend).target, part) else None
        reason = f"its kernel does not fit ({misfit(asked, op, part, features)})" if asked is not None else \
            f"it has no fused {op} {part} kernel"
        why = f"backend {backend!r}: {reason}; {be.name!r} ran it"
        given = {}  # the tunables were meant for the backend asked for
    cfg, source = resolve(be, op, part, features, sizes, given, api=api, hints=hints)
    fused = FUSED.get(op)
    be.run_fused(fused.call(part, features, cfg), arrays, sizes)
    return record(FusedInfo(be.name, part, cfg, source, op, why))


@dataclass(frozen=True)
class FusedPlan:
    """One part of a fused operation as one call resolved it (backend, compiled variant, tunables), for repeated
    calls of the same signature: :meth:`launch` calls the kernel through the backend's checked direct call
    (:mod:`scanweaver.runtime.fastcall`: every buffer's size, alignment and writability checked in C).

    Attributes:
        backend: the backend that ran it.
        call: the compiled variant.
        info: what the call ran (recorded again by every launch).
        sizes: the kernel's ``int`` parameters, in ABI order.
        names: its array parameters, in ABI order.
        invoke: the direct call, ``invoke(buffers, *sizes) -> status``.
        stamp: the tuned store's stamp taken before the call resolved its tunables (``None``: the call gave its
            own, and the store was not read).
    """

    backend: Backend
    call: FusedCall
    info: FusedInfo
    sizes: dict[str, int]
    names: tuple[str, ...]
    invoke: Callable[..., int]
    stamp: object = None

    def fresh(self) -> bool:
        """False when the tunables came from the tuned store (or its defaults) and a store has changed since."""
        return self.stamp is None or self.stamp == store.stamp()

    def launch(self, arrays: dict[str, Any]) -> FusedInfo:
        """Runs the part on ``arrays`` (parameter name -> NumPy array, ``None`` or absent for NULL; the ``out``
        arrays written in place) and records it as :func:`run` does.

        Raises:
            ValueError, BufferError: an array that does not fit the plan (missing, too small, misaligned,
                read-only where written, overlapping an output), found before the kernel ran.
        """
        if self.invoke(tuple(arrays.get(n) for n in self.names), *self.sizes.values()) != 0:
            self.backend.run_fused(self.call, arrays, self.sizes)  # the backend reports the status as it does
        return record(self.info)


def plan_of(info: FusedInfo, features: Any, sizes: dict[str, int], stamp: object) -> FusedPlan | None:
    """A :class:`FusedPlan` of the call that ``info`` reports (run with ``features`` and ``sizes``), or ``None``
    where its backend has no direct call.

    Args:
        info: what :func:`run` returned for the call.
        features, sizes: the call's.
        stamp: ``scanweaver.tuning.store.stamp()`` taken before the call (kept unless the call gave its tunables).
    """
    be = get_backend(info.backend)
    make = getattr(be, "fused_invoker", None)
    fused = FUSED.get(info.op)
    call = fused.call(info.part, features, info.config)
    invoke = make(call, sizes) if make is not None and not info.fallback else None
    if invoke is None:
        return None
    params = fused.params(info.part)
    return FusedPlan(be, call, info, {p.name: int(sizes[p.name]) for p in params if p.kind == "int"},
                     tuple(p.name for p in params if p.kind != "int"), invoke,
                     None if info.source == "explicit" else stamp)
