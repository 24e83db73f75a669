"""Search spaces: the tunables of a backend's schedules, with invalid combinations ruled out.

Values come from the :class:`~scanweaver.schedules.Tunable` declarations
(schedule tunables and the backend's ``extra_tunables``), so the schedules
stay the one source of truth, and every key is the keyword the runtime
accepts: a configuration from a space can be passed straight to
``selective_scan(..., **config)``.

Two kinds of rules shrink a space before anything is compiled:

* value filters (:data:`VALUE_FILTERS`) drop values that are invalid or
  redundant for the problem: ``threads`` above the CPU count, ``chunk``
  values beyond the first that covers L (they all run one chunk),
  ``lanes_per_group`` beyond the first that covers every lane, a
  ``workgroup_size`` above the device limit;
* restrictions (:data:`RESTRICTIONS`) rule out combinations: first whatever
  the schedule itself rejects (its ``ops(config)`` raising, e.g.
  ``lanes_per_group > workgroup_size``), then an ``unroll`` that does not
  divide the per-thread length, then GPU kernels whose shared memory or
  block size the device cannot hold (with the reason).

When a space covers several schedule families, ``schedule`` is itself a
tunable and the tunables of the other families are pinned to one value, so
no configuration is measured twice.

Example:
    >>> from scanweaver.tuning.space import build_space
    >>> sp = build_space("numpy", schedules=("chunked",), lanes=4, L=1000, dtype="float32")
    >>> sp.params["chunk"]
    (256, 512, 1024)
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass, field
from collections.abc import Callable

from ..errors import ScanInputError
from ..passes.materialize_schedule import resolve_config
from ..schedules import Tunable, get_schedule


@dataclass(frozen=True)
class Limits:
    """What the problem and the device allow.

    Attributes:
        lanes, L: problem size.
        dtype: storage dtype.
        cpu_count: usable CPU threads.
        max_workgroup: largest work-group (thread-block) size of the device, if known.
        local_mem: bytes of work-group local (shared) memory, if known; with it (or
            ``max_workgroup``) GPU configurations the device cannot launch are ruled out
            (:mod:`scanweaver.targets.launch_limits`).
        target: the GPU target whose kernel layout counts (``cuda`` or ``opencl``).
    """

    lanes: int
    L: int
    dtype: str = "float32"
    cpu_count: int = field(default_factory=lambda: len(os.sched_getaffinity(0))
                           if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
    max_workgroup: int | None = None
    local_mem: int | None = None
    target: str = "cuda"

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8


def _first_covering(values: tuple, size: int, scale: int = 1) -> tuple:
    """Values whose ``scale*v`` stays below ``size``, plus the first that reaches it."""
    keep = []
    for v in sorted(values):
        keep.append(v)
        if v * scale >= size:
            break
    return tuple(keep)


def _threads(values: tuple, cpus: int) -> tuple:
    """1 .. cpus; 0 ("every core") only when it is not the same as a listed count."""
    keep = tuple(v for v in values if 1 <= v <= cpus)
    return keep if cpus in keep else (*((0,) if 0 in values else ()), *keep) or (min(values),)


#: tunable name -> filter(values, limits) returning the values worth measuring
VALUE_FILTERS: dict[str, Callable[[tuple, Limits], tuple]] = {
    "threads": lambda vs, lim: _threads(vs, lim.cpu_count),
    "chunk": lambda vs, lim: _first_covering(vs, lim.L),
    "workgroup_size": lambda vs, lim: tuple(v for v in vs if lim.max_workgroup is None or v <= lim.max_workgroup)
    or (min(vs),),
    "lanes_per_group": lambda vs, lim: _first_covering(vs, lim.lanes),
}


def _unroll(p: dict, lim: Limits) -> str | None:
    u, c = p.get("unroll"), p.get("chunk") or p.get("items_per_thread")
    if u and c and c % u:
        return f"unroll={u} does not divide the per-thread length {c}"
    return None


def _launchable(p: dict, lim: Limits) -> str | None:
    """GPU kernels whose shared memory or block size the device cannot hold (registers are bounded by
    ``__launch_bounds__``; the runtime checks the compiled function too)."""
    if lim.local_mem is None and lim.max_workgroup is None:
        return None
    from ..targets.gpu import SCHEDULES
    from ..targets.launch_limits import DeviceLimits, why_not_launchable

    sched = p.get("schedule")
    if sched not in SCHEDULES:
        return None
    dev = DeviceLimits(threads_per_block=lim.max_workgroup or DeviceLimits.threads_per_block,
                       shared_per_block=lim.local_mem or DeviceLimits.shared_per_block)
    cfg = {k: v for k, v in p.items() if k != "schedule"}
    return why_not_launchable(sched, cfg, lim.dtype, dev=dev, target=lim.target)


#: rules over a whole configuration (with its ``schedule``); each returns why it is invalid, or None
RESTRICTIONS: list[Callable[[dict, Limits], str | None]] = [_unroll, _launchable]


def _tunable_values(t: Tunable, lim: Limits) -> tuple:
    values = tuple(v for v in t.values if not t.problem(v))
    flt = VALUE_FILTERS.get(t.name)
    return flt(values, lim) if flt else values


@dataclass(frozen=True)
class SearchSpace:
    """A backend's search space for one problem.

    Attributes:
        backend: backend name.
        schedules: schedule families covered.
        params: Kernel Tuner ``tune_params``: name -> values, ``schedule`` first
            when several families are covered.
        owners: tunable name -> {schedule it belongs to: the values it takes there}
            (backend tunables belong to every schedule).
        pinned: value a tunable keeps while another family's schedule is chosen.
        limits: the problem and device limits used.
        extra: the backend's extra tunables (for validation).
    """

    backend: str
    schedules: tuple[str, ...]
    params: dict[str, tuple]
    owners: dict[str, dict[str, frozenset]]
    pinned: dict[str, object]
    limits: Limits
    extra: tuple = ()

    def schedule_of(self, p: dict) -> str:
        """The schedule family of configuration ``p``."""
        return p.get("schedule", self.schedules[0])

    def why_invalid(self, p: dict) -> str | None:
        """Why configuration ``p`` (a Kernel Tuner params dict) is ruled out, or ``None``."""
        sched = self.schedule_of(p)
        for name, owners in self.owners.items():
            if sched not in owners:
                if p.get(name) != self.pinned[name]:
                    return f"{name} does not apply to schedule {sched!r}"
            elif p.get(name) not in owners[sched]:
                return f"{name}={p.get(name)!r} is not a candidate value for schedule {sched!r}"
        return self.why_rejected(p)

    def why_rejected(self, p: dict) -> str | None:
        """Why the schedule or a restriction rejects ``p`` (candidate lists aside), or ``None``."""
        sched, cfg = self.split(p)
        try:
            get_schedule(sched).ops(resolve_config(sched, cfg, "tune", self.extra))
        except ScanInputError as exc:
            return str(exc)
        for rule in RESTRICTIONS:
            why = rule({"schedule": sched, **cfg}, self.limits)
            if why:
                return why
        return None

    def valid(self, p: dict) -> bool:
        """``True`` when ``p`` passes every restriction (Kernel Tuner's ``restrictions=``)."""
        return self.why_invalid(p) is None

    def configs(self) -> list[dict]:
        """Every valid configuration, as Kernel Tuner params dicts."""
        names = list(self.params)
        out = (dict(zip(names, vals, strict=True)) for vals in itertools.product(*self.params.values()))
        return [p for p in out if self.valid(p)]

    @property
    def size(self) -> int:
        """Number of valid configurations."""
        return len(self.configs())

    def split(self, p: dict) -> tuple[str, dict]:
        """Kernel Tuner params -> ``(schedule, config)`` with only that schedule's tunables."""
        sched = self.schedule_of(p)
        cfg = {k: p[k] for k, owners in self.owners.items() if sched in owners and k in p}
        return sched, cfg

    def join(self, schedule: str, config: dict) -> dict:
        """``(schedule, config)`` -> Kernel Tuner params, pinning the other families' tunables."""
        p = {"schedule": schedule} if "schedule" in self.params else {}
        for name in self.owners:
            p[name] = config.get(name, self.pinned[name]) if schedule in self.owners[name] else self.pinned[name]
        return p

    def key(self, p: dict) -> str:
        """Kernel Tuner's cache key of ``p`` (values joined by commas, in param order)."""
        return ",".join(str(p[k]) for k in self.params)

    def to_json(self) -> dict:
        """A JSON-able description (enough to rebuild the space for a replay)."""
        return {"backend": self.backend, "schedules": list(self.schedules),
                "params": {k: list(v) for k, v in self.params.items()},
                "owners": {n: {s: sorted(vs) for s, vs in o.items()} for n, o in self.owners.items()},
                "pinned": self.pinned, "limits": dataclasses.asdict(self.limits)}

    @classmethod
    def from_json(cls, d: dict) -> SearchSpace:
        """The space :meth:`to_json` described (backend tunables resolved from the registry)."""
        from ..runtime import REGISTRY

        backend = REGISTRY.get(d["backend"], None)
        return cls(d["backend"], tuple(d["schedules"]), {k: tuple(v) for k, v in d["params"].items()},
                   {n: {s: frozenset(vs) for s, vs in o.items()} for n, o in d["owners"].items()},
                   dict(d["pinned"]), Limits(**d["limits"]), tuple(backend.extra_tunables) if backend else ())

    def contains(self, p: dict) -> bool:
        """``True`` when every value of ``p`` is in the space and ``p`` is valid."""
        return all(p.get(k) in vs for k, vs in self.params.items()) and self.valid(p)


def build_space(backend: str, *, schedules: tuple[str, ...] | None = None, lanes: int, L: int,
                dtype: str = "float32", limits: Limits | None = None,
                backend_owners: dict[str, tuple[str, ...]] | None = None,
                pins: dict[str, object] | None = None, values: dict[str, tuple] | None = None) -> SearchSpace:
    """The search space of ``backend`` over ``schedules`` for a ``(lanes, L)`` problem.

    Args:
        backend: a registered backend name (its ``schedules`` and ``extra_tunables`` are used).
        schedules: schedule families to cover (default: every one the backend runs).
        lanes, L: problem size.
        dtype: storage dtype.
        limits: device limits (defaults: this machine's CPU count, no device limits).
        backend_owners: backend tunable -> the schedules that read it (default: every schedule).
        pins: the value a tunable takes under schedules that do not own it, when that
            matters to the launch (default: its declared default, else its first value).
        values: candidate values to use instead of the declared ones for some tunables
            (e.g. a small space for a quick tune); each must pass the tunable's rule.

    Raises:
        ScanInputError: unknown backend or a schedule the backend cannot run.
    """
    from ..runtime import REGISTRY

    cls = REGISTRY.get(backend)
    schedules = tuple(schedules or cls.schedules)
    bad = [s for s in schedules if s not in cls.schedules]
    if bad:
        raise ScanInputError(f"tune: backend {backend!r} cannot run schedule(s) {', '.join(bad)}; "
                             f"it runs {', '.join(cls.schedules)}")
    lim = limits or Limits(lanes=lanes, L=L, dtype=dtype)
    values = dict(values or {})
    params: dict[str, tuple] = {"schedule": schedules} if len(schedules) > 1 else {}
    owners: dict[str, dict[str, frozenset]] = {}
    defaults: dict[str, object] = {}
    for t in [t for s in schedules for t in get_schedule(s).tunables] + list(cls.extra_tunables):
        cand = _tunable_values(t, lim)
        if t.name in values:
            cand = tuple(sorted(v for v in values[t.name] if not t.problem(v)))
            if not cand:
                raise ScanInputError(f"tune: no valid value in {t.name}={values[t.name]!r}; {t.doc}")
        if t in cls.extra_tunables:
            scheds = [s for s in schedules if s in (backend_owners or {}).get(t.name, schedules)]
        else:
            scheds = [s for s in schedules if t in get_schedule(s).tunables]
        if not scheds:
            continue  # read by none of these schedules' kernels
        params[t.name] = tuple(sorted(set(params.get(t.name, ())) | set(cand)))
        defaults.setdefault(t.name, t.default)
        for s in scheds:
            owners.setdefault(t.name, {})[s] = frozenset(cand)
    pinned = {n: defaults[n] if defaults[n] in vs else vs[0] for n, vs in params.items() if n != "schedule"}
    pinned.update({n: v for n, v in (pins or {}).items() if v in params.get(n, ())})
    return SearchSpace(backend, schedules, params, owners, pinned, lim, tuple(cls.extra_tunables))
