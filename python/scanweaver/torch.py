"""PyTorch front end: differentiable scans on tensors (``pip install 'scanweaver[torch]'``).

:func:`selective_scan` and :func:`apply` (any ``@scanweaver.recurrence``,
gates written as expressions included) run ScanWeaver's kernels on tensors
and have gradients for every operand, ``h0`` and through the final state.
They are two ``torch.library`` custom ops, ``scanweaver::forward`` and
``scanweaver::backward``, with a registered autograd formula, so they work
in eager mode, under ``torch.compile`` (no graph break) and with
``torch.library.opcheck``.  Every :class:`~scanweaver.calls.pairs.KernelPair`
goes through the same two ops (:func:`call`).

Devices: CPU tensors run on the ``cpu`` backend (or ``backend=``) as NumPy
views of the tensors' memory, and the results are tensors over the kernels'
output buffers: no copies either way.  A declared operation's call that
autograd would not record (``torch.no_grad()``, ``torch.inference_mode()``,
or no tensor requiring a gradient) on plain CPU tensors NumPy can view, not
traced and not under a ``torch.func`` transform or forward-mode AD, runs the
NumPy entry on the views directly and skips the custom op's dispatch (a
decode loop's one-token calls: 241 to 125 us at (1, 16, 64, 64)); a tensor
it writes in place (``mamba2_state_update``'s cache) gets its version
counter bumped, as PyTorch's own writes do.  CUDA tensors go to the ``cuda``
backend as CuPy views (DLPack) on PyTorch's current stream.  bfloat16
tensors are computed in float32 (NumPy has no bfloat16) and cast back.

The backward is stage ``adjoint`` of :mod:`scanweaver.ir.adjoint`, run by the
same backend as the forward (``states=`` chooses recomputing or saving the
states; see :mod:`scanweaver.core.autodiff`).  Second derivatives are not
supported.

Example:
    >>> import torch, scanweaver.torch
    >>> a = torch.full((1, 4), 0.5, dtype=torch.float64, requires_grad=True)
    >>> b = x = torch.ones(1, 4, dtype=torch.float64)
    >>> y = scanweaver.torch.selective_scan(a, b, x)
    >>> y.sum().backward()
    >>> y.detach().tolist(), a.grad.tolist()
    ([[1.0, 1.5, 1.75, 1.875]], [[0.0, 1.75, 2.25, 1.75]])
"""

from __future__ import annotations

import sys


import numpy as np
import torch

from .arrays import dtype_refusal, operands_from
from .calls import route
from .core.recurrence import Recurrence
from .calls.declare import CALL_ARRAYS, OPERATIONS, Operation, make_entry
from .calls.pairs import PAIRS, options_text, parse_options
from .ops.scan.grad import scan_options
from .errors import ScanInputError, ScanWeaverError

_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
           torch.complex64: np.complex64, torch.complex128: np.complex128, torch.bool: np.bool_,
           torch.uint8: np.uint8, torch.int32: np.int32, torch.int64: np.int64}
_TORCH = {np.dtype(v): k for k, v in _DTYPES.items()}
#: Arguments holding indices or masks, not operands (their dtype checks are the operations' own).
_INDICES = ("reset", "state_batch_indices", "cu_seqlens")


def to_array(t: torch.Tensor | None):
    """A NumPy (CPU) or CuPy (CUDA) view of ``t``'s memory, or ``None``."""
    if t is None:
        return None
    t = t.detach()
    if t.device.type == "cuda":
        import cupy

        return cupy.from_dlpack(t)
    if t.device.type != "cpu":
        raise ScanInputError(f"scanweaver.torch: tensors on {t.device} are not supported; use CPU or CUDA tensors")
    if t.dtype not in _DTYPES:
        raise ScanInputError(f"scanweaver.torch: dtype {t.dtype} is not supported (float16/32/64, bfloat16 "
                             "through float32, complex for the forward only)")
    return t.numpy()


def from_array(a) -> torch.Tensor:
    """A tensor over array ``a``'s memory (NumPy: ``from_numpy``; CuPy: DLPack)."""
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a if a.flags.writeable else np.array(a))  # PyTorch has no read-only tensors
    return torch.from_dlpack(a)


def _stream(tensors):
    """A context making PyTorch's current CUDA stream CuPy's (no-op for CPU tensors)."""
    import contextlib

    dev = next((t.device for t in tensors if t is not None and t.device.type == "cuda"), None)
    if dev is None:
        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.ExternalStream(torch.cuda.current_stream(dev).cuda_stream)


def _spec(t: torch.Tensor | None):
    if t is None:
        return None
    if t.dtype not in _DTYPES:
        raise ScanInputError(f"scanweaver.torch: dtype {t.dtype} is not supported")
    return tuple(t.shape), np.dtype(_DTYPES[t.dtype])


def _full(tensors: list, present: list[bool]) -> list:
    """The inputs with ``None`` back where ``present`` is False (custom ops take ``list[Tensor]`` only:
    autograd does not track tensors inside ``list[Optional[Tensor]]``)."""
    it = iter(tensors)
    return [next(it) if p else None for p in present]


@torch.library.custom_op("scanweaver::forward", mutates_args=())
def _forward(name: str, inputs: list[torch.Tensor], present: list[bool], options: str) -> list[torch.Tensor]:
    pair, opts = PAIRS.get(name), parse_options(options)
    with _stream(inputs), operands_from("torch"):  # the checks see views: their hints speak of tensors
        results = pair.forward([to_array(t) for t in _full(inputs, present)], opts)
    return [from_array(r) for r in results]


@_forward.register_fake
def _forward_fake(name, inputs, present, options):
    pair, opts = PAIRS.get(name), parse_options(options)
    dev = inputs[0].device
    return [torch.empty(shape, dtype=_TORCH[np.dtype(dt)], device=dev)
            for shape, dt in pair.shapes([_spec(t) for t in _full(inputs, present)], opts)]


@torch.library.custom_op("scanweaver::backward", mutates_args=())
def _backward(name: str, inputs: list[torch.Tensor], present: list[bool], residuals: list[torch.Tensor],
              cotangents: list[torch.Tensor], given: list[bool], needs: list[bool], options: str) -> list[torch.Tensor]:
    pair, opts = PAIRS.get(name), parse_options(options)
    with _stream([*inputs, *cotangents]), operands_from("torch"):
        grads = pair.backward([to_array(t) for t in _full(inputs, present)], [to_array(t) for t in residuals],
                              [to_array(t) for t in _full(cotangents, given)], list(needs), opts)
    return [from_array(g) for g in grads]


@_backward.register_fake
def _backward_fake(name, inputs, present, residuals, cotangents, given, needs, options):
    return [torch.empty_like(t) for t, need in zip(_full(inputs, present), needs, strict=True) if need]


def _setup_context(ctx, inputs, output):
    name, tensors, present, options = inputs
    pair = PAIRS.get(name)
    ctx.name, ctx.options, ctx.present = name, options, list(present)
    ctx.needs = [t is not None and t.requires_grad for t in _full(tensors, present)]
    ctx.save_for_backward(*tensors, *output[pair.n_outputs:])


def _autograd(ctx, grads):
    pair = PAIRS.get(ctx.name)
    saved = list(ctx.saved_tensors)
    n = sum(ctx.present)
    cot = list(grads[: pair.n_outputs])
    given = [g is not None for g in cot]
    out = _backward(ctx.name, saved[:n], ctx.present, saved[n:], [g for g in cot if g is not None], given,
                    ctx.needs, ctx.options) if any(ctx.needs) else []
    it = iter(out)
    full = [next(it) if need else None for need in ctx.needs]
    return None, [g for g, p in zip(full, ctx.present, strict=True) if p], None, None


torch.library.register_autograd("scanweaver::forward", _autograd, setup_context=_setup_context)


def _setup_second(ctx, inputs, output):
    ctx.name = inputs[0]


def _no_second_derivative(ctx, grads):
    """The backward's own derivative: none. A gradient taken with ``create_graph=True`` and differentiated again
    reaches here; this says so, instead of PyTorch's message about a missing autograd formula."""
    raise ScanWeaverError(f"scanweaver.torch: second derivatives are not supported: the gradient of {ctx.name} "
                          "(scanweaver::backward) has no derivative of its own, so a gradient taken with "
                          "create_graph=True cannot be differentiated again (double backward, Hessian-vector "
                          "products, gradient penalties through this operation)")


torch.library.register_autograd("scanweaver::backward", _no_second_derivative, setup_context=_setup_second)


def _refuse_transforms(name: str, inputs: list) -> None:
    """Raises :class:`ScanInputError` for tensors of a ``torch.func`` transform (grad, vmap, jacrev, jvp, ...):
    the custom ops have an autograd formula and no batching or forward-mode rule, and PyTorch's own refusal
    speaks of an ``autograd.Function`` the caller never wrote."""
    wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    if wrapped is not None and any(t is not None and wrapped(t) for t in inputs):
        raise ScanInputError(f"scanweaver.torch: {name} does not run under torch.func transforms (grad, vmap, "
                             "jacrev, jvp, ...); differentiate with torch.autograd (loss.backward() or "
                             "torch.autograd.grad), and loop or batch along an axis the operation takes instead "
                             "of vmap")



def _one_device(name: str, inputs: list) -> None:
    """Raises :class:`ScanInputError` for tensors on more than one device, as PyTorch's own operations do (a meta
    tensor beside CPU tensors returned a meta result; 0-d CPU tensors may stand beside any device, as in PyTorch)."""
    devices = {t.device for t in inputs if t is not None and not (t.dim() == 0 and t.device.type == "cpu")}
    if len(devices) > 1:
        raise ScanInputError(f"scanweaver.torch: {name} got tensors on {', '.join(sorted(map(str, devices)))}; "
                             "pass them all on one device")

def call(name: str, inputs: list, options: dict | str) -> list[torch.Tensor]:
    """Runs kernel pair ``name`` on tensors (``None`` for absent optional inputs); returns its outputs.

    Args:
        name: a name in :data:`scanweaver.calls.pairs.PAIRS`.
        inputs: tensors or ``None``, in the pair's order.
        options: a dict of Python literals for the pair's kernels (or its ``repr``).
    """
    n = PAIRS.get(name).n_outputs
    if not torch.compiler.is_compiling():
        _refuse_transforms(name, inputs)
        _one_device(name, inputs)
    present = [t is not None for t in inputs]
    text = options if isinstance(options, str) else repr(options)
    return _forward(name, [t for t in inputs if t is not None], present, text)[:n]


def _check_tensors(api: str, values: dict) -> None:
    """Raises :class:`ScanInputError` naming the first argument that is neither a tensor nor ``None``, or a
    tensor of operands of a dtype NumPy has no view for (int8, float8, ...: no scan takes them; index and mask
    arguments keep their own checks)."""
    for name, t in values.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise ScanInputError(f"scanweaver.torch.{api}: {name} must be a torch.Tensor or None; got "
                                 f"{type(t).__name__}")
        if t is not None and t.dtype not in _DTYPES and t.dtype != torch.bfloat16 and name not in _INDICES:
            raise dtype_refusal(api, name, t)


def _needs_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _on_device(tensors) -> bool:
    """True when every tensor given is a CUDA tensor (and there is one)."""
    given = [t for t in tensors if isinstance(t, torch.Tensor)]
    return bool(given) and all(t.is_cuda for t in given)


@torch.compiler.assume_constant_result
def _scan_options(rec: Recurrence, reverse, cu_seqlens, backend, schedule, config, states, tunables) -> str:
    """The ``scan`` options as text; a constant for ``torch.compile`` (it runs once, when tracing)."""
    return repr(scan_options(rec, reverse=reverse, cu_seqlens=cu_seqlens, backend=backend, schedule=schedule,
                             config=config, states=states, **dict(tunables)))


def apply(rec: Recurrence, *operands, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
          cu_seqlens=None, backend: str = "auto", schedule: str = "auto", config="auto", states: str = "recompute",
          out=None, **tunables):
    """Runs recurrence ``rec`` on tensors, differentiably (see :meth:`scanweaver.Recurrence.__call__`).

    CUDA tensors that need no gradient run on the ``cuda`` backend as CuPy views of their memory, on
    PyTorch's current stream, with no copy and no synchronisation (``out=`` allowed); everything else runs
    through the ``scan`` kernel pair with an autograd formula.

    Args:
        rec: a ``@scanweaver.recurrence``.
        *operands: tensors in the order of ``rec.inputs`` (broadcast like the recurrence's NumPy call).
        h0: initial state tensor, or None.
        reset: boolean tensor marking segment starts, or None.
        reverse, cu_seqlens, backend, schedule, config, **tunables: as for the NumPy call.
        return_state: also return the final state (differentiable too).
        states: ``"recompute"`` (default) or ``"save"``: how the backward gets the states.
        out: a CUDA tensor to write ``y`` into, for calls that need no gradient.

    Returns:
        ``y`` (the operands' shape and dtype), or ``(y, h_last)``.
    """
    if len(operands) != len(rec.inputs):
        raise ScanInputError(f"{rec.name}: takes {len(rec.inputs)} operands ({', '.join(rec.inputs)}), "
                             f"got {len(operands)}")
    missing = [n for n, t in zip(rec.inputs, operands, strict=True) if t is None]
    if missing:
        raise ScanInputError(f"{rec.name}: operand(s) {', '.join(missing)} missing (None); needs "
                             f"{', '.join(rec.inputs)} as tensors")
    _check_tensors(rec.name, {**dict(zip(rec.inputs, operands, strict=True)), "h0": h0, "reset": reset, "out": out})
    tensors = [*operands, h0, reset]
    if not _needs_grad(tensors) and _on_device([*tensors, out]):
        with _stream(tensors), operands_from("torch"):
            result = rec(*(to_array(t) for t in operands), h0=to_array(h0), reset=to_array(reset), reverse=reverse,
                         return_state=return_state, cu_seqlens=cu_seqlens, backend=backend, schedule=schedule,
                         config=config, out=to_array(out), **tunables)
        if return_state:
            return (out if out is not None else from_array(result[0])), from_array(result[1])
        return out if out is not None else from_array(result)
    if out is not None:
        raise ScanInputError(f"{rec.name}: out= takes CUDA tensors that need no gradient (or NumPy or device "
                             f"arrays); with these operands the result is a new tensor (drop out=)")
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.tolist()
    opts = _scan_options(rec, reverse, None if cu_seqlens is None else tuple(cu_seqlens), backend, schedule,
                         config, states, tuple(sorted(tunables.items())))
    half = [t.dtype == torch.bfloat16 for t in operands]
    ops = [t.float() if is_bf16 else t for t, is_bf16 in zip(operands, half, strict=True)]
    h0 = h0.float() if h0 is not None and h0.dtype == torch.bfloat16 else h0
    y, h_last = call("scan", [*ops, h0, reset], opts)
    if all(half):
        y = y.to(torch.bfloat16)
    return (y, h_last) if return_state else y


def _static(value, name: str = "an argument"):
    """A non-array argument as a constant for :func:`_options`: a tensor (offsets, sequence indices, a
    0-d scale) as its values in nested tuples, with its shape and its kind of number, so the operation's
    checks see what the caller passed (a float or 2-D ``cu_seqlens`` is refused, not truncated)."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "meta":
            raise ScanInputError(f"scanweaver.torch: {name} is a meta tensor, and its values are needed (offsets, "
                                 "indices or a scale); pass it on the CPU or the operands' device")
        if name in _INDICES and (value.is_floating_point() or value.is_complex()):
            # NumPy scalars keep the kind of number for the operation's refusal (tolist() makes float32 float64)
            return _scalars(value.detach().cpu().numpy())
        return _frozen(value.detach().cpu().tolist())
    if isinstance(value, dict):
        return tuple(sorted((k, _static(v, k)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_static(v, name) for v in value)
    return value


def _scalars(a: np.ndarray):
    """``a`` as nested tuples of NumPy scalars (of ``a``'s dtype)."""
    return tuple(_scalars(x) for x in a) if a.ndim else a[()]


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


@torch.compiler.assume_constant_result
def _options(name: str, static: tuple) -> str:
    """Operation ``name``'s kernel-pair options as text; a constant for ``torch.compile`` (it runs when tracing)."""
    args = dict(static)
    args["tunables"] = dict(args.get("tunables") or ())
    return options_text(name, OPERATIONS.get(name).options(args))


#: The tensor types whose NumPy views the no-autograd path takes (subclasses, fake tensors among them, take the
#: custom op, which has a fake implementation).
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
#: The innermost ``torch.func`` transform around a call, or None (a PyTorch without it: every call is taken as
#: transformed, so every call keeps the custom op).
_TRANSFORM = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", lambda: True)


def _forward_ad() -> bool:
    """True inside ``torch.autograd.forward_ad.dual_level()`` (dual tensors require no gradient, yet their tangents
    must go through the custom op's path)."""
    return getattr(torch.autograd.forward_ad, "_current_level", 0) >= 0


def _writable(t: torch.Tensor) -> bool:
    """True when PyTorch itself would write ``t`` in place: not an inference tensor outside inference mode, and no
    element stored twice (a stride of 0 over more than one element, as ``expand`` makes)."""
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return False
    return not any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape, strict=True))


def _host_views(args: dict, arrays: tuple[str, ...], writes: tuple[str, ...] = ()) -> dict | None:
    """NumPy views of a call's tensors when nothing around it needs the custom op, else ``None``.

    That is: every array argument a CPU tensor of a dtype NumPy has (bfloat16 is computed in float32 by the
    custom op's path) or ``None``, at least one given, and every other tensor argument (``cu_seqlens``, a 0-d
    ``scale``) a CPU tensor NumPy can view; none that autograd would record (grad mode off, or no tensor
    requiring a gradient); not traced (``torch.compile``, ``torch.jit.trace``) nor under a ``torch.func``
    transform nor forward-mode AD; the tensors in ``writes`` (changed in place) :func:`_writable`.  Such a call is
    the NumPy entry's on views of the same memory (decode loops under ``torch.no_grad()`` or
    ``torch.inference_mode()`` are such calls), so it skips the custom op's dispatch, which costs more than a
    one-token kernel.  Anything else (meta tensors among them) takes the custom op's path and its checks.
    """
    grad = torch.is_grad_enabled()
    views = {}
    for name, t in args.items():
        if name in arrays:
            if t is None:
                continue
            if t.__class__ not in _PLAIN_TENSORS or t.dtype not in _DTYPES:
                return None
        elif not isinstance(t, torch.Tensor):
            continue
        if t.__class__ not in _PLAIN_TENSORS or not t.is_cpu or (grad and t.requires_grad):
            return None
        views[name] = t
    if not any(n in views for n in arrays) or torch.compiler.is_compiling() or torch.jit.is_tracing() or \
            _TRANSFORM() is not None or _forward_ad() or not all(_writable(views[n]) for n in writes if n in views):
        return None
    try:
        return {n: (t.detach() if t.requires_grad else t).numpy() for n, t in views.items()}
    except (RuntimeError, TypeError):  # no NumPy view (a conjugate bit, a dtype NumPy lacks): the custom op's path
        return None


def _as_tensors(result, inputs: tuple):
    """A NumPy entry's result with its arrays as tensors over their memory (tuples and lists kept); an array
    that may share memory with one of the ``inputs`` is copied (the custom op's outputs never alias its inputs,
    and neither do these)."""
    if isinstance(result, np.ndarray):
        return from_array(np.array(result) if any(np.may_share_memory(result, x) for x in inputs) else result)
    if type(result) in (tuple, list):
        return type(result)(_as_tensors(r, inputs) for r in result)
    return result


def _float32(tensors: list, follows: int = 0) -> tuple[list, bool]:
    """bfloat16 tensors as float32 (NumPy has no bfloat16); True when ``tensors[follows]``, the input whose dtype
    the first output takes (:attr:`~scanweaver.calls.pairs.KernelPair.follows`: v, or u, or x), was bfloat16."""
    bf16 = tensors[follows] is not None and tensors[follows].dtype == torch.bfloat16
    return [t.float() if t is not None and t.dtype == torch.bfloat16 else t for t in tensors], bf16


def _entry(op: Operation):
    """``scanweaver.torch.<op>``: the declared operation on tensors, with gradients for every input."""

    def run(args: dict):
        op.check(args)
        if op.recurrence is not None:  # a compiled recurrence: apply() (CUDA without gradients: the device path)
            rec = op.recurrence(args)
            rest = {k: v for k, v in args.items() if k != "tunables" and (k not in op.arrays or k in CALL_ARRAYS)}
            return apply(rec, *(args[n] for n in rec.inputs), **rest, **args["tunables"])
        views = _host_views(args, op.arrays, op.writes)
        if views is not None:  # no autograd, no tracing: the NumPy entry's work on views of the tensors
            with operands_from("torch"):
                result = op.run_numpy({**args, **views})
            for name in op.writes:  # changed through a view: autograd's saved tensors must see the change
                if name in views:
                    torch.autograd.graph.increment_version(args[name])
            return _as_tensors(result, tuple(views.values()))
        if op.pair is None:  # written in the caller's array library: differentiable by PyTorch itself
            return op.run_numpy(args)
        static = tuple(sorted((k, _static(v, k)) for k, v in args.items() if k not in op.arrays))
        opts = _options(op.name, static)
        inputs = op.pair_inputs(args)
        _check_tensors(op.name, {n: args.get(n) for n in op.arrays})
        ins, bf16 = _float32(inputs, PAIRS.get(op.pair).follows)
        outs = call(op.pair, ins, opts)
        if bf16:
            outs[0] = outs[0].to(torch.bfloat16)
        return op.finish(outs, args)

    return make_entry(op, run, __name__)


#: The framework this adapter takes (the router's name for it).
FRAMEWORK = "torch"
#: Entry points, one per declared operation this adapter carries (same signature as the NumPy one).
ENTRIES = {op.name: _entry(op) for op in OPERATIONS.values() if FRAMEWORK in op.frameworks}
globals().update(ENTRIES)
route.register(FRAMEWORK, sys.modules[__name__])

__all__ = ["apply", "call", "from_array", "to_array", *sorted(ENTRIES)]
