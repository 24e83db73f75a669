"""The scan path of Mamba-1: the step traced as one ScanWeaver recurrence over ``batch*D*N`` lanes.

The readable definition (it materialises the broadcast operands and the
states, about ``5 * batch*D*N*L`` elements), and the path for complex A/B/C
and ``log_space``.
"""

from __future__ import annotations

import numpy as np

from ...core.recurrence import Recurrence
from ...arrays import seqlens_reset
from ...errors import ScanInputError
from ...ir.functions import NUMPY
from .operands import API, MambaOperands


def _s6(h, delta, A, B, u):
    return np.exp(delta * A) * h + delta * B * u


_s6_step = Recurrence(_s6, name="mamba_selective_scan")


def scan_path(ops: MambaOperands, cu_seqlens, log_space: bool, backend: str, schedule: str, tunables: dict):
    """The materialising lowering: one diagonal scan over ``batch*D*N`` lanes, then the contraction."""
    batch, Dm, L = ops.u.shape
    N = ops.A.shape[1]
    delta = ops.delta if ops.delta_bias is None else ops.delta + ops.delta_bias[:, None]
    if ops.softplus:
        delta = NUMPY["softplus"](delta)
    G = max(ops.groups_b, 1)
    H = Dm // G
    state0 = ops.h0.reshape(batch, G, H, N) if ops.h0 is not None else None
    if log_space:
        h, h_last = _log_space_states(ops, delta, state0, cu_seqlens, backend, tunables)
    else:
        h, h_last = _s6_step(delta.reshape(batch, G, H, 1, L), ops.A.reshape(1, G, H, N, 1),
                             _as_groups(ops.B, ops.groups_b, batch, Dm, N, L), ops.u.reshape(batch, G, H, 1, L),
                             h0=state0, return_state=True, cu_seqlens=cu_seqlens, backend=backend,
                             schedule=schedule, **tunables)
    y = _contract(h.reshape(batch, Dm, N, L), ops.C, ops.groups_c)
    if ops.D is not None:
        y = y + ops.D[:, None] * ops.u
    if ops.z is not None:
        y = y * NUMPY["silu"](ops.z)
    return y, h_last.reshape(batch, Dm, N)


def _as_groups(M: np.ndarray, groups: int, batch: int, Dm: int, N: int, L: int) -> np.ndarray:
    """B or C as a view of shape ``(batch|1, G, D/G, N, L|1)``."""
    if groups == 0:
        return M.reshape(1, 1, Dm, N, 1)
    return M.reshape(batch, groups, 1, N, L)


def _contract(h: np.ndarray, C: np.ndarray, groups: int) -> np.ndarray:
    """y[b, d, t] = sum_n C[..n..] * h[b, d, n, t] for fixed, per-step or grouped C."""
    if groups == 0:
        return np.einsum("bdnl,dn->bdl", h, C)
    batch, Dm, N, L = h.shape
    y = np.einsum("bghnl,bgnl->bghl", h.reshape(batch, groups, Dm // groups, N, L),
                  C.reshape(batch, groups, N, L))
    return y.reshape(batch, Dm, L)


def _log_space_states(ops: MambaOperands, delta, state0, cu_seqlens, backend, tunables):
    """The states through :func:`scanweaver.log_scan` with the exact log gate delta*A."""
    from ..log_scan import log_scan

    if backend not in ("auto", "numpy"):
        raise ScanInputError(f"{API}: log_space=True runs as a NumPy front end; got backend={backend!r}, "
                             "use backend='auto' or 'numpy'")
    if np.iscomplexobj(ops.A):
        raise ScanInputError(f"{API}: log_space=True needs a real A (positive gates exp(delta*A)); "
                             f"got A of dtype {ops.A.dtype}")
    batch, Dm, L = ops.u.shape
    N = ops.A.shape[1]
    G = max(ops.groups_b, 1)
    H = Dm // G
    log_a = delta.reshape(batch, G, H, 1, L) * ops.A.reshape(1, G, H, N, 1)
    x = delta.reshape(batch, G, H, 1, L) * _as_groups(ops.B, ops.groups_b, batch, Dm, N, L) * \
        ops.u.reshape(batch, G, H, 1, L)
    reset = None if cu_seqlens is None else seqlens_reset(API, cu_seqlens, L)
    return log_scan(log_a, x, h0=state0, reset=reset, return_state=True, **tunables)
