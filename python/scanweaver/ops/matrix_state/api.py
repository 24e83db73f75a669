"""The public matrix-state operations: ``linear_attention``, ``mamba2_scan`` and ``rwkv6``.

Each is declared once here (:func:`scanweaver.calls.declare.operation`): its
signature, with the layout and semantics of the library its users come from
(flash-linear-attention, mamba-ssm), and its kernel pair (:mod:`.grad`), a thin
layer over the fused operation :mod:`scanweaver.fused.matrix_state`.  The NumPy
entry runs the pair's forward; :mod:`scanweaver.torch` and :mod:`scanweaver.jax`
build their entries from the same declarations, with gradients for every input.
"""

from __future__ import annotations

import math

from ...calls.declare import operation
from .attention import LA, LA_INPUTS, RWKV6, RWKV6_INPUTS
from .grad import la_options, mamba2_options, rwkv6_options
from .mamba2 import INPUTS as MAMBA2_INPUTS


def _tunables() -> set[str]:
    """Every tunable of the fused ``matrix_state`` kernels (every target family)."""
    from ...fused import REGISTRY as FUSED

    return {t.name for ts in FUSED.get("matrix_state").tunables.values() for t in ts}


def _la_options(args: dict) -> dict:
    return la_options(args["scale"], args["reverse"], args["cu_seqlens"], args["backend"], **args["tunables"])


def _rwkv6_options(args: dict) -> dict:
    return rwkv6_options(args["scale"], args["cu_seqlens"], args["backend"], **args["tunables"])


def _mamba2_options(args: dict) -> dict:
    return mamba2_options(args["dt_softplus"], args["dt_limit"], args["cu_seqlens"], args["chunk_size"],
                          args["backend"], **args["tunables"])


def _with_state(outputs: list, args: dict):
    """``(o, final_state or None)``, as flash-linear-attention returns them."""
    o, h = outputs
    return o, (h if args["output_final_state"] else None)


def _mamba2_finish(outputs: list, args: dict):
    out, h = outputs
    return (out, h) if args["return_final_states"] else out


@operation(arrays=LA_INPUTS, pair=LA, options=_la_options, finish=_with_state, tunables=_tunables)
def linear_attention(q, k, v, *, g=None, g_head=None, decay=None, scale=None, initial_state=None,
                     output_final_state: bool = False, cu_seqlens=None, reverse: bool = False, backend: str = "auto",
                     **tunables):
    """Linear attention with a matrix state: GLA, simple GLA / Mamba-2 style, RetNet, or no decay.

    flash-linear-attention's layout and ``chunk_gla`` / ``chunk_simple_gla`` semantics.  Per batch
    element and head, with the state ``S`` of shape ``(K, V)``::

        S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T       (g: a log decay per key dim; GLA)
        S_t = exp(g_head_t) * S_{t-1} + k_t v_t^T           (g_head: one per head and step; simple GLA)
        S_t = exp(decay) * S_{t-1} + k_t v_t^T              (decay: a constant per head; RetNet)
        o_t = scale * S_t^T q_t

    Args:
        q, k: ``(batch, T, Hq, K)``; ``Hq`` may divide ``H`` (grouped queries/keys).
        v: ``(batch, T, H, V)``.
        g: log decays ``(batch, T, H, K)`` (at most one of g, g_head, decay).
        g_head: log decays ``(batch, T, H)``.
        decay: constant log decays ``(H,)`` (RetNet: ``log(1 - 2**(-5 - arange(H)))``).
        scale: output scale, default ``K**-0.5``.
        initial_state: ``(N, H, K, V)``, N = batch (or the sequences of ``cu_seqlens``), or None (zeros).
        output_final_state: also compute the final state.
        cu_seqlens: ``[0, ..., T]`` offsets of sequences packed along T (batch 1); each starts from its own
            row of ``initial_state`` and ends in its own row of the final state.
        reverse: run each sequence from its end to its start.
        backend: ``auto`` (the best available backend that renders ``matrix_state``) or a name.
        **tunables: tunables of the backend's matrix-state kernel.

    Returns:
        ``(o, final_state)``: ``o`` ``(batch, T, H, V)`` in v's dtype, the state ``(N, H, K, V)`` in the
        accumulation dtype or ``None`` unless ``output_final_state`` (as fla returns them).

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(3, 1, 6, 2, 4))
        >>> o, h = scanweaver.linear_attention(q, k, v, g=-rng.uniform(0, 1, (1, 6, 2, 4)), output_final_state=True)
        >>> o.shape, h.shape
        ((1, 6, 2, 4), (1, 2, 4, 4))
    """


@operation(arrays=RWKV6_INPUTS, pair=RWKV6, options=_rwkv6_options, finish=_with_state, tunables=_tunables)
def rwkv6(r, k, v, w, u, *, scale=None, initial_state=None, output_final_state: bool = False, cu_seqlens=None,
          backend: str = "auto", **tunables):
    """RWKV-6's time mixing with a matrix state (flash-linear-attention's ``chunk_rwkv6`` semantics).

    Per batch element and head, with ``w`` a log decay per key dim (``exp(w)`` the decay, as fla takes it)::

        o_t = scale * (S_{t-1}^T r_t + (r_t . (u * k_t)) v_t)
        S_t = exp(w_t)[:, None] * S_{t-1} + k_t v_t^T

    Args:
        r, k, w: ``(batch, T, H, K)``.  v: ``(batch, T, H, V)``.  u: the bonus ``(H, K)``.
        scale: default ``K**-0.5``.
        initial_state, output_final_state, cu_seqlens, backend: as for :func:`linear_attention`.

    Returns:
        ``(o, final_state)`` as :func:`linear_attention`.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> r, k, v = rng.normal(size=(3, 1, 5, 2, 3))
        >>> o, _ = scanweaver.rwkv6(r, k, v, -np.exp(rng.normal(size=(1, 5, 2, 3))), rng.normal(size=(2, 3)))
        >>> o.shape
        (1, 5, 2, 3)
    """


@operation(arrays=MAMBA2_INPUTS, pair="mamba2", options=_mamba2_options, finish=_mamba2_finish,
           tunables=_tunables)
def mamba2_scan(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                dt_limit=(0.0, math.inf), initial_states=None, return_final_states: bool = False, cu_seqlens=None,
                chunk_size=None, backend: str = "auto", **tunables):
    """Mamba-2's SSD scan with mamba-ssm's ``mamba_chunk_scan_combined`` semantics.

    Per batch element, head h (group ``h // (H // G)`` of B and C) and step t, state ``(P, N)``::

        dt_t = dt_t + dt_bias;  softplus with dt_softplus;  clamp to dt_limit unless it is (0, inf)
        S_t  = exp(dt_t * A) * S_{t-1} + (dt_t * x_t) B_t^T
        y_t  = S_t C_t + D * x_t;   then y_t * silu(z_t) when z is given

    Args:
        x: ``(batch, L, H, P)``.  dt: ``(batch, L, H)``.  A: ``(H,)``.
        B, C: ``(batch, L, G, N)`` with G dividing H.
        D: ``(H,)`` or ``(H, P)``, or None.  z: ``(batch, L, H, P)`` or None.  dt_bias: ``(H,)`` or None.
        dt_softplus: apply softplus to ``dt + dt_bias`` (PyTorch's: linear above 20).
        dt_limit: ``(min, max)`` clamp of dt (gradient zero where clamped).
        initial_states: ``(batch, H, P, N)`` (rows per sequence with ``cu_seqlens``), or None.
        return_final_states: also return the final states ``(batch, H, P, N)``.
        cu_seqlens: ``[0, ..., L]`` offsets of sequences packed along L (batch 1), each from its own state.
        chunk_size: the chunk length of a chunked kernel where the backend has one (results do not depend on
            it); ignored by kernels without chunks.
        backend: ``auto`` or a backend name.

    Returns:
        ``out`` ``(batch, L, H, P)`` in x's dtype, or ``(out, final_states)``.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> x, dt = rng.normal(size=(1, 6, 2, 3)), rng.uniform(0.1, 1, (1, 6, 2))
        >>> B, C = rng.normal(size=(2, 1, 6, 1, 4))
        >>> scanweaver.mamba2_scan(x, dt, -np.ones(2), B, C, D=np.ones(2)).shape
        (1, 6, 2, 3)
    """
