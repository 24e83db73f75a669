"""The ``mamba1`` kernel pair: the fused Mamba-1 forward and backward for the PyTorch and JAX front ends.

Registered in :data:`scanweaver.calls.pairs.PAIRS`, so
``scanweaver.torch.mamba_selective_scan`` (a ``torch.library`` custom op with
an autograd formula) and ``scanweaver.jax.mamba_selective_scan`` (a
``jax.custom_vjp``) run the same fused kernels as
:func:`scanweaver.mamba_selective_scan`.  Nothing of size (batch, D, N, L) is
saved for the backward: the residuals are the inputs themselves, and the
backward kernel recomputes the states from per-chunk checkpoints.

Inputs, in order: ``u, delta, A, B, C, D, z, delta_bias, h0`` (``None`` for
absent optional ones).  Outputs: ``y`` (``u``'s dtype) and ``h_last``
(the accumulation dtype).  Options: ``delta_softplus``, ``cu_seqlens``,
``backend``, ``tunables``.  Where each part computes is
:func:`scanweaver.calls.device.place`'s rule: device arrays (CuPy, from CUDA
tensors) stay on the device when the backend is ``cuda`` (``auto`` picks it
where it runs): the operands are checked and converted there, the fused CUDA
kernels run on the current stream (PyTorch's, made CuPy's by the front end)
and the results are CuPy arrays handed back through DLPack; with another
backend they go through host arrays.  A backend without the fused backward (``julia``) is
differentiated on the best one with it (:func:`~.kernels.backward_backend`).

Example:
    >>> import numpy as np
    >>> from scanweaver.calls.pairs import PAIRS
    >>> rng = np.random.default_rng(0)
    >>> u, dl = rng.normal(size=(1, 2, 5)), rng.uniform(0.1, 1, (1, 2, 5))
    >>> A, B, C = -np.ones((2, 3)), rng.normal(size=(1, 3, 5)), rng.normal(size=(1, 3, 5))
    >>> ins, opts = [u, dl, A, B, C, None, None, None, None], {"backend": "numpy"}
    >>> y, h = PAIRS.get("mamba1").forward(ins, opts)
    >>> grads = PAIRS.get("mamba1").backward(ins, [], [np.ones_like(y), None], [True] * 5 + [False] * 4, opts)
    >>> [g.shape for g in grads]
    [(1, 2, 5), (1, 2, 5), (2, 3), (1, 3, 5), (1, 3, 5)]
"""

from __future__ import annotations

import numpy as np

from ...arrays import compute_dtype
from ...calls.device import place
from ...calls.pairs import PAIRS, KernelPair
from ...checks import seqlens_option
from ...errors import ScanInputError
from .kernels import OP, backward, backward_backend, forward
from .operands import prepare

#: Input names of the pair, in order.
INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
#: Gradient key of each input (``scanweaver.mamba.backward``'s names).
GRADS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dh0")
API = "mamba_selective_scan"


def _prepared(inputs: list, options: dict, xp=None):
    return prepare(*inputs[:5], *inputs[5:8], options.get("delta_softplus", False), inputs[8],
                   options.get("cu_seqlens"), api=API, xp=xp)


def _forward(inputs: list, options: dict) -> list:
    where = place(list(inputs), OP, "forward", options.get("backend", "auto"), api=API)
    with where.context():
        ops = _prepared(where.host(inputs), options, where.xp if where.on_device else None)
        y, h = forward(ops, backend=where.backend, return_state=True, api=API, **options.get("tunables", {}))
        return where.results([y.astype(ops.out_dtype, copy=False), h])


def _backward(inputs: list, residuals: list, cotangents: list, needs: list, options: dict) -> list:
    asked = options.get("backend", "auto")
    where = place([*inputs, *cotangents], OP, "backward", asked, api=API)
    with where.context():
        return _backward_at(where, inputs, cotangents, needs, options)


def _backward_at(where, inputs: list, cotangents: list, needs: list, options: dict) -> list:
    asked = options.get("backend", "auto")
    host = where.host(inputs)
    dy, dh = where.host(list(cotangents))
    mod = where.xp
    ops = _prepared(host, options, mod if where.on_device else None)
    if dy is None:
        dy = mod.zeros(ops.u.shape, ops.dtype)
    be = where.backend if where.on_device else backward_backend(asked, ops.dtype)
    tunables = options.get("tunables", {}) if be == asked or asked == "auto" else {}
    grads = backward(ops, dy, dh, backend=be, api=API, **tunables)
    out = []
    for x, key, need in zip(host, GRADS, needs, strict=True):
        if need:
            g = grads[key]
            g = mod.zeros(x.shape, ops.dtype) if g is None else g.reshape(x.shape)
            out.append(g.astype(x.dtype, copy=False))
    return where.results(out)


def _shapes(specs: list, options: dict) -> list:
    if any(s is None for s in specs[:5]):
        raise ScanInputError(f"{API}: u, delta, A, B and C are required")
    (u_shape, u_dt), (a_shape, _) = specs[0], specs[2]
    if len(u_shape) != 3 or len(a_shape) != 2:
        raise ScanInputError(f"{API}: u needs (batch, D, L) and A (D, N); got {tuple(u_shape)} and {tuple(a_shape)}")
    wide = compute_dtype([s[1] for s in specs if s is not None])
    return [(tuple(u_shape), np.dtype(u_dt)), ((u_shape[0], u_shape[1], a_shape[1]), wide)]


PAIRS.register()(KernelPair("mamba1", _forward, _backward, _shapes, n_outputs=2))


def options(args: dict) -> dict:
    """The pair's options for a call of ``mamba_selective_scan`` (Python literals only: they key the
    framework adapters' compiled ops).

    Raises:
        ScanInputError: for what only the NumPy entry runs (``log_space``, a ``schedule``, ``fused=False``).
    """
    if args.get("log_space") or args.get("schedule", "auto") != "auto" or args.get("fused") is False:
        raise ScanInputError(f"{API}: log_space=True, schedule= and fused=False run the scan path on NumPy arrays "
                             "only; PyTorch and JAX arrays run the fused kernels (drop them, or pass NumPy arrays)")
    cu = seqlens_option(API, args.get("cu_seqlens"))
    return {"delta_softplus": bool(args.get("delta_softplus", False)), "cu_seqlens": cu,
            "backend": args.get("backend", "auto"), "tunables": dict(args.get("tunables") or {})}


def finish(outputs: list, args: dict):
    """The call's result from the pair's outputs ``[y, h_last]``."""
    y, h = outputs
    return (y, h) if args.get("return_last_state") or args.get("return_state") else y
