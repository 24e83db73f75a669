"""Tracing a step over a matrix state (``state_shape=("K", "V")``) into stage ``matrix_scan``.

The step ``step(S, *operands)`` runs on symbolic values: ``S`` a ``(rows, columns)``
matrix, every operand a scalar per step or a vector whose axis is bound by how
it meets the state (``k[:, None] * v[None, :]``, ``np.outer(k, v)``, ``q @ S``,
``S @ c``, ``np.exp(g)[:, None] * S``; NumPy's broadcasting rules hold, so a 1-D
``g * S`` scales columns).  Each value knows whether it is free of ``S``, linear
in it (a matrix: transition factors, an added part, or a low-rank term), or a
contraction of it (a readout); anything else raises :class:`NotAffineError`
quoting the term.  :func:`trace_matrix` classifies the result (see
:mod:`scanweaver.ir.matrix`) and derives the lowering onto ``matrix_state``.
"""

from __future__ import annotations


import numpy as np

from ..errors import NotAffineError, ScanWeaverError
from .trace import MAX_DEPTH, MAX_EXPANDED

ONE = "1"


class OverBudget(Exception):
    """Raised while tracing when a value grows past the front end's expression budget (:func:`.trace.check_budget`;
    not a :class:`ScanWeaverError`, so that no retry of the trace swallows it)."""

    def __init__(self, depth: int, expanded: int):
        super().__init__(f"depth {depth}, expanded size {expanded}")
        self.depth, self.expanded = depth, expanded


class Ax:
    """An operand's axis: unbound until it meets the state's rows or columns (union-find)."""

    def __init__(self, bound: str | None = None):
        self.parent: Ax | None = None
        self.bound = bound

    def root(self) -> Ax:
        return self if self.parent is None else self.parent.root()


def _unify(a, b, what: str):
    if a == ONE:
        return b
    if b == ONE:
        return a
    ra, rb = a.root(), b.root()
    if ra is rb:
        return ra
    if ra.bound and rb.bound and ra.bound != rb.bound:
        raise ScanWeaverError(f"recurrence: {what} mixes the state's {ra.bound} and {rb.bound}")
    if ra.bound:
        rb.parent = ra
        return ra
    ra.parent = rb
    return rb


def _broadcast(s1: tuple, s2: tuple, what: str) -> tuple:
    n = max(len(s1), len(s2))
    s1, s2 = (ONE,) * (n - len(s1)) + s1, (ONE,) * (n - len(s2)) + s2
    return tuple(_unify(a, b, what) for a, b in zip(s1, s2, strict=True))


class M:
    """A traced value.  ``kind``: ``free`` (no S), ``lin`` (a matrix linear in S) or ``read`` (a contraction of S).

    Free values carry ``fn(env)`` (the array over the operands, trailing axis for a vector) and, for an outer
    product of two vectors, ``outer = (row, col)``; ``log`` is the text and fn of the logarithm when the value
    is ``exp(x)``.  Linear values carry ``factors`` (free values multiplying S), ``const`` (the added free
    part), ``extra`` (structure that no fused form has: ``dense`` or ``low rank``) and ``base``
    (the :class:`M` it came from, to tell the state before an update from after it).  ``depth`` and
    ``expanded`` measure the expression (``parts``: the values it is built from) against the front end's budget.
    """

    __array_priority__ = 1000

    def __init__(self, kind: str, shape: tuple, text: str, **kw):
        self.kind, self.shape, self.text = kind, shape, text
        self.fn = kw.get("fn")
        self.outer = kw.get("outer")
        self.log = kw.get("log")
        self.operand = kw.get("operand")
        self.factors: list = kw.get("factors", [])
        self.const: M | None = kw.get("const")
        self.extra: str = kw.get("extra", "")
        self.of: M | None = kw.get("of")
        self.vector: M | None = kw.get("vector")
        self.axis: str = kw.get("axis", "")
        self.src: frozenset = kw.get("src", frozenset())
        parts: tuple[M, ...] = kw.get("parts", ())
        self.depth: int = 1 + max((p.depth for p in parts), default=0)
        self.expanded: int = 1 + sum(p.expanded for p in parts)
        if self.depth > MAX_DEPTH or self.expanded > MAX_EXPANDED:
            raise OverBudget(self.depth, self.expanded)

    def __repr__(self) -> str:
        return f"M({self.text})"

    # --- arithmetic -------------------------------------------------------------------------------------------
    def __add__(self, o): return _add(self, _m(o), "+")
    def __radd__(self, o): return _add(_m(o), self, "+")
    def __sub__(self, o): return _add(self, _neg(_m(o)), "-")
    def __rsub__(self, o): return _add(_m(o), _neg(self), "-")
    def __mul__(self, o): return _mul(self, _m(o))
    def __rmul__(self, o): return _mul(_m(o), self)
    def __neg__(self): return _neg(self)
    def __truediv__(self, o):
        o = _m(o)
        if o.kind != "free":
            raise NotAffineError(f"recurrence: ({self.text} / {o.text}) divides by the state S; it is not affine")
        inv = M("free", o.shape, f"(1 / {o.text})", fn=_lift(lambda a: 1.0 / a, o), src=o.src, parts=(o,))
        return _mul(self, inv)
    def __rtruediv__(self, o): return _m(o).__truediv__(self)
    def __matmul__(self, o): return _matmul(self, _m(o))
    def __rmatmul__(self, o): return _matmul(_m(o), self)
    def __pow__(self, o):
        if self.kind != "free":
            raise NotAffineError(f"recurrence: ({self.text} ** {o}) is not affine in the state S")
        return M("free", self.shape, f"({self.text} ** {o})", fn=_lift(lambda a: a ** o, self), src=self.src,
                 parts=(self,))

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        real = [k for k in key if k is not None]
        if self.kind == "free" and not self.shape:
            raise Promote(self.src)
        if self.kind == "free" and len(self.shape) == 1 and all(isinstance(k, slice) and k == slice(None)
                                                                for k in real) and len(real) == 1:
            shape = tuple(ONE if k is None else self.shape[0] for k in key)
            return M("free", shape, self.text, fn=self.fn, log=self.log, operand=self.operand, src=self.src)
        if self.kind == "read" and len(real) == 1 and len(key) == 2:
            return M("read", tuple(ONE if k is None else self.shape[0] for k in key), self.text, of=self.of,
                     vector=self.vector, axis=self.axis, const=self.const)
        raise ScanWeaverError(f"recurrence: indexing {self.text}[{key}] is not supported in a matrix-state step; "
                              "use x[:, None] and x[None, :] to broadcast a vector")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs:
            return NotImplemented
        args = [_m(a) for a in inputs]
        if ufunc is np.add:
            return args[0] + args[1]
        if ufunc is np.subtract:
            return args[0] - args[1]
        if ufunc is np.multiply:
            return args[0] * args[1]
        if ufunc is np.true_divide:
            return args[0] / args[1]
        if ufunc is np.matmul:
            return _matmul(*args)
        if ufunc is np.negative:
            return -args[0]
        (x,) = args if len(args) == 1 else (None,)
        if x is None:
            raise ScanWeaverError(f"recurrence: np.{ufunc.__name__} of two values is not supported in a "
                                  "matrix-state step")
        if x.kind != "free":
            raise NotAffineError(f"recurrence: np.{ufunc.__name__}({x.text}) is not affine in the state S")
        out = M("free", x.shape, f"{ufunc.__name__}({x.text})", fn=_lift(ufunc, x), src=x.src, parts=(x,))
        if ufunc is np.exp:
            out.log = (x.text, x.fn)
        return out

    def __array_function__(self, func, types, args, kwargs):
        if func is np.outer and not kwargs:
            a, b = (_m(v) for v in args)
            _need_vectors(a, b)
            return _mul(a[:, None], b[None, :])
        if func is np.dot and not kwargs:
            return _matmul(*(_m(v) for v in args))
        return NotImplemented


class Promote(Exception):
    """Raised while tracing when scalar operands turn out to be vectors (indexed, outer, contracted):
    the tracer runs the step again with them as vectors."""

    def __init__(self, names: frozenset):
        super().__init__(", ".join(sorted(names)))
        self.names = names


def _need_vectors(*xs: M) -> None:
    names = frozenset().union(*(x.src for x in xs if x.kind == "free" and not x.shape))
    if names:
        raise Promote(names)


def _rank(x: M) -> int:
    return sum(1 for s in x.shape if s != ONE)


def _lift(f, *xs: M):
    """``fn`` of an elementwise op on free values of rank <= 1 (a scalar broadcast over a vector)."""
    if any(x.fn is None for x in xs):
        return None
    ranks = [_rank(x) for x in xs]

    def fn(env):
        vals = [x.fn(env) for x in xs]
        vals = [v[..., None] if r == 0 and max(ranks) == 1 and np.ndim(v) else v for v, r in zip(vals, ranks,
                                                                                                   strict=True)]
        return ufunc_of(f, env)(*vals)
    return fn


def ufunc_of(f, env: dict):
    """``f``, or for a NumPy ufunc the function of that name in ``env["__xp__"]`` (PyTorch, JAX), so that a
    step's gates are computed, and differentiated, by the caller's framework."""
    xp = env.get("__xp__")
    return getattr(xp, f.__name__) if xp is not None and isinstance(f, np.ufunc) else f


def _m(v) -> M:
    if isinstance(v, M):
        return v
    if isinstance(v, (int, float, np.number)) and not isinstance(v, bool):
        c = float(v)
        return M("free", (), repr(c), fn=lambda env, c=c: c)
    raise ScanWeaverError(f"recurrence: cannot use a value of type {type(v).__name__} inside a matrix-state step; "
                          "use the step's arguments, Python numbers and NumPy functions")


def _neg(x: M) -> M:
    return _mul(_m(-1.0), x)


def _mul(a: M, b: M) -> M:
    text = f"({a.text} * {b.text})"
    if a.kind != "free" and b.kind != "free":
        raise NotAffineError(f"recurrence: {text} multiplies the state S by itself; it is not affine in S")
    if a.kind == "free" and b.kind == "free":
        shape = _broadcast(a.shape, b.shape, text)
        if _rank(a) + _rank(b) == 2 and len(shape) == 2 and ONE not in shape and a.outer is None and b.outer is None:
            row, col = (a, b) if a.shape[0] != ONE else (b, a)
            return M("free", shape, text, outer=(_vec(row), _vec(col)), src=a.src | b.src, parts=(a, b))
        if a.outer is not None or b.outer is not None:
            o, s = (a, b) if a.outer is not None else (b, a)
            if s.outer is None and _rank(s) <= 1:
                row, col = o.outer
                if _rank(s) == 0 or s.shape[-1] == ONE or (len(s.shape) == 2 and s.shape[1] == ONE):
                    return M("free", shape, text, outer=(_vec(_mul(s if _rank(s) == 0 else _vec(s), row)), col),
                             src=a.src | b.src, parts=(a, b))
                return M("free", shape, text, outer=(row, _vec(_mul(_vec(s), col))), src=a.src | b.src, parts=(a, b))
            return M("free", shape, text, src=a.src | b.src, parts=(a, b))
        return M("free", shape, text, fn=_lift(np.multiply, a, b), src=a.src | b.src, parts=(a, b))
    f, x = (a, b) if a.kind == "free" else (b, a)
    if x.kind == "read":
        if len(f.shape) == 2 and len(x.shape) == 2:  # k[:, None] * (k @ S)[None, :]: a rank-one term in S
            return M("lin", _broadcast(f.shape, x.shape, text), text, extra="low rank", base=None, parts=(a, b))
        return M("read", x.shape, text, of=x.of, vector=_mul(f, x.vector) if x.vector else f, axis=x.axis,
                 const=x.const, parts=(a, b))
    shape = _broadcast(f.shape, x.shape, text)
    return M("lin", shape, text, factors=[*x.factors, f], const=None if x.const is None else _mul(f, x.const),
             extra=x.extra, of=x.of if x.of is not None else x, parts=(a, b))


def _vec(x: M) -> M:
    """A broadcast vector ``x[:, None]`` / ``x[None, :]`` as its 1-D self."""
    axis = [s for s in x.shape if s != ONE]
    return M("free", tuple(axis), x.text, fn=x.fn, log=x.log, operand=x.operand, src=x.src)


def _add(a: M, b: M, op: str) -> M:
    text = f"({a.text} {op} {b.text})"
    if a.kind == "free" and b.kind == "free":
        shape = _broadcast(a.shape, b.shape, text)
        fn = _lift(np.add, a, b) if a.outer is None and b.outer is None else None
        return M("free", shape, text, fn=fn, src=a.src | b.src, parts=(a, b))
    if "read" in (a.kind, b.kind):
        r, o = (a, b) if a.kind == "read" else (b, a)
        raise ScanWeaverError(f"recurrence: {text} adds to a readout of S; write the readout as one contraction, "
                              f"e.g. q @ (S + ...) (a bonus term) or q @ S")
    if a.kind == "lin" and b.kind == "lin":
        extra = "low rank" if "low rank" in (a.extra, b.extra) else a.extra or b.extra or "elementwise"
        return M("lin", _broadcast(a.shape, b.shape, text), text, factors=a.factors, const=a.const, extra=extra,
                 of=a.of or a, parts=(a, b))
    lin, f = (a, b) if a.kind == "lin" else (b, a)
    shape = _broadcast(lin.shape, f.shape, text)
    const = f if lin.const is None else _add(lin.const, f, "+")
    return M("lin", shape, text, factors=lin.factors, const=const, extra=lin.extra, of=lin.of or lin, parts=(a, b))


def _matmul(a: M, b: M) -> M:
    text = f"({a.text} @ {b.text})"
    if a.kind != "free" and b.kind != "free":
        raise NotAffineError(f"recurrence: {text} multiplies the state S by itself; it is not affine in S")
    if a.kind == "free" and b.kind == "free":
        raise ScanWeaverError(f"recurrence: {text}: a matrix product of operands is not supported in a matrix-state "
                              "step (use elementwise products and np.outer)")
    f, x = (a, b) if a.kind == "free" else (b, a)
    _need_vectors(f)
    left = a is f
    if x.kind == "read":
        raise ScanWeaverError(f"recurrence: {text} contracts a readout again; return the readout q @ S itself")
    if len(f.shape) == 1:
        axis = x.shape[0] if left else x.shape[1]
        _unify(f.shape[0], axis, text)
        out = (x.shape[1],) if left else (x.shape[0],)
        return M("read", out, text, of=x, vector=f, axis="rows" if left else "columns", parts=(a, b))
    return M("lin", x.shape, text, factors=x.factors, const=x.const, of=x.of or x,
             extra="dense on rows" if left else "dense on columns", parts=(a, b))
