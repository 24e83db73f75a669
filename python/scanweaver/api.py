"""The front door: ``@scanweaver.recurrence`` and every public operation, in one namespace.

Each operation lives in its own package under :mod:`scanweaver.ops`; this
module gathers their NumPy entry points (which route PyTorch and JAX arrays
to :mod:`scanweaver.torch` / :mod:`scanweaver.jax` through the one router,
:mod:`scanweaver.calls.route`) and defines :func:`recurrence`, which compiles
a step function into a vector-state :class:`~scanweaver.core.recurrence.Recurrence`
or, with ``state_shape``, a matrix-state recurrence.
"""

from __future__ import annotations

from collections.abc import Callable

from .core.recurrence import CallInfo, Recurrence
from .errors import api_boundary
from .ops.delta_rule import (
    delta_rule,
    delta_rule_step,
    gated_delta_rule,
    gated_delta_rule_step,
    kda,
    kda_step,
    rwkv7,
    rwkv7_step,
)
from .ops.log_scan import log_scan
from .ops.mamba1 import mamba_selective_scan
from .ops.matrix_state import (
    linear_attention,
    linear_attention_step,
    mamba2_scan,
    mamba2_state_update,
    mamba2_step,
    retention,
    rwkv6,
    rwkv6_step,
    simple_gla,
)
from .ops.matrix_state.recurrence import MatrixRecurrence
from .ops.scan import SELECTIVE, SELECTIVE_NO_C, selective_scan


@api_boundary
def recurrence(step: Callable | None = None, *, name: str | None = None, broadcast: bool = True,
               state_size: int = 1, state_shape: tuple[str, str] | None = None):
    """Compiles a step function ``step(h, *operands)`` into a :class:`Recurrence`.

    The step is traced with symbolic values and proved affine in ``h``
    (h' = A*h + U); it may return ``h_next`` or ``(h_next, y)``.  Operators
    ``+ - * /``, unary minus, and NumPy functions of terms free of ``h``
    (``np.exp``, ``np.log1p``, :func:`scanweaver.sigmoid` ...) are allowed.

    Args:
        step: the step function.
        name: name used in IR and messages (defaults to the function's).
        broadcast: broadcast operands to a common shape (else require equal shapes).
        state_size: k > 1 makes ``h`` a vector of k components (dense k x k
            transitions such as second-order filters); ``h0`` and the returned
            state then have shape ``(..., k)``.
        state_shape: two axis names such as ``("K", "V")`` make the state a matrix per head
            (Mamba-2, GLA, RetNet, RWKV-6): ``step(S, *operands)`` returns ``(S_new, readout)``,
            and the result is a :class:`~scanweaver.ops.matrix_state.recurrence.MatrixRecurrence` that runs
            on the fused ``matrix_state`` operation (see the README's matrix-state section).

    Raises:
        NotAffineError: quoting the sub-expression that is not affine in ``h``.

    Example:
        >>> import numpy as np, scanweaver
        >>> @scanweaver.recurrence
        ... def ema(h, alpha, x):
        ...     return alpha * h + (1 - alpha) * x
        >>> ema(np.full(4, 0.5), np.ones(4), backend="numpy").tolist()
        [0.5, 0.75, 0.875, 0.9375]
    """
    if state_shape is not None:
        if step is None:
            return lambda fn: MatrixRecurrence(fn, state_shape, name)
        return MatrixRecurrence(step, state_shape, name)
    if step is None:
        return lambda fn: Recurrence(fn, name=name, broadcast=broadcast, state_size=state_size)
    return Recurrence(step, name=name, broadcast=broadcast, state_size=state_size)




__all__ = ["CallInfo", "MatrixRecurrence", "Recurrence", "SELECTIVE", "SELECTIVE_NO_C", "delta_rule",
           "delta_rule_step", "gated_delta_rule", "gated_delta_rule_step", "kda", "kda_step", "linear_attention",
           "linear_attention_step", "log_scan", "mamba2_scan", "mamba2_state_update", "mamba2_step",
           "mamba_selective_scan", "recurrence", "retention", "rwkv6", "rwkv6_step", "rwkv7", "rwkv7_step",
           "selective_scan", "simple_gla"]
