"""The kernel pairs of the matrix-state operations, for the PyTorch and JAX front ends.

Registered in :data:`scanweaver.calls.pairs.PAIRS` as ``linear_attention``,
``mamba2`` and ``rwkv6``, so ``scanweaver.torch.<op>`` (a ``torch.library``
custom op with an autograd formula) and ``scanweaver.jax.<op>`` (a
``jax.custom_vjp``) run the fused ``matrix_state`` forward and backward of
:mod:`.kernels` with the wrappers' chain rule of :mod:`.attention` and
:mod:`.mamba2`.  Nothing per step is saved between the passes: the residuals
are the inputs, and the backward recomputes the states.

Outputs of every pair: ``o`` (the inputs' dtype) and the final state (the
accumulation dtype), in the named operation's layout.  CUDA tensors (CuPy
views) and CuPy arrays stay on the device when the backend that runs the part
is ``cuda`` (``auto`` picks it where it runs): checks, conversions, the gates
and the scale and their gradients run with CuPy, the fused kernels on the
current stream (:mod:`scanweaver.calls.device`); nothing is copied to the host
and nothing waits.  Options are Python literals (``dt_limit`` as text, since
``inf`` is no literal), built from a call's arguments by :func:`la_options`,
:func:`rwkv6_options` and :func:`mamba2_options`, which check what they take
(``scale``, ``cu_seqlens``, ``seq_idx``, ``chunk_size``).
"""

from __future__ import annotations

import numpy as np

from ...arrays import real_compute_dtype, returned_dtype
from ...calls.device import place
from ...calls.pairs import PAIRS, KernelPair
from ...checks import offsets_name, offsets_option, scale_option, seqlens_option
from ...errors import ScanInputError
from . import attention, mamba2
from .kernels import OP, check_chunk_size
from .segments import seq_idx_option


def _wrap(forward, backward, api: str):
    """The pair's functions where :func:`~scanweaver.calls.device.place` says: on the caller's device with its
    array module (CuPy arrays, e.g. from CUDA tensors, on a backend that takes them), else on host arrays
    (device inputs copied once, the results copied back)."""

    def fwd(inputs: list, options: dict) -> list:
        where = place(list(inputs), OP, "forward", options.get("backend", "auto"), api=api)
        with where.context():
            out = forward(where.host(inputs), {**options, "backend": where.backend},
                          where.xp if where.on_device else None)
        return where.results(out)

    def bwd(inputs: list, residuals: list, cotangents: list, needs: list, options: dict) -> list:
        where = place([*inputs, *cotangents], OP, "backward", options.get("backend", "auto"), api=api)
        with where.context():
            out = backward(where.host(inputs), residuals, where.host(list(cotangents)), needs,
                           {**options, "backend": where.backend}, where.xp if where.on_device else None)
        return where.results(out)

    return fwd, bwd


def _spec(specs: list, i: int, api: str, name: str, ndim: int):
    if specs[i] is None or len(specs[i][0]) != ndim:
        raise ScanInputError(f"{api}: {name} needs {ndim} dimensions, got "
                             f"{'none' if specs[i] is None else tuple(specs[i][0])}")
    return tuple(specs[i][0])


def _nseq(batch: int, options: dict) -> int:
    cu = options.get("cu_seqlens")
    return batch if cu is None else len(cu) - 1


def _la_shapes(specs: list, options: dict, api: str = attention.LA) -> list:
    q = _spec(specs, 0, api, "q" if api == attention.LA else "r", 4)
    v = _spec(specs, 2, api, "v", 4)
    wide = real_compute_dtype([s[1] for s in specs if s is not None])
    out = returned_dtype(specs[2][1], wide)
    K, V = (v[3], q[3]) if options.get("state_v_first") else (q[3], v[3])
    return [(v, np.dtype(out)), ((_nseq(v[0], options), v[2], K, V), wide)]


def _mamba2_shapes(specs: list, options: dict) -> list:
    x = _spec(specs, 0, mamba2.API, "x", 4)
    B = _spec(specs, 3, mamba2.API, "B", 4)
    wide = real_compute_dtype([s[1] for s in specs if s is not None])
    out = returned_dtype(specs[0][1], wide)
    return [(x, np.dtype(out)), ((_nseq(x[0], options), x[2], x[3], B[3]), wide)]


PAIRS.register()(KernelPair(attention.LA, *_wrap(attention.la_forward, attention.la_backward, attention.LA),
                            _la_shapes, n_outputs=2, follows=2))
PAIRS.register()(KernelPair(attention.RWKV6, *_wrap(attention.rwkv6_forward, attention.rwkv6_backward,
                                                    attention.RWKV6),
                            lambda specs, options: _la_shapes(specs, options, attention.RWKV6), n_outputs=2,
                            follows=2))
PAIRS.register()(KernelPair("mamba2", *_wrap(mamba2.mamba2_forward, mamba2.mamba2_backward, mamba2.API),
                            _mamba2_shapes, n_outputs=2))


def la_options(api: str, args: dict, *, retention: bool = False, names: dict | None = None) -> dict:
    """The linear-attention pair's options for a call of ``api`` (``linear_attention``, ``simple_gla``,
    ``retention``) with arguments ``args``: Python literals, which key the front ends' compiled ops.

    Raises:
        ScanInputError: naming the argument (``scale``, ``cu_seqlens``, ``chunk_size`` ...).
    """
    return {"api": api, "scale": scale_option(api, args.get("scale")),
            "reverse": bool(args.get("reverse", False)), "state_v_first": bool(args.get("state_v_first", False)),
            "retention": retention, "names": dict(names or {}),
            "cu_seqlens": offsets_option(api, args.get("cu_seqlens"), args.get("cu_seqlens_cpu")),
            "cu_seqlens_name": offsets_name(args.get("cu_seqlens"), args.get("cu_seqlens_cpu")),
            "chunk_size": check_chunk_size(api, args.get("chunk_size")), "backend": args.get("backend", "auto"),
            "tunables": dict(args.get("tunables") or {})}


def rwkv6_options(args: dict) -> dict:
    """The ``rwkv6`` pair's options for a call with arguments ``args``."""
    api = attention.RWKV6
    return {"scale": scale_option(api, args.get("scale")),
            "cu_seqlens": offsets_option(api, args.get("cu_seqlens"), args.get("cu_seqlens_cpu")),
            "cu_seqlens_name": offsets_name(args.get("cu_seqlens"), args.get("cu_seqlens_cpu")),
            "chunk_size": check_chunk_size(api, args.get("chunk_size")), "backend": args.get("backend", "auto"),
            "tunables": dict(args.get("tunables") or {})}


def mamba2_options(args: dict) -> dict:
    """The ``mamba2`` pair's options for a call of ``mamba2_scan`` (``dt_limit`` as text: ``inf`` is no literal)."""
    api = mamba2.API
    lo, hi = mamba2.limit_of(args.get("dt_limit", (0.0, float("inf"))))
    cu = seqlens_option(api, args.get("cu_seqlens"))
    if args.get("return_varlen_states") and cu is None:
        raise ScanInputError(f"{api}: return_varlen_states=True returns the final state of each sequence of "
                             "cu_seqlens; pass cu_seqlens")
    return {"dt_softplus": bool(args.get("dt_softplus", False)), "dt_limit": (repr(lo), repr(hi)), "cu_seqlens": cu,
            "seq_idx": seq_idx_option(api, args.get("seq_idx")),
            "chunk_size": check_chunk_size(api, args.get("chunk_size")), "backend": args.get("backend", "auto"),
            "tunables": dict(args.get("tunables") or {})}
