"""``delta_rule``: the delta-rule family (DeltaNet, Gated DeltaNet, KDA, RWKV-7), one fused operation.

A K x V matrix state per batch element b (or packed sequence) and value head
h whose transition is a diagonal plus a rank-one matrix.  With ``D_t`` the
decay (``gate``: ``none`` 1; ``scalar`` exp(g_t), g ``(batch, T, H)``;
``key`` Diag(exp(g_t)) over the K rows, g ``(batch, T, H, K)``), the two
*forms* are, from ``S_{-1}`` = h0 (or 0)::

    delta:  S'_t = D_t S_{t-1};  u_t = beta_t (v_t - S'_t^T k_t);  S_t = S'_t + k_t u_t^T
            = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T
    dplr:   S_t = D_t S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T
    o_t = S_t^T q_t

``delta`` with gate ``none`` is DeltaNet (flash-linear-attention's
``delta_rule_recurrence``), ``scalar`` Gated DeltaNet
(``naive_recurrent_gated_delta_rule``: decay first, then the delta update of
the decayed state), ``key`` KDA (``naive_recurrent_kda``).  ``dplr`` with
gate ``key`` is RWKV-7 (``dplr_recurrence`` / ``chunk_rwkv7``: q = r, g = w,
a_t^T applied to the undecayed S_{t-1}).  Both forms are ``S_t = A_t S_{t-1}
+ c_t v_t^T`` with ``A_t = (I + x_t y_t^T) D_t`` (delta: x = -beta k,
y = D k absorbed) or ``D_t + b_t a_t^T`` (dplr).

``l2norm`` normalises q_t and k_t in the kernel, ``x / sqrt(sum x^2 + 1e-6)``
(fla's ``use_qk_l2norm_in_kernel``).  q, k ``(batch, T, Hq, K)`` with ``H %
Hq == 0`` (value head h reads q/k head ``h // (H // Hq)``: fla's grouped
value heads, its HV = our H); v, o ``(batch, T, H, V)``; beta ``(batch, T,
H)``; a, b ``(batch, T, H, K)``; states ``(nseq, H, K, V)``; ``cu_seqlens``
(int64, ``nseq + 1`` offsets, batch 1) packs sequences, each from its own row
of h0.  The output scale is applied by the named operations (o is linear in
it; the backward takes ``scale * do``).  dtype float32 or float64 is stored
and accumulated as such; float16 and bfloat16 are storage (q, k, v, g, beta,
a, b, o and their gradients) with float32 accumulation and float32 states.

Backward, G_t = dL/dS_t (the transposed transition in reverse, G_{T-1} from
dhlast), per step from the last, with q, k the normalised ones::

    G_t += q_t do_t^T;  dq_t = S_t do_t
    delta:  du = G_t^T k_t;  r = v_t - S'_t^T k_t;  u = beta_t r
            dv_t = beta_t du;  dbeta_t = du . r;  dk_t = G_t u - beta_t S'_t du
            Gs = G_t - beta_t k_t du^T (= dL/dS'_t);  dg_t = rows(S'_t o Gs);  G_{t-1} = D_t Gs
    dplr:   p = a_t^T S_{t-1};  dp = G_t^T b_t
            dv_t = G_t^T k_t;  dk_t = G_t v_t;  db_t = G_t p;  da_t = S_{t-1} dp
            dg_t = D_t rows(G_t o S_{t-1});  G_{t-1} = D_t G_t + a_t dp^T
    dh0 = G_{-1}

``rows(X)`` sums each row over V (``key``), and over K as well (``scalar``);
dg is ``D`` times the derivative in D, so a decay of 0 (g = -inf) gives 0,
never NaN.  dq and dk sum over each group's heads, then pass back through the
normalisation, ``dx = (dy - y (y . dy)) / sqrt(sum x^2 + 1e-6)``.  States are
never kept for every step: :func:`backward_reference`, like the kernels,
saves S every ``C ~ sqrt(length)`` steps and recomputes each chunk's states
from its checkpoint in the reverse sweep.

:func:`forward_reference` and :func:`backward_reference` are the definition
every kernel is checked against (the backward against finite differences in
the tests).  The C kernels have the tunable ``algorithm``: ``recurrent``, or
``chunked``, the WY (UT transform) form on chunks of ``chunk`` steps: the
forward and the backward of both forms (by default the backward from 1024
steps with K x V >= 4096, 8192 with a decay per key, the ``delta`` form's
forward from K x V >= 16384: :attr:`DeltaRule.chunked_from`); the GPU kernels both parts of both forms
(:mod:`scanweaver.targets.delta_gpu_chunked`,
:mod:`scanweaver.targets.delta_gpu_chunked_backward`); ScanWeaver.jl (``julia``)
both parts of both forms (``src/matrix/delta_chunked.jl``, ``src/matrix/delta_chunked_backward.jl``; its
backward on the CPU).

Example:
    >>> import numpy as np
    >>> from scanweaver.fused.delta_rule import forward_reference
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 5, 2, 4))
    >>> o, h = forward_reference(q, k, v, rng.uniform(0, 1, (1, 5, 2)), g=-rng.uniform(0, 1, (1, 5, 2)))
    >>> o.shape, h.shape
    ((1, 5, 2, 4), (1, 2, 4, 4))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ScanInputError
from ..schedules.base import Tunable, non_negative, power_of_two_between
from .base import PARTS, FusedOp, Param, register
from .matrix_state import (GPU_MAX_CHUNK, GPU_TUNABLES, JULIA_TUNABLES, MAX_CHUNK, _between, _heads, _segments,
                           check_offsets)

GATES = ("none", "scalar", "key")
FORMS = ("delta", "dplr")
DTYPES = ("float32", "float64", "float16", "bfloat16")
#: The storage-only dtypes (float32 accumulation, float32 states).
HALF = ("float16", "bfloat16")
#: fla's l2norm epsilon: x / sqrt(sum x^2 + L2_EPS).
L2_EPS = 1e-6


@dataclass(frozen=True)
class DeltaRuleFeatures:
    """Compile-time features of one delta-rule kernel (a key of the kernel caches).

    Attributes:
        dtype: ``float32``/``float64`` (stored and accumulated), ``float16``/``bfloat16`` (stored; float32
            accumulation and states).
        K, V: the state's rows (key dim) and columns (value dim).
        has_h0: an initial state is given.
        has_seqlens: packed sequences (``cu_seqlens``; batch is 1).
        has_dhlast: (backward) a gradient of the final state is given.
        gate: ``none``, ``scalar`` (one log decay per head and step) or ``key`` (one per key row).
        form: ``delta`` (beta) or ``dplr`` (a, b).
        l2norm: q and k are L2-normalised in the kernel.
    """

    dtype: str
    K: int
    V: int
    has_h0: bool = False
    has_seqlens: bool = False
    has_dhlast: bool = False
    gate: str = "none"
    form: str = "delta"
    l2norm: bool = False

    def __post_init__(self) -> None:
        for name, value, allowed in (("dtype", self.dtype, DTYPES), ("gate", self.gate, GATES),
                                     ("form", self.form, FORMS)):
            if value not in allowed:
                raise ScanInputError(f"delta_rule: {name}={value!r}; it must be one of {', '.join(allowed)}")
        if not (isinstance(self.K, int) and isinstance(self.V, int) and self.K > 0 and self.V > 0):
            raise ScanInputError(f"delta_rule: K={self.K!r}, V={self.V!r}; both must be positive ints")

    @property
    def state_dtype(self) -> str:
        """The dtype of the states (h0, hlast, dhlast, dh0) and of the accumulation."""
        return "float32" if self.dtype in HALF else self.dtype


def storage(name: str) -> np.dtype:
    """The NumPy dtype named ``name`` (``bfloat16`` from ml_dtypes, imported only when asked for)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as exc:
            raise ScanInputError("delta_rule: bfloat16 needs ml_dtypes (pip install ml_dtypes)") from exc
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


#: The CPU kernels' algorithms: the fused recurrence, or the chunked WY (UT transform) form.
ALGORITHMS = ("recurrent", "chunked")
#: The CPU (C) kernels' tunables.
C_TUNABLES = (
    Tunable("algorithm", "recurrent", ALGORITHMS, "algorithm: the fused recurrence (the default) or the chunked WY "
            "form, forward and backward (bench/delta_chunked.py)",
            lambda v: None if v in ALGORITHMS else f"it must be one of {', '.join(ALGORITHMS)}"),
    Tunable("chunk", 32, (16, 32, 64, 128), "time steps per chunk of the chunked form (any length from 1 to "
            f"{MAX_CHUNK}; results do not depend on it; 16 or 32 ran fastest, bench/delta_chunked.py)",
            lambda v: _between(v, 1, MAX_CHUNK)),
    Tunable("block_v", 64, (16, 32, 64, 128), "value columns of the state per work item (columns are independent)",
            power_of_two_between(4, 512)),
    Tunable("checkpoint", 8, (4, 8, 16, 32), "backward: steps between saved states (a chunk's states are "
            "recomputed from its checkpoint)", power_of_two_between(1, 256)),
    Tunable("width", 8, (4, 8, 16), "lanes per vector; the default follows the CPU's vectors",
            power_of_two_between(4, 16)),
    Tunable("threads", 0, (0, 1, 2, 4, 8, 16), "OpenMP threads; 0 uses the free cores",
            lambda v: non_negative(v) or _between(v, 0, 1024)),
)

#: The GPU (OpenCL, CUDA) kernels' tunables: the matrix-state kernels', the split of K over work-items, and the
#: algorithm of the ``delta`` form (the chunked WY form: :mod:`scanweaver.targets.delta_gpu_chunked`, its backward
#: :mod:`scanweaver.targets.delta_gpu_chunked_backward`).
GPU_DELTA_TUNABLES = (*GPU_TUNABLES, Tunable(
    "key_split", 4, (1, 2, 4, 8), "work-items per state column, each keeping K / key_split of its rows in "
    "registers (a workgroup sum joins their dots)", power_of_two_between(1, 64)),
    Tunable("algorithm", "recurrent", ALGORITHMS, "the fused recurrence (the default) or the chunked WY form, "
            "forward and backward (DeltaNet, Gated DeltaNet, KDA; not timed on a GPU yet); RWKV-7 runs the "
            "recurrence", lambda v: None if v in ALGORITHMS else f"it must be one of {', '.join(ALGORITHMS)}"),
    Tunable("chunk", 32, (16, 32, 64), f"time steps per chunk of the chunked form (any length from 1 to "
            f"{GPU_MAX_CHUNK}; results do not depend on it)", lambda v: _between(v, 1, GPU_MAX_CHUNK)))

#: ScanWeaver.jl's (``julia`` backend) tunables: :data:`JULIA_TUNABLES`, and the algorithm (the chunked WY form of
#: either transition: the forward in KernelAbstractions kernels, ``src/matrix/delta_chunked.jl``; the backward's
#: chunk states and adjoints too, then the recurrence's gradients per chunk on the CPU,
#: ``src/matrix/delta_chunked_backward.jl``) with its ``chunk``.
JULIA_DELTA_TUNABLES = (*JULIA_TUNABLES, Tunable(
    "algorithm", "recurrent", ALGORITHMS, "the fused recurrence (the default) or the chunked WY form, forward and "
    "backward (DeltaNet, Gated DeltaNet, KDA, RWKV-7; the backward runs on the CPU)",
    lambda v: None if v in ALGORITHMS else f"it must be one of {', '.join(ALGORITHMS)}"),
    Tunable("chunk", 32, (16, 32, 64, 128), f"time steps per chunk of the chunked form (any length from 1 to "
            f"{MAX_CHUNK}; results do not depend on it)", lambda v: _between(v, 1, MAX_CHUNK)))

#: Inputs, optional inputs, sizes (H: heads of v/o and of the state; Hq: heads of q/k).
_IN = ("q", "k", "v")
_OPT_IN = ("g", "beta", "a", "b", "h0", "cu_seqlens")
_SIZES = ("batch", "T", "H", "Hq", "nseq")
_STATES = ("h0", "hlast", "dhlast", "dh0")
_SWITCH = {"h0": "has_h0", "dh0": "has_h0", "cu_seqlens": "has_seqlens", "dhlast": "has_dhlast"}


@register
class DeltaRule(FusedOp):
    """The delta-rule family: a diagonal-plus-rank-one transition of a matrix state and its readout, fused."""

    name = "delta_rule"
    description = ("delta rule S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T or D_t S_{t-1} + "
                   "b_t a_t^T S_{t-1} + k_t v_t^T read by q_t (DeltaNet, Gated DeltaNet, KDA, RWKV-7)")
    parts = PARTS
    tunables = {"c": C_TUNABLES, "gpu": GPU_DELTA_TUNABLES, "julia": JULIA_DELTA_TUNABLES}
    implementations = {"numpy": PARTS, "c": PARTS, "opencl": PARTS, "cuda": PARTS, "julia": PARTS}
    #: The C kernels have the chunked (WY) form of both parts for both forms (RWKV-7's backward:
    #: :mod:`scanweaver.targets.delta_c_chunked_backward`), and so have the GPU kernels
    #: (:mod:`scanweaver.targets.delta_gpu_chunked_backward`), and so has ScanWeaver.jl.
    chunked_parts = {"c": PARTS, "gpu": PARTS, "julia": PARTS}
    #: The algorithm rule (bench/results/delta_chunked.json, float32, 2 threads, quiet cores, chunks of 32): the
    #: chunked backward from 1024 steps per sequence with K * V >= 4096 for a decay per head or none (DeltaNet,
    #: Gated DeltaNet: 1.09-1.36x the recurrent one's speed at K = V = 64 over three runs, 1.77x at K = 64,
    #: V = 128) and K * V >= 8192 for a decay per key (KDA, RWKV-7: 0.84-1.33x at K = V = 64, about even, and
    #: 1.13-1.19x at K = 64, V = 128); every family 1.42-2.22x at K = V = 128 (T = 1024 and 4096); the chunked
    #: forward of the ``delta`` form (``delta_form``) from K * V >= 16384, where it ran 1.08-1.62x the recurrent
    #: one's speed at K = V = 128 (once 0.92x, KDA's) and 0.54-0.99x at K * V = 4096 and 8192; RWKV-7's forward
    #: stays recurrent (its chunked one ran at 0.59-0.95x).
    chunked_from = {"c": {"backward": ((1024, 4096, "head_decay"), (1024, 8192)),
                          "forward": ((1024, 16384, "delta_form"),)}}
    backward_only = frozenset({"checkpoint"})

    def condition(self, name: str, features: DeltaRuleFeatures, sizes: dict[str, int]) -> bool:
        """``delta_form``: the ``delta`` form (DeltaNet, Gated DeltaNet, KDA), not RWKV-7's; ``head_decay``: a log
        decay per head or none (DeltaNet, Gated DeltaNet), not one per key (KDA, RWKV-7)."""
        if name == "delta_form":
            return getattr(features, "form", "delta") == "delta"
        if name == "head_decay":
            return getattr(features, "gate", "none") != "key"
        return super().condition(name, features, sizes)

    def work(self, features: DeltaRuleFeatures, sizes: dict[str, int]) -> int:
        """``batch * T * H * K * V`` state elements per forward call."""
        return sizes.get("batch", 1) * sizes.get("T", 1) * sizes.get("H", 1) * features.K * features.V

    def params(self, part: str) -> tuple[Param, ...]:
        return _params(part)

    def shapes(self, part, features: DeltaRuleFeatures, sizes):
        B, T, H, Hq, nseq = (sizes[n] for n in _SIZES)
        K, V = features.K, features.V
        qk, vo, hk, state = (B, T, Hq, K), (B, T, H, V), (B, T, H, K), (nseq, H, K, V)
        g = hk if features.gate == "key" else (B, T, H)
        out = {"q": qk, "k": qk, "v": vo, "g": g, "beta": (B, T, H), "a": hk, "b": hk, "h0": state,
               "cu_seqlens": (nseq + 1,), "o": vo, "hlast": state, "do": vo, "dhlast": state}
        out.update({"d" + n: out[n] for n in ("q", "k", "v", "g", "beta", "a", "b", "h0")})
        return {p.name: out[p.name] for p in self.params(part) if p.kind != "int"}

    def enabled(self, name: str, features: DeltaRuleFeatures) -> bool:
        """True when the optional parameter ``name`` is used by a kernel with ``features``."""
        base = name[1:] if name in ("dg", "dbeta", "da", "db") else name
        if base == "g":
            return features.gate != "none"
        if base == "beta":
            return features.form == "delta"
        if base in ("a", "b"):
            return features.form == "dplr"
        flag = _SWITCH.get(name)
        return flag is None or bool(getattr(features, flag))

    def layout(self, part: str, features: DeltaRuleFeatures, sizes: tuple) -> list:
        """As :meth:`FusedOp.layout`, with the states in :attr:`DeltaRuleFeatures.state_dtype`."""
        key = (part, features, sizes)
        memo = self.__dict__.setdefault("_layouts", {})
        if key not in memo:
            shapes = self.shapes(part, features, dict(sizes))
            data, state = storage(features.dtype), np.dtype(features.state_dtype)
            if len(memo) > 256:
                memo.clear()
            memo[key] = [(p, self.enabled(p.name, features), tuple(shapes.get(p.name, ())),
                          np.dtype(p.dtype) if p.dtype else state if p.name in _STATES else data)
                         for p in self.params(part)]
        return memo[key]

    def arguments(self, part, features, arrays, sizes, api):
        if sizes["Hq"] <= 0 or sizes["H"] % sizes["Hq"]:
            raise ScanInputError(f"{api}: H = {sizes['H']} value heads must be a multiple of Hq = {sizes['Hq']} "
                                 "query/key heads")
        out = super().arguments(part, features, arrays, sizes, api)
        if features.has_seqlens and isinstance(arrays["cu_seqlens"], np.ndarray):
            # device offsets are the device copy of host offsets checked by the operands (reading them back
            # here would wait for the device)
            check_offsets(api, arrays["cu_seqlens"], sizes["T"])
        return out

    def reference(self, part, features: DeltaRuleFeatures, arrays, sizes) -> None:
        kw = {n: (arrays.get(n) if self.enabled(n, features) else None) for n in _OPT_IN}
        kw["l2norm"] = features.l2norm
        q, k, v = (arrays[n] for n in _IN)
        if part == "forward":
            o, h = forward_reference(q, k, v, **kw)
            arrays["o"][...] = o
            if arrays.get("hlast") is not None:
                arrays["hlast"][...] = h
            return
        grads = backward_reference(q, k, v, **kw, do=arrays["do"],
                                   dhlast=arrays.get("dhlast") if features.has_dhlast else None)
        for name, value in grads.items():
            if arrays.get(name) is not None and value is not None:
                arrays[name][...] = value


@functools.cache
def _params(part: str) -> tuple[Param, ...]:
    """:meth:`DeltaRule.params` (the same tuple every time)."""
    ins = [Param(n, "in") for n in _IN] + [Param(n, "in", True, "int64" if n == "cu_seqlens" else "")
                                           for n in _OPT_IN]
    sizes = [Param(n, "int") for n in _SIZES]
    if part == "forward":
        return (*ins, Param("o", "out"), Param("hlast", "out", True), *sizes)
    outs = [Param(n, "out") for n in ("dq", "dk", "dv")] + [Param(n, "out", True)
                                                            for n in ("dg", "dbeta", "da", "db", "dh0")]
    return (*ins, Param("do", "in"), Param("dhlast", "in", True), *outs, *sizes)


class _Problem:
    """The operands of one call in the accumulation dtype: q and k (normalised) per value head."""

    def __init__(self, q, k, v, g, beta, a, b, l2norm: bool):
        self.store = v.dtype
        self.acc = np.dtype(np.float32) if v.dtype.name in HALF else v.dtype
        q, k, self.v = (np.asarray(x).astype(self.acc) for x in (q, k, v))
        opt: list[Any] = [None if x is None else np.asarray(x).astype(self.acc) for x in (g, beta, a, b)]
        self.g, self.beta, self.a, self.b = opt
        self.rq: Any = None
        self.rk: Any = None
        if l2norm:
            self.rq = 1 / np.sqrt((q * q).sum(-1, keepdims=True) + self.acc.type(L2_EPS))
            self.rk = 1 / np.sqrt((k * k).sum(-1, keepdims=True) + self.acc.type(L2_EPS))
            q, k = q * self.rq, k * self.rk
        self.qn, self.kn = q, k
        self.batch, self.T, self.H, self.V = self.v.shape
        self.q, self.k = _heads(q, self.H), _heads(k, self.H)
        self.dplr = self.a is not None

    def decay(self, b: int, t: int):
        """D_t as ``(H, K or 1, 1)``, or None without a gate (exp(-inf) = 0: an exact reset)."""
        if self.g is None:
            return None
        d = np.exp(self.g[b, t])
        return d[:, None, None] if d.ndim == 1 else d[:, :, None]

    def step(self, S, b: int, t: int):
        """S_t from S_{t-1} (``(H, K, V)``)."""
        d, k, v = self.decay(b, t), self.k[b, t], self.v[b, t]
        if self.dplr:
            p = np.einsum("hkv,hk->hv", S, self.a[b, t])
            return (S if d is None else d * S) + self.b[b, t][:, :, None] * p[:, None, :] + k[:, :, None] * v[:, None]
        Sp = S if d is None else d * S
        u = self.beta[b, t][:, None] * (v - np.einsum("hkv,hk->hv", Sp, k))
        return Sp + k[:, :, None] * u[:, None, :]

    def start(self, h0, row: int):
        K = self.q.shape[-1]
        return np.zeros((self.H, K, self.V), self.acc) if h0 is None else np.array(h0[row], self.acc)


def forward_reference(q, k, v, beta=None, *, g=None, a=None, b=None, l2norm=False, h0=None, cu_seqlens=None):
    """``(o, hlast)`` of the delta rule in NumPy: o in v's dtype, hlast in the accumulation dtype.

    The gate is ``none`` without g, ``scalar`` for g ``(batch, T, H)``, ``key`` for ``(batch, T, H, K)``;
    the form is ``dplr`` when a and b are given, else ``delta`` (beta).

    Args:
        q, k: ``(batch, T, Hq, K)``.  v: ``(batch, T, H, V)``.  beta: ``(batch, T, H)`` (delta).
        g: log decays or None.  a, b: ``(batch, T, H, K)`` (dplr).  l2norm: normalise q and k.
        h0: ``(nseq, H, K, V)`` or None.  cu_seqlens: ``nseq + 1`` offsets into T (batch 1), or None.
    """
    P = _Problem(q, k, v, g, beta, a, b, l2norm)
    segs = _segments(P.T, P.batch, cu_seqlens)
    o = np.zeros(P.v.shape, P.acc)
    hlast = np.zeros((len(segs), P.H, P.q.shape[-1], P.V), P.acc)
    with np.errstate(over="ignore", under="ignore"):
        for row, bi, start, stop in segs:
            S = P.start(h0, row)
            for t in range(start, stop):
                S = P.step(S, bi, t)
                o[bi, t] = np.einsum("hk,hkv->hv", P.q[bi, t], S)
            hlast[row] = S
    return o.astype(P.store), hlast


def backward_reference(q, k, v, beta=None, *, g=None, a=None, b=None, l2norm=False, h0=None, cu_seqlens=None,
                       do, dhlast=None) -> dict[str, np.ndarray | None]:
    """Every gradient of :func:`forward_reference`'s ``o`` (and ``hlast``) given ``do`` (and ``dhlast``).

    Returns ``dq, dk`` (q/k's layout, summed over each group's heads, through the normalisation), ``dv``,
    ``dg``, ``dbeta``, ``da``, ``db`` (None where the input is) in the inputs' dtype, and ``dh0`` ``(nseq,
    H, K, V)`` in the accumulation dtype.  States are saved every ``ceil(sqrt(length))`` steps and each
    chunk's recomputed from its checkpoint.
    """
    P = _Problem(q, k, v, g, beta, a, b, l2norm)
    do = np.asarray(do).astype(P.acc)
    segs = _segments(P.T, P.batch, cu_seqlens)
    dqh, dkh, dv = np.zeros(P.q.shape, P.acc), np.zeros(P.k.shape, P.acc), np.zeros(P.v.shape, P.acc)
    grads = {n: None if x is None else np.zeros(x.shape, P.acc)
             for n, x in (("dg", P.g), ("dbeta", P.beta), ("da", P.a), ("db", P.b))}
    dh0 = np.zeros((len(segs), P.H, P.q.shape[-1], P.V), P.acc)
    with np.errstate(over="ignore", under="ignore"):
        for row, bi, start, stop in segs:
            C = max(1, math.isqrt(max(stop - start - 1, 0)) + 1)
            S, saved = P.start(h0, row), []
            for t in range(start, stop):
                if (t - start) % C == 0:
                    saved.append(S)
                S = P.step(S, bi, t)
            G = np.zeros_like(S) if dhlast is None else np.array(dhlast[row], P.acc)
            for c in reversed(range(len(saved))):
                steps = range(start + c * C, min(stop, start + (c + 1) * C))
                states = [saved[c]]
                for t in steps:
                    states.append(P.step(states[-1], bi, t))
                for i in reversed(range(len(steps))):
                    G = _back(P, G, states[i], states[i + 1], bi, steps[i], do[bi, steps[i]], dqh, dkh, dv, grads)
            dh0[row] = G
    out = {"dq": _through_norm(P, dqh, P.qn, P.rq), "dk": _through_norm(P, dkh, P.kn, P.rk), "dv": dv, **grads}
    out = {n: None if x is None else x.astype(P.store) for n, x in out.items()}
    return {**out, "dh0": dh0}


def _back(P: _Problem, G, prev, cur, b: int, t: int, do, dqh, dkh, dv, grads):
    """One reverse step: the gradients of step t from G = dL/dS_t (less q_t's share); returns dL/dS_{t-1}."""
    q, k, v, d = P.q[b, t], P.k[b, t], P.v[b, t], P.decay(b, t)
    G = G + q[:, :, None] * do[:, None, :]
    dqh[b, t] = np.einsum("hkv,hv->hk", cur, do)
    if P.dplr:
        a, bb = P.a[b, t], P.b[b, t]
        p = np.einsum("hkv,hk->hv", prev, a)
        dp = np.einsum("hkv,hk->hv", G, bb)
        dv[b, t] = np.einsum("hkv,hk->hv", G, k)
        dkh[b, t] = np.einsum("hkv,hv->hk", G, v)
        grads["db"][b, t] = np.einsum("hkv,hv->hk", G, p)
        grads["da"][b, t] = np.einsum("hkv,hv->hk", prev, dp)
        if d is not None:
            rows = (G * prev).sum(-1) * d[:, :, 0]
            grads["dg"][b, t] = rows if P.g.ndim == 4 else rows.sum(-1)
        return (G if d is None else d * G) + a[:, :, None] * dp[:, None, :]
    beta = P.beta[b, t][:, None]
    Sp = prev if d is None else d * prev
    r = v - np.einsum("hkv,hk->hv", Sp, k)
    du = np.einsum("hkv,hk->hv", G, k)
    dv[b, t] = beta * du
    grads["dbeta"][b, t] = (du * r).sum(-1)
    dkh[b, t] = np.einsum("hkv,hv->hk", G, beta * r) - beta * np.einsum("hkv,hv->hk", Sp, du)
    Gs = G - beta[:, :, None] * k[:, :, None] * du[:, None, :]
    if d is None:
        return Gs
    rows = (Sp * Gs).sum(-1)
    grads["dg"][b, t] = rows if P.g.ndim == 4 else rows.sum(-1)
    return d * Gs


def _through_norm(P: _Problem, dh, y, rstd):
    """Per-value-head gradients of q or k summed over each group, then through the L2 normalisation."""
    B, T, Hq, K = y.shape
    dy = dh.reshape(B, T, Hq, P.H // Hq, K).sum(3)
    return dy if rstd is None else rstd * (dy - y * (y * dy).sum(-1, keepdims=True))
