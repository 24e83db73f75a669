"""Tracing a step function into stage ``scan``."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from ..errors import ScanWeaverError
from ..ir import expr as E
from ..ir.stages import Features, ScanIR
from ..ir.verifier import verify_scan
from .symbolic import Sym, to_expr


def step_inputs(step: Callable) -> tuple[str, ...]:
    """The per-step operand names of ``step(h, *inputs)``."""
    try:
        params = list(inspect.signature(step).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ScanWeaverError(f"recurrence: cannot read the signature of {step!r}: {exc}") from exc
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if not params or any(p.kind not in kinds for p in params):
        raise ScanWeaverError(
            "recurrence: the step function must take the state first and then named operands, "
            "e.g. `def step(h, a, b, x)`; *args, **kwargs and keyword-only parameters are not supported"
        )
    if len(params) < 2:
        raise ScanWeaverError("recurrence: the step function needs at least one operand after the state h")
    return tuple(p.name for p in params[1:])


def _substitute(e: E.Expr, target: E.Expr, repl: E.Expr) -> E.Expr:
    if e == target:
        return repl
    if not e.args:
        return e
    return E.Expr(e.op, tuple(_substitute(a, target, repl) for a in e.args), e.name, e.value)


def _split_result(result: object, k: int) -> tuple[object, object]:
    """``(h_next, y)`` from what a step returned."""
    if k == 1:
        if isinstance(result, tuple):
            if len(result) != 2:
                raise ScanWeaverError(
                    f"recurrence: step must return h_next or (h_next, y), got a tuple of {len(result)}"
                )
            return result
        return result, None
    seq = (list, tuple, np.ndarray)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], seq):
        h_next, y = result
    else:
        h_next, y = result, None
    if not isinstance(h_next, seq) or len(h_next) != k:
        raise ScanWeaverError(
            f"recurrence: with state_size={k} the step must return a sequence of {k} components "
            "(or (components, y))"
        )
    return tuple(h_next), y


def trace(step: Callable, *, name: str | None = None, dtype: str = "float32",
          features: Features = Features(), state_size: int = 1) -> ScanIR:
    """Runs ``step`` on symbolic values and returns stage ``scan``.

    Args:
        step: ``step(h, *inputs)`` returning ``h_next`` or ``(h_next, y)``.
            With ``state_size=k > 1``, ``h`` is a length-k array of symbolic
            components (index it, unpack it, or use it with ``@``) and
            ``h_next`` a sequence of k components.
        name: recurrence name; defaults to the function's name.
        dtype: storage dtype.
        features: call-site features.
        state_size: k, the length of the state vector.

    Returns:
        The verified :class:`~scanweaver.ir.stages.ScanIR`.

    Example:
        >>> ir = trace(lambda h, a, x: a * h + x, name="ema")
        >>> str(ir.next_state)
        '(a * h) + x'
    """
    inputs = step_inputs(step)
    k = state_size
    if k == 1:
        h = Sym(E.STATE)
    else:
        h = np.empty(k, dtype=object)
        h[:] = [Sym(E.state(j)) for j in range(k)]
    h_next, y = _split_result(step(h, *(Sym(E.inp(n)) for n in inputs)), k)
    if k == 1:
        h_expr = to_expr(h_next)
        news = [(h_expr, E.NEW_STATE)]
    else:
        h_expr = tuple(to_expr(v) for v in h_next)
        news = [(e, E.new_state(j)) for j, e in enumerate(h_expr)]
    y_expr = None if y is None else to_expr(y)
    for target, repl in news:
        if y_expr is not None and target.op != "state":
            y_expr = _substitute(y_expr, target, repl)
    if y_expr == news[0][1]:
        y_expr = None
    ir = ScanIR(
        name=name or getattr(step, "__name__", "recurrence").replace("<lambda>", "lambda"),
        inputs=inputs,
        next_state=h_expr,
        output=y_expr,
        dtype=dtype,
        features=features,
        state_size=k,
    )
    verify_scan(ir)
    return ir
