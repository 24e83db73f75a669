"""Mamba-2 (SSD) on NumPy arrays: ``mamba_chunk_scan_combined``'s wrappers around ``matrix_state``.

Per batch element, head h (group ``h // (H // G)`` of B and C) and step t,
with the state ``S`` of shape ``(P, N)``::

    dt_t = clamp(softplus(dt_t + dt_bias))         (softplus with dt_softplus; clamp unless dt_limit = (0, inf))
    S_t  = exp(dt_t * A) * S_{t-1} + (dt_t * x_t) B_t^T
    y_t  = S_t C_t + D * x_t,   then  y_t * silu(z_t)

maps onto the fused operation with q = C, k = B, v = dt*x, g = dt*A
(``decay="scalar"``), K = N, V = P and Hq = G; the fused state is ``(N, P)``,
so states cross this boundary transposed to mamba-ssm's ``(batch, H, P, N)``.
mamba-ssm's ``seq_idx`` (the state starts again where the index changes within
a row) runs as packed segments of the rows laid end to end (:mod:`.segments`).
The gradients run the chain rule of these wrappers around the fused
backward: through the gate ``silu(z)``, the skip ``D``, ``dt * x`` and ``dt * A``,
the clamp (a zero gradient where dt was clamped, as ``torch.clamp``), the
softplus (PyTorch's, linear above 20) and ``dt_bias``.  With ``xp`` (a device
array module, CuPy) every one of these runs on the device with that module.
"""

from __future__ import annotations

import math

import numpy as np

from ...arrays import real_compute_dtype, returned_dtype
from ...errors import ScanInputError
from .attention import pick
from .kernels import backward, forward
from .operands import array, check_shape, operands
from .segments import segments

API = "mamba2_scan"
#: Inputs of the Mamba-2 pair, in order.
INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
#: PyTorch's softplus is x itself above this threshold.
SOFTPLUS_THRESHOLD = 20.0


def limit_of(dt_limit, api: str = API) -> tuple[float, float]:
    """``dt_limit`` as two floats (options carry them as text: ``inf`` is no Python literal), checked: the one rule
    of :func:`scanweaver.mamba2_scan` and its decode step."""
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        raise ScanInputError(f"{api}: dt_limit must be a pair (min, max) of numbers, got {dt_limit!r}") from None
    if math.isnan(lo) or math.isnan(hi):
        raise ScanInputError(f"{api}: dt_limit = ({lo}, {hi}) needs numbers, not NaN (inf for no upper bound)")
    if lo > hi:
        raise ScanInputError(f"{api}: dt_limit = ({lo}, {hi}) needs min <= max")
    return lo, hi


def _softplus(x, xp=np):
    """PyTorch's softplus (x itself above :data:`SOFTPLUS_THRESHOLD`) in array module ``xp``."""
    return xp.where(x > SOFTPLUS_THRESHOLD, x, xp.log1p(xp.exp(xp.minimum(x, SOFTPLUS_THRESHOLD))))


def _sigmoid(x, xp=np):
    with np.errstate(over="ignore"):  # NumPy's warning for exp(-x) of very negative x; the result is exact
        return 1.0 / (1.0 + xp.exp(-x))


class Prepared:
    """Checked Mamba-2 arrays (accumulation dtype) and the fused operands built from them; with ``xp`` (a
    device array module) all of them stay on the device."""

    def __init__(self, inputs: list, options: dict, xp=None):
        x, dt, A, B, C, D, z, dt_bias, h0 = inputs
        mod = np if xp is None else xp
        self.xp = mod
        x = array(API, "x", x, 4, "(batch, L, H, P)", xp=xp)
        b, L, H, P = x.shape
        dt = array(API, "dt", dt, 3, f"(batch, L, H) = {(b, L, H)}", xp=xp)
        check_shape(API, "dt", dt, (b, L, H), "(batch, L, H)")
        A = array(API, "A", A, 1, f"(H,) = ({H},)", xp=xp)
        check_shape(API, "A", A, (H,), "(H,)")
        B = array(API, "B", B, 4, f"(batch, L, G, N) with batch={b}, L={L} and G dividing H = {H}", xp=xp)
        if B.shape[:2] != (b, L) or B.shape[2] < 1 or H % B.shape[2] or B.shape[3] < 1:
            raise ScanInputError(f"{API}: B has shape {B.shape}; it needs (batch, L, G, N) with (batch, L) = "
                                 f"{(b, L)}, G dividing H = {H} and N >= 1")
        C = array(API, "C", C, 4, f"B's shape {B.shape}", xp=xp)
        check_shape(API, "C", C, B.shape, "B's shape (batch, L, G, N)")
        G, N = B.shape[2:]
        if D is not None:
            D = array(API, "D", D, np.ndim(D), "(H,) or (H, P)", xp=xp)
            if D.shape not in ((H,), (H, P)):
                raise ScanInputError(f"{API}: D has shape {D.shape}; it needs (H,) = ({H},) or (H, P) = {(H, P)}")
        if z is not None:
            z = array(API, "z", z, 4, f"x's shape {x.shape}", xp=xp)
            check_shape(API, "z", z, x.shape, "x's shape (batch, L, H, P)")
        if dt_bias is not None:
            dt_bias = array(API, "dt_bias", dt_bias, 1, f"(H,) = ({H},)", xp=xp)
            check_shape(API, "dt_bias", dt_bias, (H,), "(H,)")
        cu = options.get("cu_seqlens")
        nseq = b if cu is None else len(cu) - 1
        self.segs = segments(API, b, L, cu, options.get("seq_idx"))
        if h0 is not None:
            h0 = array(API, "initial_states", h0, 4, f"(batch, H, P, N) = {(nseq, H, P, N)}", xp=xp)
            check_shape(API, "initial_states", h0, (nseq, H, P, N),
                        "(batch, H, P, N) (batch: the sequences of cu_seqlens when given)")
        self.softplus = bool(options.get("dt_softplus", False))
        self.limit = limit_of(options.get("dt_limit", ("0.0", "inf")))
        self.clamped = self.limit != (0.0, math.inf)
        wide = real_compute_dtype([a.dtype for a in (x, dt, A, B, C, D, z, dt_bias, h0) if a is not None])
        self.out_dtype = returned_dtype(x.dtype, wide)
        cast = [None if a is None else mod.asarray(a, dtype=wide) for a in (x, dt, A, B, C, D, z, dt_bias, h0)]
        self.x, self.dt_in, self.A, self.B, self.C, self.D, self.z, self.dt_bias, self.h0 = cast
        raw = self.dt_in if self.dt_bias is None else self.dt_in + self.dt_bias
        self.raw = raw
        self.soft = _softplus(raw, mod) if self.softplus else raw
        self.dt = mod.clip(self.soft, *self.limit) if self.clamped else self.soft
        v = self.x * self.dt[..., None]
        g = self.dt * self.A
        h0k = None if self.h0 is None else self.h0.transpose(0, 1, 3, 2)
        q, k = self.C, self.B
        if self.segs is not None:  # the rows end to end, cut into segments (the call's sequences spread over them)
            q, k, v, g = (a.reshape(1, b * L, *a.shape[2:]) for a in (q, k, v, g))
            h0k, cu = self.segs.spread(h0k, self.segs.first), self.segs.cu
        self.ops = operands(API, q, k, v, g, decay="scalar", h0=h0k, cu_seqlens=cu,
                            names={"q": "C", "k": "B", "v": "dt * x", "g": "dt * A", "h0": "initial_states"}, xp=xp)

    def skip(self) -> np.ndarray | None:
        """``D`` broadcast over ``(H, P)``, or None."""
        if self.D is None:
            return None
        return self.D[:, None] if self.D.ndim == 1 else self.D


def mamba2_forward(inputs: list, options: dict, xp=None) -> list:
    """``[out, final_states]``: ``out (batch, L, H, P)`` in x's dtype, the state ``(batch, H, P, N)``."""
    p = Prepared(inputs, options, xp)
    y, h = _y(p, options)
    if p.z is not None:
        y = y * (p.z * _sigmoid(p.z, p.xp))
    return [y.astype(p.out_dtype, copy=False), p.xp.ascontiguousarray(h.transpose(0, 1, 3, 2))]


def _y(p: Prepared, options: dict) -> tuple[np.ndarray, np.ndarray]:
    o, h = forward(p.ops, backend=options.get("backend", "auto"), api=API, chunk_size=options.get("chunk_size"),
                   **options.get("tunables", {}))
    if p.segs is not None:
        o, h = o.reshape(p.x.shape), h[p.segs.last]
    skip = p.skip()
    return (o if skip is None else o + skip * p.x), h


def mamba2_backward(inputs: list, residuals: list, cotangents: list, needs: list, options: dict, xp=None) -> list:
    """Gradients of Mamba-2 for the inputs with ``needs`` set (see :mod:`scanweaver.calls.pairs`)."""
    p = Prepared(inputs, options, xp)
    mod = p.xp
    dout, dfinal = cotangents
    dout = mod.zeros(p.x.shape, p.x.dtype) if dout is None else mod.asarray(dout, dtype=p.x.dtype)
    full: dict[str, np.ndarray | None] = {}
    if p.z is not None:
        y, _ = _y(p, options)
        sg = _sigmoid(p.z, mod)
        dy = dout * p.z * sg
        full["z"] = dout * y * sg * (1 + p.z * (1 - sg))
    else:
        dy = dout
    dht = None if dfinal is None else mod.asarray(dfinal, dtype=p.x.dtype).transpose(0, 1, 3, 2)
    if p.segs is not None:
        dy, dht = dy.reshape(p.ops.v.shape), p.segs.spread(dht, p.segs.last)
    gr = backward(p.ops, dy, dht, backend=options.get("backend", "auto"), api=API,
                  chunk_size=options.get("chunk_size"), **options.get("tunables", {}))
    if p.segs is not None:
        dy = dy.reshape(p.x.shape)
        gr = {"dq": gr["dq"].reshape(p.C.shape), "dk": gr["dk"].reshape(p.B.shape), "dv": gr["dv"].reshape(p.x.shape),
              "dg": gr["dg"].reshape(p.dt.shape), "dh0": None if gr["dh0"] is None else gr["dh0"][p.segs.first]}
    dx = gr["dv"] * p.dt[..., None]
    skip = p.skip()
    if skip is not None:
        dx = dx + dy * skip
        dD = (dy * p.x).sum((0, 1))
        full["D"] = dD.sum(-1) if p.D.ndim == 1 else dD
    ddt = (gr["dv"] * p.x).sum(-1) + gr["dg"] * p.A
    full["A"] = (gr["dg"] * p.dt).sum((0, 1))
    if p.clamped:
        ddt = ddt * ((p.soft >= p.limit[0]) & (p.soft <= p.limit[1]))
    if p.softplus:
        ddt = ddt * mod.where(p.raw > SOFTPLUS_THRESHOLD, 1.0, _sigmoid(p.raw, mod))
    full.update(x=dx, dt=ddt, B=gr["dk"], C=gr["dq"],
                dt_bias=None if p.dt_bias is None else ddt.sum((0, 1)),
                initial_states=None if gr["dh0"] is None else gr["dh0"].transpose(0, 1, 3, 2))
    return pick(inputs, INPUTS, full, needs, p.x.dtype, mod)
