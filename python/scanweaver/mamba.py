"""``scanweaver.mamba``: Mamba-1's fused kernels at the NumPy level (the operation is :mod:`scanweaver.ops.mamba1`).

:func:`forward` and :func:`backward` run the fused kernels on operands checked by
:func:`prepare`; :data:`last` says what the most recent fused call ran.
"""

from __future__ import annotations

from .ops import mamba1 as _op
from .ops.mamba1 import FusedInfo, MambaOperands, backward, forward, fused_backend, mamba_selective_scan, prepare


def __getattr__(name: str):
    if name == "last":  # the operation's, updated by every fused call
        return _op.last
    raise AttributeError(f"module 'scanweaver.mamba' has no attribute {name!r}")


__all__ = ["FusedInfo", "MambaOperands", "backward", "forward", "fused_backend", "mamba_selective_scan", "prepare"]
