"""Float64 host references of the model scans the GPU model scoreboard checks (PyTorch on the CPU, autograd).

Each is the plainest recurrent loop over time with the semantics of the peer
it checks, run in float64 on the host, so that an entry's forward output and
every gradient are compared with numbers that carry no float32 or chunking
error of their own:

* :func:`mamba1` -- ``selective_scan_ref`` (mamba-ssm): u, delta ``(b, D, L)``, A ``(D, N)``, B, C
  ``(b, N, L)``, D ``(D,)``, delta_bias ``(D,)``, softplus on delta.
* :func:`mamba2` -- ``mamba_chunk_scan_combined`` (mamba-ssm): x ``(b, L, H, P)``, dt ``(b, L, H)``, A ``(H,)``,
  B, C ``(b, L, G, N)``, D ``(H,)``, dt_bias ``(H,)``, softplus on dt: per head
  ``S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T``, ``y_t = S_t C_t + D x_t``.
* :func:`gla` -- ``chunk_gla`` (flash-linear-attention): q, k, g ``(B, T, H, K)``, v ``(B, T, H, V)``,
  ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``, ``o_t = scale * q_t^T S_t`` (scale ``K**-0.5``).
* :func:`simple_gla` (``chunk_simple_gla``: one log decay per head and step, g ``(B, T, H)``), :func:`retnet`
  (a constant log decay per head, ``(H,)``), :func:`rwkv6` (``chunk_rwkv6``: ``o_t = scale * (S_{t-1}^T r_t +
  (r_t . (u * k_t)) v_t)``), :func:`mamba2_gated` (Mamba-2 with its clamp ``dt_limit``, ``D (H, P)`` and the
  gate ``y * silu(z)``), :func:`scan` (the selective scan ``h_t = a_t h_{t-1} + b_t x_t``, ``y_t = c_t h_t``),
  :func:`delta` (``chunk_delta_rule``: ``S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T``) and
  :func:`gated_delta` (``chunk_gated_delta_rule``: ``S_{t-1}`` decayed by ``exp(g_t)`` first) and :func:`rwkv7`
  (``chunk_rwkv7``: ``S_t = diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T``, ``o_t = S_t^T r_t``).

Example:
    >>> import torch
    >>> from scanweaver.benchmarks import model_refs
    >>> ins = model_refs.inputs("gla", (1, 5, 1, 2, 3), torch.float64)
    >>> model_refs.gla(**ins).shape
    torch.Size([1, 5, 1, 3])
"""

from __future__ import annotations

from typing import Any

#: Gate ranges: decays that keep the past (the bounded setting of the scan cases).
DT_LOW, DT_HIGH = 0.05, 0.5


def mamba1(u, delta, A, B, C, D, delta_bias):
    """``y`` of Mamba-1's selective scan (delta_softplus on), one step per t."""
    import torch

    dt = torch.nn.functional.softplus(delta + delta_bias[:, None])
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        h = torch.exp(dt[:, :, t, None] * A) * h + (dt[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return torch.stack(ys, -1) + D[:, None] * u


def mamba2(x, dt, A, B, C, D, dt_bias):
    """``y`` of Mamba-2's SSD scan (dt_softplus on), one step per t; heads share B and C within a group."""
    import torch

    H, G = x.shape[2], B.shape[2]
    dts = torch.nn.functional.softplus(dt + dt_bias)
    Bh, Ch = B.repeat_interleave(H // G, dim=2), C.repeat_interleave(H // G, dim=2)
    S = x.new_zeros(x.shape[0], H, x.shape[3], B.shape[3])
    ys = []
    for t in range(x.shape[1]):
        decay = torch.exp(dts[:, t] * A)[:, :, None, None]
        S = decay * S + (dts[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        ys.append((S * Ch[:, t, :, None, :]).sum(-1))
    return torch.stack(ys, 1) + D[:, None] * x


def gla(q, k, v, g):
    """``o`` of gated linear attention with a per-key decay ``exp(g)``, one step per t."""
    import torch

    scale = q.shape[-1] ** -0.5
    S = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    os = []
    for t in range(q.shape[1]):
        S = torch.exp(g[:, t])[..., None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        os.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    return torch.stack(os, 1)


def _attention(q, k, v, decay, bonus=None):
    """``o`` of linear attention with ``decay(t)`` multiplying S (broadcast over (B, H, K, V)) before each update;
    with ``bonus`` (RWKV-6's u) the readout takes S_{t-1} plus the bonus term."""
    import torch

    scale = q.shape[-1] ** -0.5
    S = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    os = []
    for t in range(q.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]
        if bonus is None:
            S = decay(t) * S + kv
            os.append(scale * (q[:, t, :, :, None] * S).sum(-2))
        else:
            os.append(scale * (q[:, t, :, :, None] * (S + bonus[None, :, :, None] * kv)).sum(-2))
            S = decay(t) * S + kv
    return torch.stack(os, 1)


def simple_gla(q, k, v, g):
    """``o`` of simple GLA: one log decay per head and step, g ``(B, T, H)``."""
    import torch

    return _attention(q, k, v, lambda t: torch.exp(g[:, t])[:, :, None, None])


def retnet(q, k, v, decay):
    """``o`` of RetNet's retention: a constant log decay per head, ``(H,)``."""
    import torch

    return _attention(q, k, v, lambda t: torch.exp(decay)[None, :, None, None])


def rwkv6(r, k, v, w, u):
    """``o`` of RWKV-6's time mixing (decay ``exp(w)`` per key, bonus ``u (H, K)``)."""
    import torch

    return _attention(r, k, v, lambda t: torch.exp(w[:, t])[..., None], bonus=u)


#: The clamp of :func:`mamba2_gated` (it acts on part of the inputs' dt).
DT_LIMIT = (0.05, 0.3)


def mamba2_gated(x, dt, A, B, C, D, z, dt_bias):
    """``y`` of Mamba-2 with every gate: softplus, the clamp :data:`DT_LIMIT`, ``D (H, P)``, ``y * silu(z)``."""
    import torch

    H, G = x.shape[2], B.shape[2]
    dts = torch.clamp(torch.nn.functional.softplus(dt + dt_bias), *DT_LIMIT)
    Bh, Ch = B.repeat_interleave(H // G, dim=2), C.repeat_interleave(H // G, dim=2)
    S = x.new_zeros(x.shape[0], H, x.shape[3], B.shape[3])
    ys = []
    for t in range(x.shape[1]):
        S = torch.exp(dts[:, t] * A)[:, :, None, None] * S + (dts[:, t, :, None] * x[:, t])[..., None] * \
            Bh[:, t, :, None, :]
        ys.append((S * Ch[:, t, :, None, :]).sum(-1) + D * x[:, t])
    return torch.stack(ys, 1) * torch.nn.functional.silu(z)


def scan(a, b, x, c):
    """``y`` of the selective scan ``h_t = a_t h_{t-1} + b_t x_t``, ``y_t = c_t h_t`` over the last axis."""
    import torch

    h = a.new_zeros(a.shape[:-1])
    ys = []
    for t in range(a.shape[-1]):
        h = a[..., t] * h + b[..., t] * x[..., t]
        ys.append(c[..., t] * h)
    return torch.stack(ys, -1)


def gated_delta(q, k, v, g, beta):
    """``o`` of the gated delta rule: ``S <- exp(g_t) S``, then ``S += beta_t k_t (v_t - S^T k_t)^T``."""
    import torch

    scale = q.shape[-1] ** -0.5
    S = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3])
    os = []
    for t in range(q.shape[1]):
        S = torch.exp(g[:, t])[:, :, None, None] * S
        err = v[:, t] - (S * k[:, t, :, :, None]).sum(-2)
        S = S + beta[:, t, :, None, None] * k[:, t, :, :, None] * err[:, :, None, :]
        os.append(scale * (q[:, t, :, :, None] * S).sum(-2))
    return torch.stack(os, 1)


def delta(q, k, v, beta):
    """``o`` of DeltaNet's delta rule (the gated one with no decay)."""
    return gated_delta(q, k, v, beta.new_zeros(beta.shape), beta)


def rwkv7(r, w, k, v, a, b):
    """``o`` of RWKV-7 (scale 1): ``S <- diag(exp(w_t)) S + b_t (a_t^T S) + k_t v_t^T``, ``o_t = S^T r_t``."""
    import torch

    S = r.new_zeros(r.shape[0], r.shape[2], r.shape[3], v.shape[3])
    os = []
    for t in range(r.shape[1]):
        proj = (a[:, t, :, :, None] * S).sum(-2)
        S = torch.exp(w[:, t])[..., None] * S + b[:, t, :, :, None] * proj[:, :, None, :] + \
            k[:, t, :, :, None] * v[:, t, :, None, :]
        os.append((r[:, t, :, :, None] * S).sum(-2))
    return torch.stack(os, 1)


#: Model name -> (reference, input names in the call order).
REFERENCES = {"mamba1": (mamba1, ("u", "delta", "A", "B", "C", "D", "delta_bias")),
              "mamba2": (mamba2, ("x", "dt", "A", "B", "C", "D", "dt_bias")),
              "gla": (gla, ("q", "k", "v", "g")),
              "simple_gla": (simple_gla, ("q", "k", "v", "g")),
              "retnet": (retnet, ("q", "k", "v", "decay")),
              "rwkv6": (rwkv6, ("r", "k", "v", "w", "u")),
              "mamba2_gated": (mamba2_gated, ("x", "dt", "A", "B", "C", "D", "z", "dt_bias")),
              "scan": (scan, ("a", "b", "x", "c")),
              "delta": (delta, ("q", "k", "v", "beta")),
              "gated_delta": (gated_delta, ("q", "k", "v", "g", "beta")),
              "rwkv7": (rwkv7, ("r", "w", "k", "v", "a", "b"))}


def inputs(model: str, shape: tuple[int, ...], dtype: Any, device: str = "cpu", seed: int = 0) -> dict:
    """Random inputs of ``model`` (non-uniform, decays in a range that keeps the past).

    Args:
        model: ``mamba1`` (shape ``(batch, D, N, L)``), ``mamba2`` and ``mamba2_gated`` (``(batch, L, H, P,
            N)``, one group), ``scan`` (any shape, scanned over its last axis), or ``gla``, ``simple_gla``,
            ``retnet``, ``rwkv6``, ``delta``, ``gated_delta``, ``rwkv7`` (``(B, T, H, K, V)``).
        shape: the sizes, as named above.
        dtype: a torch dtype.
        device: where the tensors are made.
        seed: generator seed.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rnd(*s, low=None, high=None):
        t = torch.rand(s, generator=gen, dtype=torch.float64) if low is not None else \
            torch.randn(s, generator=gen, dtype=torch.float64)
        if low is not None:
            t = low + (high - low) * t
        return t.to(dtype=dtype, device=device)

    if model == "mamba1":
        b, D, N, L = shape
        return {"u": rnd(b, D, L), "delta": rnd(b, D, L, low=-3.0, high=-0.5), "A": -rnd(D, N, low=0.5, high=2.0),
                "B": rnd(b, N, L), "C": rnd(b, N, L), "D": rnd(D), "delta_bias": rnd(D, low=-1.0, high=0.0)}
    if model == "mamba2":
        b, L, H, P, N = shape
        return {"x": rnd(b, L, H, P), "dt": rnd(b, L, H, low=-3.0, high=-0.5), "A": -rnd(H, low=0.5, high=2.0),
                "B": rnd(b, L, 1, N), "C": rnd(b, L, 1, N), "D": rnd(H), "dt_bias": rnd(H, low=-1.0, high=0.0)}
    if model in ("gla", "simple_gla", "retnet", "rwkv6"):
        B, T, H, K, V = shape
        ins = {"q": rnd(B, T, H, K), "k": rnd(B, T, H, K) * K ** -0.5, "v": rnd(B, T, H, V)}
        gshape = {"gla": (B, T, H, K), "simple_gla": (B, T, H), "retnet": (H,), "rwkv6": (B, T, H, K)}[model]
        g = torch.log(rnd(*gshape, low=0.9, high=0.999).double()).to(dtype)
        if model == "rwkv6":
            return {"r": ins["q"], "k": ins["k"], "v": ins["v"], "w": g, "u": rnd(H, K)}
        return {**ins, ("decay" if model == "retnet" else "g"): g}
    if model == "mamba2_gated":
        b, L, H, P, N = shape
        return {"x": rnd(b, L, H, P), "dt": rnd(b, L, H, low=-3.0, high=-0.5), "A": -rnd(H, low=0.5, high=2.0),
                "B": rnd(b, L, 1, N), "C": rnd(b, L, 1, N), "D": rnd(H, P), "z": rnd(b, L, H, P),
                "dt_bias": rnd(H, low=-1.0, high=0.0)}
    if model == "scan":
        return {"a": rnd(*shape, low=0.5, high=1.0), "b": rnd(*shape), "x": rnd(*shape), "c": rnd(*shape)}
    if model in ("delta", "gated_delta"):
        B, T, H, K, V = shape
        k = rnd(B, T, H, K).double()
        ins = {"q": rnd(B, T, H, K), "k": (k / k.norm(dim=-1, keepdim=True)).to(dtype), "v": rnd(B, T, H, V)}
        if model == "gated_delta":
            ins["g"] = torch.log(rnd(B, T, H, low=0.9, high=0.999).double()).to(dtype)
        return {**ins, "beta": rnd(B, T, H, low=0.1, high=0.9)}
    if model == "rwkv7":  # RWKV-7's a = -kappa, b = kappa * iclr with kappa unit, iclr in (0, 1): a contraction
        B, T, H, K, V = shape
        kappa = rnd(B, T, H, K).double()
        kappa = kappa / kappa.norm(dim=-1, keepdim=True)
        iclr = rnd(B, T, H, K, low=0.1, high=0.9).double()
        return {"r": rnd(B, T, H, K), "w": torch.log(rnd(B, T, H, K, low=0.9, high=0.999).double()).to(dtype),
                "k": rnd(B, T, H, K) * K ** -0.5, "v": rnd(B, T, H, V), "a": (-kappa).to(dtype),
                "b": (kappa * iclr).to(dtype)}
    raise ValueError(f"model_refs.inputs: unknown model {model!r}; choose one of {', '.join(REFERENCES)}")


def reference(model: str, ins: dict, weight) -> tuple[Any, dict]:
    """The float64 host output of ``model`` on ``ins`` and the gradients of ``sum(y * weight)`` for every input."""
    import torch

    fn, names = REFERENCES[model]
    wide = {k: v.detach().to("cpu", torch.float64).requires_grad_(True) for k, v in ins.items()}
    y = fn(*(wide[n] for n in names))
    (y * weight.detach().to("cpu", torch.float64)).sum().backward()
    return y.detach(), {k: v.grad for k, v in wide.items()}
