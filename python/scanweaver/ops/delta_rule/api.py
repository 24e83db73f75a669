"""The public delta-rule operations: ``delta_rule``, ``gated_delta_rule``, ``kda`` and ``rwkv7``.

Each is declared once here (:func:`scanweaver.calls.declare.operation`) with
flash-linear-attention's signature, positional order included (``chunk_delta_rule``,
``chunk_gated_delta_rule``, ``chunk_kda``, ``chunk_rwkv7`` of fla 0.6), so a
model ports by changing the import.  fla's arguments that only steer its
Triton kernels (``chunk_indices``, ``safe_gate``, ``lower_bound``,
``disable_recompute``) are accepted and change nothing; ``cu_seqlens_cpu`` is
the offsets as ``cu_seqlens`` is (either may be given); ``chunk_size`` is the
runner's hint for the chunked form (it never changes the result beyond
rounding); those with a meaning ScanWeaver does not carry (``cp_context``,
``use_gate_in_kernel``, ``return_intermediate_states``, ``use_graph``,
``head_first``) are refused with a message when set.  The NumPy entry runs the
kernel pair of :mod:`.grad`, a repeated signature from the plan its first call kept
(:func:`.plans.call`); :mod:`scanweaver.torch` and :mod:`scanweaver.jax`
build theirs from the same declarations, with gradients for every input.
"""

from __future__ import annotations

import functools

from ...calls.declare import operation
from . import plans
from .families import INPUTS
from .grad import FLA_KEYWORDS, HEAD_FIRST, options


def _tunables(family: str) -> set[str]:
    """Every tunable of the fused ``delta_rule`` kernels, and fla's keywords ``family`` takes."""
    from ...fused import REGISTRY as FUSED

    names = {t.name for ts in FUSED.get("delta_rule").tunables.values() for t in ts}
    return names | set(FLA_KEYWORDS[family]) | {"transpose_state_layout"}


def _with_state(outputs: list, args: dict):
    """``(o, final_state or None)``, as flash-linear-attention returns them."""
    o, h = outputs
    return o, (h if args["output_final_state"] else None)


def _declare(family: str):
    return operation(arrays=INPUTS[family], pair=family, options=functools.partial(options, family),
                     finish=_with_state, tunables=functools.partial(_tunables, family),
                     refused={"head_first": HEAD_FIRST})


@_declare("delta_rule")
def delta_rule(q, k, v, beta, scale=None, initial_state=None, output_final_state: bool = False,
               use_qk_l2norm_in_kernel: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, *,
               backend: str = "auto", **tunables):
    """DeltaNet's delta rule (flash-linear-attention's ``chunk_delta_rule``).

    Per batch element (or packed sequence) and head, with the state ``S`` of shape ``(K, V)``::

        S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

    Args:
        q, k: ``(B, T, H, K)``; k as given unless ``use_qk_l2norm_in_kernel`` (unnormalised keys make the
            recurrence diverge, as in fla).
        v: ``(B, T, HV, V)``, HV a multiple of H (value head i reads q/k head ``i // (HV // H)``).
        beta: ``(B, T, HV)``, the writing strengths (usually in (0, 1)).
        scale: the output scale; ``K**-0.5`` when None.
        initial_state: ``(N, HV, K, V)`` (N = B, or the sequences of ``cu_seqlens``), or None (zeros).
        output_final_state: also return the final states ``(N, HV, K, V)``.
        use_qk_l2norm_in_kernel: normalise q and k, ``x / sqrt(sum x^2 + 1e-6)``, inside the kernel.
        cu_seqlens: ``[0, ..., T]`` offsets of sequences packed along T (B = 1; empty ones allowed).
        cu_seqlens_cpu: fla's host copy of ``cu_seqlens``: either may be given (checked equal when both are).
        backend: ``auto`` (the best available backend that runs it) or a backend name.
        **tunables: tunables of the backend's delta-rule kernels; fla's ``chunk_size``, a hint for the chunked
            form (no effect on results beyond rounding).

    Returns:
        ``(o, final_state)``: o ``(B, T, HV, V)`` in v's dtype; the state in float32 (float64 for float64
        inputs), or None unless ``output_final_state``.

    Raises:
        ScanInputError: a shape, dtype, ``cu_seqlens`` or flag that does not fit, named with what it needs.
        BackendUnavailable: ``backend`` does not run the delta rule.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(3, 1, 6, 2, 4))
        >>> beta = rng.uniform(0, 1, (1, 6, 2))
        >>> o, h = scanweaver.delta_rule(q, k, v, beta, None, None, True, True)
        >>> o.shape, h.shape
        ((1, 6, 2, 4), (1, 2, 4, 4))
    """
    return plans.call("delta_rule", locals())  # the arguments by name, ``tunables`` the ** keywords


@_declare("gated_delta_rule")
def gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state: bool = False,
                     use_qk_l2norm_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                     allow_neg_eigval: bool = False, state_v_first: bool = False, cu_seqlens=None,
                     cu_seqlens_cpu=None, chunk_indices=None, cp_context=None, *, backend: str = "auto",
                     **tunables):
    """Gated DeltaNet (Qwen3-Next, Qwen3.5; flash-linear-attention's ``chunk_gated_delta_rule``).

    Per batch element (or packed sequence) and value head, the state ``S`` of shape ``(K, V)``::

        S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

    Args:
        q, k: ``(B, T, H, K)``.  v: ``(B, T, HV, V)``, HV a multiple of H (grouped value heads: value head i
            reads q/k head ``i // (HV // H)``).
        g: log decays ``(B, T, HV)`` (``-inf``: the state is reset exactly).
        beta: ``(B, T, HV)``.
        scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens, cu_seqlens_cpu, backend:
            as for :func:`delta_rule`.
        use_beta_sigmoid_in_kernel: beta is a logit: ``beta = sigmoid(beta)`` first.
        allow_neg_eigval: with ``use_beta_sigmoid_in_kernel``, ``beta = 2 * sigmoid(beta)``.
        state_v_first: the states are ``(N, HV, V, K)`` (fla's V-first layout), in and out.
        chunk_indices: fla's precomputed chunk indices (no effect here).
        cp_context: fla's context parallelism; must be None.
        **tunables: as for :func:`delta_rule`; fla's ``use_gate_in_kernel``, ``A_log`` and ``dt_bias`` are
            refused (compute g first).

    Returns:
        ``(o, final_state)`` as :func:`delta_rule`.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k = rng.normal(size=(2, 1, 6, 1, 4))
        >>> v = rng.normal(size=(1, 6, 2, 3))
        >>> g, beta = -rng.uniform(0, 1, (1, 6, 2)), rng.uniform(0, 1, (1, 6, 2))
        >>> o, h = scanweaver.gated_delta_rule(q, k, v, g, beta, output_final_state=True,
        ...                                    use_qk_l2norm_in_kernel=True)
        >>> o.shape, h.shape
        ((1, 6, 2, 3), (1, 2, 4, 3))
    """
    return plans.call("gated_delta_rule", locals())  # the arguments by name, ``tunables`` the ** keywords


@_declare("kda")
def kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False, use_gate_in_kernel: bool = False,
        use_beta_sigmoid_in_kernel: bool = False, allow_neg_eigval: bool = False, safe_gate: bool = False,
        lower_bound=None, disable_recompute: bool = False, return_intermediate_states: bool = False,
        state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None, cp_context=None,
        use_graph: bool = False, max_num_seqs=None, *, backend: str = "auto", **tunables):
    """Kimi Delta Attention (Kimi Linear; flash-linear-attention's ``chunk_kda``).

    Per batch element (or packed sequence) and value head, a log decay per key dimension, decay first::

        S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

    Args:
        q, k: ``(B, T, H, K)``.  v: ``(B, T, HV, V)``.  g: log decays ``(B, T, HV, K)``.  beta: ``(B, T, HV)``.
        scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
            allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu, backend: as for
            :func:`gated_delta_rule`.
        use_gate_in_kernel: must be False (compute g first).
        safe_gate, lower_bound, disable_recompute: steer fla's kernels; no effect here (``lower_bound`` must be a
            negative real number when given).
        return_intermediate_states, cp_context, use_graph, max_num_seqs: must keep their defaults.
        **tunables: as for :func:`delta_rule`.

    Returns:
        ``(o, final_state)`` as :func:`delta_rule`.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k, v, g = rng.normal(size=(4, 1, 5, 2, 3))
        >>> o, _ = scanweaver.kda(q, k, v, -np.exp(g), rng.uniform(0, 1, (1, 5, 2)), use_qk_l2norm_in_kernel=True)
        >>> o.shape
        (1, 5, 2, 3)
    """
    return plans.call("kda", locals())  # the arguments by name, ``tunables`` the ** keywords


@_declare("rwkv7")
def rwkv7(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state: bool = False, cu_seqlens=None,
          cu_seqlens_cpu=None, safe_gate: bool = False, chunk_size=None, disable_recompute: bool = False,
          cp_context=None, lower_bound=None, *, backend: str = "auto", **tunables):
    """RWKV-7's time mixing, the generalised delta rule (flash-linear-attention's ``chunk_rwkv7``).

    Per batch element (or packed sequence) and head, ``w`` a log decay per key dimension::

        S_t = Diag(exp(w_t)) S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,    o_t = scale * S_t^T r_t

    Args:
        r, k: ``(B, T, H, K)``.  w, a, b: ``(B, T, HV, K)`` (RWKV-7 takes ``a = -kappa``, ``b = kappa * iclr``).
        v: ``(B, T, HV, V)``: HV = H as in RWKV-7, or a multiple of H (grouped value heads, as :func:`delta_rule`).
        scale: the output scale, 1.0 by default (None: ``K**-0.5``).
        initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, backend: as for :func:`delta_rule`.
        safe_gate, disable_recompute, lower_bound: steer fla's kernels; no effect here.
        chunk_size: a hint for the chunked form (no effect on the result beyond rounding).
        cp_context: must be None.
        **tunables: as for :func:`delta_rule`.

    Returns:
        ``(o, final_state)`` as :func:`delta_rule`.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> r, w, k, v, kappa = rng.normal(size=(5, 1, 4, 2, 3))
        >>> kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
        >>> o, h = scanweaver.rwkv7(r, -np.exp(w), k, v, -kappa, 0.5 * kappa, output_final_state=True)
        >>> o.shape, h.shape
        ((1, 4, 2, 3), (1, 2, 3, 3))
    """
    return plans.call("rwkv7", locals())  # the arguments by name, ``tunables`` the ** keywords
