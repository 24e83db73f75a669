"""``scanweaver.delta_rule``: DeltaNet's recurrence with flash-linear-attention's ``chunk_delta_rule`` semantics.

A thin layer over the fused operation :mod:`scanweaver.fused.delta_rule`:
inputs are checked and brought to one dtype and layout, the backend's
``run_fused`` runs the kernel, and the output is scaled.
"""

from __future__ import annotations

import numpy as np

from ...calls.declare import operation
from ...arrays import check_seqlens
from ...calls import runner
from ...errors import ScanInputError
from ...fused.delta_rule import DeltaRuleFeatures

API = "delta_rule"


def _array(name: str, x, ndim: int, layout: str) -> np.ndarray:
    if x is None:
        raise ScanInputError(f"{API}: {name} is required, shaped {layout}")
    a = np.asarray(x)
    if a.ndim != ndim:
        raise ScanInputError(f"{API}: {name} has shape {a.shape}; it must be {layout}")
    if a.dtype.kind not in "fiub":
        raise ScanInputError(f"{API}: {name} has dtype {a.dtype}; it must be real (float32 or float64)")
    return a


@operation(arrays=("q", "k", "v", "beta", "initial_state"), frameworks=())
def delta_rule(q, k, v, beta, *, scale: float | None = None, initial_state=None, output_final_state: bool = False,
               cu_seqlens=None, backend: str = "auto"):
    """DeltaNet's delta rule (fla ``chunk_delta_rule`` semantics), forward.

    Per batch element (or packed sequence) and head, with the state S of shape (K, V)::

        S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = scale * S_t^T q_t

    Args:
        q, k: ``(batch, T, H, K)``; k is used as given (L2-normalise it first, as fla's callers do).
        v: ``(batch, T, H, V)``.
        beta: ``(batch, T, H)``, the writing strengths (usually in (0, 1)).
        scale: the output scale; ``K**-0.5`` when None.
        initial_state: ``(nseq, H, K, V)`` or None (zero).
        output_final_state: also return the final states ``(nseq, H, K, V)``.
        cu_seqlens: ``nseq + 1`` integer offsets of sequences packed along T (batch 1), or None.
        backend: a backend name, or ``auto`` (the best available one that runs it).

    Returns:
        ``(o, final_state)``: o ``(batch, T, H, V)`` in the inputs' float dtype (float16 computes in float32);
        final_state None unless ``output_final_state``.

    Raises:
        ScanInputError: a shape, dtype or ``cu_seqlens`` that does not fit, named with what it needs.
        BackendUnavailable: ``backend`` does not run the delta rule.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> q, k, v = rng.normal(size=(3, 1, 6, 2, 4))
        >>> k /= np.linalg.norm(k, axis=-1, keepdims=True)
        >>> o, h = scanweaver.delta_rule(q, k, v, rng.uniform(0, 1, (1, 6, 2)), output_final_state=True)
        >>> o.shape, h.shape
        ((1, 6, 2, 4), (1, 2, 4, 4))
    """
    qa = _array("q", q, 4, "(batch, T, H, K)")
    batch, T, H, K = qa.shape
    ka = _array("k", k, 4, "(batch, T, H, K)")
    va = _array("v", v, 4, "(batch, T, H, V)")
    ba = _array("beta", beta, 3, "(batch, T, H)")
    if ka.shape != qa.shape:
        raise ScanInputError(f"{API}: k has shape {ka.shape}; it needs q's shape {qa.shape}")
    if va.shape[:3] != (batch, T, H):
        raise ScanInputError(f"{API}: v has shape {va.shape}; it needs (batch, T, H, V) = ({batch}, {T}, {H}, V)")
    if ba.shape != (batch, T, H):
        raise ScanInputError(f"{API}: beta has shape {ba.shape}; it needs (batch, T, H) = {(batch, T, H)}")
    V = va.shape[-1]
    cu = None if cu_seqlens is None else check_seqlens(API, cu_seqlens, T, batch)
    nseq = batch if cu is None else cu.size - 1
    h0 = None if initial_state is None else _array("initial_state", initial_state, 4, "(nseq, H, K, V)")
    if h0 is not None and h0.shape != (nseq, H, K, V):
        raise ScanInputError(f"{API}: initial_state has shape {h0.shape}; it needs (nseq, H, K, V) = "
                             f"{(nseq, H, K, V)}")
    kinds = [qa, ka, va, ba] + ([h0] if h0 is not None else [])
    dtype = np.result_type(np.float32, *(a.dtype for a in kinds))
    if dtype not in (np.float32, np.float64):
        dtype = np.dtype(np.float64)
    features = DeltaRuleFeatures(dtype.name, K, V, h0 is not None, cu is not None)
    sizes = {"batch": batch, "T": T, "H": H, "Hq": H, "nseq": nseq}
    arrays = {n: np.ascontiguousarray(a, dtype) for n, a in (("q", qa), ("k", ka), ("v", va), ("beta", ba))}
    arrays.update(h0=None if h0 is None else np.ascontiguousarray(h0, dtype), cu_seqlens=cu,
                  o=np.empty((batch, T, H, V), dtype), hlast=np.empty((nseq, H, K, V), dtype))
    runner.run("delta_rule", "forward", features, arrays, sizes, backend=backend, api=API)
    o = arrays["o"]
    o *= dtype.type(K ** -0.5 if scale is None else scale)
    return o, (arrays["hlast"] if output_final_state else None)
