"""JAX front end: differentiable scans on JAX arrays (``pip install 'scanweaver[jax]'``).

:func:`selective_scan` and :func:`apply` (any ``@scanweaver.recurrence``)
are ``jax.custom_vjp`` functions whose forward and backward run ScanWeaver's
compiled kernels through ``jax.pure_callback``: they work under ``jax.jit``,
``jax.grad`` (and ``jax.vjp``) and ``jax.vmap`` (the callback receives the
batch as a leading axis, which the scans treat as more lanes).  Every
:class:`~scanweaver.calls.pairs.KernelPair` gets the same treatment
(:func:`call`); under ``jax.vmap`` the named operations, whose kernels take
no batch axis (:attr:`~scanweaver.calls.pairs.KernelPair.batches`), run once
per batch element.

Copies: the callback hands the kernels host NumPy arrays (no copy on the
CPU device) and JAX copies each result into its own buffer once; on a GPU
device the data crosses to the host and back.

The backward is stage ``adjoint`` of :mod:`scanweaver.ir.adjoint` on the same
backend as the forward.  Gradients come back for every floating-point
input (JAX does not say which are needed); second derivatives are not
supported.

Example:
    >>> import jax, jax.numpy as jnp, scanweaver.jax
    >>> a = jnp.full((1, 4), 0.5); b = x = jnp.ones((1, 4))
    >>> loss = lambda a: scanweaver.jax.selective_scan(a, b, x).sum()
    >>> jax.jit(jax.grad(loss))(a).tolist()
    [[0.0, 1.75, 2.25, 1.75]]
"""

from __future__ import annotations

import sys

import functools

import jax
import numpy as np

from .arrays import dtype_refusal, is_floating
from .calls import route
from .core.recurrence import Recurrence
from .calls.declare import CALL_ARRAYS, OPERATIONS, Operation, make_entry
from .calls.pairs import PAIRS, options_text, parse_options
from .ops.scan.grad import scan_options
from .errors import ScanInputError, ScanWeaverError


def _full(values, present: tuple[bool, ...]) -> list:
    it = iter(values)
    return [next(it) if p else None for p in present]


@functools.lru_cache(maxsize=256)
def _op(name: str, present: tuple[bool, ...], options: str):
    """The ``custom_vjp`` function of pair ``name`` for one pattern of present inputs and options."""
    pair, opts = PAIRS.get(name), parse_options(options)
    n = pair.n_outputs
    vmap_method = "broadcast_all" if pair.batches else "sequential"  # see KernelPair.batches

    def result_specs(args):
        specs = _full([(tuple(a.shape), np.dtype(a.dtype)) for a in args], present)
        return [jax.ShapeDtypeStruct(shape, np.dtype(dt)) for shape, dt in pair.shapes(specs, opts)]

    def forward(*args):
        specs = result_specs(args)

        def host(*arrays):
            try:
                results = pair.forward(_full([np.asarray(a) for a in arrays], present), opts)
            except ScanWeaverError as exc:  # JAX wraps it in its runtime error: :func:`call` raises it again
                _failures.append(exc)
                del _failures[:-8]
                raise
            return tuple(np.asarray(r, dtype=s.dtype) for r, s in zip(results, specs, strict=True))

        @jax.custom_jvp
        def run(*values):
            return jax.pure_callback(host, tuple(specs), *values, vmap_method=vmap_method)

        run.defjvp(functools.partial(_no_second_derivative, name))  # reached by a second derivative only
        return run(*args)

    @jax.custom_vjp
    def op(*args):
        return tuple(forward(*args)[:n])

    def op_fwd(*args):
        results = forward(*args)
        return tuple(results[:n]), (args, tuple(results[n:]))

    def op_bwd(saved, cotangents):
        args, residuals = saved
        needs = [is_floating(a.dtype) for a in args]
        full_needs = [False if a is None else is_floating(a.dtype) for a in _full(args, present)]
        specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a, need in zip(args, needs, strict=True) if need]

        def host(*arrays):
            ins = [np.asarray(a) for a in arrays[: len(args)]]
            res = [np.asarray(a) for a in arrays[len(args): len(args) + len(residuals)]]
            cts = [np.asarray(a) for a in arrays[len(args) + len(residuals):]]
            grads = pair.backward(_full(ins, present), res, cts, full_needs, opts)
            return tuple(np.asarray(g, dtype=s.dtype) for g, s in zip(grads, specs, strict=True))

        @jax.custom_jvp
        def backward(*values):
            return jax.pure_callback(host, tuple(specs), *values, vmap_method=vmap_method)

        backward.defjvp(functools.partial(_no_second_derivative, name))
        grads = iter(backward(*args, *residuals, *cotangents))
        return tuple(next(grads) if need else None for need in needs)

    op.defvjp(op_fwd, op_bwd)
    return op


def _no_second_derivative(name: str, primals, tangents):
    """The backward's own derivative: none. Differentiating a gradient again (``jax.grad`` of ``jax.grad``,
    ``jax.hessian``, ``jax.jvp`` of a gradient) reaches here; this says so, instead of JAX's message about
    callbacks."""
    raise ScanWeaverError(f"scanweaver.jax: second derivatives are not supported: the gradient of {name} has no "
                          "derivative of its own, so it cannot be differentiated again (jax.grad of jax.grad, "
                          "jax.hessian, forward mode through a gradient)")


def call(name: str, inputs: list, options: dict) -> list:
    """Runs kernel pair ``name`` on JAX arrays (``None`` for absent optional inputs); returns its outputs.

    Args:
        name: a name in :data:`scanweaver.calls.pairs.PAIRS`.
        inputs: arrays or ``None``, in the pair's order.
        options: a dict of Python literals for the pair's kernels.
    """
    present = tuple(v is not None for v in inputs)
    args = [v for v in inputs if v is not None]
    try:
        out = list(_op(name, present, repr(options))(*args))
        if not any(isinstance(v, jax.core.Tracer) for v in args):
            jax.block_until_ready(out)  # eager: a failed callback raises here, where it can be unwrapped
        return out
    except ScanWeaverError:
        raise
    except Exception as exc:
        text = str(exc)
        cause = next((f for f in reversed(_failures) if str(f).splitlines()[0] in text), None)
        if cause is None:
            raise
        _failures.remove(cause)
        raise cause.with_traceback(None) from None


#: ScanWeaver errors raised inside callbacks lately (JAX reports them as its own runtime error).
_failures: list[ScanWeaverError] = []


def _check_floating(api: str, values: dict) -> None:
    """Raises :class:`ScanInputError` naming the first array that is not of a floating or complex dtype (the
    message of :func:`~scanweaver.arrays.dtype_refusal`, with JAX's conversion)."""
    for name, v in values.items():
        if v is not None and hasattr(v, "dtype") and not is_floating(v.dtype):
            raise dtype_refusal(api, name, v)


def apply(rec: Recurrence, *operands, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
          cu_seqlens=None, backend: str = "auto", schedule: str = "auto", config="auto", states: str = "recompute",
          out=None, **tunables):
    """Runs recurrence ``rec`` on JAX arrays, differentiably (see :meth:`scanweaver.Recurrence.__call__`).

    Args:
        rec: a ``@scanweaver.recurrence``.
        *operands: arrays in the order of ``rec.inputs``.
        h0: initial state, or None.
        reset: boolean array marking segment starts, or None.
        reverse, cu_seqlens, backend, schedule, config, **tunables: as for the NumPy call
            (``cu_seqlens`` must be concrete, not traced).
        return_state: also return the final state (differentiable too).
        states: ``"recompute"`` (default) or ``"save"``.

    Returns:
        ``y``, or ``(y, h_last)``.
    """
    if out is not None:
        raise ScanInputError(f"{rec.name}: out= takes NumPy or device arrays; with {FRAMEWORK} operands the result "
                             f"is a new {FRAMEWORK} array (drop out=)")
    if len(operands) != len(rec.inputs):
        raise ScanInputError(f"{rec.name}: takes {len(rec.inputs)} operands ({', '.join(rec.inputs)}), "
                             f"got {len(operands)}")
    missing = [n for n, v in zip(rec.inputs, operands, strict=True) if v is None]
    if missing:
        raise ScanInputError(f"{rec.name}: operand(s) {', '.join(missing)} missing (None); needs "
                             f"{', '.join(rec.inputs)} as arrays")
    _check_floating(rec.name, {**dict(zip(rec.inputs, operands, strict=True)), "h0": h0})
    opts = scan_options(rec, reverse=reverse, cu_seqlens=None if cu_seqlens is None else np.asarray(cu_seqlens),
                        backend=backend, schedule=schedule, config=config, states=states, **tunables)
    y, h_last = call("scan", [*operands, h0, reset], opts)
    return (y, h_last) if return_state else y


def _entry(op: Operation):
    """``scanweaver.jax.<op>``: the declared operation on JAX arrays, differentiable under ``jax.grad``/``jit``."""

    def run(args: dict):
        op.check(args)
        if op.recurrence is not None:
            rec = op.recurrence(args)
            rest = {k: v for k, v in args.items() if k != "tunables" and (k not in op.arrays or k in CALL_ARRAYS)}
            return apply(rec, *(args[n] for n in rec.inputs), **rest, **args["tunables"])
        if op.pair is None:  # written in the caller's array library: differentiable by JAX itself
            return op.run_numpy(args)
        _check_floating(op.name, {n: args.get(n) for n in op.arrays})
        options = op.options(args)
        options_text(op.name, options)
        return op.finish(call(op.pair, op.pair_inputs(args), options), args)

    return make_entry(op, run, __name__)


#: The framework this adapter takes (the router's name for it).
FRAMEWORK = "jax"
#: Entry points, one per declared operation this adapter carries (same signature as the NumPy one).
ENTRIES = {op.name: _entry(op) for op in OPERATIONS.values() if FRAMEWORK in op.frameworks}
globals().update(ENTRIES)
route.register(FRAMEWORK, sys.modules[__name__])

__all__ = ["apply", "call", *sorted(ENTRIES)]
