"""DeltaNet, Gated DeltaNet, KDA and RWKV-7 on arrays: the wrappers around the fused ``delta_rule``.

:func:`family_forward` and :func:`family_backward` take a kernel pair's inputs
(in the order of :data:`INPUTS`) and options, and around the fused kernels of
:mod:`.kernels` apply what the named operations add: the output scale
(``o = scale * S^T q``, so the backward takes ``scale * do``), fla's
``use_beta_sigmoid_in_kernel`` and ``allow_neg_eigval`` (``beta = c *
sigmoid(beta)``, c = 2 with negative eigenvalues allowed, and its chain rule)
and ``state_v_first`` (states stored ``(N, HV, V, K)``).  Outputs are ``[o,
final_state]``, o in v's dtype and the state in the accumulation dtype;
gradients come back in each input's dtype.  With ``xp`` (a device array module,
CuPy) the inputs are its arrays and every step (checks, conversions, the sigmoid
of beta and its chain rule, the scale, the ``state_v_first`` transposes, the
kernels, the gradients' reshapes) runs with that module, on the device.

Example:
    >>> import numpy as np
    >>> from scanweaver.ops.delta_rule.families import family_forward
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 5, 2, 4))
    >>> g, beta = -rng.uniform(0, 1, (2, 1, 5, 2))
    >>> o, h = family_forward("gated_delta_rule", [q, k / 2, v, g, -beta, None], {"backend": "numpy"})
    >>> o.shape, h.shape
    ((1, 5, 2, 4), (1, 2, 4, 4))
"""

from __future__ import annotations

import numpy as np

from ...arrays import is_real
from ...calls.runner import FusedInfo
from ...checks import scale_of
from .kernels import backward, reported_forward
from .operands import DeltaOperands, array, operands

#: Each named operation's kernel-pair inputs, in order (also its declaration's ``arrays``).
INPUTS = {"delta_rule": ("q", "k", "v", "beta", "initial_state"),
          "gated_delta_rule": ("q", "k", "v", "g", "beta", "initial_state"),
          "kda": ("q", "k", "v", "g", "beta", "initial_state"),
          "rwkv7": ("r", "w", "k", "v", "a", "b", "initial_state")}
#: The default output scale where it is not ``K**-0.5``.
DEFAULT_SCALE = {"rwkv7": 1.0}


def _sigmoid(x, xp=np):
    """The logistic function in float32 or wider (arrays of module ``xp``), without overflow warnings."""
    x = x if xp is not np else np.asarray(x)
    x = xp.asarray(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    with np.errstate(over="ignore"):
        return 1 / (1 + xp.exp(-x))


def beta_scale(options: dict) -> float | None:
    """c of ``beta = c * sigmoid(beta)`` (2 with ``allow_neg_eigval``), or None when beta is taken as given."""
    if not options.get("beta_sigmoid"):
        return None
    return 2.0 if options.get("neg_eigval") else 1.0


def beta_of_logits(raw, c: float, xp=np):
    """fla's ``use_beta_sigmoid_in_kernel``: ``c * sigmoid(raw)`` in raw's dtype (float64 for a non-real one)."""
    return (c * _sigmoid(raw, xp)).astype(raw.dtype if is_real(raw.dtype) else np.float64)


def _shape(x) -> tuple:
    """The shape of an array of any module (a list's through NumPy)."""
    return tuple(x.shape) if hasattr(x, "shape") else tuple(np.shape(x))


def _swap(x, xp=np):
    """``(..., K, V)`` <-> ``(..., V, K)`` (fla's ``state_v_first``) in array module ``xp``, or None."""
    return None if x is None else xp.swapaxes(np.asarray(x) if xp is np else x, -1, -2)


def prepare(family: str, inputs: list, options: dict, xp=None) -> DeltaOperands:
    """The checked operands of one call of ``family`` (a key of :data:`INPUTS`); with ``xp`` (a device array
    module) on its arrays, on the device.  Errors name ``options["api"]`` (a decode step's name), else
    ``family``."""
    mod = np if xp is None else xp
    named = dict(zip(INPUTS[family], inputs, strict=True))
    h0 = named.pop("initial_state")
    c = beta_scale(options)
    if c is not None and named.get("beta") is not None:  # checked first: the logits are beta as given
        named["beta"] = beta_of_logits(array(options.get("api", family), "beta", named["beta"], 3, "(B, T, HV)", xp),
                                       c, mod)
    names = {"cu_seqlens": options.get("cu_seqlens_name", "cu_seqlens")}
    if family == "rwkv7":
        named = {"q": named["r"], "g": named["w"], **{n: named[n] for n in ("k", "v", "a", "b")}}
        names.update(q="r", g="w")
    return operands(options.get("api", family), family, named.pop("q"), named.pop("k"), named.pop("v"), h0=h0,
                    cu_seqlens=options.get("cu_seqlens"), l2norm=bool(options.get("l2norm")),
                    state_v_first=bool(options.get("state_v_first")), names=names, xp=xp, **named)


def family_forward(family: str, inputs: list, options: dict, xp=None) -> list:
    """``[o, final_state]`` of ``family`` (o in v's dtype, the state in the accumulation dtype, ``(N, HV, K, V)``
    or ``(N, HV, V, K)`` with ``state_v_first``); with ``xp``, on its arrays."""
    return reported_family_forward(family, inputs, options, xp)[0]


def reported_family_forward(family: str, inputs: list, options: dict, xp=None
                            ) -> tuple[list, DeltaOperands, FusedInfo | None]:
    """:func:`family_forward`'s result, with the checked operands and the runner's report of the kernel that ran
    (``None`` where none ran: T = 0)."""
    ops = prepare(family, inputs, options, xp)
    o, h, info = reported_forward(ops, backend=options.get("backend", "auto"), api=options.get("api", family),
                                  chunk_size=options.get("chunk_size"), **options.get("tunables", {}))
    return finish_forward(o, h, output_scale(family, ops, options), ops.out_dtype,
                          bool(options.get("state_v_first")), ops.xp), ops, info


def output_scale(family: str, ops: DeltaOperands, options: dict):
    """The output scale of a call, a scalar of the accumulation dtype (``K**-0.5`` unless the options say)."""
    return ops.state_dtype.type(scale_of(family, options.get("scale", DEFAULT_SCALE.get(family)), ops.q.shape[3]))


def finish_forward(o, h, scale, out_dtype: np.dtype, v_first: bool, xp=np) -> list:
    """``[o, final_state]`` from the kernel's unscaled ``o`` and its state ``h``: o times ``scale`` (a scalar of
    the accumulation dtype) in ``out_dtype``, the state transposed with ``v_first``."""
    if o.dtype == scale.dtype:
        o *= scale  # in place: o is the kernel's own buffer
    else:  # half storage: scaled in float32, rounded once
        o = xp.multiply(o, scale, dtype=scale.dtype)
    o = o.astype(out_dtype, copy=False)
    if v_first:
        h = xp.ascontiguousarray(_swap(h, xp))
    return [o, h]


def family_backward(family: str, inputs: list, residuals: list, cotangents: list, needs: list,
                    options: dict, xp=None) -> list:
    """Gradients of ``family`` for the inputs with ``needs`` set (see :mod:`scanweaver.calls.pairs`); with ``xp``,
    on its arrays."""
    ops = prepare(family, inputs, options, xp)
    mod = ops.xp
    do, dht = cotangents
    s = output_scale(family, ops, options)
    if do is not None:  # one new array: the kernels read scale * do
        do = mod.multiply(do if xp is not None else np.asarray(do), s, dtype=ops.state_dtype).astype(ops.dtype,
                                                                                                    copy=False)
    if dht is not None and options.get("state_v_first"):
        dht = _swap(dht, mod)
    gr = backward(ops, do, dht, backend=options.get("backend", "auto"), api=family,
                  chunk_size=options.get("chunk_size"), **options.get("tunables", {}))
    c = beta_scale(options)
    if c is not None and gr["dbeta"] is not None:
        sig = _sigmoid(inputs[INPUTS[family].index("beta")], mod)
        gr["dbeta"] = gr["dbeta"].astype(sig.dtype) * (c * sig * (1 - sig))
    if gr["dh0"] is not None and options.get("state_v_first"):
        gr["dh0"] = _swap(gr["dh0"], mod)
    alias = {"r": "dq", "w": "dg", "q": "dq", "g": "dg", "initial_state": "dh0"}
    out = []
    for x, name, need in zip(inputs, INPUTS[family], needs, strict=True):
        if need:
            gx = gr[alias.get(name, "d" + name)]
            shape = _shape(x)
            gx = mod.zeros(shape, ops.state_dtype) if gx is None else gx.reshape(shape)
            out.append(mod.ascontiguousarray(gx, dtype=x.dtype if xp is not None else np.asarray(x).dtype))
    return out
