"""Pass ``normalize_affine``: prove h' is affine in h and rewrite to h' = A*h + U."""

from __future__ import annotations

from ..errors import NotAffineError
from ..ir import expr as E
from ..ir.stages import AffineScanIR, OutputForm, ScanIR
from ..ir.verifier import verify_affine

Linear = tuple[dict[str, E.Expr], E.Expr]


def _not_affine(sub: E.Expr, why: str, var: str) -> NotAffineError:
    return NotAffineError(
        f"recurrence: not affine in {var}: `{E.format_expr(sub)}` {why}; "
        "the state may only be scaled by and added to terms free of it"
    )


def linearize(e: E.Expr, variables: tuple[str, ...] = ("state",)) -> Linear:
    """Splits ``e`` into ``({var: coefficient}, offset)`` over the given state nodes.

    Raises:
        NotAffineError: quoting the first sub-expression that is not affine.
    """
    if e.op in variables:
        return {e.op: E.ONE}, E.ZERO
    if not any(n.op in variables for n in e.walk()):
        return {}, e
    var = "h" if "state" in variables else "h'"
    if e.op == "neg":
        c, o = linearize(e.args[0], variables)
        return {k: E.neg(v) for k, v in c.items()}, E.neg(o)
    if e.op in ("add", "sub"):
        (c1, o1), (c2, o2) = (linearize(a, variables) for a in e.args)
        combine = E.add if e.op == "add" else E.sub
        coef = {k: combine(c1.get(k, E.ZERO), c2.get(k, E.ZERO)) for k in sorted(set(c1) | set(c2))}
        return coef, combine(o1, o2)
    if e.op == "mul":
        (c1, o1), (c2, o2) = (linearize(a, variables) for a in e.args)
        if c1 and c2:
            raise _not_affine(e, "multiplies the state by itself", var)
        coef = {k: E.mul(v, e.args[1]) for k, v in c1.items()} | {k: E.mul(e.args[0], v) for k, v in c2.items()}
        return coef, E.mul(o1, o2)
    if e.op == "div":
        if any(n.op in variables for n in e.args[1].walk()):
            raise _not_affine(e, "divides by the state", var)
        c, o = linearize(e.args[0], variables)
        return {k: E.div(v, e.args[1]) for k, v in c.items()}, E.div(o, e.args[1])
    if e.op == "call":
        raise _not_affine(e, f"applies {e.name} to the state", var)
    raise _not_affine(e, f"uses op {e.op}", var)


def normalize_affine(ir: ScanIR) -> AffineScanIR:
    """Returns stage ``affine_scan`` for stage ``scan``.

    Raises:
        NotAffineError: when h' is not affine in h, or y not affine in h and h'.
    """
    coef, offset = linearize(ir.next_state)
    A = coef.get("state", E.ZERO)
    if ir.output is None:
        out = OutputForm()
    else:
        ycoef, yconst = linearize(ir.output, ("state", "new_state"))
        out = OutputForm(new=ycoef.get("new_state", E.ZERO), old=ycoef.get("state", E.ZERO), const=yconst)
    affine = AffineScanIR(
        name=ir.name,
        inputs=ir.inputs,
        kind="diagonal",
        A=A,
        U=offset,
        output=out,
        dtype=ir.dtype,
        features=ir.features,
    )
    verify_affine(affine)
    return affine
