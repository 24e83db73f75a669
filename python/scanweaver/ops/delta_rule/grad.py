"""The kernel pairs of the delta-rule operations, for the PyTorch and JAX front ends, and their options.

Registered in :data:`scanweaver.calls.pairs.PAIRS` as ``delta_rule``,
``gated_delta_rule``, ``kda`` and ``rwkv7``, so ``scanweaver.torch.<op>`` (a
``torch.library`` custom op with an autograd formula) and
``scanweaver.jax.<op>`` (a ``jax.custom_vjp``) run the fused ``delta_rule``
forward and backward of :mod:`.kernels` with the chain rule of
:mod:`.families`.  Nothing per step is saved between the passes: the residuals
are the inputs, and the backward recomputes the states from checkpoints.

Outputs of every pair: ``o`` (v's dtype) and the final state (the accumulation
dtype).  :func:`options` turns a call's arguments (fla's, by name) into the
pair's options, Python literals, refusing fla's arguments that have no meaning
here when they are set.

A forward on NumPy arrays (CPU tensors reach it as NumPy views) runs through :func:`.plans.forward`: a
repeated call of a signature runs the plan the first one kept.  Where each part computes is
:func:`scanweaver.calls.device.place`'s rule, as
for the matrix-state pairs: CUDA tensors (CuPy views) and CuPy arrays stay on
the device when the backend that runs the part is ``cuda`` (``auto`` picks it
where it runs): checks, conversions, beta's sigmoid, the scale, the
``state_v_first`` transposes and the gradients' chain rule run with CuPy, the
fused kernels on the current stream; nothing is copied to the host and nothing
waits.  Where the GPU kernels do not fit the call (float16 storage), the part
runs on the best backend whose kernels do, on host copies
made once (the results copied back), and :data:`scanweaver.matrix.last` says so
in its ``fallback``.

Example:
    >>> import numpy as np
    >>> from scanweaver.calls.pairs import PAIRS
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 4, 1, 2))
    >>> pair = PAIRS.get("delta_rule")
    >>> ins = [q, k / 2, v, rng.uniform(0, 1, (1, 4, 1)), None]
    >>> o, h = pair.forward(ins, {"backend": "numpy"})
    >>> [g.shape for g in pair.backward(ins, [], [np.ones_like(o), None], [True, False, True, False, False],
    ...                                 {"backend": "numpy"})]
    [(1, 4, 1, 2), (1, 4, 1, 2)]
"""

from __future__ import annotations

import functools

import numpy as np

from ...arrays import returned_dtype
from ...calls.device import place
from ...calls.pairs import PAIRS, KernelPair
from ...checks import offsets_name, offsets_option, real_option, scale_option
from ...errors import ScanInputError
from ...fused.delta_rule import DeltaRuleFeatures
from . import plans
from .families import INPUTS, family_backward, family_forward
from .kernels import OP
from .operands import FAMILIES, accumulation, storage_dtype

#: fla's keyword arguments (its ``**kwargs``) each operation takes beside the kernels' tunables.
FLA_KEYWORDS = {"delta_rule": ("chunk_size",), "gated_delta_rule": ("chunk_size", "use_gate_in_kernel", "A_log",
                                                                     "dt_bias", "gk", "gv"),
                "kda": ("chunk_size", "A_log", "dt_bias"), "rwkv7": ()}
#: fla's ``fused_recurrent_gated_delta_rule`` decays beside g, taken when None (its callers pass them by keyword).
_OTHER_DECAYS = {
    "gk": "a log decay per key dimension is KDA's gate: call scanweaver.kda(q, k, v, gk, beta, ...) (with a g too, "
          "pass gk + g[..., None] as KDA's g)",
    "gv": "a decay of the state along its value dimension has no kernel here",
}
#: fla's removed ``head_first`` (its own message).
HEAD_FIRST = "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."
_GATE = ("computes the gate -exp(A_log) * softplus(g + dt_bias) inside fla's kernel; compute g so in PyTorch or "
         "JAX (it is differentiable there) and pass it with use_gate_in_kernel=False")


def features(family: str, inputs: list, options: dict, has_dhlast: bool = False) -> DeltaRuleFeatures | None:
    """The fused operation's features of a call of ``family`` as far as its inputs' shapes and dtypes give them
    (for :func:`~scanweaver.calls.device.place`: the GPU kernels run float32 and float64 storage, and no RWKV-7
    backward), or None where they do not (the operand checks then name what is wrong)."""
    named = dict(zip(INPUTS[family], inputs, strict=True))
    q, v = named["r" if family == "rwkv7" else "q"], named["v"]
    gate, form = FAMILIES[family]
    try:
        store = storage_dtype([x.dtype for n, x in named.items() if x is not None and n != "initial_state"])
        return DeltaRuleFeatures(store.name, int(q.shape[3]), int(v.shape[3]), named["initial_state"] is not None,
                                 options.get("cu_seqlens") is not None, has_dhlast, gate, form,
                                 bool(options.get("l2norm")))
    except (AttributeError, IndexError, TypeError, ValueError, ScanInputError):
        return None


def _wrap(family: str):
    """The pair's functions where :func:`~scanweaver.calls.device.place` says: on the caller's device with its
    array module (CuPy arrays, e.g. from CUDA tensors, on a backend that takes them), else on host arrays
    (device inputs copied once, the results copied back)."""

    def fwd(inputs: list, options: dict) -> list:
        if all(x is None or type(x) is np.ndarray for x in inputs):  # host arrays: a plan per signature
            return plans.forward(family, list(inputs), options)
        where = place(list(inputs), OP, "forward", options.get("backend", "auto"), api=family,
                      features=features(family, inputs, options))
        with where.context():
            out = family_forward(family, where.host(inputs), {**options, "backend": where.backend},
                                 where.xp if where.on_device else None)
        return where.results(out)

    def bwd(inputs: list, residuals: list, cotangents: list, needs: list, options: dict) -> list:
        feats = features(family, inputs, options, has_dhlast=cotangents[1] is not None)
        where = place([*inputs, *cotangents], OP, "backward", options.get("backend", "auto"), api=family,
                      features=feats)
        with where.context():
            out = family_backward(family, where.host(inputs), residuals, where.host(list(cotangents)), needs,
                                  {**options, "backend": where.backend}, where.xp if where.on_device else None)
        return where.results(out)

    return fwd, bwd


def _shapes(family: str, specs: list, options: dict) -> list:
    """``[(o's shape, dtype), (the final state's shape, dtype)]`` from the inputs' specs."""
    spec = dict(zip(INPUTS[family], specs, strict=True))
    qn = "r" if family == "rwkv7" else "q"
    for name in (qn, "v"):
        if spec[name] is None or len(spec[name][0]) != 4:
            raise ScanInputError(f"{family}: {name} needs 4 dimensions, got "
                                 f"{'none' if spec[name] is None else tuple(spec[name][0])}")
    (B, _, _, K), v = spec[qn][0], tuple(spec["v"][0])
    store = storage_dtype([s[1] for n, s in spec.items() if s is not None and n != "initial_state"])
    out = returned_dtype(spec["v"][1], store)
    cu = options.get("cu_seqlens")
    nseq = B if cu is None else len(cu) - 1
    state = (nseq, v[2], v[3], K) if options.get("state_v_first") else (nseq, v[2], K, v[3])
    return [(v, np.dtype(out)), (state, accumulation(store))]


for _family in INPUTS:
    PAIRS.register()(KernelPair(_family, *_wrap(_family), functools.partial(_shapes, _family), n_outputs=2,
                                follows=INPUTS[_family].index("v")))


def _refuse(api: str, args: dict, checks: dict) -> None:
    """Raises for the first argument of ``checks`` (name -> (default, why)) set to another value."""
    for name, (default, why) in checks.items():
        value = args.get(name, default)
        if value is not default and value != default:
            raise ScanInputError(f"{api}: {name}={value!r} is not supported: {why}")


def options(family: str, args: dict) -> dict:
    """The kernel pair's options of one call of ``family`` from its arguments by name (``tunables``: the ``**``
    keywords).  Literals only: they key the front ends' compiled ops.

    Raises:
        ScanInputError: an argument of fla's set to a value that has no meaning here, or inconsistent flags.
    """
    tunables = dict(args.get("tunables") or {})
    extra = {n: tunables.pop(n) for n in FLA_KEYWORDS[family] if n in tunables}
    if "transpose_state_layout" in tunables:
        raise ScanInputError(f"{family}: transpose_state_layout is fla's deprecated name of state_v_first; pass "
                             "state_v_first")
    if extra.get("use_gate_in_kernel") or args.get("use_gate_in_kernel"):
        raise ScanInputError(f"{family}: use_gate_in_kernel=True is not supported: it {_GATE}")
    for name in ("A_log", "dt_bias"):
        if extra.get(name) is not None:
            raise ScanInputError(f"{family}: {name} is read only by fla's use_gate_in_kernel, which {_GATE}")
    for name, why in _OTHER_DECAYS.items():
        if extra.get(name) is not None:
            raise ScanInputError(f"{family}: {name} (a decay of fla's fused_recurrent_gated_delta_rule) must be None; "
                                 f"{why}")
    _refuse(family, args, {
        "cp_context": (None, "context parallelism splits a sequence over devices in fla; ScanWeaver runs whole "
                             "sequences (pass cu_seqlens for packed ones)"),
        "return_intermediate_states": (False, "fla's per-chunk states of its chunked kernels; the decode step "
                                              f"{family}_step and output_final_state give the states"),
        "use_graph": (False, "fla's CUDA/NPU graph capture with padded cu_seqlens; not needed here"),
        "max_num_seqs": (None, "it goes with fla's use_graph"),
    })
    if args.get("allow_neg_eigval") and not args.get("use_beta_sigmoid_in_kernel"):
        raise ScanInputError(f"{family}: allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True "
                             "(beta = 2 * sigmoid(beta))")
    lower = real_option(family, "lower_bound", args.get("lower_bound"), "a negative real number or None")
    if lower is not None and not lower < 0:
        raise ScanInputError(f"{family}: lower_bound must be negative (a bound on log decays < 0), got {lower}")
    chunk = extra.get("chunk_size", args.get("chunk_size"))
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1):
        raise ScanInputError(f"{family}: chunk_size must be a positive int or None, got {chunk!r}")
    return {"scale": scale_option(family, args.get("scale")), "l2norm": bool(args.get("use_qk_l2norm_in_kernel")),
            "beta_sigmoid": bool(args.get("use_beta_sigmoid_in_kernel")),
            "neg_eigval": bool(args.get("allow_neg_eigval")), "state_v_first": bool(args.get("state_v_first")),
            "cu_seqlens": offsets_option(family, args.get("cu_seqlens"), args.get("cu_seqlens_cpu")),
            "cu_seqlens_name": offsets_name(args.get("cu_seqlens"), args.get("cu_seqlens_cpu")),
            "chunk_size": None if chunk is None else int(chunk), "backend": args.get("backend", "auto"),
            "tunables": tunables}
