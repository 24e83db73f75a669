"""One-token decode steps of the delta-rule operations: the state update for one step, no scan launched.

:func:`delta_rule_step`, :func:`gated_delta_rule_step`, :func:`kda_step` and
:func:`rwkv7_step` take the state, laid out as flash-linear-attention's
``(N, HV, K, V)``, and one token's inputs, and return ``(o, new_state)`` with
the semantics of the full calls (the full call at ``T = 1`` from this state
gives the same; chained over T tokens, the same as one call over T).  Every
input is checked first.

On NumPy arrays a step runs the full call's fused kernel at ``T = 1`` from
the state (one read of it and one write of the new one); so do CPU tensors
that need no gradient, which :mod:`scanweaver.torch` hands it as NumPy views
(no copies).  Otherwise (JAX arrays, GPU tensors, tensors that need
gradients, traced or transformed calls) it is a few array
expressions of the caller's library, so it stays on the caller's device and
is differentiable by the framework itself (device arrays of a module, CuPy's, likewise
compute with that module, on the device): it reads the state once for its two
dots (one batched matrix product of the state with the stacked key and query
vectors; the readout is taken from the old state, ``q^T S' = (D q)^T S +
(q . k) u``) and again to write the new one, in the common dtype of its
arguments.  o comes back in v's dtype, the state in the state's dtype.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np

from ...arrays import device_module, dtype_refusal, is_real
from ...calls.declare import operation
from ...checks import scale_of
from ...errors import ScanInputError

_LIBS = {"torch": "torch", "jax": "jax.numpy", "jaxlib": "jax.numpy"}
#: fla's l2norm epsilon.
L2_EPS = 1e-6


def _xp(values):
    """The array namespace of ``values`` (``numpy``, ``torch``, ``jax.numpy``, or a device arrays' module: CuPy)."""
    for v in values:
        lib = _LIBS.get(type(v).__module__.split(".")[0]) if v is not None else None
        if lib is not None:
            return importlib.import_module(lib)
    return device_module(values) or np


def _shape(api: str, name: str, arr, need: tuple, what: str) -> None:
    """Raises unless ``arr`` has shape ``need`` (``what`` names the layout; its sizes come from the state and q,
    which the message says, since a wrong state shows as the next operand's mismatch)."""
    if arr is None:
        raise ScanInputError(f"{api}: {name} is required, shaped {what} = {tuple(need)}")
    shape = tuple(getattr(arr, "shape", np.shape(arr)))
    if shape != tuple(need):
        raise ScanInputError(f"{api}: {name} has shape {shape}; it needs {what} = {tuple(need)} (N, HV, K, V from "
                             "the state, H from q/r)")


def _dims(api: str, state, q, qname: str, state_v_first: bool = False,
          v_first_offered: bool = False) -> tuple[int, int, int, int, int]:
    """``(N, H, HV, K, V)`` from the state and q, checking that H divides HV (``v_first_offered``: the step takes
    ``state_v_first``, which a mismatch that a state of the other layout explains names)."""
    s = tuple(getattr(state, "shape", np.shape(state))) if state is not None else None
    if s is None or len(s) != 4:
        raise ScanInputError(f"{api}: state has shape {s}; it needs (N, HV, {'V, K' if state_v_first else 'K, V'})")
    N, HV = s[:2]
    K, V = (s[3], s[2]) if state_v_first else (s[2], s[3])
    qs = tuple(getattr(q, "shape", np.shape(q))) if q is not None else None
    if qs is None or len(qs) != 3 or qs[0] != N or qs[2] != K:
        other = "(N, HV, K, V) needs state_v_first=False" if state_v_first else \
            "(N, HV, V, K) needs state_v_first=True"
        hint = f"; a state laid out {other}" if qs is not None and len(qs) == 3 and qs[0] == N and qs[2] == V and \
            v_first_offered else ""
        raise ScanInputError(f"{api}: {qname} has shape {qs}; it needs (N, H, K) with (N, K) = {(N, K)} from the "
                             f"state {tuple(s)} ({'V-first: (N, HV, V, K)' if state_v_first else '(N, HV, K, V)'})"
                             f"{hint}")
    H = qs[1]
    if H < 1 or HV % H:
        raise ScanInputError(f"{api}: {qname} has {H} heads; they must divide the state's HV = {HV}")
    return N, H, HV, K, V


def _heads(xp, x, HV: int):
    """``(N, H, K)`` repeated to ``HV`` heads (value head i reads head ``i // (HV // H)``)."""
    H = x.shape[1]
    if H == HV:
        return x
    if xp.__name__ == "torch":
        return x.repeat_interleave(HV // H, dim=1)
    return xp.repeat(x, HV // H, axis=1)


def _l2(xp, x):
    return x / xp.sqrt((x * x).sum(-1, keepdims=True) + L2_EPS)


def _cast(x, dtype):
    """``x`` in ``dtype`` (``.to`` for tensors, ``.astype`` otherwise), not copied when it is in ``dtype``."""
    if hasattr(x, "to") and not hasattr(x, "astype"):
        return x.to(dtype)
    return x if x.dtype == dtype else x.astype(dtype)


def _fused(api: str, state, xs: list, options: dict):
    """The full call's kernel at T = 1 from ``state`` on NumPy arrays (CPU tensors arrive as views): it reads the
    state once and writes the new one once, where the expressions take several passes: ``(o, new state)``."""
    from .plans import forward

    o, h = forward(api.removesuffix("_step"), [np.asarray(x)[:, None] for x in xs] + [np.asarray(state)],
                   {**options, "api": api})
    return o[:, 0], _cast(h, np.asarray(state).dtype)


def _floating(api: str, named: dict) -> None:
    """Raises for an operand (``None`` skips) not of a real floating-point dtype, as the fused kernel's operands
    do: the expressions would otherwise take integers, or drop a complex operand's imaginary part."""
    for name, x in named.items():
        if x is None:
            continue
        d = x.dtype
        if not (d.is_floating_point if hasattr(d, "is_floating_point") else is_real(d)):
            raise dtype_refusal(api, name, x)


def _promoted(xp, arrays):
    """``arrays`` (``None`` kept) in their common dtype (PyTorch's matmul takes no mixed dtypes)."""
    given = [a for a in arrays if a is not None]
    if xp.__name__ == "torch":
        dtype = functools.reduce(xp.promote_types, [a.dtype for a in given])
    else:
        dtype = xp.result_type(*given)
    return [None if a is None else _cast(a, dtype) for a in arrays]


def _dots(xp, rows, S):
    """``[x^T S for x in rows]``, each ``(N, HV, V)``, from one pass over S (a batched matrix product)."""
    P = xp.stack(rows, -2) @ S
    return [P[..., i, :] for i in range(len(rows))]


def _delta_step(api, state, q, k, v, beta, decay, *, scale, l2norm, state_v_first, key_decay=False):
    """The delta form's step, reading the state once for both dots: with ``D`` the decay,
    ``u = beta (v - (D k)^T S)``, ``o = scale ((D q)^T S + (q . k) u)``, ``S' = D S + k u^T``."""
    N, H, HV, K, V = _dims(api, state, q, "q", state_v_first, v_first_offered=api != "delta_rule_step")
    scale = scale_of(api, scale, K)  # checked first, named by the step
    _shape(api, "k", k, (N, H, K), "(N, H, K)")
    _shape(api, "v", v, (N, HV, V), "(N, HV, V)")
    _shape(api, "beta", beta, (N, HV), "(N, HV)")
    if decay is not None:
        _shape(api, "g", decay, (N, HV, K) if key_decay else (N, HV), "(N, HV, K)" if key_decay else "(N, HV)")
    xp = _xp((state, q, k, v, beta, decay))
    if xp is np:
        return _fused(api, state, [q, k, v] + ([] if decay is None else [decay]) + [beta],
                      {"scale": scale, "l2norm": l2norm, "state_v_first": state_v_first})
    _floating(api, {"state": state, "q": q, "k": k, "v": v, "g": decay, "beta": beta})
    out_dtype = v.dtype
    S, q, k, v, beta, decay = _promoted(xp, [state, q, k, v, beta, decay])
    if state_v_first:
        S = xp.swapaxes(S, -1, -2)
    if l2norm:
        q, k = _l2(xp, q), _l2(xp, k)
    q, k = _heads(xp, q, HV), _heads(xp, k, HV)
    d = None if decay is None else xp.exp(decay) if key_decay else xp.exp(decay)[..., None]
    Sk, Sq = _dots(xp, [k, q] if d is None else [d * k, d * q], S)
    u = beta[..., None] * (v - Sk)
    o = (Sq + (q * k).sum(-1, keepdims=True) * u) * scale
    S = (S if d is None else d[..., None] * S) + k[..., :, None] * u[..., None, :]
    S = _cast(S, state.dtype)
    return _cast(o, out_dtype), (xp.swapaxes(S, -1, -2) if state_v_first else S)


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
    scale = scale_of(api, scale, K)  # checked first, named by the step
    _shape(api, "k", k, (N, H, K), "(N, H, K)")
    for name, x in (("w", w), ("a", a), ("b", b)):
        _shape(api, name, x, (N, HV, K), "(N, HV, K)")
    _shape(api, "v", v, (N, HV, V), "(N, HV, V)")
    xp = _xp((state, r, w, k, v, a, b))
    if xp is np:
        return _fused(api, state, [r, w, k, v, a, b], {"scale": scale})
    _floating(api, {"state": state, "r": r, "w": w, "k": k, "v": v, "a": a, "b": b})
    S, r, w, k, vv, a, b = _promoted(xp, [state, r, w, k, v, a, b])
    r, k = _heads(xp, r, HV), _heads(xp, k, HV)
    d = xp.exp(w)
    p, Sr = _dots(xp, [a, d * r], S)  # a^T S and (D r)^T S: o = r^T S' = (D r)^T S + (r . b) p + (r . k) v
    o = (Sr + (r * b).sum(-1, keepdims=True) * p + (r * k).sum(-1, keepdims=True) * vv) * scale
    S = d[..., None] * S + b[..., :, None] * p[..., None, :] + k[..., :, None] * vv[..., None, :]
    return _cast(o, v.dtype), _cast(S, state.dtype)
