"""Each public operation declared once: its signature, array roles, options, result and docstring.

An operation's package writes its public function once, decorated with
:func:`operation`; the decorator records the declaration (an
:class:`Operation`) in :data:`OPERATIONS` and returns the NumPy entry point.
Every framework adapter builds its own entry point of the operation from the
same declaration (:func:`make_entry`), so the NumPy, PyTorch, JAX and Dask
entry points have one signature, one docstring and one set of checks by
construction (``test/test_declarations.py`` asserts it).

What a declaration says:

* the signature: the decorated function's own (positional order as in the
  library its users come from, defaults, keyword-only parameters);
* ``arrays``: the array parameters, in the order its kernel pair takes them
  (the router looks at these; the adapters hand them to the pair);
* ``pair``: the differentiable kernel pair (:mod:`scanweaver.calls.pairs`)
  the adapters run, with ``options(args)`` (the pair's options: Python
  literals, checked) and ``finish(outputs, args)`` (the call's return value);
* ``tunables``: the names of the tunables its kernels take, so that an unknown
  keyword is reported as neither a parameter nor a tunable, with the nearest name;
* the NumPy body: the decorated function's body, or, when it has none (only a
  docstring), the pair's forward on NumPy arrays.

Parameters annotated ``bool`` must be booleans (``reverse="no"`` is an error,
not a reversed scan); every entry point checks that first.

Example:
    >>> import numpy as np
    >>> from scanweaver.calls.declare import operation
    >>> @operation(arrays=("x",), name="double_demo")
    ... def double(x, scale: float = 2.0, *, verbose: bool = False):
    ...     '''Twice (or ``scale`` times) x.'''
    ...     return np.asarray(x) * scale
    >>> double([1.0, 2.0]).tolist(), double.declaration.name
    ([2.0, 4.0], 'double_demo')
    >>> try:
    ...     double([1.0], verbose="yes")
    ... except ValueError as exc:
    ...     print(str(exc))
    double_demo: verbose must be True or False, got 'yes'
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks import boolean
from ..errors import ScanInputError, api_boundary, unknown_keyword
from ..registry import Discovery, Registry
from . import route


@dataclass(frozen=True)
class Operation:
    """One public operation's declaration (see the module docstring).

    Attributes:
        name: the public name (``linear_attention``).
        signature: the entry points' signature.
        doc: their docstring.
        arrays: array parameters in the kernel pair's input order.
        pair: the kernel pair the adapters run (``None``: the operation is written in the caller's
            array library and every adapter calls the NumPy entry's body itself).
        options: ``options(args) -> dict`` of the pair's options (``args``: parameter name -> value,
            ``tunables`` -> the ``**tunables`` dict).
        finish: ``finish(outputs, args)`` -> the call's result, from the pair's outputs.
        inputs: ``inputs(args) -> list`` of the pair's inputs (default: ``args`` at :attr:`arrays`).
        tunables: names the operation's kernels accept as ``**tunables`` (for unknown-keyword errors).
        frameworks: the adapters that carry it.
        recurrence: for operations that run a compiled recurrence (``selective_scan``):
            ``recurrence(args)`` -> the :class:`~scanweaver.core.recurrence.Recurrence` a call runs;
            the adapters then run their ``apply`` on it, and :func:`scanweaver.vjp` and
            :func:`scanweaver.plan` ask it too.
        refused: keyword -> the message a call passing it gets (keywords of the library users come
            from that have no meaning here, e.g. fla's removed ``head_first``).
        body: the NumPy entry's own body, or ``None`` (the pair's forward on NumPy arrays).
        writes: the array parameters a call changes in place (``mamba2_state_update``'s state cache); an adapter
            that writes them through views of another library tells its own framework (PyTorch's version
            counters) and leaves to the framework's path what it refuses to write.
    """

    name: str
    signature: inspect.Signature
    doc: str
    arrays: tuple[str, ...]
    pair: str | None = None
    options: Callable[[dict], dict] | None = None
    finish: Callable[[list, dict], Any] | None = None
    inputs: Callable[[dict], list] | None = None
    tunables: Callable[[], Iterable[str]] | None = None
    frameworks: tuple[str, ...] = ("torch", "jax")
    recurrence: Callable[[dict], Any] | None = None
    refused: tuple[tuple[str, str], ...] = ()
    body: Callable | None = field(default=None, compare=False)
    writes: tuple[str, ...] = ()
    #: Parameters annotated ``bool`` (from :attr:`signature`).
    booleans: tuple[str, ...] = field(init=False, compare=False, repr=False)
    #: The named parameters, not ``**tunables`` (from :attr:`signature`).
    parameters: tuple[str, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Plain attributes, set once here: torch.compile traces the entry points' checks, and a
        # functools.cached_property takes a lock on Python 3.11 that Dynamo cannot trace (fullgraph=True
        # failed on an operation's first call in a process).
        params = self.signature.parameters.items()
        object.__setattr__(self, "booleans", tuple(n for n, p in params if p.annotation in (bool, "bool")))
        object.__setattr__(self, "parameters", tuple(n for n, p in params if p.kind is not p.VAR_KEYWORD))

    def check(self, args: dict, extra: tuple[str, ...] = ()) -> None:
        """The checks every entry point makes first: booleans, and keywords that are neither a parameter
        nor one of :attr:`tunables` (nor one of ``extra``, an adapter's own keywords).

        Raises:
            ScanInputError: naming the argument.
        """
        for name in self.booleans:
            boolean(self.name, name, args.get(name))
        given = args.get("tunables")
        if given:
            for key, message in self.refused:
                if key in given:
                    raise ScanInputError(f"{self.name}: {message}")
            if self.tunables is not None:
                known = set(self.tunables()) | set(extra)
                for key in given:
                    if key not in known:
                        raise ScanInputError(unknown_keyword(self.name, key, self.parameters, sorted(known)))

    def pair_inputs(self, args: dict) -> list:
        """The kernel pair's inputs for a call."""
        return self.inputs(args) if self.inputs is not None else [args.get(n) for n in self.arrays]

    def run_numpy(self, args: dict):
        """The NumPy entry's work: the declared body, or the pair's forward on NumPy arrays."""
        if self.body is not None:
            return self.body(**call_kwargs(self, args))
        from .pairs import PAIRS

        assert self.pair is not None and self.options is not None and self.finish is not None
        pair = PAIRS.get(self.pair)
        outputs = pair.forward(self.pair_inputs(args), self.options(args))
        return self.finish(list(outputs[: pair.n_outputs]), args)


#: Array parameters of every compiled-recurrence call beside its operands (passed to an adapter's ``apply``).
CALL_ARRAYS = ("h0", "reset")

#: Public operation name -> its declaration (each package under :mod:`scanweaver.ops` declares its own).
OPERATIONS: Registry[Operation] = Registry("operation", (Discovery("scanweaver.ops"),))


def call_kwargs(op: Operation, args: dict) -> dict:
    """The keywords that call ``op``'s function with ``args`` (its named parameters, then the ``**`` ones)."""
    kwargs = {n: args[n] for n in op.parameters if n in args}
    kwargs.update(args.get("tunables") or {})
    return kwargs


#: Argument types that need no routing: NumPy arrays, Python scalars and ``None`` (the plain NumPy call).
PLAIN = frozenset({np.ndarray, type(None), float, int})


def make_entry(op: Operation, run: Callable[[dict], Any], module: str, fast: Callable | None = None):
    """A function with ``op``'s exact signature and docstring whose call runs ``run(args)``.

    The function is generated from the signature (as :mod:`dataclasses` generates ``__init__``), so
    binding the arguments is Python's own and costs nothing beyond a call; ``args`` maps every named
    parameter to its value, and ``tunables`` to the ``**`` keywords (``{}`` when none).  With ``fast``
    (the NumPy body), a call whose arrays are all NumPy arrays, scalars or ``None``, whose booleans are
    booleans and that passes no ``**`` keywords calls ``fast`` with its own arguments directly: the
    checks of ``run`` could not fail and there is nothing to route.
    """
    params, names, call = [], [], []
    star = None
    defaults: dict[str, Any] = {}
    kw_only_started = False
    for name, p in op.signature.parameters.items():
        if p.kind is p.VAR_KEYWORD:
            star = name
            continue
        if p.kind is p.VAR_POSITIONAL:
            raise TypeError(f"{op.name}: declarations take no *args")
        if p.kind is p.KEYWORD_ONLY and not kw_only_started:
            params.append("*")
            kw_only_started = True
        if p.default is p.empty:
            params.append(name)
        else:
            defaults[f"_d_{name}"] = p.default
            params.append(f"{name}=_d_{name}")
        names.append(name)
        call.append(f"{name}={name}" if kw_only_started else name)
    if star is not None:
        params.append(f"**{star}")
    body = ", ".join(f"{n!r}: {n}" for n in names)
    extra = star if star is not None else "{}"
    lines = [f"def {op.name}({', '.join(params)}):"]
    if fast is not None:
        tests = [f"{n}.__class__ in _P" for n in op.arrays if n in names]
        tests += [f"{n}.__class__ is _bool" for n in op.booleans]
        if star is not None:
            tests.insert(0, f"not {star}")
        lines.append(f"    if {' and '.join(tests) or 'True'}:")
        lines.append(f"        return _fast({', '.join(call)})")
    lines.append(f"    return _run({{{body}, 'tunables': {extra}}})")
    namespace: dict[str, Any] = {"_run": run, "_fast": fast, "_P": PLAIN, "_bool": bool, **defaults}
    exec(compile("\n".join(lines) + "\n", f"<scanweaver entry {module}.{op.name}>", "exec"), namespace)  # noqa: S102
    fn = namespace[op.name]
    fn.__doc__ = op.doc
    fn.__module__ = module
    fn.__qualname__ = op.name
    fn.__signature__ = op.signature
    fn.declaration = op
    if op.recurrence is not None:
        pick = op.recurrence
        fn.recurrence_for = lambda operands: pick(dict(zip(op.arrays, operands, strict=False)))
    return fn


def numpy_entry(op: Operation):
    """The public entry point of ``op`` for NumPy (and device) arrays: checks, routes, runs."""

    def run(args: dict):
        op.check(args)
        front = route.framework(op.name, [args.get(n) for n in op.arrays])
        if front is not None:
            if front not in op.frameworks:
                kind = {"torch": "PyTorch tensors", "jax": "JAX arrays", "dask": "Dask arrays"}[front]
                raise ScanInputError(f"{op.name}: takes NumPy arrays only ({kind} are not supported by this "
                                     "operation yet); convert them, e.g. with .numpy() / numpy.asarray")
            return _call_kwargs_entry(route.entry(front, op.name), op, args)
        return op.run_numpy(args)

    return api_boundary(make_entry(op, run, "scanweaver", fast=op.body))


def _call_kwargs_entry(fn, op: Operation, args: dict):
    return fn(**call_kwargs(op, args))


def operation(*, arrays: tuple[str, ...], pair: str | None = None, options: Callable | None = None,
              finish: Callable | None = None, inputs: Callable | None = None,
              tunables: Callable[[], Iterable[str]] | None = None, frameworks: tuple[str, ...] = ("torch", "jax"),
              recurrence: Callable | None = None, refused: dict[str, str] | None = None, name: str | None = None,
              writes: tuple[str, ...] = ()):
    """Declares the decorated function as a public operation; returns its NumPy entry point.

    The function's signature and docstring become the operation's (every adapter's entry point
    has them too); its body, unless it is only a docstring, is the NumPy implementation and
    receives the arguments by name (``**tunables`` included).  See the module docstring.
    """

    def deco(fn: Callable):
        sig = inspect.signature(fn)
        op = Operation(name=name or fn.__name__, signature=sig, doc=inspect.getdoc(fn) or "", arrays=tuple(arrays),
                       pair=pair, options=options, finish=finish, inputs=inputs, tunables=tunables,
                       frameworks=tuple(frameworks), recurrence=recurrence,
                       refused=tuple(sorted((refused or {}).items())), body=None if _only_doc(fn) else fn,
                       writes=tuple(writes))
        if set(op.writes) - set(op.arrays):
            raise TypeError(f"{op.name}: writes names {sorted(set(op.writes) - set(op.arrays))}, not array parameters")
        if op.body is None and (pair is None or options is None or finish is None):
            raise TypeError(f"{op.name}: a declaration without a body needs pair, options and finish")
        OPERATIONS.add(op.name, op)
        entry = numpy_entry(op)
        entry.__module__ = fn.__module__
        return entry

    return deco


def _only_doc(fn: Callable) -> bool:
    """True when ``fn``'s body is its docstring alone (or ``...``): it returns ``None`` and does nothing else."""
    code = fn.__code__
    quiet = {"RESUME", "NOP", "CACHE", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "POP_TOP"}
    consts = [c for c in code.co_consts if c is not None and c != fn.__doc__ and c is not Ellipsis]
    return not consts and not code.co_names and all(i.opname in quiet for i in dis.get_instructions(fn))
