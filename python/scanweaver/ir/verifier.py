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
        if n.op in ("state", "new_state") and n.op not in allowed_state:
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


def verify_scan(ir: ScanIR, pass_name: str = "trace") -> None:
    """Checks stage ``scan``."""
    _check_common(ir.name, ir.inputs, ir.dtype, pass_name)
    _check_expr(ir.next_state, ir.inputs, {"state"}, pass_name, "h'")
    if ir.output is not None:
        _check_expr(ir.output, ir.inputs, {"state", "new_state"}, pass_name, "y")


def verify_affine(ir: AffineScanIR, pass_name: str = "normalize_affine") -> None:
    """Checks stage ``affine_scan``: A, U and the output coefficients are free of h."""
    _check_common(ir.name, ir.inputs, ir.dtype, pass_name)
    if ir.kind != "diagonal":
        raise _fail(pass_name, f"@{ir.name}", f"unknown transition kind {ir.kind!r}")
    for node, e in (("A", ir.A), ("U", ir.U), ("y.new", ir.output.new), ("y.old", ir.output.old),
                    ("y.const", ir.output.const)):
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
