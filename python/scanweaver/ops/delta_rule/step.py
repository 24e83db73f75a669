"""One-token decode steps of the delta-rule operations: the state update for one step, no scan launched.

:func:`delta_rule_step`, :func:`gated_delta_rule_step`, :func:`kda_step` and
:func:`rwkv7_step` take the state, laid out as flash-linear-attention's
``(N, HV, K, V)``, and one token's inputs, and return ``(o, new_state)`` with
the semantics of the full calls (the full call at ``T = 1`` from this state
gives the same; chained over T tokens, the same as one call over T).  They
are a few array expressions in the caller's array library (NumPy, PyTorch or
JAX, found from the arguments), so they stay on the caller's device and are
differentiable by the framework itself.  Every input is checked first.

Each step reads the state twice (``S^T k`` of the decayed state, then the
update and readout) and writes it once; o comes back in v's dtype, the state
in the state's dtype.
"""

from __future__ import annotations

import importlib

import numpy as np

from ...calls.declare import operation
from ...errors import ScanInputError

_LIBS = {"torch": "torch", "jax": "jax.numpy", "jaxlib": "jax.numpy"}
#: fla's l2norm epsilon.
L2_EPS = 1e-6


def _xp(values):
    """The array namespace of ``values`` (``numpy``, ``torch`` or ``jax.numpy``)."""
    for v in values:
        lib = _LIBS.get(type(v).__module__.split(".")[0]) if v is not None else None
        if lib is not None:
            return importlib.import_module(lib)
    return np


def _shape(api: str, name: str, arr, need: tuple, what: str) -> None:
    """Raises unless ``arr`` has shape ``need`` (``what`` names the layout)."""
    if arr is None:
        raise ScanInputError(f"{api}: {name} is required, shaped {what} = {tuple(need)}")
    shape = tuple(getattr(arr, "shape", np.shape(arr)))
    if shape != tuple(need):
        raise ScanInputError(f"{api}: {name} has shape {shape}; it needs {what} = {tuple(need)}")


def _dims(api: str, state, q, qname: str, state_v_first: bool = False) -> tuple[int, int, int, int, int]:
    """``(N, H, HV, K, V)`` from the state and q, checking that H divides HV."""
    s = tuple(getattr(state, "shape", np.shape(state))) if state is not None else None
    if s is None or len(s) != 4:
        raise ScanInputError(f"{api}: state has shape {s}; it needs (N, HV, {'V, K' if state_v_first else 'K, V'})")
    N, HV = s[:2]
    K, V = (s[3], s[2]) if state_v_first else (s[2], s[3])
    qs = tuple(getattr(q, "shape", np.shape(q))) if q is not None else None
    if qs is None or len(qs) != 3 or qs[0] != N or qs[2] != K:
        raise ScanInputError(f"{api}: {qname} has shape {qs}; it needs (N, H, K) with (N, K) = {(N, K)} from the "
                             "state")
    H = qs[1]
    if H < 1 or HV % H:
        raise ScanInputError(f"{api}: {qname} has {H} heads; they must divide the state's HV = {HV}")
    return N, H, HV, K, V


def _heads(xp, x, HV: int):
    """``(N, H, K)`` repeated to ``HV`` heads (value head i reads head ``i // (HV // H)``)."""
    H = x.shape[1]
    if H == HV:
        return x
    if xp is np or xp.__name__ == "jax.numpy":
        return xp.repeat(x, HV // H, axis=1)
    return x.repeat_interleave(HV // H, dim=1)


def _l2(xp, x):
    return x / xp.sqrt((x * x).sum(-1, keepdims=True) + L2_EPS)


def _cast(x, like):
    """``x`` in ``like``'s dtype (``.to`` for tensors, ``.astype`` otherwise)."""
    return x.to(like.dtype) if hasattr(x, "to") and not hasattr(x, "astype") else x.astype(like.dtype)


def _delta_step(api, state, q, k, v, beta, decay, *, scale, l2norm, state_v_first, key_decay=False):
    """The delta form's step: decay, then ``S += k (beta (v - S^T k))^T``, then ``o = scale S^T q``."""
    N, H, HV, K, V = _dims(api, state, q, "q", state_v_first)
    _shape(api, "k", k, (N, H, K), "(N, H, K)")
    _shape(api, "v", v, (N, HV, V), "(N, HV, V)")
    _shape(api, "beta", beta, (N, HV), "(N, HV)")
    if decay is not None:
        _shape(api, "g", decay, (N, HV, K) if key_decay else (N, HV), "(N, HV, K)" if key_decay else "(N, HV)")
    xp = _xp((state, q, k, v, beta, decay))
    S = xp.swapaxes(state, -1, -2) if state_v_first else state
    if l2norm:
        q, k = _l2(xp, q), _l2(xp, k)
    q, k = _heads(xp, q, HV), _heads(xp, k, HV)
    if decay is not None:
        S = S * (xp.exp(decay)[..., None] if key_decay else xp.exp(decay)[..., None, None])
    u = beta[..., None] * (v - (S * k[..., :, None]).sum(-2))
    S = S + k[..., :, None] * u[..., None, :]
    s = float(K) ** -0.5 if scale is None else float(scale)
    o = (S * q[..., :, None]).sum(-2) * s
    S = _cast(S, state)
    return _cast(o, v), (xp.swapaxes(S, -1, -2) if state_v_first else S)


@operation(arrays=("state", "q", "k", "v", "beta"))
def delta_rule_step(state, q, k, v, beta, *, scale=None, use_qk_l2norm_in_kernel: bool = False):
    """One token of :func:`scanweaver.delta_rule`: ``S = (I - beta k k^T) S + beta k v^T``, ``o = scale S^T q``.

    Args:
        state: ``(N, HV, K, V)``.  q, k: ``(N, H, K)``.  v: ``(N, HV, V)``.  beta: ``(N, HV)``.
        scale: default ``K**-0.5``.
        use_qk_l2norm_in_kernel: normalise q and k first, as the full call does.

    Returns:
        ``(o (N, HV, V), new_state (N, HV, K, V))``.

    Example:
        >>> import numpy as np, scanweaver
        >>> S = np.zeros((1, 2, 4, 3))
        >>> o, S = scanweaver.delta_rule_step(S, np.ones((1, 2, 4)), np.ones((1, 2, 4)) / 2, np.ones((1, 2, 3)),
        ...                                   np.full((1, 2), 0.5))
        >>> float(o[0, 0, 0]), S.shape
        (0.5, (1, 2, 4, 3))
    """
    return _delta_step("delta_rule_step", state, q, k, v, beta, None, scale=scale,
                       l2norm=use_qk_l2norm_in_kernel, state_v_first=False)


@operation(arrays=("state", "q", "k", "v", "g", "beta"))
def gated_delta_rule_step(state, q, k, v, g, beta, *, scale=None, use_qk_l2norm_in_kernel: bool = False,
                          state_v_first: bool = False):
    """One token of :func:`scanweaver.gated_delta_rule`: ``S = exp(g) (I - beta k k^T) S + beta k v^T``.

    Args:
        state: ``(N, HV, K, V)`` (``(N, HV, V, K)`` with ``state_v_first``).  q, k: ``(N, H, K)``.
        v: ``(N, HV, V)``.  g, beta: ``(N, HV)``.
        scale, use_qk_l2norm_in_kernel: as for :func:`delta_rule_step`.

    Returns:
        ``(o (N, HV, V), new_state)``.
    """
    return _delta_step("gated_delta_rule_step", state, q, k, v, beta, g, scale=scale,
                       l2norm=use_qk_l2norm_in_kernel, state_v_first=state_v_first)


@operation(arrays=("state", "q", "k", "v", "g", "beta"))
def kda_step(state, q, k, v, g, beta, *, scale=None, use_qk_l2norm_in_kernel: bool = False,
             state_v_first: bool = False):
    """One token of :func:`scanweaver.kda`: ``S = (I - beta k k^T) Diag(exp(g)) S + beta k v^T``.

    Args:
        state: ``(N, HV, K, V)`` (``(N, HV, V, K)`` with ``state_v_first``).  q, k: ``(N, H, K)``.
        v: ``(N, HV, V)``.  g: ``(N, HV, K)``.  beta: ``(N, HV)``.
        scale, use_qk_l2norm_in_kernel: as for :func:`delta_rule_step`.

    Returns:
        ``(o (N, HV, V), new_state)``.
    """
    return _delta_step("kda_step", state, q, k, v, beta, g, scale=scale, l2norm=use_qk_l2norm_in_kernel,
                       state_v_first=state_v_first, key_decay=True)


@operation(arrays=("state", "r", "w", "k", "v", "a", "b"))
def rwkv7_step(state, r, w, k, v, a, b, *, scale=1.0):
    """One token of :func:`scanweaver.rwkv7`: ``S = Diag(exp(w)) S + b (a^T S) + k v^T``, ``o = scale S^T r``.

    Args:
        state: ``(N, HV, K, V)``.  r, k: ``(N, H, K)``.  w, a, b: ``(N, HV, K)``.  v: ``(N, HV, V)``.
        scale: 1.0 by default (None: ``K**-0.5``).

    Returns:
        ``(o (N, HV, V), new_state (N, HV, K, V))``.
    """
    api = "rwkv7_step"
    N, H, HV, K, V = _dims(api, state, r, "r")
    _shape(api, "k", k, (N, H, K), "(N, H, K)")
    for name, x in (("w", w), ("a", a), ("b", b)):
        _shape(api, name, x, (N, HV, K), "(N, HV, K)")
    _shape(api, "v", v, (N, HV, V), "(N, HV, V)")
    xp = _xp((state, r, w, k, v, a, b))
    r, k = _heads(xp, r, HV), _heads(xp, k, HV)
    p = (state * a[..., :, None]).sum(-2)
    S = xp.exp(w)[..., None] * state + b[..., :, None] * p[..., None, :] + k[..., :, None] * v[..., None, :]
    s = float(K) ** -0.5 if scale is None else float(scale)
    return _cast((S * r[..., :, None]).sum(-2) * s, v), _cast(S, state)
