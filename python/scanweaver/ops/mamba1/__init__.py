"""The Mamba-1 selective scan (S6): the fused kernel by default, the scan lowering as the readable reference.

* :func:`mamba_selective_scan` (:mod:`.api`): the public call, ``mamba_ssm``'s semantics.
* :func:`prepare` (:mod:`.operands`): checked operands in the kernels' layouts.
* :func:`forward`, :func:`backward` (:mod:`.kernels`): the fused kernels at the NumPy level;
  :data:`last` says what the last fused call ran (backend, part, tunables and their source).
* :mod:`.scan_path`: the step traced as one ScanWeaver recurrence (``fused=False``).
* :mod:`.grad`: the ``mamba1`` kernel pair of :mod:`scanweaver.calls.pairs`, which
  ``scanweaver.torch.mamba_selective_scan`` and ``scanweaver.jax.mamba_selective_scan`` run.
"""

from __future__ import annotations

from . import grad as _grad  # noqa: F401  (registers the mamba1 kernel pair)
from ...calls import runner
from . import kernels as _kernels
from .api import mamba_selective_scan
from .kernels import FusedInfo, backward, forward, fused_backend
from .operands import MambaOperands, _groups, prepare
from .scan_path import _s6_step


def __getattr__(name: str):
    if name == "last":  # the kernels module's, updated by every fused call
        return runner.last.get(_kernels.OP)
    raise AttributeError(f"module 'scanweaver.mamba' has no attribute {name!r}")


__all__ = ["FusedInfo", "MambaOperands", "backward", "forward", "fused_backend", "mamba_selective_scan", "prepare",
           "_groups", "_s6_step"]
