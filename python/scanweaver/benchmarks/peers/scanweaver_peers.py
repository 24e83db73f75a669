"""ScanWeaver's own entries: every available backend and schedule, the default path, and the roofline.

Entries are made on demand from :data:`scanweaver.runtime.REGISTRY`, so a
backend that appears later (or is restricted with ``--backend``) needs no
change here.  ``ScanWeaver default path`` is ``selective_scan`` as a user
calls it: ``backend="auto"``, ``config="auto"`` (the tuned store, else the
documented defaults).
"""

from __future__ import annotations

import numpy as np

from ..cases import Case, Settings
from ..machine import host_cpu
from . import Peer, provider

#: Cost model of one call per backend, ns per element (the numpy backend also pays per step).
BACKEND_COST_NS = {"numpy": 250.0, "cpu": 3.0, "opencl": 100.0, "cuda": 0.05}
#: Per-step cost of the NumPy interpreter's Python loops, microseconds.
NUMPY_STEP_US = 8.0
#: Figure 4's kernels: the naive sequential kernel (compiled backends; the interpreter is no kernel) and Blelloch.
PAPER_SCHEDULES = {"sequential": "compiled", "blelloch": "any"}
#: What --quick runs per backend (None: every schedule).  Others compile for seconds per schedule
#: (PoCL) or interpret slowly; ``--backend NAME`` runs all of that backend's schedules even in --quick.
QUICK_SCHEDULES: dict[str, tuple[str, ...] | None] = {"cpu": None, "auto": None, "numpy": ("sequential", "blelloch")}


class ScanWeaverEntry(Peer):
    """``scanweaver.selective_scan(a, b, x, c, backend=B, schedule=S, config=...)``."""

    kind = "ours"

    def __init__(self, backend: str, schedule: str = "auto", config: str = "default", explicit: bool = False):
        self.backend, self.schedule, self.config, self.explicit = backend, schedule, config, explicit
        self.name = f"scanweaver:{backend}:{schedule}" if config == "default" else f"scanweaver:{backend}:{config}"
        self.label = f"ScanWeaver {backend}/{schedule}"
        role = PAPER_SCHEDULES.get(schedule)
        self.paper = role == "any" or (role == "compiled" and backend != "numpy")
        self.ns_per_element = BACKEND_COST_NS.get(backend, 5.0)
        self.us_per_step = NUMPY_STEP_US if backend == "numpy" else 0.0
        self.gpu = backend in ("cuda", "auto")

    def availability(self) -> str | None:
        from ...runtime import REGISTRY

        if self.backend == "auto":
            return None
        cls = REGISTRY.get(self.backend, None)
        if cls is None:
            return REGISTRY.unknown_message(self.backend)
        avail = cls.availability()
        return None if avail.ok else avail.reason

    def device(self) -> str:
        from ...core.dispatch import pick_backend

        dev = pick_backend(self.backend).availability().device
        return dev or host_cpu()

    def skip_reason(self, case: Case, settings: Settings) -> str | None:
        if case.device == "cuda":
            from ...runtime import REGISTRY

            avail = REGISTRY["cuda"].availability()
            if not avail.ok:
                return f"the GPU suite's operands live on the GPU: {avail.reason}"
        if settings.quick and not self.explicit:
            allowed = QUICK_SCHEDULES.get(self.backend, ())
            if allowed is not None and self.schedule not in allowed:
                return (f"left out of --quick ({self.backend}/{self.schedule} compiles or interprets slowly); "
                        f"run without --quick, or with --backend {self.backend}")
        return super().skip_reason(case, settings)

    def estimate(self, case: Case) -> float:
        if self.backend == "auto":
            from ...core.dispatch import pick_backend

            name = pick_backend("auto").name
            return case.elements * BACKEND_COST_NS.get(name, 5.0) * 1e-9
        return super().estimate(case)

    def prepare(self, ops):
        import scanweaver

        from ...runtime import device_arrays

        a, b, x, c = (ops[k] for k in ("a", "b", "x", "c"))
        kw = {"backend": self.backend, "schedule": self.schedule, "config": self.config}
        if device_arrays.kind(a) != "cuda":
            return lambda: scanweaver.selective_scan(a, b, x, c, **kw)
        import cupy

        def run():  # the call is asynchronous on device arrays: wait for it, as the peers do
            y = scanweaver.selective_scan(a, b, x, c, **kw)
            cupy.cuda.get_current_stream().synchronize()
            return y

        return run

    def details(self) -> dict:
        from ...api import SELECTIVE

        last = SELECTIVE.last
        if last is None:
            return {}
        return {"backend": last.backend, "schedule": last.schedule, "config": dict(last.config),
                "config_source": last.source}


class DefaultPath(ScanWeaverEntry):
    """What a user gets with no arguments: the best backend, the tuned store's config (else defaults)."""

    def __init__(self, backend: str = "auto", explicit: bool = False):
        super().__init__(backend, "auto", "auto", explicit)
        self.paper = True
        self.label = "ScanWeaver default path (tuned best)" if backend == "auto" else f"ScanWeaver {backend}/tuned"


class Roofline(Peer):
    """An elementwise C kernel with the scan's traffic (4 reads, 1 write) on the free cores: the memory bound."""

    name = "roofline"
    label = "Roofline: elementwise a*b+x*c (memory bound)"
    kind = "bound"
    recurrence = "elementwise (no recurrence)"
    checked = False
    note = ("Roofline: y = a*b + x*c in C with OpenMP on the free cores (scanweaver.runtime.roofline's kernel, "
            "the cpu backend's threads=0 rule) on the same operands, writing a preallocated y; same bytes as the "
            "scan. Roofline fraction = roofline time / scan time, from the two timed again interleaved on the "
            "default path's own thread count; above 1.05 it is impossible and reported as n/a (busy).")
    ns_per_element = 1.0

    def availability(self):
        try:
            from ...runtime import roofline  # noqa: F401
            from ...runtime.toolchain import missing_reason
        except ImportError as exc:
            return f"the roofline kernel is not available: {exc}"
        return missing_reason()

    def device(self) -> str:
        return host_cpu()

    def prepare(self, ops):
        import ctypes

        from ...runtime import roofline

        make = roofline.kernel
        fn = make(ops["a"].dtype.name)
        a, b, x, c = (np.ascontiguousarray(ops[k]) for k in ("a", "b", "x", "c"))
        y = np.empty_like(a)
        keep = (a, b, x, c, y)  # the closure holds the arrays whose addresses the kernel gets

        def run():
            fn(*[v.ctypes.data for v in keep], ctypes.c_long(y.size))

        return run


@provider
def scanweaver_entries(backend: str | None) -> list[Peer]:
    """One entry per (backend, schedule), the default path, and the roofline bound."""
    from ...runtime import REGISTRY

    out: list[Peer] = []
    for name in sorted(REGISTRY):
        if backend not in (None, "auto", name):
            continue
        cls = REGISTRY[name]
        if not cls.availability().ok:
            out.append(ScanWeaverEntry(name, "any"))
            continue
        out.extend(ScanWeaverEntry(name, sched, explicit=backend == name) for sched in cls.schedules)
    out.append(DefaultPath(backend or "auto", explicit=backend is not None))
    if backend in (None, "auto", "cuda") and REGISTRY["cuda"].availability().ok:
        plain = ScanWeaverEntry("cuda", "auto", "default", explicit=backend == "cuda")
        plain.label = "ScanWeaver cuda, documented defaults (no store, no device file)"
        plain.name = "scanweaver:cuda:defaults"
        out.append(plain)
    out.append(Roofline())
    return out

