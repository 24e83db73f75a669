"""One deterministic text form per stage, in the spirit of MLIR's print-after-all."""

from __future__ import annotations

from .expr import format_expr
from .stages import AffineScanIR, AssocScanIR, ScanIR, ScheduleIR


def _operands(inputs: tuple[str, ...], dtype: str) -> str:
    short = {"float32": "f32", "float64": "f64"}.get(dtype, dtype)
    return ", ".join(f"%{n}: {short}[lanes, L]" for n in inputs)


def _vec(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(format_expr(v) for v in value) + "]"
    return format_expr(value)


def _mat(value, k: int) -> str:
    if k == 1:
        return format_expr(value)
    rows = ("[" + ", ".join(format_expr(v) for v in value[i * k:(i + 1) * k]) + "]" for i in range(k))
    return "[" + ", ".join(rows) + "]"


def _state_text(k: int) -> str:
    return "" if k == 1 else f" state={k}"


def print_scan(ir: ScanIR) -> str:
    """Text of stage ``scan``."""
    lines = [
        f"scanweaver.scan @{ir.name}({_operands(ir.inputs, ir.dtype)}) axis=-1{_state_text(ir.state_size)} "
        f"features={ir.features.text()} {{",
        f"  h' = {_vec(ir.next_state)}",
        f"  y = {format_expr(ir.output) if ir.output is not None else 'h' + chr(39)}",
        "}",
    ]
    return "\n".join(lines)


def print_affine(ir: AffineScanIR) -> str:
    """Text of stage ``affine_scan``."""
    out = ir.output
    lines = [
        f"scanweaver.affine_scan @{ir.name}({_operands(ir.inputs, ir.dtype)}) "
        f"kind={ir.kind}{_state_text(ir.state_size)} features={ir.features.text()} {{",
        f"  A = {_mat(ir.A, ir.state_size)}",
        f"  U = {_vec(ir.U)}",
        f"  h' = A {'@' if ir.state_size > 1 else '*'} h + U",
        f"  y = ({_vec(out.new)}) {'.' if ir.state_size > 1 else '*'} h' + ({_vec(out.old)}) "
        f"{'.' if ir.state_size > 1 else '*'} h + ({format_expr(out.const)})",
        "}",
    ]
    return "\n".join(lines)


def print_assoc(ir: AssocScanIR) -> str:
    """Text of stage ``assoc_scan``."""
    f = ir.features
    order = "t = L-1 .. 0" if f.reverse else "t = 0 .. L-1"
    lines = [
        f"scanweaver.assoc_scan @{ir.affine.name} combine={ir.combine} "
        f"identity=({'1' if ir.affine.state_size == 1 else 'I'}, 0) "
        f"order=({order}) features={f.text()} {{",
        f"  elem(t) = ({_mat(ir.affine.A, ir.affine.state_size)}{' if !reset[t] else 0' if f.has_reset else ''}, "
        f"{_vec(ir.affine.U)})",
        "  combine((A2, U2), (A1, U1)) = (A2 * A1, A2 * U1 + U2)" if ir.affine.state_size == 1 else
        "  combine((A2, U2), (A1, U1)) = (A2 @ A1, A2 @ U1 + U2)",
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
