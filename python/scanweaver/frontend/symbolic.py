"""Symbolic values for tracing a step function.

A :class:`Sym` records every operation applied to it as an
:class:`~scanweaver.ir.expr.Expr`.  NumPy ufuncs (``np.exp``, ``np.log1p`` ...)
dispatch here through ``__array_ufunc__``, so a gate such as
``np.exp(delta * A)`` can be written inside the step.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..errors import NotAffineError, ScanWeaverError
from ..ir import expr as E
from ..ir.functions import NUMPY

_UFUNCS = {
    "add": lambda x, y: E.add(x, y),
    "subtract": lambda x, y: E.sub(x, y),
    "multiply": lambda x, y: E.mul(x, y),
    "true_divide": lambda x, y: E.div(x, y),
    "divide": lambda x, y: E.div(x, y),
    "negative": lambda x: E.neg(x),
    "positive": lambda x: x,
    "exp": lambda x: E.call("exp", x),
    "log": lambda x: E.call("log", x),
    "log1p": lambda x: E.call("log1p", x),
    "expm1": lambda x: E.call("expm1", x),
    "sqrt": lambda x: E.call("sqrt", x),
    "tanh": lambda x: E.call("tanh", x),
    "sin": lambda x: E.call("sin", x),
    "cos": lambda x: E.call("cos", x),
    "absolute": lambda x: E.call("abs", x),
    "sign": lambda x: E.call("sign", x),
    "power": lambda x, y: E.call("pow", x, y),
    "maximum": lambda x, y: E.call("max", x, y),
    "minimum": lambda x, y: E.call("min", x, y),
    "reciprocal": lambda x: E.div(E.ONE, x),
    "clip": lambda x, lo, hi: E.call("min", E.call("max", x, lo), hi),
    "greater": lambda x, y: E.call("gt", x, y),
    "greater_equal": lambda x, y: E.call("ge", x, y),
    "less": lambda x, y: E.call("lt", x, y),
    "less_equal": lambda x, y: E.call("le", x, y),
    "equal": lambda x, y: E.call("eq", x, y),
    "not_equal": lambda x, y: E.call("ne", x, y),
}

#: NumPy functions (not ufuncs) a step may apply to its inputs, as expressions.
_FUNCTIONS = {
    "where": lambda c, a, b: E.call("where", c, a, b),
    "clip": lambda x, lo, hi: E.call("min", E.call("max", x, lo), hi),
    "maximum": lambda x, y: E.call("max", x, y),
    "minimum": lambda x, y: E.call("min", x, y),
    "abs": lambda x: E.call("abs", x),
    "absolute": lambda x: E.call("abs", x),
}


def to_expr(value: object) -> E.Expr:
    """Turns a :class:`Sym` or a real number into an expression."""
    if isinstance(value, Sym):
        return value.expr
    if isinstance(value, numbers.Real) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return E.const(float(value))
    raise ScanWeaverError(
        f"recurrence: cannot use a value of type {type(value).__name__} inside a step function; "
        "use the step's arguments, Python numbers and NumPy functions"
    )


class Sym:
    """A traced value: an expression plus Python operators that extend it."""

    __array_priority__ = 1000
    __slots__ = ("expr",)

    def __init__(self, expr: E.Expr):
        self.expr = expr

    def __repr__(self) -> str:
        return f"Sym({E.format_expr(self.expr)})"

    def _bin(self, other: object, fn, swap: bool = False) -> Sym:
        x, y = self.expr, to_expr(other)
        return Sym(fn(y, x) if swap else fn(x, y))

    def __add__(self, o): return self._bin(o, E.add)
    def __radd__(self, o): return self._bin(o, E.add, True)
    def __sub__(self, o): return self._bin(o, E.sub)
    def __rsub__(self, o): return self._bin(o, E.sub, True)
    def __mul__(self, o): return self._bin(o, E.mul)
    def __rmul__(self, o): return self._bin(o, E.mul, True)
    def __truediv__(self, o): return self._bin(o, E.div)
    def __rtruediv__(self, o): return self._bin(o, E.div, True)
    def __neg__(self): return Sym(E.neg(self.expr))
    def __pos__(self): return self

    def __pow__(self, o):
        y = to_expr(o)
        if y.op == "const" and y.value == 1.0:
            return self
        if y.op == "const" and y.value == 2.0 and not self.expr.uses_state():
            return Sym(E.mul(self.expr, self.expr))
        return Sym(E.call("pow", self.expr, y))

    def __rpow__(self, o):
        return Sym(E.call("pow", to_expr(o), self.expr))

    def _compare(self, other: object, name: str, sym: str) -> Sym:
        """A comparison of inputs: a 0/1 mask (``np.where(x > 0, a, b)``); of the state: not affine."""
        rhs = to_expr(other)
        if self.expr.uses_state() or rhs.uses_state():
            text = f"{E.format_expr(self.expr)} {sym} {E.format_expr(rhs)}"
            raise NotAffineError(
                f"recurrence: the state is used in a condition: `{text}`; "
                "an affine recurrence cannot branch on h"
            )
        return Sym(E.call(name, self.expr, rhs))

    def __lt__(self, o): return self._compare(o, "lt", "<")
    def __le__(self, o): return self._compare(o, "le", "<=")
    def __gt__(self, o): return self._compare(o, "gt", ">")
    def __ge__(self, o): return self._compare(o, "ge", ">=")
    def __eq__(self, o): return self._compare(o, "eq", "==")  # type: ignore[override]
    def __ne__(self, o): return self._compare(o, "ne", "!=")  # type: ignore[override]
    __hash__ = object.__hash__
    def __abs__(self): return Sym(E.call("abs", self.expr))

    def clip(self, lo=None, hi=None) -> Sym:
        """``np.clip`` of a traced value (a gate of the inputs)."""
        x = self.expr
        if lo is not None:
            x = E.call("max", x, to_expr(lo))
        if hi is not None:
            x = E.call("min", x, to_expr(hi))
        return Sym(x)

    def _scalar(self, what: str):
        text = E.format_expr(self.expr)
        if self.expr.uses_state():
            raise NotAffineError(f"recurrence: {what} of the state, `{text}`, is not affine in h (it needs h's "
                                 "value while tracing)")
        raise ScanWeaverError(f"recurrence: {what} of `{text}` cannot be evaluated inside a step function: the "
                              "inputs are traced, not numbers; use NumPy functions (np.exp, np.abs, np.clip, "
                              "np.where ...), which the step records as gates")

    def __float__(self): return self._scalar("float() (or a math.* function)")
    def __int__(self): return self._scalar("int()")
    def __index__(self): return self._scalar("an integer index")
    def __complex__(self): return self._scalar("complex()")

    def __bool__(self):
        what = "the state" if self.expr.uses_state() else "a traced input"
        err = NotAffineError if self.expr.uses_state() else ScanWeaverError
        raise err(
            f"recurrence: {what} is used in a condition: `{E.format_expr(self.expr)}`; "
            "step functions must be straight-line code"
        )

    def __array_function__(self, func, types, args, kwargs):
        fn = _FUNCTIONS.get(func.__name__)
        if fn is None or any(v is not None for k, v in kwargs.items() if k not in ("a_min", "a_max", "min", "max")):
            raise ScanWeaverError(
                f"recurrence: numpy.{func.__name__} is not supported inside a step function; supported: "
                f"{', '.join(sorted({*_UFUNCS, *_FUNCTIONS}))}"
            )
        if func.__name__ == "clip":
            x, lo, hi = (list(args) + [None, None])[:3]
            lo = kwargs.get("a_min", kwargs.get("min", lo))
            hi = kwargs.get("a_max", kwargs.get("max", hi))
            return Sym(to_expr(x)).clip(lo, hi)
        return Sym(fn(*(to_expr(v) for v in args)))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        fn = _UFUNCS.get(ufunc.__name__)
        if method != "__call__" or fn is None or kwargs:
            raise ScanWeaverError(
                f"recurrence: numpy.{ufunc.__name__} is not supported inside a step function; "
                f"supported: {', '.join(sorted(_UFUNCS))}"
            )
        return Sym(fn(*(to_expr(v) for v in inputs)))


def _lift(name: str, numeric):
    def fn(x):
        if isinstance(x, Sym):
            return Sym(E.call(name, x.expr))
        return numeric(np.asarray(x))

    fn.__name__ = name
    fn.__doc__ = f"``{name}(x)`` on arrays, or recorded when ``x`` is traced inside a step function."
    return fn


sigmoid = _lift("sigmoid", NUMPY["sigmoid"])
softplus = _lift("softplus", NUMPY["softplus"])
silu = _lift("silu", NUMPY["silu"])
