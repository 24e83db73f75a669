"""Verifiers run after every pass; a failure names the pass and the node."""

from __future__ import annotations

from ..errors import VerificationError
from .expr import FUNCTIONS, LEAVES, BINARY, Expr, format_expr
from .stages import DTYPES, AffineScanIR, AssocScanIR, ScanIR, ScheduleIR


def _fail(pass_name: str, node: str, why: str) -> VerificationError:
    return VerificationError(f"verifier after pass '{pass_name}': node {node}: {why}")


def _check_expr(e: Expr, inputs: tuple[str, ...], allowed_state: set[str], pass_name: str, node: str) -> None:
    for n in e.walk():
        if n.op == "input" and n.name not in inputs:
            raise _fail(pass_name, node, f"reads undeclared input {n.name!r} in `{format_expr(e)}`")
        if n.op in ("state", "new_state", "adjoint") and n.op not in allowed_state:
            raise _fail(pass_name, node, f"must not read {format_expr(n)} in `{format_expr(e)}`")
        if n.op == "call" and FUNCTIONS.get(n.name) != len(n.args):
            raise _fail(pass_name, node, f"unknown function {n.name!r} in `{format_expr(e)}`")
        if n.op not in LEAVES and n.op not in BINARY and n.op not in ("neg", "call"):
            raise _fail(pass_name, node, f"unknown op {n.op!r}")


def _check_common(name: str, inputs: tuple[str, ...], dtype: str, pass_name: str) -> None:
    if len(set(inputs)) != len(inputs):
        raise _fail(pass_name, f"@{name}", f"duplicate input names {inputs}")
    if dtype not in DTYPES:
        raise _fail(pass_name, f"@{name}", f"dtype {dtype!r} is not one of {DTYPES}")


def _components(value, k: int, pass_name: str, node: str) -> tuple[Expr, ...]:
    """``value`` as a tuple of k expressions (a bare expression when k == 1)."""
    if k == 1:
        if not isinstance(value, Expr):
            raise _fail(pass_name, node, f"must be one expression for a scalar state, got {type(value).__name__}")
        return (value,)
    if not isinstance(value, tuple) or len(value) != k or not all(isinstance(v, Expr) for v in value):
        raise _fail(pass_name, node, f"must be a tuple of {k} expressions for a state of size {k}")
    return value


def verify_scan(ir: ScanIR, pass_name: str = "trace") -> None:
    """Checks stage ``scan``."""
    _check_common(ir.name, ir.inputs, ir.dtype, pass_name)
    if ir.state_size < 1:
        raise _fail(pass_name, f"@{ir.name}", f"state_size must be >= 1, got {ir.state_size}")
    for j, e in enumerate(_components(ir.next_state, ir.state_size, pass_name, "h'")):
        _check_expr(e, ir.inputs, {"state"}, pass_name, f"h'[{j}]" if ir.state_size > 1 else "h'")
    if ir.output is not None:
        _check_expr(ir.output, ir.inputs, {"state", "new_state"}, pass_name, "y")


def verify_affine(ir: AffineScanIR, pass_name: str = "normalize_affine") -> None:
    """Checks stage ``affine_scan``: A, U and the output coefficients are free of h."""
    _check_common(ir.name, ir.inputs, ir.dtype, pass_name)
    k = ir.state_size
    if (ir.kind, k == 1) not in (("diagonal", True), ("dense", False)):
        raise _fail(pass_name, f"@{ir.name}", f"kind {ir.kind!r} does not fit state_size {k} "
                    "(diagonal has state_size 1, dense more)")
    nodes = [("A", e) for e in _components(ir.A, k * k if k > 1 else 1, pass_name, "A")]
    nodes += [("U", e) for e in _components(ir.U, k, pass_name, "U")]
    nodes += [("y.new", e) for e in _components(ir.output.new, k, pass_name, "y.new")]
    nodes += [("y.old", e) for e in _components(ir.output.old, k, pass_name, "y.old")]
    nodes.append(("y.const", ir.output.const))
    for node, e in nodes:
        _check_expr(e, ir.inputs, set(), pass_name, node)


def verify_assoc(ir: AssocScanIR, pass_name: str = "decompose_assoc") -> None:
    """Checks stage ``assoc_scan``."""
    verify_affine(ir.affine, pass_name)
    if ir.combine != "affine_compose":
        raise _fail(pass_name, "combine", f"unknown combine {ir.combine!r}")


def verify_schedule(ir: ScheduleIR, expected: tuple[str, ...], pass_name: str = "materialize_schedule") -> None:
    """Checks stage ``schedule``: its ops are ``expected``, in that order."""
    verify_assoc(ir.assoc, pass_name)
    got = tuple(op.name for op in ir.ops)
    if got != expected:
        raise _fail(pass_name, f"schedule {ir.schedule}", f"ops {got} differ from {expected}")
    if not ir.ops:
        raise _fail(pass_name, f"schedule {ir.schedule}", "has no ops")
