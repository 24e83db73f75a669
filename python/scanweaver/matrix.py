"""``scanweaver.matrix``: the matrix-state kernels at the NumPy level (the operations are
:mod:`scanweaver.ops.matrix_state`).

:func:`forward` and :func:`backward` run the fused ``matrix_state`` kernels on operands checked by
:func:`operands`; :data:`last` says what the most recent matrix-state call ran.
"""

from __future__ import annotations

from .ops import matrix_state as _op
from .ops.matrix_state import (
    FusedInfo,
    MatrixOperands,
    backward,
    forward,
    linear_attention,
    linear_attention_step,
    mamba2_scan,
    mamba2_state_update,
    mamba2_step,
    operands,
    retention,
    runs_matrix_state,
    rwkv6,
    rwkv6_step,
    simple_gla,
)


def __getattr__(name: str):
    if name == "last":  # the operation's, updated by every call
        return _op.last
    raise AttributeError(f"module 'scanweaver.matrix' has no attribute {name!r}")


__all__ = ["FusedInfo", "MatrixOperands", "backward", "forward", "linear_attention", "linear_attention_step",
           "mamba2_scan", "mamba2_state_update", "mamba2_step", "operands", "retention", "runs_matrix_state", "rwkv6",
           "rwkv6_step", "simple_gla"]
