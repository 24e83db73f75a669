"""Tracing a step function into stage ``scan``."""

from __future__ import annotations

import inspect
from typing import Callable

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


def trace(step: Callable, *, name: str | None = None, dtype: str = "float32",
          features: Features = Features()) -> ScanIR:
    """Runs ``step`` on symbolic values and returns stage ``scan``.

    Args:
        step: ``step(h, *inputs)`` returning ``h_next`` or ``(h_next, y)``.
        name: recurrence name; defaults to the function's name.
        dtype: storage dtype.
        features: call-site features.

    Returns:
        The verified :class:`~scanweaver.ir.stages.ScanIR`.

    Example:
        >>> ir = trace(lambda h, a, x: a * h + x, name="ema")
        >>> str(ir.next_state)
        '(a * h) + x'
    """
    inputs = step_inputs(step)
    result = step(Sym(E.STATE), *(Sym(E.inp(n)) for n in inputs))
    if isinstance(result, tuple):
        if len(result) != 2:
            raise ScanWeaverError(
                f"recurrence: step must return h_next or (h_next, y), got a tuple of {len(result)}"
            )
        h_next, y = result
    else:
        h_next, y = result, None
    h_expr = to_expr(h_next)
    y_expr = None if y is None else to_expr(y)
    if y_expr is not None and h_expr.op != "state":
        y_expr = _substitute(y_expr, h_expr, E.NEW_STATE)
    if y_expr == E.NEW_STATE:
        y_expr = None
    ir = ScanIR(
        name=name or getattr(step, "__name__", "recurrence").replace("<lambda>", "lambda"),
        inputs=inputs,
        next_state=h_expr,
        output=y_expr,
        dtype=dtype,
        features=features,
    )
    verify_scan(ir)
    return ir
