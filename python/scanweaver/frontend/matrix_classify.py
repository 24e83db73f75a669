"""Classifying a traced matrix-state step (:mod:`.matrix`) into :class:`~scanweaver.ir.matrix.MatrixScanIR`.

The lowering onto the fused ``matrix_state`` operation: the kernel's rows are the
axis the readout contracts (``q @ S``: the state's rows; ``S @ c``: its columns,
so the state is transposed, as Mamba-2's ``(P, N)`` state read by ``S @ C``).  The
decay must be a scalar or a vector over that axis; the input an outer product
``k v^T`` (k over the kernel's rows); the readout after the update, or before
it (``bonus`` with ``u = 0``), or before it plus an outer product ``a_t b_t^T`` (RWKV-6's
``diag(u) k v^T``), whose contribution ``(q . a) b`` is added beside the kernel.  A decay given
as ``exp(x)`` is lowered as ``g = x``; any other as ``g = log|a|`` with its signs carried on q, k
and the final state (:mod:`.matrix_sign`), so a gate of either sign runs exactly.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ..errors import NotAffineError, ScanWeaverError
from ..ir.matrix import MatrixScanIR
from .matrix import ONE, Ax, M, OverBudget
from .trace import check_sizes


def step_operands(step: Callable) -> tuple[str, ...]:
    """The operand names of ``step(S, *operands)``."""
    params = list(inspect.signature(step).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) < 2 or any(p.kind not in kinds for p in params):
        raise ScanWeaverError("recurrence: a matrix-state step takes the state first and then named operands, "
                              "e.g. `def gla(S, q, k, v, g)`")
    return tuple(p.name for p in params[1:])


def _axis_name(x: M, rows: Ax, cols: Ax) -> str | None:
    axes = [s for s in x.shape if s != ONE]
    if not axes:
        return None
    r = axes[0].root()
    return "rows" if r is rows.root() else "columns" if r is cols.root() else "unbound"


def _factor(lin: M, rows: Ax, cols: Ax) -> tuple[str, M | None]:
    """The transition's kind and its single factor (None for the identity)."""
    if lin.extra:
        kind = {"low rank": "diagonal plus low rank"}.get(lin.extra, lin.extra)
        return kind, None
    if not lin.factors:
        return "identity", None
    f = lin.factors[0]
    for g in lin.factors[1:]:
        f = f * g
    if f.outer is not None or (len(f.shape) == 2 and ONE not in f.shape):
        return "elementwise", f
    axis = _axis_name(f, rows, cols)
    return {None: "scalar", "rows": "diagonal on rows", "columns": "diagonal on columns"}.get(axis, "unbound"), f


def classify(name: str, inputs: tuple[str, ...], state_shape: tuple[str, str], operands: dict[str, M],
             new: M, read: M | None, rows: Ax, cols: Ax) -> tuple[MatrixScanIR, dict]:
    """The IR of a traced step and the lowering's evaluators (``q``, ``k``, ``v``, ``g``, ``u``: fn(env) or None).

    Raises:
        ScanWeaverError: the step returns no matrix linear in S, or no readout.
    """
    if not isinstance(new, M) or new.kind != "lin" or len([s for s in new.shape if s != ONE]) != 2:
        raise ScanWeaverError(f"recurrence: the step must return the new state (a matrix affine in S) first; got "
                              f"{getattr(new, 'text', type(new).__name__)}")
    if read is None or not isinstance(read, M) or read.kind != "read":
        raise ScanWeaverError("recurrence: a matrix-state step must return (S_new, readout) with the readout a "
                              "contraction of the state with a step vector (q @ S or S @ c)")
    kind, factor = _factor(new, rows, cols)
    const = new.const
    inp = "outer product" if const is not None and const.outer is not None else "general"
    axes = {n: tuple(() if _axis_name(m, rows, cols) is None else (state_shape[0] if _axis_name(m, rows, cols) ==
                                                                    "rows" else state_shape[1],))
            for n, m in operands.items()}
    of = read.of
    bonus = None
    if of is new:
        read_of = "after"
    elif of is not None and of.of is None and not of.factors and of.const is None and not of.extra:
        read_of = "before"
    elif of is not None and not of.factors and not of.extra and of.const is not None and of.const.outer is not None:
        read_of, bonus = "bonus", of.const
    else:
        read_of = "general"
    ir_kw = dict(name=name, inputs=inputs, state_shape=state_shape, operand_axes=axes, transition=kind,
                 transition_factor="" if factor is None else factor.text, input=inp,
                 input_factors=() if inp != "outer product" else tuple(v.text for v in const.outer),
                 readout_axis=read.axis, readout_of="before" if read_of == "bonus" else read_of,
                 readout_vector=read.vector.text, bonus="" if bonus is None else bonus.text)
    why, low = _lower(kind, factor, const, inp, read, read_of, bonus)
    ir = MatrixScanIR(**ir_kw, lowering={k: v for k, v in low.items() if k not in ("fns",)}, unsupported=why)
    return ir, low.get("fns", {})


def _lower(kind, factor, const, inp, read, read_of, bonus) -> tuple[str, dict]:
    transpose = read.axis == "columns"
    want = "diagonal on columns" if transpose else "diagonal on rows"
    if kind in ("diagonal plus low rank", "dense on rows", "dense on columns", "elementwise"):
        return f"matrix_state has no {kind} transition; it takes the identity, a scalar or a diagonal decay", {}
    if kind not in ("identity", "scalar", want):
        return (f"a transition {kind} with a readout contracting the state's {read.axis}: matrix_state needs the "
                f"identity, a scalar or a decay over the contracted axis ({want})", {})
    if inp != "outer product":
        return "an input that is not an outer product of two step vectors", {}
    if read_of == "general":
        return "a readout of a state that is neither S_t nor S_{t-1} (plus a bonus outer product)", {}
    k, v = const.outer if not transpose else const.outer[::-1]
    decay = {"identity": "none", "scalar": "scalar"}.get(kind, "key")
    g_text, g_fn, sign = "", None, ""
    fns = {"q": read.vector.fn, "k": k.fn, "v": v.fn, "g": None, "u": None}
    if factor is not None and factor.log is not None:
        g_text, g_fn = factor.log
    elif factor is not None:  # a gate of either sign: its log magnitude, its signs carried (.matrix_sign)
        g_text, g_fn, sign = f"log(abs({factor.text}))", _log_abs(factor.fn), factor.text
        fns["neg"] = lambda env, fn=factor.fn: fn(env) < 0
    fns["g"] = g_fn
    u_text = ""
    readout = "after" if read_of == "after" else "bonus"
    if read_of == "before":
        u_text = "0"
    elif read_of == "bonus":
        bk, bv = bonus.outer if not transpose else bonus.outer[::-1]
        fns["bonus"] = (bk.fn, bv.fn)
        u_text = f"0, plus ({read.vector.text} . {bk.text}) {bv.text} after the kernel"
        if bk.fn is None or bv.fn is None:
            return f"a bonus term {bonus.text} that is not an outer product of elementwise functions", {}
    if any(fns[n] is None for n in ("q", "k", "v")) or (factor is not None and g_fn is None):
        return "a factor that is not an elementwise function of the operands", {}
    return "", {"q": read.vector.text, "k": k.text, "v": v.text, "g": g_text, "u": u_text, "sign": sign,
                "decay": decay, "readout": readout, "transpose": transpose, "fns": fns}


def _log_abs(fn):
    """``log|a|`` of a gate (``-inf`` where it is zero: a reset) in the caller's framework."""
    import numpy as np

    from .matrix import ufunc_of

    def g(env):
        with np.errstate(divide="ignore"):
            return ufunc_of(np.log, env)(ufunc_of(np.abs, env)(fn(env)))

    return None if fn is None else g


def trace_matrix(step: Callable, state_shape: tuple[str, str], name: str | None = None,
                 vectors: frozenset | None = None) -> tuple[MatrixScanIR, dict]:
    """Traces ``step(S, *operands) -> (S_new, readout)`` and classifies it (see :func:`classify`).

    ``vectors`` names the operands that are vectors (the call knows it from the arrays); without it,
    operands used bare are scalars and one that is indexed (``x[:, None]``), passed to ``np.outer`` or
    contracted with S (``q @ S``) becomes a vector (a value computed from several operands: each of
    them is tried, see :func:`_search`), the step traced again.

    Raises:
        NotAffineError: quoting a term that is not affine in S.
        ScanWeaverError: an unsupported construct, or a result that is not ``(S_new, readout)``.
        ScanInputError: expressions deeper or larger than the front ends' budget (:func:`.trace.check_sizes`).
    """
    if not (isinstance(state_shape, tuple) and len(state_shape) == 2 and all(isinstance(a, str) and a
                                                                            for a in state_shape)):
        raise ScanWeaverError(f"recurrence: state_shape must be two axis names such as ('K', 'V'), got "
                              f"{state_shape!r}")
    inputs = step_operands(step)
    label = name or getattr(step, "__name__", "recurrence").replace("<lambda>", "lambda")
    try:
        return _trace(step, inputs, state_shape, label, vectors)
    except OverBudget as big:
        check_sizes(step, big.depth, big.expanded)  # raises: the value grew past the budget
        raise


def _trace(step: Callable, inputs: tuple[str, ...], state_shape: tuple[str, str], label: str,
           vectors: frozenset | None) -> tuple[MatrixScanIR, dict]:
    from .matrix import Promote

    if vectors is not None:
        try:
            result, ops, rows, cols = _run(step, inputs, set(vectors))
        except Promote as p:
            raise ScanWeaverError(f"recurrence: {', '.join(sorted(p.names))} is used as a vector (indexed, in "
                                  "np.outer or contracted with S) but was given as a scalar per step") from None
    else:
        result, ops, rows, cols = _search(step, inputs)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ScanWeaverError("recurrence: a matrix-state step must return (S_new, readout)")
    new, read = result
    return classify(label, inputs, state_shape, ops, new, read, rows, cols)


def _run(step: Callable, inputs: tuple[str, ...], vectors: set[str]):
    """One symbolic run of the step with ``vectors`` as vector operands."""
    rows, cols = Ax("rows"), Ax("columns")
    S = M("lin", (rows, cols), "S")
    ops = {n: M("free", (Ax(),) if n in vectors else (), n, fn=lambda env, n=n: env[n], operand=n,
                src=frozenset([n])) for n in inputs}
    return step(S, *ops.values()), ops, rows, cols


def _search(step: Callable, inputs: tuple[str, ...]):
    """Runs the step, making operands vectors where it needs them: when a value computed from several
    operands must be a vector, each of them is tried in turn (the first consistent choice wins)."""
    from .matrix import Promote

    tried: set[frozenset] = set()
    todo = [frozenset()]
    last: Exception | None = None
    while todo:
        vectors = todo.pop(0)
        if vectors in tried:
            continue
        tried.add(vectors)
        try:
            return _run(step, inputs, set(vectors))
        except Promote as p:
            todo[:0] = [vectors | {n} for n in sorted(p.names - vectors)]
        except NotAffineError:
            raise
        except ScanWeaverError as exc:
            last = exc
    raise last if last is not None else ScanWeaverError("recurrence: cannot tell which operands are vectors")
