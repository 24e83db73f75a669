"""Building blocks of the MLIR target: tensor types, ``linalg.generic`` regions, the gates, the flips.

The MLIR target (:mod:`.mlir_target`) writes one module per lowering in
upstream dialects only (``func``, ``arith``, ``math``, ``tensor``,
``linalg``).  Operands are ``tensor<?x?xT>`` of shape ``(lanes, L)``
(dynamic, so one module serves every shape), the reset mask
``tensor<?x?xi8>``, states ``tensor<?xT>``.  A scan step is a
``linalg.generic`` whose time dimension is a ``reduction`` iterator: the
carried state is an output indexed by the lane only, so the loop over time
runs in order inside one dispatch while lanes are parallel.

Example:
    >>> m = Module("f32")
    >>> m.t2, m.state
    ('tensor<?x?xf32>', 'tensor<?xf32>')
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.expr import Expr, is_const
from ..ir.stages import AffineScanIR
from .mlir_expr import ELEMENT_TYPES, Body

PARALLEL, REDUCTION = "parallel", "reduction"


@dataclass
class Operand:
    """One ``ins``/``outs`` operand of a ``linalg.generic``: SSA value, tensor type, indexing map."""

    value: str
    type: str
    map: str


@dataclass
class Module:
    """The functions of one module and the counters that keep SSA names unique.

    Args:
        ty: element type, ``f32`` or ``f64``.
    """

    ty: str
    functions: list[str] = field(default_factory=list)
    _regions: int = 0

    @classmethod
    def for_dtype(cls, dtype: str) -> Module:
        """A module for the NumPy ``dtype`` (``float32`` or ``float64``)."""
        if dtype not in ELEMENT_TYPES:
            raise ValueError(f"mlir target: dtype {dtype!r} has no element type; it emits {', '.join(ELEMENT_TYPES)}")
        return cls(ELEMENT_TYPES[dtype])

    @property
    def t2(self) -> str:
        """``(lanes, L)`` operands."""
        return f"tensor<?x?x{self.ty}>"

    @property
    def state(self) -> str:
        """``(lanes,)`` states."""
        return f"tensor<?x{self.ty}>"

    mask2 = "tensor<?x?xi8>"

    def tensor(self, dims: tuple[int | None, ...], ty: str | None = None) -> str:
        """A tensor type with static dims (ints) and dynamic ones (``None``)."""
        shape = "x".join("?" if d is None else str(d) for d in dims)
        return f"tensor<{shape}x{ty or self.ty}>"

    def body(self) -> Body:
        """A region body with a fresh SSA prefix."""
        self._regions += 1
        return Body(self.ty, {}, prefix=f"r{self._regions}_")

    def text(self) -> str:
        """The module as text."""
        return "module {\n" + "\n\n".join(self.functions) + "\n}\n"


def identity_map(rank: int) -> str:
    """``affine_map<(d0, ..) -> (d0, ..)>``."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({dims})>"


def prefix_map(rank: int, keep: int) -> str:
    """``affine_map`` of ``rank`` loops to the first ``keep`` of them (a state indexed by lane and block)."""
    dims = ", ".join(f"d{i}" for i in range(rank))
    return f"affine_map<({dims}) -> ({', '.join(f'd{i}' for i in range(keep))})>"


def generic(body: Body, results: list[str], ins: list[Operand], outs: list[Operand], iters: list[str],
            args: list[str], yields: list[str], indent: str = "  ") -> list[str]:
    """The lines of one ``linalg.generic``.

    Args:
        body: the region's ops (``body.lines``), already emitted.
        results: SSA names of the results (one per ``outs``).
        ins, outs: the operands.
        iters: iterator types, outermost first.
        args: block argument names (one per ``ins`` then ``outs``), with their scalar types.
        yields: the values yielded (one per ``outs``).
    """
    maps = ", ".join(o.map for o in (*ins, *outs))
    head = (f"{indent}{', '.join(results)} = linalg.generic {{indexing_maps = [{maps}], "
            f"iterator_types = [{', '.join(repr(i).replace(chr(39), chr(34)) for i in iters)}]}}")
    lines = [head]
    if ins:
        lines.append(f"{indent}    ins({', '.join(o.value for o in ins)} : {', '.join(o.type for o in ins)})")
    lines.append(f"{indent}    outs({', '.join(o.value for o in outs)} : {', '.join(o.type for o in outs)}) {{")
    lines.append(f"{indent}  ^bb0({', '.join(args)}):")
    lines += [f"{indent}    {ln}" for ln in body.lines]
    ytypes = ", ".join(a.split(": ")[1] for a in args[len(ins):])
    lines.append(f"{indent}    linalg.yield {', '.join(yields)} : {ytypes}")
    out_types = ", ".join(o.type for o in outs)
    lines.append(f"{indent}  }} -> ({out_types})" if len(outs) > 1 else f"{indent}  }} -> {out_types}")
    return lines


def element(body: Body, aff: AffineScanIR, reset: str | None) -> tuple[str, str]:
    """The pair (A_t, U_t) of a diagonal scan from the inputs bound in ``body.env``; a reset zeroes A_t."""
    a = body.expr(aff.A)  # type: ignore[arg-type]
    u = body.expr(aff.U)  # type: ignore[arg-type]
    if reset is not None:
        zero8 = body.op("arith.constant 0 : i8")
        flag = body.op(f"arith.cmpi ne, {reset}, {zero8} : i8")
        a = body.select(flag, body.const(0.0), a)
    return a, u


def project(body: Body, aff: AffineScanIR, h: str, hprev: str) -> str:
    """y_t = new * h_t + old * h_{t-1} + const (the output projection of stage ``affine_scan``)."""
    out = aff.output
    if out.is_identity:
        return h
    terms = []
    for coef, state in ((out.new, h), (out.old, hprev)):
        assert isinstance(coef, Expr)
        if is_const(coef, 1.0):
            terms.append(state)
        elif not is_const(coef, 0.0):
            terms.append(body.binary("arith.mulf", body.expr(coef), state))
    if not is_const(out.const, 0.0):
        terms.append(body.expr(out.const))
    if not terms:
        return body.const(0.0)
    y = terms[0]
    for t in terms[1:]:
        y = body.binary("arith.addf", y, t)
    return y


def uses_prev_state(aff: AffineScanIR) -> bool:
    """True when y_t reads h_{t-1}."""
    return not is_const(aff.output.old, 0.0)  # type: ignore[arg-type]


def flip_function(m: Module, name: str, ty: str) -> str:
    """``func.func private @name(x) -> x[:, ::-1]`` for ``(lanes, L)`` tensors of element type ``ty``."""
    t = m.tensor((None, None), ty)
    body = m.body()
    i = body.op("linalg.index 0 : index")
    t_ = body.op("linalg.index 1 : index")
    last = body.op("arith.subi %l, %c1 : index")
    src = body.op(f"arith.subi {last}, {t_} : index")
    v = body.op(f"tensor.extract %x[{i}, {src}] : {t}")
    lines = [f"func.func private @{name}(%x: {t}) -> {t} {{",
             "  %c0 = arith.constant 0 : index", "  %c1 = arith.constant 1 : index",
             f"  %n = tensor.dim %x, %c0 : {t}", f"  %l = tensor.dim %x, %c1 : {t}",
             f"  %e = tensor.empty(%n, %l) : {t}"]
    lines += generic(body, ["%r"], [], [Operand("%e", t, identity_map(2))], [PARALLEL, PARALLEL],
                     [f"%o: {ty}"], [v])
    lines += [f"  return %r : {t}", "}"]
    return "\n".join(lines)
