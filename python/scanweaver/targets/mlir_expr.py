"""The MLIR expression printer: IR expressions as SSA ops in upstream dialects (``arith``, ``math``).

:class:`Body` collects the ops of one region (a ``linalg.generic`` body):
:meth:`Body.expr` lowers an :class:`~scanweaver.ir.expr.Expr` whose leaves are
bound to SSA values, sharing common sub-expressions (the tree is hash-consed,
so equal sub-trees are emitted once).  Every function of
:data:`scanweaver.ir.functions.FUNCTIONS` has a lowering here; the composite
ones follow their NumPy definitions (``softplus`` as
``max(x, 0) + log1p(exp(-|x|))``, which is ``np.logaddexp(0, x)``).

Example:
    >>> from scanweaver.ir.expr import call, inp, mul
    >>> body = Body("f32", {"a": "%a", "x": "%x"})
    >>> body.expr(mul(call("exp", inp("a")), inp("x")))
    '%v1'
    >>> print("\\n".join(body.lines))
    %v0 = math.exp %a : f32
    %v1 = arith.mulf %v0, %x : f32
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

from ..ir.expr import Expr, format_expr
from ..ir.functions import FUNCTIONS

#: NumPy dtype name -> MLIR element type.
ELEMENT_TYPES = {"float32": "f32", "float64": "f64"}

_BINARY = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf"}
_UNARY = {"exp": "math.exp", "log": "math.log", "log1p": "math.log1p", "expm1": "math.expm1",
          "sqrt": "math.sqrt", "tanh": "math.tanh", "sin": "math.sin", "cos": "math.cos", "abs": "math.absf"}
_BINARY_CALLS = {"pow": "math.powf", "max": "arith.maximumf", "min": "arith.minimumf"}


def float_literal(value: float, ty: str) -> str:
    """An exact MLIR float literal of ``ty`` (decimal when finite, the bit pattern otherwise)."""
    if math.isfinite(value):
        return f"{value:.17e}"
    if ty == "f32":
        return "0x" + struct.pack(">f", value).hex().upper()
    return "0x" + struct.pack(">d", value).hex().upper()


class Body:
    """The ops of one region, in SSA form.

    Args:
        ty: the element type (``f32`` or ``f64``).
        env: leaf text (an input name, ``h``, ``h[0]`` ...) -> the SSA value that holds it.
        prefix: the SSA name prefix (distinct per region keeps the text readable).
    """

    def __init__(self, ty: str, env: dict[str, str], prefix: str = "v"):
        self.ty = ty
        self.env = dict(env)
        self.prefix = prefix
        self.lines: list[str] = []
        self._memo: dict[Expr, str] = {}
        self._consts: dict[str, str] = {}
        self._n = 0

    def fresh(self) -> str:
        """A new SSA name."""
        name = f"%{self.prefix}{self._n}"
        self._n += 1
        return name

    def op(self, text: str) -> str:
        """Appends ``%new = text`` and returns ``%new``."""
        name = self.fresh()
        self.lines.append(f"{name} = {text}")
        return name

    def const(self, value: float) -> str:
        """The SSA value of a float constant (emitted once per region)."""
        lit = float_literal(float(value), self.ty)
        if lit not in self._consts:
            self._consts[lit] = self.op(f"arith.constant {lit} : {self.ty}")
        return self._consts[lit]

    def binary(self, opname: str, x: str, y: str) -> str:
        """``opname x, y`` on the element type."""
        return self.op(f"{opname} {x}, {y} : {self.ty}")

    def fma(self, a: str, h: str, u: str) -> str:
        """``a * h + u`` as one ``math.fma``."""
        return self.op(f"math.fma {a}, {h}, {u} : {self.ty}")

    def select(self, cond: str, x: str, y: str) -> str:
        """``cond ? x : y``."""
        return self.op(f"arith.select {cond}, {x}, {y} : {self.ty}")

    def cmp(self, pred: str, x: str, y: str) -> str:
        """``arith.cmpf pred, x, y`` (an ``i1``)."""
        return self.op(f"arith.cmpf {pred}, {x}, {y} : {self.ty}")

    def expr(self, e: Expr) -> str:
        """The SSA value of ``e`` (emitting the ops it needs once)."""
        hit = self._memo.get(e)
        if hit is not None:
            return hit
        value = self._lower(e)
        self._memo[e] = value
        return value

    def _lower(self, e: Expr) -> str:
        if e.op == "const":
            return self.const(e.value)
        if e.op in ("input", "state", "new_state", "adjoint"):
            key = e.name if e.op == "input" else format_expr(e)
            if key not in self.env:
                raise ValueError(f"mlir target: expression leaf {key!r} has no value in this region")
            return self.env[key]
        args = [self.expr(a) for a in e.args]
        if e.op == "neg":
            return self.op(f"arith.negf {args[0]} : {self.ty}")
        if e.op in _BINARY:
            return self.binary(_BINARY[e.op], *args)
        if e.op == "call":
            return self._call(e.name, args)
        raise ValueError(f"mlir target: unknown expression op {e.op!r}")

    def _call(self, fn: str, args: list[str]) -> str:
        if fn not in FUNCTIONS:
            raise ValueError(f"mlir target: no lowering for function {fn!r}")
        if fn == "tanh" and self.ty == "f64":
            return _tanh64(self, args[0])
        if fn in _UNARY:
            return self.op(f"{_UNARY[fn]} {args[0]} : {self.ty}")
        if fn in _BINARY_CALLS:
            return self.binary(_BINARY_CALLS[fn], *args)
        return _COMPOSITE[fn](self, *args)


def _sigmoid(b: Body, x: str) -> str:
    e = b.op(f"math.exp {b.op(f'arith.negf {x} : {b.ty}')} : {b.ty}")
    return b.binary("arith.divf", b.const(1.0), b.binary("arith.addf", b.const(1.0), e))


def _softplus(b: Body, x: str) -> str:
    ax = b.op(f"math.absf {x} : {b.ty}")
    e = b.op(f"math.exp {b.op(f'arith.negf {ax} : {b.ty}')} : {b.ty}")
    tail = b.op(f"math.log1p {e} : {b.ty}")
    return b.binary("arith.addf", b.binary("arith.maximumf", x, b.const(0.0)), tail)


def _tanh64(b: Body, x: str) -> str:
    """float64 tanh as ``e / (e + 2)``, ``e = expm1(2x)`` (IREE's llvm-cpu has no float64 ``tanh`` to link).

    ``x`` is clamped to [-20, 20], where tanh is +-1 to float64 precision, so ``e`` stays finite.
    """
    clamped = b.binary("arith.minimumf", b.binary("arith.maximumf", x, b.const(-20.0)), b.const(20.0))
    e = b.op(f"math.expm1 {b.binary('arith.mulf', clamped, b.const(2.0))} : {b.ty}")
    return b.binary("arith.divf", e, b.binary("arith.addf", e, b.const(2.0)))


def _silu(b: Body, x: str) -> str:
    return b.binary("arith.mulf", x, _sigmoid(b, x))


def _sign(b: Body, x: str) -> str:
    zero = b.const(0.0)
    pos = b.select(b.cmp("ogt", x, zero), b.const(1.0), zero)
    neg = b.select(b.cmp("olt", x, zero), b.const(-1.0), pos)
    return b.select(b.cmp("uno", x, x), x, neg)  # NaN stays NaN, as np.sign


def _compare(pred: str) -> Callable[..., str]:
    def fn(b: Body, x: str, y: str) -> str:
        return b.select(b.cmp(pred, x, y), b.const(1.0), b.const(0.0))

    return fn


def _where(b: Body, c: str, x: str, y: str) -> str:
    return b.select(b.cmp("une", c, b.const(0.0)), x, y)


#: Comparison -> the ``arith.cmpf`` predicate with NumPy's semantics (NaN: only ``ne`` holds).
_PREDICATES = {"gt": "ogt", "ge": "oge", "lt": "olt", "le": "ole", "eq": "oeq", "ne": "une"}

_COMPOSITE: dict[str, Callable[..., str]] = {"sigmoid": _sigmoid, "softplus": _softplus, "silu": _silu,
                                               "sign": _sign, "where": _where,
                                               **{n: _compare(p) for n, p in _PREDICATES.items()}}
