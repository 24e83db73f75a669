"""The one table of elementwise functions an expression may call.

Every layer reads it from here: the tracer (which NumPy functions a step
function may use), the verifiers (arity), the NumPy interpreter (how to
evaluate a call), the C-family renderers (which names they must render) and
the differentiator (each function's partial derivatives, as expressions, for
the backward pass).

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


def _sign(x):
    return np.sign(x)


# Partial derivatives.  Each rule takes the expression constructors ``E`` (the
# module :mod:`scanweaver.ir.expr`, passed in because it imports this table) and
# the call's argument expressions, and returns one partial per argument.  At
# kinks (abs at 0, max/min at ties) the rules return the subgradient PyTorch and
# JAX use: 0 for abs, half to each argument for max and min (``sign`` serves these rules,
# and step functions may use it too: ``np.sign``; its derivative is 0 almost everywhere).


def _d_exp(E, x):
    return (E.call("exp", x),)


def _d_log(E, x):
    return (E.div(E.ONE, x),)


def _d_log1p(E, x):
    return (E.div(E.ONE, E.add(E.ONE, x)),)


def _d_sqrt(E, x):
    return (E.div(E.const(0.5), E.call("sqrt", x)),)


def _d_tanh(E, x):
    t = E.call("tanh", x)
    return (E.sub(E.ONE, E.mul(t, t)),)


def _d_sin(E, x):
    return (E.call("cos", x),)


def _d_cos(E, x):
    return (E.neg(E.call("sin", x)),)


def _d_abs(E, x):
    return (E.call("sign", x),)


def _d_sign(E, x):
    return (E.ZERO,)


def _d_sigmoid(E, x):
    s = E.call("sigmoid", x)
    return (E.mul(s, E.sub(E.ONE, s)),)


def _d_softplus(E, x):
    return (E.call("sigmoid", x),)


def _d_silu(E, x):
    s = E.call("sigmoid", x)
    return (E.mul(s, E.add(E.ONE, E.mul(x, E.sub(E.ONE, s)))),)


def _d_pow(E, x, y):
    dx = E.mul(y, E.call("pow", x, E.sub(y, E.ONE)))
    dy = E.ZERO if y.op == "const" else E.mul(E.call("pow", x, y), E.call("log", x))
    return dx, dy


def _d_max(E, x, y):
    s = E.call("sign", E.sub(x, y))
    return E.mul(E.const(0.5), E.add(E.ONE, s)), E.mul(E.const(0.5), E.sub(E.ONE, s))


def _d_min(E, x, y):
    dx, dy = _d_max(E, x, y)
    return dy, dx


def _d_flat2(E, x, y):
    return E.ZERO, E.ZERO


def _d_where(E, c, a, b):
    pick = E.call("ne", c, E.ZERO)
    return E.ZERO, pick, E.sub(E.ONE, pick)


def _mask(fn):
    def numeric(x, y):
        return fn(x, y).astype(np.result_type(x, y, np.float32))

    return numeric


def _where(c, a, b):
    return np.where(c != 0, a, b)


#: The comparisons a step may apply to its inputs: each gives 1.0 where it holds, else 0.0 (NumPy's
#: semantics for NaN: every comparison but ``ne`` is false).
COMPARISONS = {"gt": (np.greater, ">"), "ge": (np.greater_equal, ">="), "lt": (np.less, "<"),
               "le": (np.less_equal, "<="), "eq": (np.equal, "=="), "ne": (np.not_equal, "!=")}


@dataclass(frozen=True)
class Function:
    """An elementwise function of the IR.

    Attributes:
        name: the name in ``call`` nodes and printed IR.
        arity: number of arguments.
        numpy: its NumPy implementation (the reference semantics).
        derivative: ``derivative(E, *args)`` -> one partial derivative per
            argument, built with the constructors of :mod:`scanweaver.ir.expr`.
    """

    name: str
    arity: int
    numpy: Callable
    derivative: Callable


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("exp", 1, np.exp, _d_exp),
        Function("log", 1, np.log, _d_log),
        Function("log1p", 1, np.log1p, _d_log1p),
        Function("expm1", 1, np.expm1, _d_exp),
        Function("sqrt", 1, np.sqrt, _d_sqrt),
        Function("tanh", 1, np.tanh, _d_tanh),
        Function("sin", 1, np.sin, _d_sin),
        Function("cos", 1, np.cos, _d_cos),
        Function("abs", 1, np.abs, _d_abs),
        Function("sign", 1, _sign, _d_sign),
        Function("sigmoid", 1, _sigmoid, _d_sigmoid),
        Function("softplus", 1, _softplus, _d_softplus),
        Function("silu", 1, _silu, _d_silu),
        Function("pow", 2, np.power, _d_pow),
        Function("max", 2, np.maximum, _d_max),
        Function("min", 2, np.minimum, _d_min),
        Function("where", 3, _where, _d_where),
        *(Function(name, 2, _mask(fn), _d_flat2) for name, (fn, _) in COMPARISONS.items()),
    )
}

#: Name -> NumPy implementation, the form :func:`scanweaver.ir.expr.evaluate` takes.
NUMPY: dict[str, Callable] = {name: f.numpy for name, f in FUNCTIONS.items()}
