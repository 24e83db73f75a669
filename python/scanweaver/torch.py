"""PyTorch front end: differentiable scans on tensors (``pip install 'scanweaver[torch]'``).

:func:`selective_scan` and :func:`apply` (any ``@scanweaver.recurrence``,
gates written as expressions included) run ScanWeaver's kernels on tensors
and have gradients for every operand, ``h0`` and through the final state.
They are two ``torch.library`` custom ops, ``scanweaver::forward`` and
``scanweaver::backward``, with a registered autograd formula, so they work
in eager mode, under ``torch.compile`` (no graph break) and with
``torch.library.opcheck``.  Every :class:`~scanweaver.differentiable.KernelPair`
goes through the same two ops (:func:`call`).

Devices: CPU tensors run on the ``cpu`` backend (or ``backend=``) as NumPy
views of the tensors' memory, and the results are tensors over the kernels'
output buffers: no copies either way.  CUDA tensors go to the ``cuda``
backend as CuPy views (DLPack) on PyTorch's current stream.  bfloat16
tensors are computed in float32 (NumPy has no bfloat16) and cast back.

The backward is stage ``adjoint`` of :mod:`scanweaver.ir.adjoint`, run by the
same backend as the forward (``states=`` chooses recomputing or saving the
states; see :mod:`scanweaver.autodiff`).  Second derivatives are not
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


import numpy as np
import torch

from . import differentiable
from .api import SELECTIVE, SELECTIVE_NO_C, Recurrence
from .differentiable import PAIRS, parse_options, scan_options
from .errors import ScanInputError

_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
           torch.complex64: np.complex64, torch.complex128: np.complex128, torch.bool: np.bool_,
           torch.uint8: np.uint8, torch.int32: np.int32, torch.int64: np.int64}
_TORCH = {np.dtype(v): k for k, v in _DTYPES.items()}


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
        return torch.from_numpy(np.ascontiguousarray(a) if not a.flags.writeable else a)
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
    with _stream(inputs):
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
    with _stream([*inputs, *cotangents]):
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


def call(name: str, inputs: list, options: dict | str) -> list[torch.Tensor]:
    """Runs kernel pair ``name`` on tensors (``None`` for absent optional inputs); returns its outputs.

    Args:
        name: a name in :data:`scanweaver.differentiable.PAIRS`.
        inputs: tensors or ``None``, in the pair's order.
        options: a dict of Python literals for the pair's kernels (or its ``repr``).
    """
    n = PAIRS.get(name).n_outputs
    present = [t is not None for t in inputs]
    text = options if isinstance(options, str) else repr(options)
    return _forward(name, [t for t in inputs if t is not None], present, text)[:n]


def _check_tensors(api: str, required: dict, optional: dict) -> None:
    """Raises :class:`ScanInputError` naming the first argument that is not a tensor (``None`` allowed for
    ``optional`` ones)."""
    for name, t in (*required.items(), *optional.items()):
        if not isinstance(t, torch.Tensor) and not (t is None and name in optional):
            raise ScanInputError(f"scanweaver.torch.{api}: {name} must be a torch.Tensor"
                                 f"{' or None' if name in optional else ''}; got {type(t).__name__}")


@torch.compiler.assume_constant_result
def _scan_options(rec: Recurrence, reverse, cu_seqlens, backend, schedule, config, states, tunables) -> str:
    """The ``scan`` options as text; a constant for ``torch.compile`` (it runs once, when tracing)."""
    return repr(scan_options(rec, reverse=reverse, cu_seqlens=cu_seqlens, backend=backend, schedule=schedule,
                             config=config, states=states, **dict(tunables)))


def apply(rec: Recurrence, *operands, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
          cu_seqlens=None, backend: str = "auto", schedule: str = "auto", config="auto", states: str = "recompute",
          **tunables):
    """Runs recurrence ``rec`` on tensors, differentiably (see :meth:`scanweaver.Recurrence.__call__`).

    Args:
        rec: a ``@scanweaver.recurrence``.
        *operands: tensors in the order of ``rec.inputs`` (broadcast like the recurrence's NumPy call).
        h0: initial state tensor, or None.
        reset: boolean tensor marking segment starts, or None.
        reverse, cu_seqlens, backend, schedule, config, **tunables: as for the NumPy call.
        return_state: also return the final state (differentiable too).
        states: ``"recompute"`` (default) or ``"save"``: how the backward gets the states.

    Returns:
        ``y`` (the operands' shape and dtype), or ``(y, h_last)``.
    """
    if len(operands) != len(rec.inputs):
        raise ScanInputError(f"{rec.name}: takes {len(rec.inputs)} operands ({', '.join(rec.inputs)}), "
                             f"got {len(operands)}")
    _check_tensors(rec.name, dict(zip(rec.inputs, operands, strict=True)), {"h0": h0, "reset": reset})
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


def selective_scan(a, b, x, c=None, *, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
                   cu_seqlens=None, backend: str = "auto", schedule: str = "auto", config="auto",
                   states: str = "recompute", **tunables):
    """h_t = a_t*h_{t-1} + b_t*x_t, y_t = c_t*h_t over the last axis of tensors, with gradients.

    The semantics of :func:`scanweaver.selective_scan`; gradients for ``a``, ``b``, ``x``,
    ``c``, ``h0`` and through the final state (``return_state=True``).  See :func:`apply`.
    """
    rec = SELECTIVE_NO_C if c is None else SELECTIVE
    operands = (a, b, x) if c is None else (a, b, x, c)
    return apply(rec, *operands, h0=h0, reset=reset, reverse=reverse, return_state=return_state,
                 cu_seqlens=cu_seqlens, backend=backend, schedule=schedule, config=config, states=states, **tunables)


@torch.compiler.assume_constant_result
def _mamba_options(delta_softplus, cu_seqlens, backend, tunables) -> str:
    """The ``mamba1`` pair's options as text; a constant for ``torch.compile``."""
    from .mamba.grad import options

    return repr(options(delta_softplus, cu_seqlens, backend, **dict(tunables)))


def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                         h0=None, return_state: bool = False, *, cu_seqlens=None, backend: str = "auto", **tunables):
    """Mamba-1's selective scan on tensors with gradients: the fused kernels of
    :func:`scanweaver.mamba_selective_scan` (``mamba_ssm``'s ``selective_scan_ref`` semantics).

    Gradients for ``u``, ``delta``, ``A``, ``B``, ``C``, ``D``, ``z``, ``delta_bias``, ``h0`` and
    through the final state (``return_state=True``); the backward recomputes the states from
    per-chunk checkpoints, so nothing of size (batch, D, N, L) is kept between the passes.
    bfloat16 tensors compute in float32.

    Example:
        >>> import torch, scanweaver.torch as swt
        >>> u = torch.randn(1, 4, 16, requires_grad=True)
        >>> y = swt.mamba_selective_scan(u, torch.rand(1, 4, 16), -torch.rand(4, 3), torch.randn(1, 3, 16),
        ...                              torch.randn(1, 3, 16), delta_softplus=True)
        >>> y.sum().backward(); u.grad.shape
        torch.Size([1, 4, 16])
    """
    _check_tensors("mamba_selective_scan", {"u": u, "delta": delta, "A": A, "B": B, "C": C},
                   {"D": D, "z": z, "delta_bias": delta_bias, "h0": h0})
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.tolist()
    opts = _mamba_options(bool(delta_softplus), None if cu_seqlens is None else tuple(cu_seqlens), backend,
                          tuple(sorted(tunables.items())))
    ins = [u, delta, A, B, C, D, z, delta_bias, h0]
    bf16 = u.dtype == torch.bfloat16
    ins = [t.float() if t is not None and t.dtype == torch.bfloat16 else t for t in ins]
    y, h_last = call("mamba1", ins, opts)
    if bf16:
        y = y.to(torch.bfloat16)
    return (y, h_last) if return_state else y


@torch.compiler.assume_constant_result
def _matrix_options(kind: str, args: tuple, tunables: tuple) -> str:
    """The options of the matrix-state pair ``kind`` as text; a constant for ``torch.compile``."""
    from .matrix import grad

    make = {"linear_attention": grad.la_options, "rwkv6": grad.rwkv6_options, "mamba2": grad.mamba2_options}[kind]
    return repr(make(*args, **dict(tunables)))


def _float32(tensors: list) -> tuple[list, bool]:
    """bfloat16 tensors as float32 (NumPy has no bfloat16); True when the first one was bfloat16."""
    bf16 = tensors[0] is not None and tensors[0].dtype == torch.bfloat16
    return [t.float() if t is not None and t.dtype == torch.bfloat16 else t for t in tensors], bf16


def _seqlens(cu_seqlens):
    if isinstance(cu_seqlens, torch.Tensor):
        cu_seqlens = cu_seqlens.tolist()
    return None if cu_seqlens is None else tuple(int(c) for c in cu_seqlens)


def linear_attention(q, k, v, *, g=None, g_head=None, decay=None, scale=None, initial_state=None,
                     output_final_state: bool = False, cu_seqlens=None, reverse: bool = False, backend: str = "auto",
                     **tunables):
    """:func:`scanweaver.linear_attention` on tensors, with gradients for q, k, v, the decay given (g, g_head
    or decay), initial_state and through the final state.

    Example:
        >>> import torch, scanweaver.torch as swt
        >>> q, k, v = torch.randn(3, 1, 8, 2, 4).unbind(0)
        >>> g = torch.nn.functional.logsigmoid(torch.randn(1, 8, 2, 4)).requires_grad_()
        >>> o, _ = swt.linear_attention(q, k, v, g=g)
        >>> o.sum().backward(); g.grad.shape
        torch.Size([1, 8, 2, 4])
    """
    opts = _matrix_options("linear_attention", (scale, bool(reverse), _seqlens(cu_seqlens), backend),
                           tuple(sorted(tunables.items())))
    ins, bf16 = _float32([q, k, v, g, g_head, decay, initial_state])
    o, h = call("linear_attention", ins, opts)
    return (o.to(torch.bfloat16) if bf16 else o), (h if output_final_state else None)


def rwkv6(r, k, v, w, u, *, scale=None, initial_state=None, output_final_state: bool = False, cu_seqlens=None,
          backend: str = "auto", **tunables):
    """:func:`scanweaver.rwkv6` on tensors, with gradients for r, k, v, w, u, initial_state and the final state."""
    opts = _matrix_options("rwkv6", (scale, _seqlens(cu_seqlens), backend), tuple(sorted(tunables.items())))
    ins, bf16 = _float32([r, k, v, w, u, initial_state])
    o, h = call("rwkv6", ins, opts)
    return (o.to(torch.bfloat16) if bf16 else o), (h if output_final_state else None)


def mamba2_scan(x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                dt_limit=(0.0, float("inf")), initial_states=None, return_final_states: bool = False,
                cu_seqlens=None, chunk_size=None, backend: str = "auto", **tunables):
    """:func:`scanweaver.mamba2_scan` on tensors, with gradients for x, dt, A, B, C, D, z, dt_bias (through the
    softplus and the dt_limit clamp), initial_states and through the final states."""
    opts = _matrix_options("mamba2", (bool(dt_softplus), tuple(float(v) for v in dt_limit), _seqlens(cu_seqlens),
                                      chunk_size, backend), tuple(sorted(tunables.items())))
    ins, bf16 = _float32([x, dt, A, B, C, D, z, dt_bias, initial_states])
    out, h = call("mamba2", ins, opts)
    out = out.to(torch.bfloat16) if bf16 else out
    return (out, h) if return_final_states else out


__all__ = ["apply", "call", "differentiable", "from_array", "linear_attention", "mamba2_scan", "mamba_selective_scan",
           "rwkv6", "selective_scan", "to_array"]
