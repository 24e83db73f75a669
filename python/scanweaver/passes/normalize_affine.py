"""Pass ``normalize_affine``: prove h' is affine in h and rewrite to h' = A*h + U.

For a scalar state (``kind=diagonal``) A and U are expressions of the inputs.
For a vector state of size k (``kind=dense``) A is a k x k matrix of
expressions (row-major) and U a vector of k.
"""

from __future__ import annotations

from ..errors import NotAffineError
from ..ir import expr as E
from ..ir.stages import AffineScanIR, OutputForm, ScanIR
from ..ir.verifier import verify_affine

Linear = tuple[dict[str, E.Expr], E.Expr]
STATE_OPS = ("state",)
OUTPUT_OPS = ("state", "new_state")


def _is_var(e: E.Expr, ops: tuple[str, ...]) -> bool:
    return e.op in ops


def _not_affine(sub: E.Expr, why: str) -> NotAffineError:
    return NotAffineError(
        f"recurrence: not affine in the state: `{E.format_expr(sub)}` {why}; "
        "the state may only be scaled by and added to terms free of it"
    )


def linearize(e: E.Expr, ops: tuple[str, ...] = STATE_OPS) -> Linear:
    """Splits ``e`` into ``({state key: coefficient}, offset)``.

    Keys are :func:`~scanweaver.ir.expr.state_key` of the state nodes whose op
    is in ``ops`` (``state`` for h, ``new_state`` for h').

    Raises:
        NotAffineError: quoting the first sub-expression that is not affine.
    """
    if _is_var(e, ops):
        return {E.state_key(e): E.ONE}, E.ZERO
    if not any(_is_var(n, ops) for n in e.walk()):
        return {}, e
    if e.op == "neg":
        c, o = linearize(e.args[0], ops)
        return {k: E.neg(v) for k, v in c.items()}, E.neg(o)
    if e.op in ("add", "sub"):
        (c1, o1), (c2, o2) = (linearize(a, ops) for a in e.args)
        combine = E.add if e.op == "add" else E.sub
        coef = {k: combine(c1.get(k, E.ZERO), c2.get(k, E.ZERO)) for k in sorted(set(c1) | set(c2))}
        return coef, combine(o1, o2)
    if e.op == "mul":
        (c1, o1), (c2, o2) = (linearize(a, ops) for a in e.args)
        if c1 and c2:
            raise _not_affine(e, "multiplies the state by itself")
        coef = {k: E.mul(v, e.args[1]) for k, v in c1.items()} | {k: E.mul(e.args[0], v) for k, v in c2.items()}
        return coef, E.mul(o1, o2)
    if e.op == "div":
        if any(_is_var(n, ops) for n in e.args[1].walk()):
            raise _not_affine(e, "divides by the state")
        c, o = linearize(e.args[0], ops)
        return {k: E.div(v, e.args[1]) for k, v in c.items()}, E.div(o, e.args[1])
    if e.op == "call":
        raise _not_affine(e, f"applies {e.name} to the state")
    raise _not_affine(e, f"uses op {e.op}")


def _output(ir: ScanIR, k: int) -> OutputForm:
    if ir.output is None:
        return OutputForm() if k == 1 else OutputForm(new=(E.ONE,) + (E.ZERO,) * (k - 1), old=(E.ZERO,) * k)
    coef, const = linearize(ir.output, OUTPUT_OPS)
    if k == 1:
        return OutputForm(new=coef.get("new_state", E.ZERO), old=coef.get("state", E.ZERO), const=const)
    return OutputForm(
        new=tuple(coef.get(f"new_state:{j}", E.ZERO) for j in range(k)),
        old=tuple(coef.get(f"state:{j}", E.ZERO) for j in range(k)),
        const=const,
    )


def normalize_affine(ir: ScanIR) -> AffineScanIR:
    """Returns stage ``affine_scan`` for stage ``scan``.

    Raises:
        NotAffineError: when h' is not affine in h, or y not affine in h and h'.
    """
    k = ir.state_size
    A: E.Expr | tuple[E.Expr, ...]
    U: E.Expr | tuple[E.Expr, ...]
    if isinstance(ir.next_state, E.Expr):
        coef, offset = linearize(ir.next_state)
        A, U, kind = coef.get("state", E.ZERO), offset, "diagonal"
    else:
        rows = [linearize(e) for e in ir.next_state]
        A = tuple(c.get(f"state:{j}", E.ZERO) for c, _ in rows for j in range(k))
        U = tuple(o for _, o in rows)
        kind = "dense"
    affine = AffineScanIR(
        name=ir.name,
        inputs=ir.inputs,
        kind=kind,
        A=A,
        U=U,
        output=_output(ir, k),
        dtype=ir.dtype,
        features=ir.features,
        state_size=k,
    )
    verify_affine(affine)
    return affine
