"""Expression nodes shared by every IR stage.

An :class:`Expr` is an immutable tree over named inputs, constants, the state
``h`` (the previous state h_{t-1}), the new state ``h'`` (h_t, only inside
output expressions), the adjoint ``g`` (dL/dh_t, only inside the gradient
expressions of stage ``adjoint``) and a small set of operators and functions.  Nodes are
hash-consed by structure, so equal trees compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable, Iterator
from typing import Any

from .functions import FUNCTIONS as _FUNCTIONS

#: Elementwise functions an expression may call, with their arity (from :mod:`.functions`).
FUNCTIONS: dict[str, int] = {name: f.arity for name, f in _FUNCTIONS.items()}

BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
LEAVES = ("input", "const", "state", "new_state", "adjoint")


@dataclass(frozen=True)
class Expr:
    """One node of an expression tree.

    Attributes:
        op: ``input``, ``const``, ``state``, ``new_state``, ``adjoint``, ``neg``, one of
            ``add sub mul div`` or ``call``.
        args: child nodes.
        name: input name (``input``) or function name (``call``).
        value: the constant (``const``).
    """

    op: str
    args: tuple[Expr, ...] = ()
    name: str = ""
    value: float = 0.0

    def walk(self) -> Iterator[Expr]:
        """Yields this node and every descendant, parents first (iteratively: any depth)."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.args))

    def inputs(self) -> set[str]:
        """Names of the inputs the expression reads."""
        return {n.name for n in self.walk() if n.op == "input"}

    def uses_state(self) -> bool:
        """True when the expression reads ``h`` or ``h'``."""
        return any(n.op in ("state", "new_state") for n in self.walk())

    def __str__(self) -> str:
        return format_expr(self)


def measure(roots: tuple[Expr, ...]) -> tuple[int, int, int]:
    """``(distinct nodes, depth, expanded size)`` of the expressions ``roots``, walked iteratively.

    Shared sub-expressions count once as distinct nodes and once per use in the
    expanded size (what a tree walk visits).  Nodes are told apart by identity,
    so this never hashes (a deep tree's hash recurses).
    """
    depth: dict[int, int] = {}
    size: dict[int, int] = {}
    for root in roots:
        stack: list[tuple[Expr, bool]] = [(root, False)]
        while stack:
            node, done = stack.pop()
            key = id(node)
            if key in depth:
                continue
            if done or not node.args:
                depth[key] = 1 + max((depth[id(a)] for a in node.args), default=0)
                size[key] = min(1 + sum(size[id(a)] for a in node.args), 1 << 62)
                continue
            stack.append((node, True))
            stack.extend((a, False) for a in node.args if id(a) not in depth)
    return (len(depth), max((depth[id(r)] for r in roots), default=0),
            min(sum(size[id(r)] for r in roots), 1 << 62))


def inp(name: str) -> Expr:
    """An input operand read at the current time step."""
    return Expr("input", name=name)


def const(value: float) -> Expr:
    """A numeric constant."""
    return Expr("const", value=float(value))


STATE = Expr("state")
NEW_STATE = Expr("new_state")


def state(j: int) -> Expr:
    """Component ``j`` of a vector state h_{t-1} (dense transitions)."""
    return Expr("state", name=str(j))


def new_state(j: int) -> Expr:
    """Component ``j`` of the new vector state h_t."""
    return Expr("new_state", name=str(j))


ADJOINT = Expr("adjoint")


def adjoint(j: int | None = None) -> Expr:
    """The adjoint g_t = dL/dh_t (component ``j`` of a vector state), in gradient expressions."""
    return ADJOINT if j is None else Expr("adjoint", name=str(j))


def state_key(e: Expr) -> str:
    """``state``/``new_state`` for a scalar state, ``state:j``/``new_state:j`` for a component."""
    return f"{e.op}:{e.name}" if e.name else e.op
ZERO = const(0.0)
ONE = const(1.0)


def is_const(e: Expr | None, value: float) -> bool:
    """True when ``e`` is the constant ``value``."""
    return e is not None and e.op == "const" and e.value == value


def add(x: Expr, y: Expr) -> Expr:
    """``x + y`` with zeros folded away."""
    if is_const(x, 0.0):
        return y
    if is_const(y, 0.0):
        return x
    if x.op == "const" and y.op == "const":
        return const(x.value + y.value)
    return Expr("add", (x, y))


def sub(x: Expr, y: Expr) -> Expr:
    """``x - y`` with zeros folded away."""
    if is_const(y, 0.0):
        return x
    if is_const(x, 0.0):
        return neg(y)
    if x.op == "const" and y.op == "const":
        return const(x.value - y.value)
    return Expr("sub", (x, y))


def mul(x: Expr, y: Expr) -> Expr:
    """``x * y`` with zeros and ones folded away."""
    if is_const(x, 0.0) or is_const(y, 0.0):
        return ZERO
    if is_const(x, 1.0):
        return y
    if is_const(y, 1.0):
        return x
    if x.op == "const" and y.op == "const":
        return const(x.value * y.value)
    return Expr("mul", (x, y))


def div(x: Expr, y: Expr) -> Expr:
    """``x / y`` with ``0 / y`` and ``x / 1`` folded away."""
    if is_const(x, 0.0) or is_const(y, 1.0):
        return x
    return Expr("div", (x, y))


def neg(x: Expr) -> Expr:
    """``-x``."""
    if x.op == "const":
        return const(-x.value)
    if x.op == "neg":
        return x.args[0]
    return Expr("neg", (x,))


def call(fn: str, *args: Expr) -> Expr:
    """``fn(args...)`` for a function in :data:`FUNCTIONS`."""
    if FUNCTIONS.get(fn) != len(args):
        raise ValueError(f"call: unknown function {fn!r} with {len(args)} argument(s)")
    return Expr("call", tuple(args), name=fn)


def _fmt_const(v: float) -> str:
    return repr(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def format_expr(e: Expr) -> str:
    """Deterministic text form: ``(a * h) + (b * x)`` style, fully parenthesised."""
    if e.op == "input":
        return e.name
    if e.op == "const":
        return _fmt_const(e.value)
    if e.op == "state":
        return f"h[{e.name}]" if e.name else "h"
    if e.op == "new_state":
        return f"h'[{e.name}]" if e.name else "h'"
    if e.op == "adjoint":
        return f"g[{e.name}]" if e.name else "g"
    if e.op == "neg":
        return f"-{_wrap(e.args[0])}"
    if e.op in BINARY:
        return f"{_wrap(e.args[0])} {BINARY[e.op]} {_wrap(e.args[1])}"
    if e.op == "call":
        return f"{e.name}({', '.join(format_expr(a) for a in e.args)})"
    raise ValueError(f"format_expr: unknown op {e.op!r}")


def _wrap(e: Expr) -> str:
    text = format_expr(e)
    return f"({text})" if e.op in BINARY else text


def evaluate(e: Expr, env: Callable[[str], Any], fns: dict[str, Callable]) -> Any:
    """Evaluates ``e`` with inputs from ``env(name)`` and functions from ``fns``.

    Works on NumPy arrays and scalars alike; the state nodes are looked up by
    their text, ``env("h")``, ``env("h'")``, ``env("h[0]")`` ... (the adjoint as ``env("g")``)
    """
    if e.op == "input":
        return env(e.name)
    if e.op == "const":
        return e.value
    if e.op in ("state", "new_state", "adjoint"):
        return env(format_expr(e))
    vals = [evaluate(a, env, fns) for a in e.args]
    if e.op == "neg":
        return -vals[0]
    if e.op == "add":
        return vals[0] + vals[1]
    if e.op == "sub":
        return vals[0] - vals[1]
    if e.op == "mul":
        return vals[0] * vals[1]
    if e.op == "div":
        return vals[0] / vals[1]
    return fns[e.name](*vals)
