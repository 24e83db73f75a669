"""Differentiable operations as forward/backward pairs of array kernels, wrapped once per framework.

A :class:`KernelPair` says how to run an operation forward on arrays (NumPy,
or CuPy for the ``cuda`` backend), which arrays to keep for the backward,
how to run the backward, and the shapes of its results without running it.
:mod:`scanweaver.torch` turns every registered pair into one ``torch.library``
custom op with a registered autograd formula (so it works under
``torch.compile``), and :mod:`scanweaver.jax` into a ``jax.custom_vjp``
function whose kernels run through ``jax.pure_callback``.  The pairs are found
by name in :data:`PAIRS`; a new differentiable kernel (a fused Mamba scan,
say) registers a pair and gets both framework wrappers for free::

    PAIRS.register()(KernelPair("my_op", forward, backward, shapes, n_outputs=1))
    y = scanweaver.torch.call("my_op", [u, delta, A], {"softplus": True})[0]

Options are a dict of Python literals (bool, int, float, str, None, and tuples,
lists and dicts of them); they reach the kernels unchanged and are part of
the op's identity under ``torch.compile`` and ``jax.jit``.

Example:
    >>> import numpy as np
    >>> pair = PAIRS.get("scan")
    >>> ops = [np.full((1, 3), 0.5), np.ones((1, 3)), np.ones((1, 3)), np.ones((1, 3)), None, None]
    >>> opts = {"recurrence": "selective_scan", "backend": "numpy"}
    >>> y, h_last, states = pair.forward(ops, opts)
    >>> y.tolist(), [g.tolist() for g in pair.backward(ops, [states], [np.ones((1, 3)), None],
    ...                                               [False, False, True, False, False, False], opts)]
    ([[1.0, 1.5, 1.75]], [[[1.75, 1.5, 1.0]]])
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ScanInputError
from ..registry import Discovery, Registry


@dataclass(frozen=True)
class KernelPair:
    """A differentiable operation on arrays.

    Attributes:
        name: its name (``scanweaver::<name>`` is not used: one generic custom op dispatches by it).
        forward: ``forward(inputs, options) -> results``: ``inputs`` a list of arrays or ``None``
            (absent optional inputs); ``results`` the outputs followed by the residuals, all arrays.
        backward: ``backward(inputs, residuals, cotangents, needs, options) -> grads``: one
            cotangent (or ``None``) per output, one flag per input; returns one gradient per
            input with ``needs`` set, in order, each shaped and typed like its input.
        shapes: ``shapes(specs, options) -> [(shape, dtype)]`` of the results, from ``specs``
            (``(shape, numpy dtype)`` or ``None`` per input), without running anything.
        n_outputs: how many of the results are outputs (the rest are residuals).
        follows: the input whose dtype the first output takes where that dtype is a storage one (float16,
            bfloat16): v for attention, u or x for Mamba; a front end that widens bfloat16 before the kernels
            (PyTorch's) narrows that output back by it.
        batches: True when ``forward`` and ``backward`` take one more leading axis on every input as more
            independent lanes (the scans'); ``jax.vmap`` then hands them the whole batch in one callback.
            Otherwise (the default: the named operations check their inputs' dimensions) a vmapped call runs
            them once per batch element.
    """

    name: str
    forward: Callable
    backward: Callable
    shapes: Callable
    n_outputs: int
    follows: int = 0
    batches: bool = False


#: Every kernel pair, by name: each operation's package under :mod:`scanweaver.ops` registers its own.
PAIRS: Registry[KernelPair] = Registry("kernel pair", (Discovery("scanweaver.ops"),))


@functools.lru_cache(maxsize=256)
def parse_options(text: str) -> dict:
    """A pair's options from their ``repr`` (as framework ops carry them), parsed once per text.

    The dict is shared between calls: read it, do not change it.
    """
    return ast.literal_eval(text)


def options_text(api: str, options: dict) -> str:
    """``repr(options)``, the text framework ops carry, checked to read back as Python literals.

    Raises:
        ScanInputError: naming the argument whose value is not one (an array passed where a number or
            a list of numbers is needed, say), instead of a parser's error from deep inside a call.
    """
    text = repr(options)
    try:
        parse_options(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        name, value = _not_literal(options) or ("an option", options)
        raise ScanInputError(f"{api}: {name} must be a number, a string, True/False, None or a list of them; "
                             f"got {type(value).__name__}") from None
    return text


def _not_literal(options: dict) -> tuple[str, object] | None:
    """The first ``(name, value)`` of ``options`` (nested dicts included) whose ``repr`` is no literal."""
    for key, value in options.items():
        if isinstance(value, dict):
            found = _not_literal(value)
        else:
            try:
                ast.literal_eval(repr(value))
                found = None
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                found = (str(key), value)
        if found is not None:
            return found
    return None
