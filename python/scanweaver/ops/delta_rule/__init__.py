"""The delta-rule family: DeltaNet, Gated DeltaNet, KDA and RWKV-7 with flash-linear-attention's signatures.

* :func:`delta_rule`, :func:`gated_delta_rule`, :func:`kda`, :func:`rwkv7` (:mod:`.api`): the named
  operations, each a thin layer over the fused operation :mod:`scanweaver.fused.delta_rule`.
* :func:`delta_rule_step`, :func:`gated_delta_rule_step`, :func:`kda_step`, :func:`rwkv7_step`
  (:mod:`.step`): one-token decode steps.
* :func:`forward`, :func:`backward` (:mod:`.kernels`): the fused kernels on checked operands
  (:func:`operands`), through the one runner.
* :mod:`.grad`: the kernel pairs that :mod:`scanweaver.torch` and :mod:`scanweaver.jax` differentiate.
"""

from __future__ import annotations

from . import grad as _grad  # noqa: F401  (registers the kernel pairs)
from .api import delta_rule, gated_delta_rule, kda, rwkv7
from .kernels import backward, forward
from .operands import DeltaOperands, operands
from .step import delta_rule_step, gated_delta_rule_step, kda_step, rwkv7_step

__all__ = ["DeltaOperands", "backward", "delta_rule", "delta_rule_step", "forward", "gated_delta_rule",
           "gated_delta_rule_step", "kda", "kda_step", "operands", "rwkv7", "rwkv7_step"]
