"""Linear attention (GLA, simple GLA, RetNet) and RWKV-6 on NumPy arrays: the wrappers around ``matrix_state``.

* :func:`la_forward` / :func:`la_backward`: flash-linear-attention's ``chunk_gla``
  (``g``, a log decay per key dim), ``chunk_simple_gla`` (``g_head``, one per head
  and step, or ``decay``, a constant per head) and ``chunk_retention`` (RetNet's
  decays, derived from the number of heads), with the output scale applied
  around the fused operation and the state in fla's ``(K, V)`` layout, or
  ``(V, K)`` with ``state_v_first``.
* :func:`rwkv6_forward` / :func:`rwkv6_backward`: ``chunk_rwkv6`` (``w`` a log
  decay per key dim, ``u`` the bonus), the ``bonus`` readout.

Inputs come in the order of the kernel pairs of :mod:`.grad`; outputs are
``[o, final_state]`` in the accumulation dtype, gradients in each input's dtype.
The options name the public call (``api``) and the caller's names of the decay
slots (``names``: ``simple_gla`` calls ``g_head`` ``g`` and ``decay`` ``g_gamma``),
so that every message speaks of the arguments the caller passed.  With ``xp`` (a
device array module, CuPy) the inputs are its arrays and every step (checks,
conversions, the scale, the kernels, the gradients' reshapes) runs on the device.
"""

from __future__ import annotations

import numpy as np

from ...arrays import real_compute_dtype
from ...checks import scale_of, state_layout
from ...errors import ScanInputError
from .kernels import backward, forward
from .operands import MatrixOperands, array, check_shape, operands

LA = "linear_attention"
RWKV6 = "rwkv6"
#: Inputs of the linear-attention pair, in order.
LA_INPUTS = ("q", "k", "v", "g", "g_head", "decay", "initial_state")
#: Inputs of the RWKV-6 pair, in order.
RWKV6_INPUTS = ("r", "k", "v", "w", "u", "initial_state")


def retention_decays(H: int, xp=None, dtype=np.float64) -> np.ndarray:
    """RetNet's log decays per head, as flash-linear-attention's ``chunk_retention`` derives them:
    ``log(1 - 2**(-5 - arange(H)))`` (Sun et al. 2023, "Retentive Network", section 2.2), in ``dtype`` (the
    operands' accumulation dtype, so that derived decays do not widen the call)."""
    d = np.log1p(-(2.0 ** (-5.0 - np.arange(H, dtype=np.float64)))).astype(dtype)
    return d if xp is None else xp.asarray(d)


def _flip(h, xp=None):
    """A state ``(N, H, K, V)`` as ``(N, H, V, K)`` and back (``state_v_first``), or None."""
    mod = xp or np
    return None if h is None else mod.ascontiguousarray(mod.swapaxes(mod.asarray(h), 2, 3))


def la_prepare(inputs: list, options: dict, xp=None) -> tuple[MatrixOperands, str]:
    """Checked operands of a linear-attention call, and which decay slot was given (or ``none``)."""
    api = options.get("api", LA)
    names = {"g": "g", "g_head": "g_head", "decay": "decay", **options.get("names", {})}
    q, k, v, g, g_head, decay, h0 = inputs
    qa = array(api, "q", q, 4, "(batch, T, H, K)", xp=xp)
    va = array(api, "v", v, 4, "(batch, T, H, V)", xp=xp)
    if options.get("retention"):
        decay = retention_decays(va.shape[2], xp, real_compute_dtype([qa.dtype, va.dtype]))
    given = [n for n, x in (("g", g), ("g_head", g_head), ("decay", decay)) if x is not None]
    if len(given) > 1:  # names[n] None: the operation has no such parameter (simple_gla's per-key g)
        offered = [f"{names[n]} ({what})" for n, what in (("g", "per key dim"), ("g_head", "per head and step"),
                                                           ("decay", "constant per head")) if names[n]]
        raise ScanInputError(f"{api}: give at most one of {', '.join(offered[:-1])} and {offered[-1]}; got "
                             f"{', '.join(names[n] for n in given)}")
    which = given[0] if given else "none"
    gname = {"g": names["g"], "g_head": names["g_head"], "decay": "g_head", "none": "g"}[which]
    if which == "decay":
        d = array(api, names["decay"], decay, 1, f"(H,) = ({va.shape[2]},)", xp=xp)
        check_shape(api, names["decay"], d, (va.shape[2],), "(H,)")
        gcore = (xp or np).broadcast_to(d, va.shape[:3])
    else:
        gcore = g if which == "g" else g_head
    kind = {"none": "none", "g": "key", "g_head": "scalar", "decay": "scalar"}[which]
    v_first = bool(options.get("state_v_first", False))
    _check_state(api, h0, qa, va, options.get("cu_seqlens"), v_first=v_first, xp=xp)
    ops = operands(api, qa, k, va, gcore, decay=kind, h0=_flip(h0, xp) if v_first and h0 is not None else h0,
                   cu_seqlens=options.get("cu_seqlens"), reverse=options.get("reverse", False),
                   names={"g": gname, "cu_seqlens": options.get("cu_seqlens_name", "cu_seqlens")}, xp=xp)
    return ops, which


def _check_state(api: str, h0, q, v, cu_seqlens, name: str = "initial_state", v_first: bool = False,
                 xp=None) -> None:
    if h0 is None:
        return
    nseq = v.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1
    K, V = q.shape[3], v.shape[3]
    need = (nseq, v.shape[2], V, K) if v_first else (nseq, v.shape[2], K, V)
    layout = state_layout(v_first)
    h = array(api, name, h0, 4, f"{layout} = {need}", xp=xp)
    check_shape(api, name, h, need, f"{layout} (N: batch, or the sequences of cu_seqlens)")


def la_forward(inputs: list, options: dict, xp=None) -> list:
    """``[o, final_state]`` of linear attention (``o`` in the inputs' dtype, the state in the accumulation's)."""
    api = options.get("api", LA)
    ops, _ = la_prepare(inputs, options, xp=xp)
    o, h = forward(ops, backend=options.get("backend", "auto"), api=api, chunk_size=options.get("chunk_size"),
                   **options.get("tunables", {}))
    o *= scale_of(api, options.get("scale"), ops.q.shape[3])
    return [o.astype(ops.out_dtype, copy=False), _flip(h, xp) if options.get("state_v_first") else h]


def la_backward(inputs: list, residuals: list, cotangents: list, needs: list, options: dict, xp=None) -> list:
    """Gradients of linear attention for the inputs with ``needs`` set (see :mod:`scanweaver.calls.pairs`)."""
    api = options.get("api", LA)
    v_first = bool(options.get("state_v_first", False))
    ops, which = la_prepare(inputs, options, xp=xp)
    do, dht = cotangents
    s = scale_of(api, options.get("scale"), ops.q.shape[3])
    do = ops.xp.zeros(ops.v.shape, ops.dtype) if do is None else ops.xp.asarray(do, dtype=ops.dtype) * s
    if v_first and dht is not None:
        dht = _flip(dht, xp)
    gr = backward(ops, do, dht, backend=options.get("backend", "auto"), api=api,
                  chunk_size=options.get("chunk_size"), **options.get("tunables", {}))
    dg = gr["dg"]
    full = {"q": gr["dq"], "k": gr["dk"], "v": gr["dv"], "g": dg if which == "g" else None,
            "g_head": dg if which == "g_head" else None,
            "decay": dg.sum((0, 1)) if which == "decay" else None,
            "initial_state": _flip(gr["dh0"], xp) if v_first else gr["dh0"]}
    return pick(inputs, LA_INPUTS, full, needs, ops.dtype, ops.xp)


def pick(inputs: list, names: tuple, full: dict, needs: list, dtype, xp=np) -> list:
    """The gradients of the inputs with ``needs`` set, each shaped and typed like its input (zeros where
    ``full`` has none), as arrays of module ``xp``."""
    out = []
    for x, name, need in zip(inputs, names, needs, strict=True):
        if need:
            gx = full.get(name)
            shape = np.shape(x)
            gx = xp.zeros(shape, dtype) if gx is None else gx.reshape(shape)
            kind = x.dtype if xp is not np else np.asarray(x).dtype
            out.append(xp.ascontiguousarray(gx).astype(kind, copy=False))
    return out


def rwkv6_prepare(inputs: list, options: dict, api: str = RWKV6, xp=None) -> MatrixOperands:
    """Checked operands of an RWKV-6 call."""
    r, k, v, w, u, h0 = inputs
    ra = array(api, "r", r, 4, "(batch, T, H, K)", xp=xp)
    va = array(api, "v", v, 4, "(batch, T, H, V)", xp=xp)
    if ra.shape[2] != va.shape[2]:
        raise ScanInputError(f"{api}: r and v need the same heads; got shapes {ra.shape} and {va.shape}")
    for name, x in (("w", w), ("u", u)):
        if x is None:
            raise ScanInputError(f"{api}: {name} is required")
    _check_state(api, h0, ra, va, options.get("cu_seqlens"), xp=xp)
    return operands(api, ra, k, va, w, decay="key", readout="bonus", u=u, h0=h0,
                    cu_seqlens=options.get("cu_seqlens"),
                    names={"q": "r", "g": "w", "cu_seqlens": options.get("cu_seqlens_name", "cu_seqlens")}, xp=xp)


def rwkv6_forward(inputs: list, options: dict, xp=None) -> list:
    """``[o, final_state]`` of RWKV-6."""
    ops = rwkv6_prepare(inputs, options, xp=xp)
    o, h = forward(ops, backend=options.get("backend", "auto"), api=RWKV6, chunk_size=options.get("chunk_size"),
                   **options.get("tunables", {}))
    o *= scale_of(RWKV6, options.get("scale"), ops.q.shape[3])
    return [o.astype(ops.out_dtype, copy=False), h]


def rwkv6_backward(inputs: list, residuals: list, cotangents: list, needs: list, options: dict, xp=None) -> list:
    """Gradients of RWKV-6 for the inputs with ``needs`` set."""
    ops = rwkv6_prepare(inputs, options, xp=xp)
    do, dht = cotangents
    s = scale_of(RWKV6, options.get("scale"), ops.q.shape[3])
    do = ops.xp.zeros(ops.v.shape, ops.dtype) if do is None else ops.xp.asarray(do, dtype=ops.dtype) * s
    gr = backward(ops, do, dht, backend=options.get("backend", "auto"), api=RWKV6,
                  chunk_size=options.get("chunk_size"), **options.get("tunables", {}))
    full = {"r": gr["dq"], "k": gr["dk"], "v": gr["dv"], "w": gr["dg"], "u": gr["du"], "initial_state": gr["dh0"]}
    return pick(inputs, RWKV6_INPUTS, full, needs, ops.dtype, ops.xp)
