"""``matrix_state``: scans whose state is a K x V matrix per head, fused, forward and backward.

The one operation behind Mamba-2 (SSD), gated linear attention (GLA), simple
GLA / RetNet / lightning attention and RWKV-6: per batch element b (or packed
sequence) and head h, with the state ``S`` of shape ``(K, V)``::

    D_t  = exp(g_t)                  scalar (decay="scalar": g (batch, T, H)),
                                     per key row (decay="key": g (batch, T, H, K)),
                                     or 1 (decay="none")
    S_t  = D_t * S_{t-1} + k_t v_t^T                                  (S_{-1} = h0, or 0)
    o_t  = S_t^T q_t                                   (readout="after": Mamba-2, GLA, RetNet)
    o_t  = S_{t-1}^T q_t + (q_t . (u * k_t)) v_t       (readout="bonus": RWKV-6, u (H, K))

``q`` and ``k`` have ``Hq`` heads with ``H % Hq == 0`` (head h reads q/k head
``h // (H // Hq)``: Mamba-2's groups of B and C); ``v`` and ``o`` have ``H``.
Layouts are flash-linear-attention's: q, k ``(batch, T, Hq, K)``, v, o
``(batch, T, H, V)``, states ``(nseq, H, K, V)``.  Packed sequences
(``cu_seqlens``, an int64 array of ``nseq + 1`` offsets with batch 1) start
each sequence from its own row of h0 (or zero) and end in its own row of
hlast.  ``reverse`` runs t from the end of each sequence to its start.  The
output scale (``K**-0.5`` for attention) is applied by the named operations
around this one: o is linear in it, and the backward takes ``scale * do``.

Backward, with G_t = dL/dS_t (a reverse affine recurrence on the transposed
state, the design notes' adjoint)::

    after:  G_t = q_t do_t^T + D_{t+1} * G_{t+1}   (G_{T-1} also gets dhlast)
            dq_t = S_t do_t;  dk_t = G_t v_t;  dv_t = G_t^T k_t
            dg_t = D_t * sum_v(G_t * S_{t-1})  (per row for "key"; summed over rows for "scalar")
            dh0  = D_0 * G_0
    bonus:  G_t = q_{t+1} do_{t+1}^T + D_{t+1} * G_{t+1}   (G_{T-1} = dhlast)
            w_t = v_t . do_t
            dq_t = S_{t-1} do_t + (u * k_t) w_t;  dk_t = G_t v_t + u * q_t w_t
            dv_t = G_t^T k_t + (q_t . (u * k_t)) do_t;  du = sum_t q_t * k_t * w_t
            dg_t = D_t * sum_v(G_t * S_{t-1});  dh0 = q_0 do_0^T + D_0 * G_0

With groups, dq and dk sum over the heads of their group.  The states are
never stored for all t: kernels recompute them from checkpoints.  The NumPy
functions here are the definition every kernel is checked against, next to
the plain float64 loops of the tests.

Example:
    >>> import numpy as np
    >>> from scanweaver.fused.matrix_state import forward_reference
    >>> rng = np.random.default_rng(0)
    >>> q, k = rng.normal(size=(2, 1, 5, 1, 3))
    >>> v, g = rng.normal(size=(1, 5, 1, 4)), -rng.uniform(0.1, 1, (1, 5, 1))
    >>> o, h = forward_reference(q, k, v, g, decay="scalar")
    >>> o.shape, h.shape
    ((1, 5, 1, 4), (1, 1, 3, 4))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..checks import check_seqlens
from ..errors import ScanInputError
from ..schedules.base import Tunable, non_negative, positive, power_of_two_between
from .base import PARTS, FusedOp, Param, register

#: The decay forms and the readouts of :class:`MatrixStateFeatures`.
DECAYS = ("none", "scalar", "key")
READOUTS = ("after", "bonus")


def _columns_rule(value) -> str | None:
    return power_of_two_between(8, 1024)(value)


def _time_tile_rule(value) -> str | None:
    return positive(value) or (None if value <= 64 else "it must be between 1 and 64 (steps staged in local memory)")


#: Tunables of GPU kernels that keep one state column per work-item (the delta rule's).
GPU_TUNABLES = (
    Tunable("workgroup_size", 64, (8, 16, 32, 64, 128, 256), "state columns (V) per workgroup, one per work-item",
            _columns_rule),
    Tunable("time_tile", 16, (4, 8, 16, 32, 64), "time steps of q, k, g (v, do) staged in local memory at once",
            _time_tile_rule),
)


def _state_rule(value) -> str | None:
    return power_of_two_between(2, 64)(value)


def _between(value, lo: int, hi: int) -> str | None:
    return None if lo <= value <= hi else f"it must be between {lo} and {hi}"


#: The algorithms of the CPU and GPU kernels: the fused recurrence, or the chunked (matmul) form.
ALGORITHMS = ("recurrent", "chunked")
#: The longest chunk of the GPU chunked forward (its output kernel keeps a chunk x chunk tile of scores in local
#: memory: 16 KiB at 64 in float32).
GPU_MAX_CHUNK = 64
#: The matrix-state GPU (OpenCL, CUDA) kernels' tunables (:mod:`scanweaver.targets.fused_gpu_matrix_state`):
#: the state tiled over work-items, a column's keys (a row's values) split over ``state_per_item`` slots each;
#: the algorithm of both parts (the chunked forms: :mod:`scanweaver.targets.matrix_gpu_chunked`,
#: :mod:`scanweaver.targets.matrix_gpu_chunked_backward`).
MATRIX_GPU_TUNABLES = (
    Tunable("algorithm", "recurrent", ALGORITHMS, "the fused recurrence (the default, but for the backward on "
            "CUDA from 8192 steps: MatrixState.chunked_from, measured on an H200) or the chunked form (the "
            "forward's matmuls; the backward recomputes the states per chunk)",
            lambda v: None if v in ALGORITHMS else f"it must be one of {', '.join(ALGORITHMS)}"),
    Tunable("chunk", 64, (16, 32, 64), f"time steps per chunk of the chunked form (any length from 1 to "
            f"{GPU_MAX_CHUNK}; results do not depend on it)", lambda v: _between(v, 1, GPU_MAX_CHUNK)),
    Tunable("workgroup_size", 256, (32, 64, 128, 256, 512, 1024), "work-items per workgroup of every kernel",
            _columns_rule),
    Tunable("time_tile", 16, (2, 4, 8, 16, 32), "time steps of q, k, g (v, do) staged in local memory at once",
            _time_tile_rule),
    Tunable("state_per_item", 32, (8, 16, 32, 64), "state elements one work-item keeps in registers: a column's "
            "keys (forward, values kernel) or a row's values (keys kernel), the rest split over work-items whose "
            "partial sums meet in local memory", _state_rule),
)


@dataclass(frozen=True)
class MatrixStateFeatures:
    """Compile-time features of one matrix-state kernel (a key of the kernel caches).

    Attributes:
        dtype: ``float32`` or ``float64`` (storage and accumulation).
        K, V: the state's rows (key dim; Mamba-2's N) and columns (value dim; Mamba-2's P).
        decay: ``none``, ``scalar`` (one log decay per head and step) or ``key`` (one per key row).
        readout: ``after`` (o_t = S_t^T q_t) or ``bonus`` (RWKV-6: S_{t-1} plus u's bonus term).
        reverse: t runs from the end of each sequence to its start.
        has_h0: an initial state is given.
        has_seqlens: packed sequences (``cu_seqlens``; batch is 1).
        has_dhlast: (backward) a gradient of the final state is given.
    """

    dtype: str
    K: int
    V: int
    decay: str = "scalar"
    readout: str = "after"
    reverse: bool = False
    has_h0: bool = False
    has_seqlens: bool = False
    has_dhlast: bool = False

    def __post_init__(self) -> None:
        if self.decay not in DECAYS:
            raise ScanInputError(f"matrix_state: decay={self.decay!r}; it must be one of {', '.join(DECAYS)}")
        if self.readout not in READOUTS:
            raise ScanInputError(f"matrix_state: readout={self.readout!r}; it must be one of {', '.join(READOUTS)}")


#: The longest chunk of the chunked form: its scratch holds a few chunk x chunk tiles per thread (4 MiB each at
#: 1024 in float32), and its intra-chunk work grows with the chunk's square.
MAX_CHUNK = 1024
#: The ``chunk`` tunable of the chunked form (C and ScanWeaver.jl kernels).
CHUNK = Tunable("chunk", 64, (16, 32, 48, 64, 96, 128), "time steps per chunk of the chunked form (any length from "
                f"1 to {MAX_CHUNK}; results do not depend on it)", lambda v: _between(v, 1, MAX_CHUNK))
#: The CPU (C) kernels' tunables.
C_TUNABLES = (
    Tunable("algorithm", "recurrent", ALGORITHMS, "the fused recurrence or the chunked matmul form; by default "
            "the rule of MatrixState.chunked_from (measured by bench/linear_rnn.py --table)",
            lambda v: None if v in ALGORITHMS else f"it must be one of {', '.join(ALGORITHMS)}"),
    CHUNK,
    Tunable("block_v", 32, (16, 32, 64, 128), "value columns of the state per block (work item) of the recurrent form",
            power_of_two_between(4, 512)),
    Tunable("width", 8, (4, 8, 16), "lanes per vector; the default follows the CPU's vectors",
            power_of_two_between(4, 16)),
    Tunable("threads", 0, (0, 1, 2, 4, 8, 16), "OpenMP threads; 0 uses every core",
            lambda v: non_negative(v) or _between(v, 0, 1024)),
)

#: ScanWeaver.jl's (``julia`` backend) tunables: the device, and the workgroup of its kernels on a GPU.
JULIA_TUNABLES = (
    Tunable("workgroup_size", 64, (32, 64, 128, 256), "work-items per workgroup on a GPU (one per state column "
            "forward, per column or key row backward); the CPU runs blocks of columns as Julia tasks",
            lambda v: positive(v) or _between(v, 1, 1024)),
    Tunable("device", "cpu", ("cpu", "cuda", "amdgpu", "oneapi", "metal"), "the KernelAbstractions device",
            lambda v: None if v in ("cpu", "cuda", "amdgpu", "oneapi", "metal") else
            "it must be one of cpu, cuda, amdgpu, oneapi, metal"),
)
#: ScanWeaver.jl's matrix-state tunables: :data:`JULIA_TUNABLES` (shared with the delta rule's), and the
#: algorithm (``src/matrix/chunked.jl``, ``chunked_backward.jl``: the chunked form, forward and backward, in
#: KernelAbstractions kernels on every device) with its ``chunk``.
MATRIX_JULIA_TUNABLES = (
    *JULIA_TUNABLES,
    Tunable("algorithm", "recurrent", ALGORITHMS, "the fused recurrence or the chunked matmul form (forward and "
            "backward, KernelAbstractions kernels); recurrent unless asked",
            lambda v: None if v in ALGORITHMS else f"it must be one of {', '.join(ALGORITHMS)}"),
    CHUNK,
)

_IN = ("q", "k", "v")
_OPT_IN = ("g", "u", "h0", "cu_seqlens")
#: batch, T, H (heads of v/o), Hq (heads of q/k), nseq (rows of h0/hlast: batch, or the packed sequences).
_SIZES = ("batch", "T", "H", "Hq", "nseq")
#: Which optional array a feature switches on (``g``/``dg`` by ``decay``, ``u``/``du`` by ``readout``).
_SWITCH = {"h0": "has_h0", "dh0": "has_h0", "cu_seqlens": "has_seqlens", "dhlast": "has_dhlast"}


@register
class MatrixState(FusedOp):
    """Matrix-state scan (Mamba-2, GLA, RetNet, RWKV-6): decay, outer-product update and readout in one kernel."""

    name = "matrix_state"
    description = "matrix-state scan S_t = exp(g_t)*S_{t-1} + k_t v_t^T read by q_t (Mamba-2, GLA, RetNet, RWKV-6)"
    parts = PARTS
    tunables = {"c": C_TUNABLES, "gpu": MATRIX_GPU_TUNABLES, "julia": MATRIX_JULIA_TUNABLES}
    implementations = {"numpy": PARTS, "c": PARTS, "opencl": PARTS, "cuda": PARTS, "julia": PARTS}
    #: The algorithm rule (bench/results/linear_rnn_algorithms.json, float32 on every core): the chunked backward
    #: from 1024 steps per sequence with K * V >= 4096, and from 256 with K * V >= 8192 (faster at 23 of the 24
    #: such shapes measured, Mamba-2, GLA and RWKV-6: the recurrent one took 1.05-2.95x its time); the forward
    #: runs chunked from 1024 steps with K * V >= 8192 where one q/k group serves every head and the decay is one
    #: value per head (Mamba-2's form: its products with q and k are computed once per group; chunked faster at
    #: the 4 such shapes of the table, 1.01-1.18x, and 1.08-1.68x at bench/linear_rnn.py's two Mamba-2 shapes),
    #: else recurrent (the chunked one lost by up to 2x on GLA and RWKV-6).  On CUDA (an H200,
    #: bench/results/gpu_chunked_h200_train.json, the training step timed as one call): the chunked backward
    #: from 8192 steps with K * V >= 4096 (a recurrent forward and a chunked backward took 1.07-1.51x less time
    #: than the recurrent pair at the 3 such shapes, GLA, simple GLA and Mamba-2; at 2048 steps 0.88-1.03x,
    #: though the chunked backward alone, by subtraction, was faster there), the forward recurrent (the chunked
    #: one ran at 0.43-0.70x).  docs/matrix-state.md#algorithms has the figures.
    chunked_from = {"c": {"backward": ((1024, 4096), (256, 8192)),
                          "forward": ((1024, 8192, "one_qk_group_head_decay"),)},
                    "cuda": {"backward": ((8192, 4096),)}}
    #: The GPU kernels have the chunked form of both parts (:mod:`scanweaver.targets.matrix_gpu_chunked`,
    #: :mod:`scanweaver.targets.matrix_gpu_chunked_backward`).
    chunked_parts = {"gpu": ("forward", "backward")}

    def condition(self, name: str, features: MatrixStateFeatures, sizes: dict[str, int]) -> bool:
        """``one_qk_group_head_decay``: a decay per head and one q/k group for four or more heads (Mamba-2)."""
        if name == "one_qk_group_head_decay":
            return features.decay == "scalar" and sizes.get("Hq", 1) == 1 and sizes.get("H", 1) >= 4
        return super().condition(name, features, sizes)

    def work(self, features: MatrixStateFeatures, sizes: dict[str, int]) -> int:
        """``batch * T * H * K * V`` state elements per forward call."""
        return sizes.get("batch", 1) * sizes.get("T", 1) * sizes.get("H", 1) * features.K * features.V

    def params(self, part: str) -> tuple[Param, ...]:
        return _params(part)

    def shapes(self, part, features: MatrixStateFeatures, sizes):
        b, T, H, Hq, nseq = (sizes[n] for n in _SIZES)
        K, V = features.K, features.V
        g = (b, T, H, K) if features.decay == "key" else (b, T, H)
        qk, vo, state = (b, T, Hq, K), (b, T, H, V), (nseq, H, K, V)
        out = {"q": qk, "k": qk, "v": vo, "g": g, "u": (H, K), "h0": state, "cu_seqlens": (nseq + 1,),
               "o": vo, "hlast": state, "do": vo, "dhlast": state, "dq": qk, "dk": qk, "dv": vo, "dg": g,
               "du": (H, K), "dh0": state}
        return {p.name: out[p.name] for p in self.params(part) if p.kind != "int"}

    def enabled(self, name: str, features: MatrixStateFeatures) -> bool:
        """True when the optional parameter ``name`` is used by a kernel with ``features``."""
        if name in ("g", "dg"):
            return features.decay != "none"
        if name in ("u", "du"):
            return features.readout == "bonus"
        flag = _SWITCH.get(name)
        return flag is None or bool(getattr(features, flag))

    def arguments(self, part, features, arrays, sizes, api):
        out = super().arguments(part, features, arrays, sizes, api)
        if features.has_seqlens and isinstance(arrays["cu_seqlens"], np.ndarray):
            # device offsets are the device copy of host offsets checked by the operands (reading them back
            # here would wait for the device)
            check_offsets(api, arrays["cu_seqlens"], sizes["T"])
        return out

    def reference(self, part, features: MatrixStateFeatures, arrays, sizes) -> None:
        kw = {n: arrays.get(n) for n in _OPT_IN}
        kw["cu_seqlens"] = kw["cu_seqlens"] if features.has_seqlens else None
        opts = dict(decay=features.decay, readout=features.readout, reverse=features.reverse)
        q, k, v = (arrays[n] for n in _IN)
        if part == "forward":
            o, h = forward_reference(q, k, v, kw["g"], u=kw["u"], h0=kw["h0"], cu_seqlens=kw["cu_seqlens"], **opts)
            arrays["o"][...] = o
            if arrays.get("hlast") is not None:
                arrays["hlast"][...] = h
            return
        grads = backward_reference(q, k, v, kw["g"], u=kw["u"], h0=kw["h0"], cu_seqlens=kw["cu_seqlens"],
                                   do=arrays["do"], dhlast=arrays.get("dhlast"), **opts)
        for name, value in grads.items():
            if arrays.get(name) is not None and value is not None:
                arrays[name][...] = value


@functools.cache
def _params(part: str) -> tuple[Param, ...]:
    """:meth:`MatrixState.params` (the same tuple every time)."""
    ins = [Param(n, "in") for n in _IN] + [Param(n, "in", True, "int64" if n == "cu_seqlens" else "")
                                           for n in _OPT_IN]
    sizes = [Param(n, "int") for n in _SIZES]
    if part == "forward":
        return (*ins, Param("o", "out"), Param("hlast", "out", True), *sizes)
    outs = [Param("dq", "out"), Param("dk", "out"), Param("dv", "out"),
            *(Param(n, "out", True) for n in ("dg", "du", "dh0"))]
    return (*ins, Param("do", "in"), Param("dhlast", "in", True), *outs, *sizes)


def check_offsets(api: str, cu_seqlens: np.ndarray, T: int) -> None:
    """Kernels index with ``cu_seqlens``: the one rule of :func:`scanweaver.checks.check_seqlens` holds.

    Raises:
        ScanInputError: naming the offsets and what they need.
    """
    check_seqlens(api, cu_seqlens, T)


def _segments(T: int, batch: int, cu_seqlens) -> list[tuple[int, int, int, int]]:
    """``(row of h0/hlast, batch index, start, stop)`` per sequence."""
    if cu_seqlens is None:
        return [(b, b, 0, T) for b in range(batch)]
    cs = [int(c) for c in np.asarray(cu_seqlens)]
    return [(i, 0, cs[i], cs[i + 1]) for i in range(len(cs) - 1)]


def _decay(g, decay: str, b: int, t: int, H: int, K: int, dtype) -> np.ndarray:
    """D_t of batch b as ``(H, K, 1)`` (broadcast over V)."""
    if decay == "none":
        return np.ones((H, 1, 1), dtype)
    if decay == "scalar":
        return np.exp(g[b, t])[:, None, None]
    return np.exp(g[b, t])[:, :, None]


def _heads(x: np.ndarray, H: int) -> np.ndarray:
    """q/k ``(..., Hq, K)`` repeated to ``H`` heads (each group's heads read its row)."""
    return np.repeat(x, H // x.shape[-2], axis=-2)


def forward_reference(q, k, v, g=None, *, decay="scalar", readout="after", u=None, h0=None, cu_seqlens=None,
                      reverse=False):
    """``(o, hlast)`` of the matrix-state scan in NumPy, in the dtype of ``v``.

    Args:
        q, k: ``(batch, T, Hq, K)``.  v: ``(batch, T, H, V)``.  g: log decays ``(batch, T, H)``
            (``scalar``) or ``(batch, T, H, K)`` (``key``); unused for ``none``.
        u: the bonus ``(H, K)`` of ``readout="bonus"``.  h0: ``(nseq, H, K, V)`` or None.
        cu_seqlens: ``nseq + 1`` offsets into T (batch 1), or None.
    """
    batch, T, H, V = v.shape
    K = q.shape[-1]
    qh, kh = _heads(q, H), _heads(k, H)
    segs = _segments(T, batch, cu_seqlens)
    o = np.zeros_like(v)
    hlast = np.zeros((len(segs), H, K, V), v.dtype)
    with np.errstate(over="ignore", under="ignore"):
        for row, b, start, stop in segs:
            S = np.zeros((H, K, V), v.dtype) if h0 is None else np.array(h0[row], v.dtype)
            steps = range(stop - 1, start - 1, -1) if reverse else range(start, stop)
            for t in steps:
                prev = S
                S = _decay(g, decay, b, t, H, K, v.dtype) * S + kh[b, t][:, :, None] * v[b, t][:, None, :]
                if readout == "after":
                    o[b, t] = np.einsum("hk,hkv->hv", qh[b, t], S)
                else:
                    bonus = (qh[b, t] * u * kh[b, t]).sum(-1)
                    o[b, t] = np.einsum("hk,hkv->hv", qh[b, t], prev) + bonus[:, None] * v[b, t]
            hlast[row] = S
    return o, hlast


def backward_reference(q, k, v, g=None, *, decay="scalar", readout="after", u=None, h0=None, cu_seqlens=None,
                       reverse=False, do, dhlast=None) -> dict[str, np.ndarray | None]:
    """Every gradient of :func:`forward_reference`'s ``o`` (and ``hlast``) given ``do`` (and ``dhlast``).

    Returns ``dq, dk`` (q/k's layout, summed over each group's heads), ``dv``, ``dg`` (g's layout,
    None for ``none``), ``du`` (None unless ``bonus``) and ``dh0`` (``(nseq, H, K, V)``).
    """
    batch, T, H, V = v.shape
    Hq, K = q.shape[-2:]
    qh, kh = _heads(q, H), _heads(k, H)
    segs = _segments(T, batch, cu_seqlens)
    dqh, dkh, dv = np.zeros_like(qh), np.zeros_like(kh), np.zeros_like(v)
    dg = None if decay == "none" else np.zeros_like(g)
    du = np.zeros((H, K), v.dtype) if readout == "bonus" else None
    dh0 = np.zeros((len(segs), H, K, V), v.dtype)
    with np.errstate(over="ignore", under="ignore"):
        for row, b, start, stop in segs:
            steps = list(range(stop - 1, start - 1, -1) if reverse else range(start, stop))
            S = np.zeros((H, K, V), v.dtype) if h0 is None else np.array(h0[row], v.dtype)
            states = [S]
            for t in steps:
                S = _decay(g, decay, b, t, H, K, v.dtype) * S + kh[b, t][:, :, None] * v[b, t][:, None, :]
                states.append(S)
            G = np.zeros((H, K, V), v.dtype) if dhlast is None else np.array(dhlast[row], v.dtype)
            for i in reversed(range(len(steps))):
                t, prev, cur = steps[i], states[i], states[i + 1]
                Dt = _decay(g, decay, b, t, H, K, v.dtype)
                qt, kt, vt, dot = qh[b, t], kh[b, t], v[b, t], do[b, t]
                if readout == "after":
                    G = G + qt[:, :, None] * dot[:, None, :]
                    dqh[b, t] = np.einsum("hkv,hv->hk", cur, dot)
                else:
                    w = (vt * dot).sum(-1)
                    dqh[b, t] = np.einsum("hkv,hv->hk", prev, dot) + u * kt * w[:, None]
                    dkh[b, t] += u * qt * w[:, None]
                    dv[b, t] += (qt * u * kt).sum(-1)[:, None] * dot
                    du += qt * kt * w[:, None]
                dkh[b, t] += np.einsum("hkv,hv->hk", G, vt)
                dv[b, t] += np.einsum("hkv,hk->hv", G, kt)
                if dg is not None:
                    rows = (Dt * G * prev).sum(-1)
                    dg[b, t] = rows.sum(-1) if decay == "scalar" else rows
                G = Dt * G
                if readout == "bonus":
                    G = G + qt[:, :, None] * dot[:, None, :]
            dh0[row] = G
    group = H // Hq
    dq = dqh.reshape(batch, T, Hq, group, K).sum(3)
    dk = dkh.reshape(batch, T, Hq, group, K).sum(3)
    return {"dq": dq, "dk": dk, "dv": dv, "dg": dg, "du": du, "dh0": dh0}
