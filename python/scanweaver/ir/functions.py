"""The one table of elementwise functions an expression may call.

Every layer reads it from here: the tracer (which NumPy functions a step
function may use), the verifiers (arity), the NumPy interpreter (how to
evaluate a call) and the C-family renderers (which names they must render).

Example:
    >>> from scanweaver.ir.functions import FUNCTIONS, NUMPY
    >>> FUNCTIONS["pow"].arity, float(NUMPY["softplus"](0.0))
    (2, 0.6931471805599453)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _silu(x):
    return x * _sigmoid(x)


@dataclass(frozen=True)
class Function:
    """An elementwise function of the IR.

    Attributes:
        name: the name in ``call`` nodes and printed IR.
        arity: number of arguments.
        numpy: its NumPy implementation (the reference semantics).
    """

    name: str
    arity: int
    numpy: Callable


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("exp", 1, np.exp),
        Function("log", 1, np.log),
        Function("log1p", 1, np.log1p),
        Function("expm1", 1, np.expm1),
        Function("sqrt", 1, np.sqrt),
        Function("tanh", 1, np.tanh),
        Function("sin", 1, np.sin),
        Function("cos", 1, np.cos),
        Function("abs", 1, np.abs),
        Function("sigmoid", 1, _sigmoid),
        Function("softplus", 1, _softplus),
        Function("silu", 1, _silu),
        Function("pow", 2, np.power),
        Function("max", 2, np.maximum),
        Function("min", 2, np.minimum),
    )
}

#: Name -> NumPy implementation, the form :func:`scanweaver.ir.expr.evaluate` takes.
NUMPY: dict[str, Callable] = {name: f.numpy for name, f in FUNCTIONS.items()}
