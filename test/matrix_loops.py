"""float64 loops of the matrix-state recurrences, written from their definitions (not from the implementation):
the oracle the matrix-state tests compare every call with."""

from __future__ import annotations

import math

import numpy as np


def _segs(batch, T, cu):
    return [(b, b, 0, T) for b in range(batch)] if cu is None else \
        [(i, 0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def la_loop(q, k, v, gk, scale, h0=None, cu=None, reverse=False, bonus=None):
    """float64 loop: S_t = exp(gk_t)[:, None] S + k v^T; o = scale * S^T q (bonus: RWKV-6's readout)."""
    batch, T, Hq, K = q.shape
    H, V = v.shape[2:]
    grp = H // Hq
    segs = _segs(batch, T, cu)
    o = np.zeros(v.shape)
    hl = np.zeros((len(segs), H, K, V))
    for row, b, s, e in segs:
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else np.array(h0[row, h], float)
            for t in (range(e - 1, s - 1, -1) if reverse else range(s, e)):
                qt, kt, vt = q[b, t, h // grp], k[b, t, h // grp], v[b, t, h]
                kv = np.outer(kt, vt)
                if bonus is None:
                    S = np.exp(gk[b, t, h])[:, None] * S + kv
                    o[b, t, h] = scale * qt @ S
                else:
                    o[b, t, h] = scale * qt @ (S + bonus[h][:, None] * kv)
                    S = np.exp(gk[b, t, h])[:, None] * S + kv
            hl[row, h] = S
    return o, hl


def mamba2_loop(x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False, limit=(0.0, math.inf), h0=None, cu=None,
                seq_idx=None):
    """float64 loop of Mamba-2 in mamba-ssm's layout (state (P, N)); with ``seq_idx`` (batch, L) the state starts
    again from zero wherever the index changes within a sequence."""
    batch, L, H, P = x.shape
    G, N = B.shape[2:]
    dt = dt + (0 if dt_bias is None else dt_bias)
    if softplus:
        dt = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))
    if limit != (0.0, math.inf):
        dt = np.clip(dt, *limit)
    segs = _segs(batch, L, cu)
    y = np.zeros(x.shape)
    hl = np.zeros((len(segs), H, P, N))
    for row, b, s, e in segs:
        for h in range(H):
            S = np.zeros((P, N)) if h0 is None else np.array(h0[row, h], float)
            for t in range(s, e):
                if seq_idx is not None and t > s and seq_idx[b, t] != seq_idx[b, t - 1]:
                    S = np.zeros((P, N))
                S = np.exp(dt[b, t, h] * A[h]) * S + np.outer(dt[b, t, h] * x[b, t, h], B[b, t, h // (H // G)])
                y[b, t, h] = S @ C[b, t, h // (H // G)]
            hl[row, h] = S
    if D is not None:
        y = y + (D[:, None] if D.ndim == 1 else D) * x
    if z is not None:
        y = y * z / (1 + np.exp(-z))
    return y, hl


def state_update_loop(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, softplus=False):
    """float64 loop of one decode step in mamba-ssm's tiled layout: state (batch, H, P, N), x and dt (batch, H, P),
    A (H, P, N), B and C (batch, G, N), D and dt_bias (H, P); returns ``(out, new_state)``."""
    batch, H, P, N = state.shape
    G = B.shape[1]
    new = np.zeros(state.shape)
    out = np.zeros((batch, H, P))
    for b in range(batch):
        for h in range(H):
            for p in range(P):
                d = dt[b, h, p] + (0 if dt_bias is None else dt_bias[h, p])
                if softplus:
                    d = d if d > 20 else math.log1p(math.exp(d))
                g = h // (H // G)
                for n in range(N):
                    new[b, h, p, n] = math.exp(d * A[h, p, n]) * state[b, h, p, n] + d * x[b, h, p] * B[b, g, n]
                out[b, h, p] = new[b, h, p] @ C[b, g] + (0 if D is None else D[h, p] * x[b, h, p])
                if z is not None:
                    out[b, h, p] *= z[b, h, p] / (1 + math.exp(-z[b, h, p]))
    return out, new
