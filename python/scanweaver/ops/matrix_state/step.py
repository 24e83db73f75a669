"""One-token decode steps of the matrix-state operations: the state update for one step, no scan launched.

:func:`linear_attention_step`, :func:`mamba2_step` and :func:`rwkv6_step` take
the state and one token's inputs and return ``(output, new_state)`` with the
semantics of the scans (the scans at ``T = 1`` from this state give the same).
They are a few array expressions in the caller's array library (NumPy,
PyTorch, JAX or CuPy, found from the arguments), so they cost what those
expressions do, stay on the caller's device and are differentiable by the
framework itself.  Every input is checked first.
"""

from __future__ import annotations

import importlib
import math

import numpy as np

from ...arrays import device_module, dtype_refusal, is_real_operand
from ...calls.declare import operation
from ...checks import scale_of
from ...errors import ScanInputError
from .mamba2 import limit_of

_LIBS = {"torch": "torch", "jax": "jax.numpy", "jaxlib": "jax.numpy"}


def _xp(values):
    """The array namespace of ``values`` (``numpy``, ``torch``, ``jax.numpy``, or a device arrays' module: CuPy)."""
    mods = {type(v).__module__.split(".")[0] for v in values if v is not None}
    for m in mods:
        if m in _LIBS:
            return importlib.import_module(_LIBS[m])
    return device_module(values) or np


def _check(api: str, values: dict[str, tuple], sizes: str) -> None:
    """Raises for any named array whose shape differs from the one it needs (``None`` entries skip); ``sizes``
    says where the needed sizes come from (a wrong state shows as the next operand's mismatch)."""
    for name, (arr, need, what) in values.items():
        if arr is None:
            continue
        shape = tuple(getattr(arr, "shape", np.shape(arr)))
        if shape != tuple(need):
            raise ScanInputError(f"{api}: {name} has shape {shape}; it needs {what} = {tuple(need)} ({sizes})")



def check_dtypes(api: str, values: dict) -> None:
    """Raises for any named array (``None`` entries skip) whose dtype no scan takes: complex, object or text.
    Real floating-point dtypes pass, and integers and booleans, which compute in float64 as in the scans."""
    for name, arr in values.items():
        dtype = getattr(arr, "dtype", None)
        if dtype is None:
            continue
        torch_complex = type(arr).__module__.startswith("torch") and dtype.is_complex
        if torch_complex or not (type(arr).__module__.startswith("torch") or is_real_operand(dtype)):
            raise dtype_refusal(api, name, arr)

def _shape(api: str, name: str, arr, ndim: int, what: str) -> tuple:
    if arr is None:
        raise ScanInputError(f"{api}: {name} is required ({what})")
    shape = tuple(getattr(arr, "shape", np.shape(arr)))
    if len(shape) != ndim:
        raise ScanInputError(f"{api}: {name} has shape {shape}; it needs {what}")
    return shape


def _heads(x, H: int):
    """``(batch, Hq, K)`` repeated to ``H`` heads."""
    Hq = x.shape[1]
    if Hq == H:
        return x
    return x[:, :, None, :].repeat(1, 1, H // Hq, 1).reshape(x.shape[0], H, x.shape[2]) \
        if type(x).__module__.startswith("torch") else _xp([x]).repeat(x, H // Hq, axis=1)


@operation(arrays=("state", "q", "k", "v", "g", "g_head", "decay"))
def linear_attention_step(state, q, k, v, *, g=None, g_head=None, decay=None, scale=None):
    """One step of :func:`scanweaver.linear_attention` (``o_t = scale * S_t^T q_t``).

    Args:
        state: ``(batch, H, K, V)``.  q, k: ``(batch, Hq, K)``.  v: ``(batch, H, V)``.
        g: ``(batch, H, K)``; g_head: ``(batch, H)``; decay: ``(H,)`` (at most one).
        scale: default ``K**-0.5``.

    Returns:
        ``(o (batch, H, V), new_state (batch, H, K, V))``.

    Example:
        >>> import numpy as np, scanweaver
        >>> S = np.zeros((1, 2, 3, 4))
        >>> o, S = scanweaver.linear_attention_step(S, np.ones((1, 2, 3)), np.ones((1, 2, 3)), np.ones((1, 2, 4)))
        >>> float(o[0, 0, 0]), S.shape
        (1.7320508075688772, (1, 2, 3, 4))
    """
    api = "linear_attention_step"
    b, H, K, V = _shape(api, "state", state, 4, "(batch, H, K, V)")
    Hq = _shape(api, "q", q, 3, "(batch, Hq, K)")[1]
    if Hq < 1 or H % Hq:
        raise ScanInputError(f"{api}: q has {Hq} heads; they must divide the state's H = {H}")
    _check(api, {"q": (q, (b, Hq, K), "(batch, Hq, K)"), "k": (k, (b, Hq, K), "(batch, Hq, K)"),
                 "v": (v, (b, H, V), "(batch, H, V)"), "g": (g, (b, H, K), "(batch, H, K)"),
                 "g_head": (g_head, (b, H), "(batch, H)"), "decay": (decay, (H,), "(H,)")},
           "batch, H, K, V from the state, Hq from q")
    if sum(x is not None for x in (g, g_head, decay)) > 1:
        raise ScanInputError(f"{api}: give at most one of g, g_head and decay")
    check_dtypes(api, {"state": state, "q": q, "k": k, "v": v, "g": g, "g_head": g_head, "decay": decay})
    xp = _xp((state, q, k, v, g, g_head, decay))
    S = _decayed(xp, state, g, g_head, decay)
    S = S + _heads(k, H)[..., :, None] * v[..., None, :]
    s = scale_of(api, scale, K)
    return (_heads(q, H)[..., :, None] * S).sum(-2) * s, S


def _decayed(xp, S, g=None, g_head=None, decay=None):
    if g is not None:
        return xp.exp(g)[..., None] * S
    if g_head is not None:
        return xp.exp(g_head)[..., None, None] * S
    if decay is not None:
        return xp.exp(decay)[:, None, None] * S
    return S


@operation(arrays=("state", "r", "k", "v", "w", "u"))
def rwkv6_step(state, r, k, v, w, u, *, scale=None):
    """One step of :func:`scanweaver.rwkv6`: ``o = scale * (S^T r + (r . (u*k)) v)``, then the update.

    Args:
        state: ``(batch, H, K, V)``.  r, k, w: ``(batch, H, K)``.  v: ``(batch, H, V)``.  u: ``(H, K)``.

    Returns:
        ``(o (batch, H, V), new_state)``.
    """
    api = "rwkv6_step"
    b, H, K, V = _shape(api, "state", state, 4, "(batch, H, K, V)")
    for name, x in (("w", w), ("u", u)):
        if x is None:
            raise ScanInputError(f"{api}: {name} is required")
    _check(api, {"r": (r, (b, H, K), "(batch, H, K)"), "k": (k, (b, H, K), "(batch, H, K)"),
                 "v": (v, (b, H, V), "(batch, H, V)"), "w": (w, (b, H, K), "(batch, H, K)"),
                 "u": (u, (H, K), "(H, K)")}, "batch, H, K, V from the state")
    check_dtypes(api, {"state": state, "r": r, "k": k, "v": v, "w": w, "u": u})
    xp = _xp((state, r, k, v, w, u))
    s = scale_of(api, scale, K)
    kv = k[..., :, None] * v[..., None, :]
    o = (r[..., :, None] * (state + u[..., :, None] * kv)).sum(-2) * s
    return o, xp.exp(w)[..., None] * state + kv


@operation(arrays=("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"))
def mamba2_step(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                dt_limit=(0.0, math.inf)):
    """One step of :func:`scanweaver.mamba2_scan` (mamba-ssm's ``selective_state_update``, returning the state).

    Args:
        state: ``(batch, H, P, N)``.  x: ``(batch, H, P)``.  dt: ``(batch, H)``.  A: ``(H,)``.
        B, C: ``(batch, G, N)``.  D: ``(H,)`` or ``(H, P)``.  z: ``(batch, H, P)``.  dt_bias: ``(H,)``.
        dt_softplus, dt_limit: as for :func:`scanweaver.mamba2_scan`.

    Returns:
        ``(y (batch, H, P), new_state (batch, H, P, N))``.
    """
    api = "mamba2_step"
    b, H, P, N = _shape(api, "state", state, 4, "(batch, H, P, N)")
    G = _shape(api, "B", B, 3, "(batch, G, N)")[1]
    if G < 1 or H % G:
        raise ScanInputError(f"{api}: B has {G} groups; they must divide H = {H}")
    dshape = tuple(getattr(D, "shape", ())) if D is not None else None
    if D is not None and dshape not in ((H,), (H, P)):
        raise ScanInputError(f"{api}: D has shape {dshape}; it needs (H,) = ({H},) or (H, P) = {(H, P)}")
    _check(api, {"x": (x, (b, H, P), "(batch, H, P)"), "dt": (dt, (b, H), "(batch, H)"), "A": (A, (H,), "(H,)"),
                 "B": (B, (b, G, N), "(batch, G, N)"), "C": (C, (b, G, N), "(batch, G, N)"),
                 "z": (z, (b, H, P), "(batch, H, P)"), "dt_bias": (dt_bias, (H,), "(H,)")},
           "batch, H, P, N from the state, G from B")
    check_dtypes(api, {"state": state, "x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias})
    xp = _xp((state, x, dt, A, B, C, D, z, dt_bias))
    lo, hi = limit_of(dt_limit, api)
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = xp.where(dt > 20.0, dt, xp.log1p(xp.exp(xp.minimum(dt, 20.0 + 0 * dt))))
    if (lo, hi) != (0.0, math.inf):
        dt = xp.clip(dt, lo, hi)
    Bh, Ch = _heads(B, H), _heads(C, H)
    S = xp.exp(dt * A)[..., None, None] * state + (dt[..., None] * x)[..., :, None] * Bh[..., None, :]
    y = (S * Ch[..., None, :]).sum(-1)
    if D is not None:
        y = y + (D[:, None] if len(dshape) == 1 else D) * x
    if z is not None:
        y = y * z / (1 + xp.exp(-z))
    return y, S
