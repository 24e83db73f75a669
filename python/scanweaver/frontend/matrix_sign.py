"""Gates of either sign in a matrix-state step: the log magnitude to the kernel, the signs carried on q and k.

The fused ``matrix_state`` operation takes log decays, ``D_t = exp(g_t)``, so a gate ``a`` whose log is not
known (``a*S`` rather than ``np.exp(x)*S``) is lowered as ``g = log|a|`` (:mod:`.matrix_classify`), and its
signs travel beside it.  With ``s_t = -1`` where ``a_t < 0`` (else 1), per key row for a gate over the
contracted axis, and ``sigma_t`` the product of the signs of the sequence's steps so far in scan order::

    S_t = a_t * S_{t-1} + k_t v_t^T   and   S'_t = sigma_t * S_t   give   S'_t = |a_t| * S'_{t-1} + (sigma_t k_t) v_t^T

so the kernel runs on ``g = log|a|``, ``k' = sigma_t k_t`` and ``q' = sigma q_t`` (``sigma_t`` for a readout
of ``S_t``, ``sigma_{t-1}`` for one of ``S_{t-1}``), and the final state is ``sigma_last * S'``.  The signs
are piecewise constant, so gradients flow through ``q``, ``k`` and ``log|a|`` unchanged.  Counts of
negative gates (a cumulative sum, exact) stand for the products; a sequence of ``cu_seqlens`` starts its own
count.  The arithmetic is the caller's framework's (``xp``: NumPy, ``torch`` or ``jax.numpy``).

Example:
    >>> import numpy as np
    >>> from scanweaver.frontend.matrix_sign import carry_signs
    >>> q = k = np.ones((1, 3, 1, 2))
    >>> neg = np.array([True, False, True]).reshape(1, 3, 1)
    >>> qs, ks, flip = carry_signs(np, neg, q, k)
    >>> ks[0, :, 0, 0].tolist(), flip(np.ones((1, 1, 2, 2)))[0, 0, 0, 0]
    ([-1.0, -1.0, 1.0], np.float64(1.0))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def _same(h):
    return h


def _offsets(cu_seqlens, batch: int, T: int) -> np.ndarray | None:
    """``cu_seqlens`` on the host as int64, or None when it is absent or malformed (the kernel call's checker
    then reports it; no signs are needed for a call that will not run)."""
    if cu_seqlens is None:
        return None
    cs = cu_seqlens.detach().cpu().numpy() if hasattr(cu_seqlens, "detach") else np.asarray(cu_seqlens)
    if (batch != 1 or cs.ndim != 1 or cs.size < 2 or cs.dtype.kind not in "iu" or cs[0] != 0 or cs[-1] != T
            or np.any(np.diff(cs) < 0)):
        return None
    return cs.astype(np.int64)


def carry_signs(xp, neg, q, k, *, readout: str = "after", reverse: bool = False,
                cu_seqlens=None) -> tuple[object, object, Callable]:
    """``(q', k', flip)`` for a gate whose negative entries are ``neg`` (see the module docstring).

    Args:
        xp: the array namespace of q and k (``numpy``, ``torch``, ``jax.numpy``).
        neg: where the gate is negative: ``(batch, T, H)`` (a scalar per step) or ``(batch, T, H, K)`` (per key
            row), or None (no signs to carry).
        q, k: ``(batch, T, H, K)``.
        readout: ``after`` (the readout contracts S_t) or ``bonus`` (S_{t-1}).
        reverse: the scan runs each sequence from its end.
        cu_seqlens: offsets of packed sequences (batch 1), or None.

    Returns:
        q and k with the signs applied, and ``flip(h)`` taking the kernel's final states ``(N, H, K, V)`` to the
        recurrence's.  NumPy gates without a negative entry return q, k and the identity unchanged.
    """
    if neg is None or (isinstance(neg, np.ndarray) and not neg.any()):
        return q, k, _same
    n = xp.where(neg, 1, 0)
    if n.ndim == 3:
        n = n[..., None]
    batch, T = n.shape[:2]
    cs = _offsets(cu_seqlens, batch, T)
    if cu_seqlens is not None and cs is None:
        return q, k, _same
    cs = np.array([0, T]) if cs is None else cs
    c = xp.cumsum(n, axis=1)
    C = xp.concatenate([c[:, :1] * 0, c], axis=1)  # C[:, j]: negative gates among steps [0, j)
    seq = np.repeat(np.arange(cs.size - 1), np.diff(cs))
    t, start, stop = np.arange(T), cs[:-1][seq], cs[1:][seq]
    if reverse:  # scan order from the sequence's end: steps [t, stop) (inclusive), (t, stop) (exclusive)
        incl, excl = C[:, stop] - C[:, t], C[:, stop] - C[:, t + 1]
    else:
        incl, excl = C[:, t + 1] - C[:, start], C[:, t] - C[:, start]
    before = excl if readout == "bonus" else incl
    qs, ks = xp.where(before % 2 == 1, -q, q), xp.where(incl % 2 == 1, -k, k)
    total = C[:, -1] - C[:, 0] if cu_seqlens is None else C[0, cs[1:]] - C[0, cs[:-1]]

    def flip(h):
        return xp.where((total % 2 == 1)[..., None], -h, h)

    return qs, ks, flip
