"""Runtime backends behind one interface (:class:`~.base.Backend`)."""

from __future__ import annotations

import importlib

from .base import REGISTRY, Availability, Backend, ScanArrays, get_backend, register

#: Modules that define backends; heavy dependencies are imported inside them lazily.
BACKEND_MODULES = (
    "scanweaver.runtime.numpy_backend",
    "scanweaver.runtime.cpu",
    "scanweaver.runtime.opencl",
    "scanweaver.runtime.cuda",
    "scanweaver.julia.backend",
)


def load_all() -> None:
    """Imports every backend module that exists (each registers itself)."""
    for mod in BACKEND_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise


__all__ = ["REGISTRY", "Availability", "Backend", "ScanArrays", "get_backend", "load_all", "register"]
