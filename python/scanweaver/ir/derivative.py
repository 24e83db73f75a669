"""Symbolic partial derivatives of expressions, for the backward pass.

:func:`diff` differentiates an expression with respect to one input (or a
state or adjoint leaf) by the chain rule, reading each function's partials
from the one function table (:data:`scanweaver.ir.functions.FUNCTIONS`).
The constructors of :mod:`.expr` fold zeros and ones, so ``d(b*x)/db`` is
``x`` and the partial of an expression that does not read the input is the
constant 0.

Example:
    >>> from scanweaver.ir import expr as E
    >>> from scanweaver.ir.derivative import diff
    >>> gate = E.call("exp", E.mul(E.inp("delta"), E.inp("A")))
    >>> str(diff(gate, "delta"))
    'exp(delta * A) * A'
"""

from __future__ import annotations

import functools

from . import expr as E
from .functions import FUNCTIONS


def _is(e: E.Expr, leaf: E.Expr) -> bool:
    return e.op == leaf.op and e.name == leaf.name


@functools.lru_cache(maxsize=4096)
def diff_leaf(e: E.Expr, leaf: E.Expr) -> E.Expr:
    """d e / d ``leaf``, where ``leaf`` is an ``input``, ``state``, ``new_state`` or ``adjoint`` node.

    Raises:
        ValueError: for an op the differentiator does not know.
    """
    if e.op in E.LEAVES:
        return E.ONE if _is(e, leaf) else E.ZERO
    if not any(_is(n, leaf) for n in e.walk()):
        return E.ZERO
    if e.op == "neg":
        return E.neg(diff_leaf(e.args[0], leaf))
    x, *rest = e.args
    if e.op in ("add", "sub"):
        combine = E.add if e.op == "add" else E.sub
        return combine(diff_leaf(x, leaf), diff_leaf(rest[0], leaf))
    if e.op == "mul":
        y = rest[0]
        return E.add(E.mul(diff_leaf(x, leaf), y), E.mul(x, diff_leaf(y, leaf)))
    if e.op == "div":
        y = rest[0]
        # d(x/y) = dx/y - x*dy/y^2, written as (dx - (x/y)*dy) / y to reuse x/y.
        dx, dy = diff_leaf(x, leaf), diff_leaf(y, leaf)
        return E.div(E.sub(dx, E.mul(E.div(x, y), dy)), y)
    if e.op == "call":
        partials = FUNCTIONS[e.name].derivative(E, *e.args)
        total = E.ZERO
        for arg, partial in zip(e.args, partials, strict=True):
            total = E.add(total, E.mul(partial, diff_leaf(arg, leaf)))
        return total
    raise ValueError(f"diff: cannot differentiate op {e.op!r}")


def diff(e: E.Expr, name: str) -> E.Expr:
    """d e / d input ``name`` (an expression of the same leaves as ``e``)."""
    return diff_leaf(e, E.inp(name))
