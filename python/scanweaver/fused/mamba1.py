"""``mamba1``: Mamba-1's selective scan (S6) as one fused kernel, forward and backward.

Gu & Dao (2023), "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Algorithm 2, with the semantics of ``mamba_ssm``'s
``selective_scan_ref``.  Per batch element b, channel d and state n::

    dt_t      = softplus(delta_t[d] + delta_bias[d])        (softplus and bias optional)
    a_t[n]    = exp(dt_t * A[d, n])                          (0 where a packed sequence starts)
    h_t[n]    = a_t[n] * h_{t-1}[n] + dt_t * B_t[n] * u_t[d]  (h_{-1} = h0, or 0)
    y_t[d]    = (sum_n C_t[n] * h_t[n] + D[d] * u_t[d]) * silu(z_t[d])

B and C are fixed ``(D, N)`` or vary per step ``(batch, G, N, L)`` (G groups of
D/G channels; ``(batch, N, L)`` is G = 1).  The fused kernels keep the N
states of a channel in registers, compute a_t and the input on the fly and
read u, delta, z, B, C once: memory traffic is the inputs and y.

Backward (with g_t[n] = dL/dh_t[n], the reverse scan of the design notes)::

    dy_t = dout_t * silu(z_t);  dz_t = dout_t * ypre_t * silu'(z_t)
    g_t  = C_t * dy_t + a_{t+1} * g_{t+1}        (g_{L-1} also gets dh_last)
    dC_t += dy_t * h_t;  dB_t += g_t * dt_t * u_t;  du_t = D*dy_t + dt_t * sum_n g_t B_t
    ddt_t = sum_n g_t * (B_t * u_t + a_t * A * h_{t-1});  dA += g_t * a_t * dt_t * h_{t-1}
    ddelta_t = ddt_t * sigmoid(delta_t + delta_bias) (softplus);  dh0 = a_0 * g_0

The states h_{t-1} are never stored for all t: the backward recomputes them
chunk by chunk from checkpoints taken every ``chunk`` steps (Mamba's
recomputation).  :meth:`Mamba1.reference` runs exactly this in NumPy; it is
the definition the compiled kernels are checked against, next to the plain
float64 loop of the tests.

Example:
    >>> import numpy as np
    >>> from scanweaver.fused.mamba1 import Mamba1Features, forward_reference
    >>> rng = np.random.default_rng(0)
    >>> u, dl = rng.normal(size=(1, 2, 5)), rng.uniform(0.1, 1, (1, 2, 5))
    >>> A, B, C = -rng.uniform(0.5, 1, (2, 3)), rng.normal(size=(1, 1, 3, 5)), rng.normal(size=(1, 1, 3, 5))
    >>> y, h = forward_reference(u, dl, A, B, C)
    >>> y.shape, h.shape
    ((1, 2, 5), (1, 2, 3))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..schedules.base import MAX_THREADS, Tunable, between, non_negative, positive, power_of_two_between, threads_rule
from .base import PARTS, FusedOp, Param, register

#: Time steps per tile of the CPU kernels, and steps between the backward's checkpoints.
CHUNK = 64


def _width_rule(value: Any) -> str | None:
    return power_of_two_between(1, 16)(value)


def _chunk_rule(value: Any) -> str | None:
    return positive(value) or (None if value % 16 == 0 and value <= 4096 else
                               "it must be a multiple of 16, at most 4096")


def _between(value: Any, lo: int, hi: int) -> str | None:
    return None if lo <= value <= hi else f"it must be between {lo} and {hi}"


#: The CPU (C) kernel's tunables.
C_TUNABLES = (
    Tunable("chunk", CHUNK, (16, 32, 64, 128, 256), "time steps per tile; steps between backward checkpoints",
            _chunk_rule),
    Tunable("width", 8, (4, 8, 16), "channels per vector (SIMD lanes); the default follows the CPU's vectors",
            _width_rule),
    Tunable("threads", 0, (0, 1, 2, 4, 8, 16), f"OpenMP threads (at most {MAX_THREADS}); "
            "0 uses the cores other processes leave free",
            threads_rule),
)
#: The GPU (OpenCL, CUDA) kernels' tunables.
GPU_TUNABLES = (
    Tunable("workgroup_size", 128, (32, 64, 128, 256, 512), "work-items per channel (over time)",
            power_of_two_between(32, 1024)),
    Tunable("items_per_thread", 8, (2, 4, 8, 16), "consecutive time steps per work-item",
            lambda v: positive(v) or _between(v, 1, 32)),
)


#: ScanWeaver.jl's (``julia`` backend) tunables: its kernels' ``Val`` parameters, and the device.
JULIA_TUNABLES = (
    Tunable("workgroup_size", 64, (32, 64, 128, 256), "work-items per workgroup (each one chunk of one channel)",
            between(1, 1024)),
    Tunable("chunk", 0, (0, 256, 1024, 4096), "time steps per work-item (backward: steps between checkpoints); "
            "0 picks from the problem's shape", non_negative),
    Tunable("device", "cpu", ("cpu", "cuda", "amdgpu", "oneapi", "metal"), "the KernelAbstractions device",
            lambda v: None if v in ("cpu", "cuda", "amdgpu", "oneapi", "metal") else
            "it must be one of cpu, cuda, amdgpu, oneapi, metal"),
)

@dataclass(frozen=True)
class Mamba1Features:
    """Compile-time features of one Mamba-1 kernel (a key of the kernel caches).

    Attributes:
        dtype: ``float32`` or ``float64`` (accumulation and storage).
        N: states per channel.
        b_fixed, c_fixed: B / C are ``(D, N)`` instead of varying per step.
        has_D, has_z, has_bias: the skip ``D``, the gate ``z``, ``delta_bias`` are given.
        softplus: ``delta_softplus``.
        has_h0: an initial state is given.
        has_reset: packed sequences (a reset mask over L).
        has_dhlast: (backward) a gradient of the final state is given.
    """

    dtype: str
    N: int
    b_fixed: bool = False
    c_fixed: bool = False
    has_D: bool = False
    has_z: bool = False
    has_bias: bool = False
    softplus: bool = False
    has_h0: bool = False
    has_reset: bool = False
    has_dhlast: bool = False


_IN = ("u", "delta", "A", "B", "C")
_OPT_IN = ("D", "z", "delta_bias", "h0", "reset")
_SIZES = ("batch", "dim", "L", "groups_b", "groups_c")
#: Which optional array a feature switches on.
_SWITCH = {"D": "has_D", "z": "has_z", "delta_bias": "has_bias", "h0": "has_h0", "reset": "has_reset",
           "dhlast": "has_dhlast", "dD": "has_D", "dz": "has_z", "ddelta_bias": "has_bias", "dh0": "has_h0"}


@register
class Mamba1(FusedOp):
    """Mamba-1 selective scan: gate, input, scan, C contraction, D skip and silu(z) in one kernel."""

    name = "mamba1"
    description = "Mamba-1 selective scan (S6) with delta_bias/softplus, D and silu(z) fused; states in registers"
    parts = PARTS
    tunables = {"c": C_TUNABLES, "gpu": GPU_TUNABLES, "julia": JULIA_TUNABLES}
    implementations = {"numpy": PARTS, "c": PARTS, "opencl": PARTS, "cuda": PARTS, "julia": PARTS}

    def params(self, part: str) -> tuple[Param, ...]:
        return _params(part)

    def shapes(self, part, features: Mamba1Features, sizes):
        b, d, L, N = sizes["batch"], sizes["dim"], sizes["L"], features.N
        seq, state, chan = (b, d, L), (b, d, N), (d,)
        Bs = (d, N) if features.b_fixed else (b, sizes["groups_b"], N, L)
        Cs = (d, N) if features.c_fixed else (b, sizes["groups_c"], N, L)
        out = {"u": seq, "delta": seq, "A": (d, N), "B": Bs, "C": Cs, "D": chan, "z": seq, "delta_bias": chan,
               "h0": state, "reset": (L,), "y": seq, "hlast": state, "dout": seq, "dhlast": state, "du": seq,
               "ddelta": seq, "dA": (d, N), "dB": Bs, "dC": Cs, "dD": chan, "dz": seq, "ddelta_bias": chan,
               "dh0": state}
        return {p.name: out[p.name] for p in self.params(part) if p.kind != "int"}

    def enabled(self, name: str, features: Mamba1Features) -> bool:
        """True when the optional parameter ``name`` is used by a kernel with ``features``."""
        flag = _SWITCH.get(name)
        return flag is None or bool(getattr(features, flag))

    def reference(self, part, features: Mamba1Features, arrays, sizes) -> None:
        ops = {n: arrays.get(n) for n in (*_IN, *_OPT_IN)}
        kw = dict(D=ops["D"], z=ops["z"], delta_bias=ops["delta_bias"], delta_softplus=features.softplus,
                  h0=ops["h0"], reset=ops["reset"])
        B, C = (_grouped(ops[k], sizes[f"groups_{k.lower()}"]) for k in ("B", "C"))
        if part == "forward":
            y, h = forward_reference(ops["u"], ops["delta"], ops["A"], B, C, **kw)
            arrays["y"][...] = y
            if arrays.get("hlast") is not None:
                arrays["hlast"][...] = h
            return
        grads = backward_reference(ops["u"], ops["delta"], ops["A"], B, C, **kw, dout=arrays["dout"],
                                   dhlast=arrays.get("dhlast"), chunk=CHUNK)
        for name, value in grads.items():
            if arrays.get(name) is not None:
                arrays[name][...] = value.reshape(arrays[name].shape)


@functools.cache
def _params(part: str) -> tuple[Param, ...]:
    """:meth:`Mamba1.params` (the same tuple every time)."""
    ins = [Param(n, "in") for n in _IN] + [Param(n, "in", True, "uint8" if n == "reset" else "")
                                           for n in _OPT_IN]
    sizes = [Param(n, "int") for n in _SIZES]
    if part == "forward":
        return (*ins, Param("y", "out"), Param("hlast", "out", True), *sizes)
    outs = [Param("du", "out"), Param("ddelta", "out"), Param("dA", "out"), Param("dB", "out"),
            Param("dC", "out"), *(Param(n, "out", True) for n in ("dD", "dz", "ddelta_bias", "dh0"))]
    return (*ins, Param("dout", "in"), Param("dhlast", "in", True), *outs, *sizes)


def _grouped(M, groups: int):
    """B or C as ``(D, N)`` (fixed) or ``(batch, G, N, L)``."""
    return M if M.ndim == 2 else M.reshape(M.shape[0], groups, *M.shape[-2:])


def _per_step(M, t: int, dim: int) -> np.ndarray:
    """B_t or C_t broadcast to ``(batch|1, D, N)``."""
    if M.ndim == 2:
        return M[None]
    return np.repeat(M[:, :, :, t], dim // M.shape[1], axis=1)


def _dt(delta, delta_bias, softplus: bool):
    """(dt, d dt / d delta) of the whole input."""
    v = delta if delta_bias is None else delta + delta_bias[:, None]
    if not softplus:
        return v, np.ones_like(v)
    with np.errstate(over="ignore"):
        return np.logaddexp(0, v).astype(v.dtype), (1 / (1 + np.exp(-v))).astype(v.dtype)


def forward_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, h0=None,
                      reset=None):
    """``(y, h_last)`` of the fused forward in NumPy (B, C as ``(D, N)`` or ``(batch, G, N, L)``)."""
    batch, dim, L = u.shape
    dt = _dt(delta, delta_bias, delta_softplus)[0]
    h = np.zeros((batch, dim, A.shape[1]), u.dtype) if h0 is None else h0.astype(u.dtype, copy=True)
    y = np.empty_like(u)
    with np.errstate(over="ignore", under="ignore"):
        for t in range(L):
            a = np.exp(dt[:, :, t, None] * A)
            if reset is not None and reset[t]:
                a = np.zeros_like(a)
            h = a * h + (dt[:, :, t] * u[:, :, t])[..., None] * _per_step(B, t, dim)
            y[:, :, t] = (_per_step(C, t, dim) * h).sum(-1)
    if D is not None:
        y += D[:, None] * u
    if z is not None:
        y *= z / (1 + np.exp(-z))
    return y, h


def backward_reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, h0=None,
                       reset=None, *, dout, dhlast=None, chunk=CHUNK) -> dict[str, np.ndarray]:
    """Every gradient of :func:`forward_reference`'s ``y`` (and ``h_last``) given ``dout`` (and ``dhlast``).

    States are recomputed from checkpoints every ``chunk`` steps, never stored for all t.
    Returns ``du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dh0`` (``dB``/``dC`` in B/C's layout).
    """
    batch, dim, L = u.shape
    N = A.shape[1]
    dt, ddt_ddelta = _dt(delta, delta_bias, delta_softplus)
    starts = range(0, L, chunk)
    h = np.zeros((batch, dim, N), u.dtype) if h0 is None else h0.astype(u.dtype, copy=True)
    ckpt = []

    def gate(t):
        a = np.exp(dt[:, :, t, None] * A)
        return np.zeros_like(a) if reset is not None and reset[t] else a

    with np.errstate(over="ignore", under="ignore"):
        for t in range(L):
            if t % chunk == 0:
                ckpt.append(h)
            h = gate(t) * h + (dt[:, :, t] * u[:, :, t])[..., None] * _per_step(B, t, dim)
        dy, dz = dout, None
        if z is not None:
            sz = 1 / (1 + np.exp(-z))
            dy = dout * z * sz
        du, dtg = np.zeros_like(u), np.zeros_like(u)
        ypre = np.zeros_like(u)
        dA = np.zeros((batch, dim, N), u.dtype)
        dB = np.zeros(B.shape, u.dtype)
        dC = np.zeros(C.shape, u.dtype)
        g = np.zeros((batch, dim, N), u.dtype) if dhlast is None else dhlast.astype(u.dtype, copy=True)
        for c in reversed(range(len(ckpt))):
            t0, t1 = starts[c], min(starts[c] + chunk, L)
            hs = [ckpt[c]]
            for t in range(t0, t1):
                hs.append(gate(t) * hs[-1] + (dt[:, :, t] * u[:, :, t])[..., None] * _per_step(B, t, dim))
            for t in reversed(range(t0, t1)):
                a, hp, ht = gate(t), hs[t - t0], hs[t - t0 + 1]
                Bt, Ct = _per_step(B, t, dim), _per_step(C, t, dim)
                ypre[:, :, t] = (Ct * ht).sum(-1)
                g = g + Ct * dy[:, :, t, None]
                _accumulate(dC, Ct.shape, t, dy[:, :, t, None] * ht)
                _accumulate(dB, Bt.shape, t, g * (dt[:, :, t] * u[:, :, t])[..., None])
                q = g * a * hp
                dA += q * dt[:, :, t, None]
                gB = (g * Bt).sum(-1)
                dtg[:, :, t] = (q * A).sum(-1) + gB * u[:, :, t]
                du[:, :, t] = gB * dt[:, :, t]
                g = a * g
    if D is not None:
        ypre += D[:, None] * u
        du += D[:, None] * dy
    if z is not None:
        dz = dout * ypre * sz * (1 + z * (1 - sz))
    ddelta = dtg * ddt_ddelta
    return {"du": du, "ddelta": ddelta, "dA": dA.sum(0), "dB": dB, "dC": dC,
            "dD": None if D is None else (dy * u).sum((0, 2)), "dz": dz,
            "ddelta_bias": None if delta_bias is None else ddelta.sum((0, 2)), "dh0": g}


def _accumulate(acc: np.ndarray, shape: tuple, t: int, value: np.ndarray) -> None:
    """Adds ``value`` ``(batch, D, N)`` into dB/dC: summed over batch (fixed) or over each group's channels."""
    if acc.ndim == 2:
        acc += value.sum(0)
        return
    batch, G = acc.shape[:2]
    acc[:, :, :, t] += value.reshape(batch, G, -1, acc.shape[2]).sum(2)
