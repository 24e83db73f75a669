"""The public matrix-state operations: ``linear_attention``, ``simple_gla``, ``retention``, ``rwkv6``, ``mamba2_scan``.

Each is declared once here (:func:`scanweaver.calls.declare.operation`): its
signature, with the positional order, layout and semantics of the library its
users come from (flash-linear-attention's ``chunk_gla``, ``chunk_simple_gla``,
``chunk_retention`` and ``chunk_rwkv6``; mamba-ssm's ``mamba_chunk_scan_combined``),
so that a call ports by renaming (``docs/porting.md``), and its kernel pair
(:mod:`.grad`), a thin layer over the fused operation :mod:`scanweaver.fused.matrix_state`.
``linear_attention``, ``simple_gla`` and ``retention`` share one pair.  The NumPy
entry runs the pair's forward; :mod:`scanweaver.torch` and :mod:`scanweaver.jax`
build their entries from the same declarations, with gradients for every input.
"""

from __future__ import annotations

import math

from ...calls.declare import operation
from .attention import LA, LA_INPUTS, RWKV6, RWKV6_INPUTS
from .grad import la_options, mamba2_options, rwkv6_options
from .mamba2 import INPUTS as MAMBA2_INPUTS

#: flash-linear-attention's keywords that have no meaning here, and what fla itself says of them.
FLA_REFUSED = {"head_first": "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."}


def _tunables() -> set[str]:
    """Every tunable of the fused ``matrix_state`` kernels (every target family)."""
    from ...fused import REGISTRY as FUSED

    return {t.name for ts in FUSED.get("matrix_state").tunables.values() for t in ts}


def _with_state(outputs: list, args: dict):
    """``(o, final_state or None)``, as flash-linear-attention returns them."""
    o, h = outputs
    return o, (h if args["output_final_state"] else None)


def _mamba2_finish(outputs: list, args: dict):
    """What ``mamba_chunk_scan_combined`` returns: ``out``, ``(out, final_states)``, and with
    ``return_varlen_states`` ``(out, varlen_states)`` or ``(out, final_states, varlen_states)``."""
    out, h = outputs
    if args["return_varlen_states"]:  # h: one state per sequence of cu_seqlens; the row's final state is the last
        return (out, h[-1:], h) if args["return_final_states"] else (out, h)
    return (out, h) if args["return_final_states"] else out


@operation(arrays=LA_INPUTS, pair=LA, options=lambda args: la_options("linear_attention", args), finish=_with_state,
           tunables=_tunables, refused=FLA_REFUSED)
def linear_attention(q, k, v, g=None, scale=None, initial_state=None, output_final_state: bool = False,
                     state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, *, g_head=None, decay=None,
                     reverse: bool = False, chunk_size=None, backend: str = "auto", **tunables):
    """Linear attention with a matrix state: GLA, simple GLA / Mamba-2 style, RetNet, or no decay.

    flash-linear-attention's ``chunk_gla``: the same positional order, layout and results
    (``chunk_gla(q, k, v, g, scale, initial_state, output_final_state, state_v_first, cu_seqlens,
    cu_seqlens_cpu)``).  Per batch element and head, with the state ``S`` of shape ``(K, V)``::

        S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T       (g: a log decay per key dim; GLA)
        S_t = exp(g_head_t) * S_{t-1} + k_t v_t^T           (g_head: one per head and step; simple GLA)
        S_t = exp(decay) * S_{t-1} + k_t v_t^T              (decay: a constant per head; RetNet)
        o_t = scale * S_t^T q_t

    Args:
        q, k: ``(batch, T, Hq, K)``; ``Hq`` may divide ``H`` (grouped queries/keys).
        v: ``(batch, T, H, V)``.
        g: log decays ``(batch, T, H, K)`` (at most one of g, g_head, decay), or None.
        scale: output scale, default ``K**-0.5``.
        initial_state: ``(N, H, K, V)`` (``(N, H, V, K)`` with ``state_v_first``), N = batch (or the
            sequences of ``cu_seqlens``), or None (zeros).
        output_final_state: also compute the final state.
        state_v_first: states in and out in the ``(N, H, V, K)`` layout (fla's V-first layout).
        cu_seqlens: ``[0, ..., T]`` offsets of sequences packed along T (batch 1); each starts from its own
            row of ``initial_state`` and ends in its own row of the final state.
        cu_seqlens_cpu: the same offsets (fla's host copy of ``cu_seqlens``); either may be given.
        g_head: log decays ``(batch, T, H)`` (:func:`simple_gla`'s ``g``).
        decay: constant log decays ``(H,)`` (:func:`simple_gla`'s ``g_gamma``; RetNet's: :func:`retention`).
        reverse: run each sequence from its end to its start.
        chunk_size: the chunk length of a chunked kernel where the backend has one (results do not depend
            on it): a positive int, or None.
        backend: ``auto`` (the best available backend that renders ``matrix_state``) or a name.
        **tunables: tunables of the backend's matrix-state kernel.

    Returns:
        ``(o, final_state)``: ``o`` ``(batch, T, H, V)`` in v's dtype, the state ``(N, H, K, V)`` (or
        ``(N, H, V, K)``) in the accumulation dtype, or ``None`` unless ``output_final_state`` (as fla
        returns them).

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(3, 1, 6, 2, 4))
        >>> o, h = scanweaver.linear_attention(q, k, v, -rng.uniform(0, 1, (1, 6, 2, 4)), output_final_state=True)
        >>> o.shape, h.shape
        ((1, 6, 2, 4), (1, 2, 4, 4))
    """


def _simple_gla_inputs(args: dict) -> list:
    """The linear-attention pair's inputs of a ``simple_gla`` call: its g in the per-head slot, g_gamma in the
    constant one."""
    return [args["q"], args["k"], args["v"], None, args["g"], args["g_gamma"], args["initial_state"]]


@operation(arrays=("q", "k", "v", "g", "g_gamma", "initial_state"), pair=LA, inputs=_simple_gla_inputs,
           options=lambda args: la_options("simple_gla", args, names={"g": None, "g_head": "g", "decay": "g_gamma"}),
           finish=_with_state, tunables=_tunables, refused=FLA_REFUSED)
def simple_gla(q, k, v, g=None, g_gamma=None, scale=None, initial_state=None, output_final_state: bool = False,
               state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, *, reverse: bool = False,
               chunk_size=None, backend: str = "auto", **tunables):
    """Simple GLA: linear attention decayed by one gate per head (flash-linear-attention's ``chunk_simple_gla``).

    The same positional order, layout and results as ``chunk_simple_gla(q, k, v, g, g_gamma, scale,
    initial_state, output_final_state, state_v_first, cu_seqlens, cu_seqlens_cpu)``.  Per batch element
    and head, with the state ``S`` of shape ``(K, V)``::

        S_t = exp(g_t) * S_{t-1} + k_t v_t^T        (g: a log decay per head and step)
        S_t = exp(g_gamma) * S_{t-1} + k_t v_t^T    (g_gamma: a constant log decay per head)
        o_t = scale * S_t^T q_t

    It is :func:`linear_attention` with ``g_head=g`` or ``decay=g_gamma`` (one kernel pair).

    Args:
        q, k: ``(batch, T, Hq, K)`` (``Hq`` dividing ``H``).  v: ``(batch, T, H, V)``.
        g: log decays ``(batch, T, H)``, or None.
        g_gamma: constant log decays ``(H,)``, or None (at most one of g and g_gamma; neither: no decay).
        scale, initial_state, output_final_state, state_v_first, cu_seqlens, cu_seqlens_cpu, reverse,
            chunk_size, backend, **tunables: as for :func:`linear_attention`.

    Returns:
        ``(o, final_state or None)`` as :func:`linear_attention`.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(3, 1, 6, 2, 4))
        >>> o, _ = scanweaver.simple_gla(q, k, v, -rng.uniform(0, 1, (1, 6, 2)))
        >>> o.shape
        (1, 6, 2, 4)
    """


def _retention_inputs(args: dict) -> list:
    """The linear-attention pair's inputs of a ``retention`` call (the decays come from the options)."""
    return [args["q"], args["k"], args["v"], None, None, None, args["initial_state"]]


@operation(arrays=("q", "k", "v", "initial_state"), pair=LA, inputs=_retention_inputs,
           options=lambda args: la_options("retention", args, retention=True), finish=_with_state,
           tunables=_tunables, refused=FLA_REFUSED)
def retention(q, k, v, scale=None, initial_state=None, output_final_state: bool = False, cu_seqlens=None, *,
              reverse: bool = False, chunk_size=None, backend: str = "auto", **tunables):
    """RetNet's retention (flash-linear-attention's ``chunk_retention``): decays derived from the heads.

    The same positional order, layout and results as ``chunk_retention(q, k, v, scale, initial_state,
    output_final_state, cu_seqlens)``: :func:`simple_gla` with ``g_gamma = log(1 - 2**(-5 - arange(H)))``
    (Sun et al. 2023, "Retentive Network: A Successor to Transformer for Large Language Models", 2.2).

    Args:
        q, k: ``(batch, T, Hq, K)``.  v: ``(batch, T, H, V)`` (the decays are per head of v).
        scale, initial_state, output_final_state, cu_seqlens, reverse, chunk_size, backend, **tunables:
            as for :func:`linear_attention`.

    Returns:
        ``(o, final_state or None)`` as :func:`linear_attention`.

    Example:
        >>> import numpy as np, scanweaver
        >>> q, k, v = np.random.default_rng(0).normal(size=(3, 1, 5, 2, 3))
        >>> o, h = scanweaver.retention(q, k, v, output_final_state=True)
        >>> o.shape, h.shape
        ((1, 5, 2, 3), (1, 2, 3, 3))
    """


@operation(arrays=RWKV6_INPUTS, pair=RWKV6, options=rwkv6_options, finish=_with_state, tunables=_tunables,
           refused=FLA_REFUSED)
def rwkv6(r, k, v, w, u, scale=None, initial_state=None, output_final_state: bool = False, cu_seqlens=None,
          cu_seqlens_cpu=None, *, chunk_size=None, backend: str = "auto", **tunables):
    """RWKV-6's time mixing with a matrix state (flash-linear-attention's ``chunk_rwkv6``).

    The same positional order, layout and results as ``chunk_rwkv6(r, k, v, w, u, scale, initial_state,
    output_final_state, cu_seqlens, cu_seqlens_cpu)``.  Per batch element and head, with ``w`` a log
    decay per key dim (``exp(w)`` the decay, as fla takes it)::

        o_t = scale * (S_{t-1}^T r_t + (r_t . (u * k_t)) v_t)
        S_t = exp(w_t)[:, None] * S_{t-1} + k_t v_t^T

    Args:
        r, k, w: ``(batch, T, H, K)``.  v: ``(batch, T, H, V)``.  u: the bonus ``(H, K)``.
        scale: default ``K**-0.5``.
        initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, chunk_size, backend, **tunables:
            as for :func:`linear_attention` (states ``(N, H, K, V)``).

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


@operation(arrays=MAMBA2_INPUTS, pair="mamba2", options=mamba2_options, finish=_mamba2_finish, tunables=_tunables)
def mamba2_scan(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                cu_seqlens=None, dt_softplus: bool = False, dt_limit=(0.0, math.inf), return_final_states: bool = False,
                return_varlen_states: bool = False, *, backend: str = "auto", **tunables):
    """Mamba-2's SSD scan (mamba-ssm's ``mamba_chunk_scan_combined``: the same positional order and results).

    Per batch element, head h (group ``h // (H // G)`` of B and C) and step t, state ``(P, N)``::

        dt_t = dt_t + dt_bias;  softplus with dt_softplus;  clamp to dt_limit unless it is (0, inf)
        S_t  = exp(dt_t * A) * S_{t-1} + (dt_t * x_t) B_t^T
        y_t  = S_t C_t + D * x_t;   then y_t * silu(z_t) when z is given

    Args:
        x: ``(batch, L, H, P)``.  dt: ``(batch, L, H)``.  A: ``(H,)``.
        B, C: ``(batch, L, G, N)`` with G dividing H.
        chunk_size: the chunk length of a chunked kernel where the backend has one (results do not depend on
            it): a positive int, or None.
        D: ``(H,)`` or ``(H, P)``, or None.  z: ``(batch, L, H, P)`` or None.  dt_bias: ``(H,)`` or None.
        initial_states: ``(batch, H, P, N)`` (one per sequence of ``cu_seqlens`` when given), or None.
        seq_idx: ``(batch, L)`` integers, mamba-ssm's sequence index of every position: the state starts
            again from zero wherever it changes within a row (each row starts from its initial state).
        cu_seqlens: ``[0, ..., L]`` offsets of sequences packed along L (batch 1), each from its own initial
            state (with ``seq_idx`` too, a sequence starts wherever either says so).
        dt_softplus: apply softplus to ``dt + dt_bias`` (PyTorch's: linear above 20).
        dt_limit: ``(min, max)`` clamp of dt (gradient zero where clamped).
        return_final_states: also return the final states: ``(batch, H, P, N)``, one per sequence of
            ``cu_seqlens`` when given (with ``return_varlen_states``, the row's: the last sequence's).
        return_varlen_states: also return the final state of each sequence of ``cu_seqlens``
            ``(len(cu_seqlens) - 1, H, P, N)``, last in the result (as mamba-ssm returns them).
        backend: ``auto`` or a backend name.
        **tunables: tunables of the backend's matrix-state kernel.

    Returns:
        ``out`` ``(batch, L, H, P)`` in x's dtype; ``(out, final_states)``; with ``return_varlen_states``
        ``(out, varlen_states)`` or ``(out, final_states, varlen_states)``.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> x, dt = rng.normal(size=(1, 6, 2, 3)), rng.uniform(0.1, 1, (1, 6, 2))
        >>> B, C = rng.normal(size=(2, 1, 6, 1, 4))
        >>> scanweaver.mamba2_scan(x, dt, -np.ones(2), B, C, 64, np.ones(2)).shape
        (1, 6, 2, 3)
    """
