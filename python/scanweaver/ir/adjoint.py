"""Stage ``adjoint``: the backward pass of an affine scan, itself an affine scan run in reverse.

For the forward h_t = A_t h_{t-1} + U_t, y_t = Cn_t h_t + Co_t h_{t-1} + E_t
and a loss L with dy_t = dL/dy_t, the adjoint g_t = dL/dh_t obeys
g_t = Cn_t^T dy_t + A_{t+1}^T g_{t+1} + Co_{t+1}^T dy_{t+1}, which reads the
*next* step's operands.  Writing it for lam_t = dL/dh_{t-1} instead removes
the shift:

    lam_t = A_t^T lam_{t+1} + A_t^T Cn_t^T dy_t + Co_t^T dy_t      (t = L .. 1)
    g_t   = lam_{t+1} + Cn_t^T dy_t,      lam_{L+1} = dL/dh_L,     dL/dh0 = lam_1

an affine recurrence over the same operands plus ``dy``, scanned in the
opposite direction, with the transposed transition: every schedule and
backend runs it.  A reset at t (A_t = 0) zeroes A_t in both places through a
``keep`` operand (1 - reset).  The operand gradients are then elementwise:
dA_t = keep_t g_t h_{t-1}^T, dU_t = g_t, dCn_t = dy_t h_t, dCo_t = dy_t h_{t-1},
dE_t = dy_t, taken through the operand expressions by the chain rule
(:mod:`scanweaver.ir.derivative`).  Each gradient is stored as one expression
of the inputs, ``dy``, ``keep``, ``h`` (h_{t-1}), ``h'`` (h_t) and ``g``.

Example:
    >>> from scanweaver.api import SELECTIVE
    >>> from scanweaver.ir.adjoint import print_adjoint
    >>> from scanweaver.passes.adjoint import adjoint
    >>> text = print_adjoint(adjoint(SELECTIVE.lower().affine))
    >>> [line.strip() for line in text.splitlines() if line.strip().startswith("d_")]
    ['d_a = (g * h)', 'd_b = (g * x)', 'd_x = (g * b)', "d_c = (dy * h')"]
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import VerificationError
from .expr import Expr, format_expr
from .printer import print_affine
from .stages import AffineScanIR
from .verifier import _check_expr, verify_affine


@dataclass(frozen=True)
class AdjointIR:
    """Stage ``adjoint`` of a forward affine scan.

    Attributes:
        forward: the forward's stage ``affine_scan`` (its features: direction, h0, resets).
        wrt: the inputs whose gradients are produced, in forward-input order.
        grads: dL/d input per element, aligned with ``wrt``: expressions of the
            inputs, :attr:`cotangent`, :attr:`keep`, ``h``, ``h'`` and ``g``.
        cotangent: operand name of dy (``dy`` unless an input has that name).
        keep: operand name of the keep mask (1 - reset), or ``""`` without resets.
        A: the adjoint transition keep_t A_t^T (one expression, or k*k row-major).
        U: the adjoint offset keep_t A_t^T Cn_t^T dy_t + Co_t^T dy_t.
        g_offset: Cn_t^T dy_t, so that g_t = lam_{t+1} + g_offset.
        dh0: dL/dh0 is produced (the forward has h0).
        dh_last: a cotangent of the final state enters (the forward returned it).
        saved_states: the forward saved h_t (else the backward recomputes it).
    """

    forward: AffineScanIR
    wrt: tuple[str, ...]
    grads: tuple[Expr, ...]
    cotangent: str
    keep: str
    A: Expr | tuple[Expr, ...]
    U: Expr | tuple[Expr, ...]
    g_offset: Expr | tuple[Expr, ...]
    dh0: bool = False
    dh_last: bool = False
    saved_states: bool = False

    @property
    def inputs(self) -> tuple[str, ...]:
        """Operands of the backward: the forward's, then dy, then keep (with resets)."""
        return (*self.forward.inputs, self.cotangent, *((self.keep,) if self.keep else ()))

    @property
    def state_size(self) -> int:
        """k, the length of the state (and adjoint) vector."""
        return self.forward.state_size


def _vec(value) -> str:
    return "[" + ", ".join(format_expr(v) for v in value) + "]" if isinstance(value, tuple) else format_expr(value)


def print_adjoint(ir: AdjointIR) -> str:
    """Text of stage ``adjoint`` (the forward's ``affine_scan`` it differentiates comes first)."""
    f = ir.forward.features
    order = "t = 0 .. L-1" if f.reverse else "t = L-1 .. 0"
    k = ir.state_size
    mul = "@" if k > 1 else "*"
    flags = [n for n, on in (("dh0", ir.dh0), ("dh_last", ir.dh_last)) if on]
    lines = [
        print_affine(ir.forward),
        f"scanweaver.adjoint @{ir.forward.name} wrt=({', '.join(ir.wrt)}) cotangent=%{ir.cotangent}"
        + (f" keep=%{ir.keep}" if ir.keep else "")
        + f" states={'saved' if ir.saved_states else 'recomputed'} order=({order})"
        + f" features={{{', '.join(flags)}}} {{",
        f"  lam = A' {mul} lam_prev + U'    (lam_prev: dL/dh_L at the start; the last lam is dL/dh0)",
        f"  A' = {_vec(ir.A)}",
        f"  U' = {_vec(ir.U)}",
        f"  g = lam_prev + {_vec(ir.g_offset)}",
    ]
    lines += [f"  d_{n} = ({format_expr(e)})" for n, e in zip(ir.wrt, ir.grads, strict=True)]
    lines.append("}")
    return "\n".join(lines)


def verify_adjoint(ir: AdjointIR, pass_name: str = "adjoint") -> None:
    """Checks stage ``adjoint``: shapes of its parts and the leaves each expression may read."""
    verify_affine(ir.forward, pass_name)
    k = ir.state_size
    fail = lambda node, why: VerificationError(f"verifier after pass '{pass_name}': node {node}: {why}")  # noqa: E731
    if len(ir.wrt) != len(ir.grads) or not set(ir.wrt) <= set(ir.forward.inputs):
        raise fail("wrt", f"{ir.wrt} must be forward inputs, one gradient each (got {len(ir.grads)})")
    if len(set(ir.inputs)) != len(ir.inputs):
        raise fail("operands", f"duplicate operand names {ir.inputs}")
    if bool(ir.keep) != ir.forward.features.has_reset:
        raise fail("keep", "a keep operand is needed exactly when the forward has resets")
    want = {"A'": (ir.A, k * k), "U'": (ir.U, k), "g": (ir.g_offset, k)}
    for node, (value, count) in want.items():
        parts = value if isinstance(value, tuple) else (value,)
        if len(parts) != count or (k == 1) == isinstance(value, tuple):
            raise fail(node, f"needs {count} expression(s) for a state of size {k}")
        for e in parts:
            _check_expr(e, ir.inputs, set(), pass_name, node)
    for n, e in zip(ir.wrt, ir.grads, strict=True):
        _check_expr(e, ir.inputs, {"state", "new_state", "adjoint"}, pass_name, f"d_{n}")
