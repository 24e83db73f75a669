"""Tracing a step function into stage ``scan``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import numpy as np

from ..errors import ScanInputError, ScanWeaverError
from ..ir import expr as E
from ..ir.stages import Features, ScanIR
from ..ir.verifier import verify_scan
from .symbolic import Sym, to_expr


#: What a recurrence name may be: it appears in emitted kernel source (comments) and in file names.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")


#: Deepest expression a step may build (passes and emitters recurse over it).
MAX_DEPTH = 200
#: Most nodes the step's expressions may expand to with shared sub-expressions written out once per use
#: (the emitted source's size follows it: ``g = g * g`` repeated n times expands to 2**n nodes).
MAX_EXPANDED = 5_000


def check_budget(roots: tuple, step: Callable) -> None:
    """Raises :class:`ScanInputError` when the traced expressions are deeper or larger than the budget."""
    nodes, depth, expanded = E.measure(roots)
    check_sizes(step, depth, expanded, f"{nodes} distinct operations that expand")


def check_sizes(step: Callable, depth: int, expanded: int, what: str = "operations that expand") -> None:
    """The expression budget of every front end (vector and matrix states): raises :class:`ScanInputError`
    naming the step and the size when ``depth`` exceeds :data:`MAX_DEPTH` or ``expanded`` :data:`MAX_EXPANDED`
    (``what`` says what was counted)."""
    name = getattr(step, "__name__", "step")
    if depth > MAX_DEPTH:
        raise ScanInputError(f"recurrence: the expressions of {name} nest {depth} operations deep; at most "
                             f"{MAX_DEPTH} are supported (combine long sums or products as a balanced tree, "
                             "or precompute the h-free part as an operand)")
    if expanded > MAX_EXPANDED:
        raise ScanInputError(f"recurrence: the expressions of {name} have {what} to {expanded} when shared "
                             f"sub-expressions are written out per use; at most {MAX_EXPANDED} are supported "
                             "(precompute the h-free part, e.g. a repeated square, as an operand)")


def recurrence_name(step: Callable, name: str | None) -> str:
    """The recurrence's name: ``name`` when given (it must match :data:`NAME`), else the step's ``__name__``
    with any character outside :data:`NAME` replaced by ``_``.

    Raises:
        ScanInputError: a given ``name`` that is not a string matching :data:`NAME`.
    """
    if name is not None and name != "":
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ScanInputError(f"recurrence: name must be an identifier (letters, digits, _ . -, starting with a "
                                 f"letter or _, at most 128 characters); got {name!r}")
        return name
    default = str(getattr(step, "__name__", "recurrence")).replace("<lambda>", "lambda")
    default = re.sub(r"[^A-Za-z0-9_.\-]", "_", default)[:128]
    return default if NAME.fullmatch(default) else f"_{default}"[:128]


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
    check_budget((*(h_expr if isinstance(h_expr, tuple) else (h_expr,)), *(() if y_expr is None else (y_expr,))),
                 step)
    for target, repl in news:
        if y_expr is not None and target.op != "state":
            y_expr = _substitute(y_expr, target, repl)
    if y_expr == news[0][1]:
        y_expr = None
    ir = ScanIR(
        name=recurrence_name(step, name),
        inputs=inputs,
        next_state=h_expr,
        output=y_expr,
        dtype=dtype,
        features=features,
        state_size=k,
    )
    verify_scan(ir)
    return ir
