"""Matrix-state recurrences: Mamba-2 (SSD), gated linear attention, RetNet and RWKV-6.

* :func:`linear_attention`, :func:`simple_gla`, :func:`retention`, :func:`rwkv6`,
  :func:`mamba2_scan` (:mod:`.api`): the named operations, each a thin layer over the fused
  operation :mod:`scanweaver.fused.matrix_state`.
* :func:`linear_attention_step`, :func:`rwkv6_step`, :func:`mamba2_step` (:mod:`.step`):
  one-token decode steps; :func:`mamba2_state_update` (:mod:`.state_update`): mamba-ssm's
  in-place ``selective_state_update``.
* :func:`forward`, :func:`backward` (:mod:`.kernels`): the fused kernels on checked
  operands, through the backends' ``run_fused``; :data:`last` says what the last call ran.
* :mod:`.grad`: the ``linear_attention``, ``rwkv6`` and ``mamba2`` kernel pairs that
  :mod:`scanweaver.torch` and :mod:`scanweaver.jax` differentiate.
"""

from __future__ import annotations

from . import grad as _grad  # noqa: F401  (registers the kernel pairs)
from . import kernels as _kernels
from ...calls import runner
from .api import linear_attention, mamba2_scan, retention, rwkv6, simple_gla
from .kernels import FusedInfo, backward, forward, runs_matrix_state
from .operands import MatrixOperands, operands
from .state_update import mamba2_state_update
from .step import linear_attention_step, mamba2_step, rwkv6_step


def __getattr__(name: str):
    if name == "last":  # the runner's report of the family's most recent call (matrix state or delta rule)
        return runner.latest(_kernels.OP, "delta_rule")
    raise AttributeError(f"module 'scanweaver.matrix' has no attribute {name!r}")


__all__ = ["FusedInfo", "MatrixOperands", "backward", "forward", "linear_attention", "linear_attention_step",
           "mamba2_scan", "mamba2_state_update", "mamba2_step", "operands", "retention", "runs_matrix_state", "rwkv6",
           "rwkv6_step", "simple_gla"]
