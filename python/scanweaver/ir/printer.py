"""One deterministic text form per stage, in the spirit of MLIR's print-after-all."""

from __future__ import annotations

from .expr import format_expr
from .stages import AffineScanIR, AssocScanIR, ScanIR, ScheduleIR


def _operands(inputs: tuple[str, ...], dtype: str) -> str:
    short = {"float32": "f32", "float64": "f64"}.get(dtype, dtype)
    return ", ".join(f"%{n}: {short}[lanes, L]" for n in inputs)


def print_scan(ir: ScanIR) -> str:
    """Text of stage ``scan``."""
    lines = [
        f"scanweaver.scan @{ir.name}({_operands(ir.inputs, ir.dtype)}) axis=-1 "
        f"features={ir.features.text()} {{",
        f"  h' = {format_expr(ir.next_state)}",
        f"  y = {format_expr(ir.output) if ir.output is not None else 'h' + chr(39)}",
        "}",
    ]
    return "\n".join(lines)


def print_affine(ir: AffineScanIR) -> str:
    """Text of stage ``affine_scan``."""
    out = ir.output
    lines = [
        f"scanweaver.affine_scan @{ir.name}({_operands(ir.inputs, ir.dtype)}) "
        f"kind={ir.kind} features={ir.features.text()} {{",
        f"  A = {format_expr(ir.A)}",
        f"  U = {format_expr(ir.U)}",
        f"  h' = A * h + U",
        f"  y = ({format_expr(out.new)}) * h' + ({format_expr(out.old)}) * h + ({format_expr(out.const)})",
        "}",
    ]
    return "\n".join(lines)


def print_assoc(ir: AssocScanIR) -> str:
    """Text of stage ``assoc_scan``."""
    f = ir.features
    order = "t = L-1 .. 0" if f.reverse else "t = 0 .. L-1"
    lines = [
        f"scanweaver.assoc_scan @{ir.affine.name} combine={ir.combine} identity=(1, 0) "
        f"order=({order}) features={f.text()} {{",
        f"  elem(t) = ({format_expr(ir.affine.A)}{' if !reset[t] else 0' if f.has_reset else ''}, "
        f"{format_expr(ir.affine.U)})",
        "  combine((A2, U2), (A1, U1)) = (A2 * A1, A2 * U1 + U2)",
        f"  h(t) = apply(elem(t) o ... o elem(first), {'h0' if f.has_h0 else '0'})",
        "}",
    ]
    return "\n".join(lines)


def _attr(value: object) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def print_schedule(ir: ScheduleIR) -> str:
    """Text of stage ``schedule``."""
    params = " ".join(f"{k}={_attr(v)}" for k, v in ir.params)
    lines = [f"scanweaver.schedule @{ir.assoc.affine.name} {ir.schedule} {{{params}}} {{"]
    for op in ir.ops:
        attrs = " ".join(f"{k}={_attr(v)}" for k, v in op.attrs)
        lines.append(f"  {op.name}{' ' + attrs if attrs else ''}")
    lines.append("}")
    return "\n".join(lines)
