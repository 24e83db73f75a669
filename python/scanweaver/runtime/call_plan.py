"""What every scan call plan resolves once per call signature: the base of the host and device plans.

:class:`CallPlan` holds what a plan knows of its call (operands, state,
optional arguments, what ran and on which backend) and whether a tuned store
has changed since it was built; :class:`scanweaver.core.fastpath.Plan` (host
arrays) and :class:`scanweaver.runtime.device_plan.DevicePlan` (CUDA device
arrays) add how they run.

Example:
    >>> import numpy as np
    >>> p = CallPlan(("a",), (4, 16), np.dtype(np.float32), (4,), False, False, False, None, None)
    >>> p.lanes, p.L, p.fresh()
    (4, 16, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class CallPlan:
    """A scan call resolved for one signature.

    Attributes:
        names: operand names, in call order.
        shape: the operands' shape ``(..., L)``.
        dtype: the operands' (and ``y``'s) dtype.
        state_shape: the shape of ``h0`` and of the returned state.
        has_h0, has_reset: the call passes ``h0`` / a ``reset`` mask.
        return_state: calls return ``(y, h_last)``.
        info: what the recurrence's ``last`` reports for the call.
        backend: the backend it runs on.
        from_store: the tunables came from the tuned-configuration store.
        store_stamp: the store's stamp then (``None``: there was no store file).
        stamp_of: the store's stamp now (``None``: never stale).
    """

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    state_shape: tuple[int, ...]
    has_h0: bool
    has_reset: bool
    return_state: bool
    info: Any
    backend: Any
    from_store: bool = field(default=False, kw_only=True)
    store_stamp: object = field(default=None, kw_only=True)
    stamp_of: Callable[[], object] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        self.lanes = int(np.prod(self.shape[:-1], dtype=np.int64))  #: independent sequences
        self.L = self.shape[-1]  #: sequence length

    def fresh(self) -> bool:
        """False when the plan came from the tuned store and the store has changed since."""
        return not self.from_store or self.stamp_of is None or self.store_stamp == self.stamp_of()
