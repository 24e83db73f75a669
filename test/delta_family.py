"""The delta-rule family's defining recurrences as float64 loops, and random problems for the fused operation.

The loops are written from the models' formulas (one matrix product per step, per sequence and value head),
not from the operation's code:

* DeltaNet:      S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
* Gated DeltaNet: S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
* KDA:           S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T
* RWKV-7:        S_t = (Diag(exp(w_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T

with o_t = scale S_t^T q_t (r_t for RWKV-7), q and k L2-normalised first when asked (x / sqrt(|x|^2 + 1e-6)),
and value head h reading q/k head h // (H // Hq).
"""

from __future__ import annotations

import numpy as np

from scanweaver.fused.delta_rule import DeltaRuleFeatures, storage

#: family -> (gate, form) of the fused operation.
FAMILIES = {"deltanet": ("none", "delta"), "gated": ("scalar", "delta"), "kda": ("key", "delta"),
            "rwkv7": ("key", "dplr")}


def l2(x):
    return x / np.sqrt((x * x).sum() + 1e-6)


def loop(family, arrays, scale=1.0, l2norm=False):
    """``(o, final states)`` of ``family`` on ``arrays`` (the fused operation's names), in float64."""
    f = {n: (None if x is None else np.asarray(x, np.float64)) for n, x in arrays.items() if n != "cu_seqlens"}
    q, k, v = f["q"], f["k"], f["v"]
    batch, T, Hq, K = q.shape
    H, V = v.shape[2:]
    cu = arrays.get("cu_seqlens")
    segs = [(b, b, 0, T) for b in range(batch)] if cu is None else \
        [(i, 0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    o = np.zeros((batch, T, H, V))
    hs = np.zeros((len(segs), H, K, V))
    for row, b, start, stop in segs:
        for h in range(H):
            hq = h // (H // Hq)
            S = np.zeros((K, V)) if f.get("h0") is None else f["h0"][row, h].copy()
            for t in range(start, stop):
                qt, kt, vt = q[b, t, hq], k[b, t, hq], v[b, t, h]
                if l2norm:
                    qt, kt = l2(qt), l2(kt)
                if family == "rwkv7":
                    A = np.diag(np.exp(f["g"][b, t, h])) + np.outer(f["b"][b, t, h], f["a"][b, t, h])
                    S = A @ S + np.outer(kt, vt)
                else:
                    bt = f["beta"][b, t, h]
                    P = np.eye(K) - bt * np.outer(kt, kt)
                    if family == "deltanet":
                        S = P @ S
                    elif family == "gated":
                        S = np.exp(f["g"][b, t, h]) * P @ S
                    else:
                        S = P @ np.diag(np.exp(f["g"][b, t, h])) @ S
                    S = S + bt * np.outer(kt, vt)
                o[b, t, h] = scale * S.T @ qt
            hs[row, h] = S
    return o, hs


def dplr_gated(rng, gate):
    """RWKV-7's ``dplr`` form with one log decay per head (``scalar``: an exact reset and an underflowing decay among
    them) or none: ``(features, arrays, sizes)`` of 2 x 37 steps, K = 8, V = 6, with dhlast."""
    import dataclasses

    f, a, sizes = problem(rng, "rwkv7", batch=2, T=2 * 16 + 5, H=2, Hq=2, K=8, V=6, dhlast=True)
    f = dataclasses.replace(f, gate=gate)
    if gate == "none":
        del a["g"]
    else:
        a["g"] = np.ascontiguousarray(a["g"][..., 0])
        a["g"][0, 20, 1] = -np.inf
        a["g"][1, 3, 0] = -1e4
    return f, a, sizes


def problem(rng, family, *, batch=2, T=9, H=2, Hq=2, K=4, V=5, seqlens=None, h0=True, l2norm=False,
            lo=-2.0, hi=-0.01, dtype="float64", dhlast=False):
    """``(features, arrays, sizes)`` of one call: non-uniform data, log decays spread from ``lo`` to ``hi``
    (log-uniformly in magnitude), packed sequences when ``seqlens`` is given (batch 1)."""
    gate, form = FAMILIES[family]
    if seqlens is not None:
        batch, T = 1, int(sum(seqlens))
    nseq = batch if seqlens is None else len(seqlens)
    a = {"q": rng.normal(size=(batch, T, Hq, K)), "k": rng.normal(size=(batch, T, Hq, K)),
         "v": rng.normal(size=(batch, T, H, V))}
    if not l2norm:
        a["k"] /= np.linalg.norm(a["k"], axis=-1, keepdims=True)  # the delta rule diverges on long raw keys
    if gate != "none":
        shape = (batch, T, H, K) if gate == "key" else (batch, T, H)
        a["g"] = -np.exp(rng.uniform(np.log(-hi), np.log(-lo), shape))
    if form == "delta":
        a["beta"] = rng.uniform(0.05, 0.95, (batch, T, H))
    else:  # RWKV-7: a = -kappa, b = kappa * iclr with kappa a unit vector (bounded transitions)
        kappa = rng.normal(size=(batch, T, H, K))
        kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
        a["a"], a["b"] = -kappa, kappa * rng.uniform(0.1, 0.9, (batch, T, H, K))
    if h0:
        a["h0"] = rng.normal(size=(nseq, H, K, V))
    if dhlast:
        a["dhlast"] = rng.normal(size=(nseq, H, K, V))
    state = "float32" if dtype in ("float16", "bfloat16") else dtype
    out = {}
    for n, x in a.items():
        out[n] = np.ascontiguousarray(x, state if n in ("h0", "dhlast") else storage(dtype))
    if seqlens is not None:
        out["cu_seqlens"] = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int64)
    features = DeltaRuleFeatures(dtype, K, V, h0, seqlens is not None, dhlast, gate, form, l2norm)
    return features, out, {"batch": batch, "T": T, "H": H, "Hq": Hq, "nseq": nseq}


def inputs_of(arrays):
    """The reference functions' keyword arguments from a problem's arrays."""
    keys = ("g", "beta", "a", "b", "h0", "cu_seqlens")
    return {n: arrays[n] for n in keys if n in arrays}


#: Public operation -> the family of its recurrence.
PUBLIC = {"delta_rule": "deltanet", "gated_delta_rule": "gated", "kda": "kda", "rwkv7": "rwkv7"}


def call_public(fn, op, a, scale=None, l2norm=False, final=True, **kw):
    """``fn`` (an entry point of public operation ``op``) on a problem's arrays, with fla's positional arguments."""
    h0, cu = a.get("h0"), a.get("cu_seqlens")
    if op == "delta_rule":
        return fn(a["q"], a["k"], a["v"], a["beta"], scale, h0, final, l2norm, cu, **kw)
    if op == "gated_delta_rule":
        return fn(a["q"], a["k"], a["v"], a["g"], a["beta"], scale, h0, final, l2norm, False, False, False, cu, **kw)
    if op == "kda":
        return fn(a["q"], a["k"], a["v"], a["g"], a["beta"], scale, h0, final, l2norm, cu_seqlens=cu, **kw)
    assert not l2norm
    return fn(a["q"], a["g"], a["k"], a["v"], a["a"], a["b"], scale, h0, final, cu, **kw)


def torch_loop(family, t, scale=1.0, l2norm=False, cu=None):
    """:func:`loop` in PyTorch (the same formulas, one step at a time), differentiable by autograd:
    ``(o, final states)`` from tensors ``t`` (the fused operation's names)."""
    import torch

    q, k, v = t["q"], t["k"], t["v"]
    batch, T, Hq, K = q.shape
    H, V = v.shape[2:]
    segs = [(b, b, 0, T) for b in range(batch)] if cu is None else \
        [(i, 0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    eye = torch.eye(K, dtype=v.dtype)
    o = [[[None] * H for _ in range(T)] for _ in range(batch)]
    finals = []
    for row, b, start, stop in segs:
        heads = []
        for h in range(H):
            hq = h // (H // Hq)
            S = torch.zeros(K, V, dtype=v.dtype) if t.get("h0") is None else t["h0"][row, h]
            for i in range(start, stop):
                qt, kt, vt = q[b, i, hq], k[b, i, hq], v[b, i, h]
                if l2norm:
                    qt, kt = qt / torch.sqrt((qt * qt).sum() + 1e-6), kt / torch.sqrt((kt * kt).sum() + 1e-6)
                if family == "rwkv7":
                    A = torch.diag(torch.exp(t["g"][b, i, h])) + torch.outer(t["b"][b, i, h], t["a"][b, i, h])
                    S = A @ S + torch.outer(kt, vt)
                else:
                    bt = t["beta"][b, i, h]
                    P = eye - bt * torch.outer(kt, kt)
                    if family == "deltanet":
                        S = P @ S
                    elif family == "gated":
                        S = torch.exp(t["g"][b, i, h]) * (P @ S)
                    else:
                        S = P @ torch.diag(torch.exp(t["g"][b, i, h])) @ S
                    S = S + bt * torch.outer(kt, vt)
                o[b][i][h] = scale * S.T @ qt
            heads.append(S)
        finals.append(torch.stack(heads))
    zero = torch.zeros(V, dtype=v.dtype)
    out = torch.stack([torch.stack([torch.stack([x if x is not None else zero for x in row]) for row in bt])
                       for bt in o]) if T else torch.zeros(batch, 0, H, V, dtype=v.dtype)
    return out, torch.stack(finals)
