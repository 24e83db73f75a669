"""Renderings of fused operations (:mod:`scanweaver.fused`) per target family.

A :class:`FusedKernel` is how one fused operation becomes source for one
*family* of targets: ``c`` (the CPU's C), ``gpu`` (every C-family GPU target:
OpenCL, CUDA, and any later :class:`~.gpu.GPURenderer`), ``numpy`` (the
operation's own NumPy definition).  A target's family is its class attribute
``family`` (its target name when it has none).  Renderings register
themselves in :data:`KERNELS` from modules named ``fused_*`` in this package,
keyed ``"<op>/<family>"``.

Example:
    >>> from scanweaver.targets.fused import implements
    >>> implements("opencl", "mamba1", "backward"), implements("julia", "delta_rule", "backward")
    (True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..registry import Discovery, Registry
from .base import TARGETS


@dataclass(frozen=True)
class FusedKernel:
    """One fused operation rendered for one target family.

    Attributes:
        op: the fused operation's name.
        family: ``c``, ``gpu`` or ``numpy``.
        parts: the parts rendered (``forward``, ``backward``).
        render: ``render(renderer, call)`` -> source text of one :class:`~scanweaver.fused.FusedCall`
            (``None`` for ``numpy``, which runs the operation's reference).
        entry: ``entry(part)`` -> the entry point's name in that source.
        plan: (GPU) ``plan(call, sizes)`` -> :class:`~.gpu.Plan` of the launches, else ``None``.
        defaults: ``defaults(features, sizes)`` -> tunable defaults by shape for this family, or ``None``
            (the backend's own defaults apply).
        fits: ``fits(part, features, config)`` -> why that variant cannot run (a resource it would
            exceed), else ``None``; ``config=None`` asks about the least demanding configuration.
            ``None``: every variant runs.
    """

    op: str
    family: str
    parts: tuple[str, ...]
    render: Callable[[Any, Any], str] | None = None
    entry: Callable[[str], str] | None = None
    plan: Callable[[Any, dict], Any] | None = None
    defaults: Callable[[Any, dict], dict] | None = None
    fits: Callable[[str, Any, dict | None], str | None] | None = None

    def misfit(self, part: str, features: Any, config: dict | None = None) -> str | None:
        """Why ``part`` with ``features`` (and ``config``) cannot run, else ``None`` (see :attr:`fits`)."""
        return self.fits(part, features, config) if self.fits is not None else None

    @property
    def key(self) -> str:
        """The registry key ``<op>/<family>``."""
        return f"{self.op}/{self.family}"


#: ``<op>/<family>`` -> :class:`FusedKernel` (from the ``fused_*`` modules of this package).
KERNELS: Registry[FusedKernel] = Registry("fused kernel", (Discovery("scanweaver.targets", ("fused_*",)),),
                                          key="key")


def family_of(target: str) -> str:
    """The rendering family of ``target`` (``c``, ``gpu``, ``numpy`` ...)."""
    cls = TARGETS.get(target, None)
    return getattr(cls, "family", target) if cls is not None else target


def kernel_for(target: str, op: str) -> FusedKernel | None:
    """The rendering of ``op`` for ``target``'s family, or ``None``."""
    return KERNELS.get(f"{op}/{family_of(target)}", None)


def implements(target: str, op: str, part: str) -> bool:
    """True when ``target`` has a rendering of ``part`` of the fused operation ``op``."""
    k = kernel_for(target, op)
    return k is not None and part in k.parts
