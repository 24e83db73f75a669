"""``delta_rule``: DeltaNet's scan, a K x V matrix state with a dense rank-one transition, fused.

Schlag et al. (2021), "Linear Transformers Are Secretly Fast Weight
Programmers", and Yang et al. (2024), "Parallelizing Linear Transformers with
the Delta Rule over Sequence Length", with the semantics of
flash-linear-attention's ``delta_rule_recurrence`` / ``chunk_delta_rule``:
per batch element b (or packed sequence) and head h, with the state ``S`` of
shape ``(K, V)``::

    u_t = beta_t * (v_t - S_{t-1}^T k_t)          (the delta: what k_t should read, minus what it reads)
    S_t = S_{t-1} + k_t u_t^T  =  (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      (S_{-1} = h0, or 0)
    o_t = S_t^T q_t

The transition multiplies the state from the left (the key side), as fla's
does; k is used as given (fla's callers L2-normalise it, its
``use_qk_l2norm_in_kernel`` is not part of this operation) and the output
scale (``K**-0.5``) is applied by the named operation (o is linear in q).
Layouts are fla's: q, k ``(batch, T, H, K)``, v, o ``(batch, T, H, V)``,
beta ``(batch, T, H)``, states ``(nseq, H, K, V)``; ``cu_seqlens`` (int64,
``nseq + 1`` offsets, batch 1) packs sequences, each from its own row of h0.

Backward (G_t = dL/dS_t; the transposed transition in reverse)::

    G_t  = q_t do_t^T + (I - beta_{t+1} k_{t+1} k_{t+1}^T) G_{t+1}    (G_{T-1} also gets dhlast)
    du_t = G_t^T k_t;  r_t = v_t - S_{t-1}^T k_t
    dq_t = S_t do_t;  dv_t = beta_t du_t;  dbeta_t = du_t . r_t
    dk_t = G_t u_t - beta_t S_{t-1} du_t;  dh0 = (I - beta_0 k_0 k_0^T) G_0

:func:`forward_reference` and :func:`backward_reference` are the definition
kernels are checked against (the backward against finite differences in the
tests).

Example:
    >>> import numpy as np
    >>> from scanweaver.fused.delta_rule import forward_reference
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 5, 2, 4))
    >>> o, h = forward_reference(q, k, v, rng.uniform(0, 1, (1, 5, 2)))
    >>> o.shape, h.shape
    ((1, 5, 2, 4), (1, 2, 4, 4))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .base import PARTS, FusedOp, Param, register
from .matrix_state import GPU_TUNABLES, _segments, check_offsets


@dataclass(frozen=True)
class DeltaRuleFeatures:
    """Compile-time features of one delta-rule kernel (a key of the kernel caches).

    Attributes:
        dtype: ``float32`` or ``float64`` (storage and accumulation).
        K, V: the state's rows (key dim) and columns (value dim).
        has_h0: an initial state is given.
        has_seqlens: packed sequences (``cu_seqlens``; batch is 1).
        has_dhlast: (backward) a gradient of the final state is given.
    """

    dtype: str
    K: int
    V: int
    has_h0: bool = False
    has_seqlens: bool = False
    has_dhlast: bool = False


_IN = ("q", "k", "v", "beta")
_SIZES = ("batch", "T", "H", "nseq")
_SWITCH = {"h0": "has_h0", "dh0": "has_h0", "cu_seqlens": "has_seqlens", "dhlast": "has_dhlast"}


@register
class DeltaRule(FusedOp):
    """DeltaNet's delta rule: the rank-one state update and the readout in one kernel."""

    name = "delta_rule"
    description = "delta rule S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T read by q_t (DeltaNet)"
    parts = PARTS
    tunables = {"gpu": GPU_TUNABLES}
    implementations = {"numpy": PARTS, "opencl": PARTS, "cuda": PARTS}

    def params(self, part: str) -> tuple[Param, ...]:
        return _params(part)

    def shapes(self, part, features: DeltaRuleFeatures, sizes):
        b, T, H, nseq = (sizes[n] for n in _SIZES)
        qk, vo, state = (b, T, H, features.K), (b, T, H, features.V), (nseq, H, features.K, features.V)
        out = {"q": qk, "k": qk, "v": vo, "beta": (b, T, H), "h0": state, "cu_seqlens": (nseq + 1,), "o": vo,
               "hlast": state, "do": vo, "dhlast": state, "dq": qk, "dk": qk, "dv": vo, "dbeta": (b, T, H),
               "dh0": state}
        return {p.name: out[p.name] for p in self.params(part) if p.kind != "int"}

    def enabled(self, name: str, features: DeltaRuleFeatures) -> bool:
        flag = _SWITCH.get(name)
        return flag is None or bool(getattr(features, flag))

    def arguments(self, part, features, arrays, sizes, api):
        out = super().arguments(part, features, arrays, sizes, api)
        if features.has_seqlens:
            check_offsets(api, arrays["cu_seqlens"], sizes["T"])
        return out

    def reference(self, part, features: DeltaRuleFeatures, arrays, sizes) -> None:
        cu = arrays.get("cu_seqlens") if features.has_seqlens else None
        args = [arrays[n] for n in _IN]
        if part == "forward":
            o, h = forward_reference(*args, h0=arrays.get("h0"), cu_seqlens=cu)
            arrays["o"][...] = o
            if arrays.get("hlast") is not None:
                arrays["hlast"][...] = h
            return
        grads = backward_reference(*args, h0=arrays.get("h0"), cu_seqlens=cu, do=arrays["do"],
                                   dhlast=arrays.get("dhlast"))
        for name, value in grads.items():
            if arrays.get(name) is not None:
                arrays[name][...] = value


@functools.cache
def _params(part: str) -> tuple[Param, ...]:
    """:meth:`DeltaRule.params` (the same tuple every time)."""
    ins = [Param(n, "in") for n in _IN] + [Param("h0", "in", True), Param("cu_seqlens", "in", True, "int64")]
    sizes = [Param(n, "int") for n in _SIZES]
    if part == "forward":
        return (*ins, Param("o", "out"), Param("hlast", "out", True), *sizes)
    outs = [Param(n, "out") for n in ("dq", "dk", "dv", "dbeta")] + [Param("dh0", "out", True)]
    return (*ins, Param("do", "in"), Param("dhlast", "in", True), *outs, *sizes)


def _states(k, v, beta, S, b, steps):
    """The states before each step and after the last, and the deltas ``u_t`` (one per step)."""
    states, us = [S], []
    for t in steps:
        u = beta[b, t][:, None] * (v[b, t] - np.einsum("hkv,hk->hv", S, k[b, t]))
        S = S + k[b, t][:, :, None] * u[:, None, :]
        states.append(S)
        us.append(u)
    return states, us


def forward_reference(q, k, v, beta, *, h0=None, cu_seqlens=None):
    """``(o, hlast)`` of the delta rule in NumPy, in the dtype of ``v``.

    Args:
        q, k: ``(batch, T, H, K)``.  v: ``(batch, T, H, V)``.  beta: ``(batch, T, H)``.
        h0: ``(nseq, H, K, V)`` or None.  cu_seqlens: ``nseq + 1`` offsets into T (batch 1), or None.
    """
    batch, T, H, V = v.shape
    K = q.shape[-1]
    segs = _segments(T, batch, cu_seqlens)
    o = np.zeros_like(v)
    hlast = np.zeros((len(segs), H, K, V), v.dtype)
    for row, b, start, stop in segs:
        S = np.zeros((H, K, V), v.dtype) if h0 is None else np.array(h0[row], v.dtype)
        states, _ = _states(k, v, beta, S, b, range(start, stop))
        for i, t in enumerate(range(start, stop)):
            o[b, t] = np.einsum("hk,hkv->hv", q[b, t], states[i + 1])
        hlast[row] = states[-1]
    return o, hlast


def backward_reference(q, k, v, beta, *, h0=None, cu_seqlens=None, do, dhlast=None) -> dict[str, np.ndarray]:
    """Every gradient of :func:`forward_reference`'s ``o`` (and ``hlast``) given ``do`` (and ``dhlast``).

    Returns ``dq, dk, dv, dbeta`` in their inputs' layouts and ``dh0`` ``(nseq, H, K, V)``.
    """
    batch, T, H, V = v.shape
    K = q.shape[-1]
    segs = _segments(T, batch, cu_seqlens)
    dq, dk, dv, dbeta = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v), np.zeros_like(beta)
    dh0 = np.zeros((len(segs), H, K, V), v.dtype)
    for row, b, start, stop in segs:
        S = np.zeros((H, K, V), v.dtype) if h0 is None else np.array(h0[row], v.dtype)
        steps = list(range(start, stop))
        states, us = _states(k, v, beta, S, b, steps)
        G = np.zeros((H, K, V), v.dtype) if dhlast is None else np.array(dhlast[row], v.dtype)
        for i in reversed(range(len(steps))):
            t, prev, cur, u = steps[i], states[i], states[i + 1], us[i]
            kt, bt = k[b, t], beta[b, t][:, None]
            G = G + q[b, t][:, :, None] * do[b, t][:, None, :]
            dq[b, t] = np.einsum("hkv,hv->hk", cur, do[b, t])
            du = np.einsum("hkv,hk->hv", G, kt)
            dv[b, t] = bt * du
            dbeta[b, t] = (du * (v[b, t] - np.einsum("hkv,hk->hv", prev, kt))).sum(-1)
            dk[b, t] = np.einsum("hkv,hv->hk", G, u) - bt * np.einsum("hkv,hv->hk", prev, du)
            G = G - bt[:, :, None] * kt[:, :, None] * du[:, None, :]
        dh0[row] = G
    return {"dq": dq, "dk": dk, "dv": dv, "dbeta": dbeta, "dh0": dh0}
