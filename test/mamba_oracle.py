"""The float64 oracle of Mamba-1 (a plain loop over t) and random operands, shared by the Mamba tests.

``s6_reference`` is written independently of ScanWeaver from the equations of
``mamba_ssm``'s ``selective_scan_ref``; every path and backend is checked against it.
"""

from __future__ import annotations

import numpy as np


def s6_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, h0=None):
    """Mamba-1 written out per time step in float64 (complex128 for complex operands)."""
    cplx = any(np.iscomplexobj(v) for v in (A, B, C))
    wide = np.complex128 if cplx else np.float64
    u, delta = np.asarray(u, np.float64), np.asarray(delta, np.float64)
    A, B, C = (np.asarray(v).astype(wide) for v in (A, B, C))
    batch, Dm, L = u.shape
    N = A.shape[1]
    if delta_bias is not None:
        delta = delta + np.asarray(delta_bias, np.float64)[:, None]
    if delta_softplus:
        delta = np.log1p(np.exp(delta))

    def at(M, t):
        if M.ndim == 2:
            return M[None, :, :]
        if M.ndim == 3:
            return M[:, None, :, t]
        return np.repeat(M[:, :, :, t], Dm // M.shape[1], axis=1)

    h = np.zeros((batch, Dm, N), wide) if h0 is None else np.asarray(h0).astype(wide)
    y = np.zeros((batch, Dm, L), wide)
    for t in range(L):
        h = np.exp(delta[:, :, t, None] * A[None]) * h + delta[:, :, t, None] * at(B, t) * u[:, :, t, None]
        y[:, :, t] = (at(C, t) * h).sum(-1)
    if D is not None:
        y = y + np.asarray(D, np.float64)[:, None] * u
    if z is not None:
        z = np.asarray(z, np.float64)
        y = y * z / (1 + np.exp(-z))
    return y, h


def operands(rng, batch=2, Dm=4, N=3, L=9, bshape="step", cshape="step", groups=2, dtype=np.float64):
    shapes = {"step": (batch, N, L), "group": (batch, groups, N, L), "fixed": (Dm, N)}
    return dict(
        u=rng.standard_normal((batch, Dm, L)).astype(dtype),
        delta=rng.uniform(0.02, 1.0, (batch, Dm, L)).astype(dtype),
        A=-rng.uniform(0.2, 3.0, (Dm, N)).astype(dtype),
        B=rng.standard_normal(shapes[bshape]).astype(dtype),
        C=rng.standard_normal(shapes[cshape]).astype(dtype),
    )


def extras(rng, batch, Dm, N, L, dtype=np.float64):
    return dict(D=rng.standard_normal(Dm).astype(dtype), z=rng.standard_normal((batch, Dm, L)).astype(dtype),
                delta_bias=rng.uniform(-1, 1, Dm).astype(dtype), delta_softplus=True,
                h0=rng.standard_normal((batch, Dm, N)).astype(dtype))
