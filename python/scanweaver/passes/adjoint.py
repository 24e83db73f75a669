"""Pass ``adjoint``: derive the backward pass of a forward ``affine_scan`` (see :mod:`scanweaver.ir.adjoint`).

Besides stage ``adjoint`` itself, two helpers turn it back into ordinary
stage-``scan`` recurrences that any backend runs with its own schedules:
:func:`adjoint_scan` (the reverse scan of lam, whose output is one component
of g) and :func:`state_scan` (the forward recurrence whose output is one
component of h_t, for recomputing or saving the states).

Example:
    >>> from scanweaver.api import SELECTIVE
    >>> from scanweaver.passes.adjoint import adjoint, adjoint_scan
    >>> adj = adjoint(SELECTIVE.lower().affine, dh0=True)
    >>> str(adj.U), str(adjoint_scan(adj).output)
    ('a * (c * dy)', 'h + (c * dy)')
"""

from __future__ import annotations

import dataclasses

from ..ir import expr as E
from ..ir.adjoint import AdjointIR, verify_adjoint
from ..ir.derivative import diff
from ..ir.stages import AffineScanIR, Features, ScanIR


def _fresh(name: str, taken: tuple[str, ...]) -> str:
    while name in taken:
        name += "_"
    return name


def _parts(value) -> tuple[E.Expr, ...]:
    return value if isinstance(value, tuple) else (value,)


def _pack(parts: list[E.Expr], k: int):
    return tuple(parts) if k > 1 else parts[0]


def _sum(terms) -> E.Expr:
    total = E.ZERO
    for t in terms:
        total = E.add(total, t)
    return total


def _gradient(fwd: AffineScanIR, name: str, dy: E.Expr, keep: E.Expr) -> E.Expr:
    """dL/d ``name`` per element: the adjoint factors times the partials of A, U and the projection."""
    k = fwd.state_size
    g = [E.adjoint(j) if k > 1 else E.adjoint() for j in range(k)]
    h = [E.state(j) if k > 1 else E.STATE for j in range(k)]
    hn = [E.new_state(j) if k > 1 else E.NEW_STATE for j in range(k)]
    A, U, out = _parts(fwd.A), _parts(fwd.U), fwd.output
    terms = [E.mul(E.mul(keep, E.mul(g[r], h[c])), diff(A[r * k + c], name)) for r in range(k) for c in range(k)]
    terms += [E.mul(g[r], diff(U[r], name)) for r in range(k)]
    terms += [E.mul(E.mul(dy, hn[j]), diff(c, name)) for j, c in enumerate(_parts(out.new))]
    terms += [E.mul(E.mul(dy, h[j]), diff(c, name)) for j, c in enumerate(_parts(out.old))]
    terms.append(E.mul(dy, diff(out.const, name)))
    return _sum(terms)


def adjoint(fwd: AffineScanIR, wrt: tuple[str, ...] | None = None, *, dh0: bool = False, dh_last: bool = False,
            saved_states: bool = False) -> AdjointIR:
    """Returns stage ``adjoint`` of the forward ``fwd``.

    Args:
        fwd: the forward's stage ``affine_scan``.
        wrt: inputs to differentiate (default: all of them).
        dh0: also produce dL/dh0 (the forward must have h0).
        dh_last: a cotangent of the final state enters the reverse scan.
        saved_states: the forward saved its states (else they are recomputed).
    """
    wrt = tuple(fwd.inputs) if wrt is None else tuple(n for n in fwd.inputs if n in wrt)
    k = fwd.state_size
    cot = _fresh("dy", fwd.inputs)
    keep_name = _fresh("keep", (*fwd.inputs, cot)) if fwd.features.has_reset else ""
    dy, keep = E.inp(cot), (E.inp(keep_name) if keep_name else E.ONE)
    A = _parts(fwd.A)
    # A'[c][r] = keep * A[r][c]: the transposed transition, zero at resets.
    At = [E.mul(keep, A[r * k + c]) for c in range(k) for r in range(k)]
    goff = [E.mul(cn, dy) for cn in _parts(fwd.output.new)]
    Ut = [E.add(_sum(E.mul(At[c * k + r], goff[r]) for r in range(k)), E.mul(co, dy))
          for c, co in enumerate(_parts(fwd.output.old))]
    ir = AdjointIR(
        forward=fwd,
        wrt=wrt,
        grads=tuple(_gradient(fwd, n, dy, keep) for n in wrt),
        cotangent=cot,
        keep=keep_name,
        A=_pack(At, k * k if k > 1 else 1),
        U=_pack(Ut, k),
        g_offset=_pack(goff, k),
        dh0=dh0 and fwd.features.has_h0,
        dh_last=dh_last,
        saved_states=saved_states,
    )
    verify_adjoint(ir)
    return ir


def _next_state(A, U, k: int):
    A, U = _parts(A), _parts(U)
    h = [E.state(j) if k > 1 else E.STATE for j in range(k)]
    rows = [E.add(_sum(E.mul(A[r * k + c], h[c]) for c in range(k)), U[r]) for r in range(k)]
    return _pack(rows, k)


def adjoint_scan(adj: AdjointIR, component: int = 0) -> ScanIR:
    """Stage ``scan`` of the reverse recurrence of lam whose output is g_t[component].

    Its features: the opposite direction of the forward, h0 = dL/dh_L when
    :attr:`~AdjointIR.dh_last`, no reset mask (the keep operand carries it),
    and the final state (dL/dh0) returned.
    """
    k = adj.state_size
    lam_prev = E.state(component) if k > 1 else E.STATE
    f = adj.forward.features
    return ScanIR(
        name=f"{adj.forward.name}_adjoint",
        inputs=adj.inputs,
        next_state=_next_state(adj.A, adj.U, k),
        output=E.add(lam_prev, _parts(adj.g_offset)[component]),
        dtype=adj.forward.dtype,
        features=Features(reverse=not f.reverse, has_h0=adj.dh_last, has_reset=False, return_state=True),
        state_size=k,
    )


def state_scan(fwd: AffineScanIR, component: int = 0) -> ScanIR:
    """Stage ``scan`` of the forward recurrence whose output is h_t[component] (the states, not y)."""
    k = fwd.state_size
    return ScanIR(
        name=f"{fwd.name}_states",
        inputs=fwd.inputs,
        next_state=_next_state(fwd.A, fwd.U, k),
        output=E.new_state(component) if k > 1 else None,
        dtype=fwd.dtype,
        features=dataclasses.replace(fwd.features, return_state=True),
        state_size=k,
    )
