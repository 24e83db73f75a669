"""Scans over Dask arrays: lazy, chunked along L and the lanes, on any Dask scheduler.

``scanweaver.dask.selective_scan``, ``scanweaver.dask.mamba_selective_scan``
and ``scanweaver.dask.apply(rec, ...)`` for any ``@recurrence`` take Dask
arrays (NumPy arrays are accepted beside them) and return Dask arrays with
the operands' chunking.  Dask (``pip install scanweaver[dask]``) is imported
when one of them is called, not by ``import scanweaver``.

Example:
    >>> import dask.array as da, scanweaver.dask
    >>> a = da.full((4, 1000), 0.9, chunks=(2, 300)); b = x = c = da.ones((4, 1000), chunks=(2, 300))
    >>> y = scanweaver.dask.selective_scan(a, b, x, c, backend="numpy")
    >>> y.chunks[1], round(float(y[0, -1].compute()), 6)
    ((300, 300, 300, 100), 10.0)
"""

from __future__ import annotations

import sys

from ..calls import route
from ..calls.declare import CALL_ARRAYS, OPERATIONS, Operation, call_kwargs, make_entry
from ..errors import api_boundary
from .graph import METHODS
from .mamba import mamba_selective_scan as _mamba
from .scan import apply

#: The keywords this adapter takes beside an operation's own: ``method`` (see :func:`apply`).
OWN = ("method",)


def _entry(op: Operation):
    """``scanweaver.dask.<op>``: the declared operation over Dask arrays (lazy, chunked along L and the lanes)."""

    def run(args: dict):
        op.check(args, extra=OWN)
        if op.recurrence is not None:
            rec = op.recurrence(args)
            rest = {k: v for k, v in args.items() if k not in ("tunables", "out", "states")
                    and (k not in op.arrays or k in CALL_ARRAYS)}
            if args.get("out") is not None:
                from ..errors import ScanInputError

                raise ScanInputError(f"{op.name}: out= takes NumPy or device arrays; over Dask the result is a "
                                     "new lazy array (drop out=)")
            return apply(rec, *(args[n] for n in rec.inputs), **rest, **args["tunables"])
        kwargs = call_kwargs(op, args)
        return _IMPLEMENTATIONS[op.name](**kwargs)

    return api_boundary(make_entry(op, run, __name__))


_IMPLEMENTATIONS = {"mamba_selective_scan": _mamba}
#: Entry points, one per declared operation this adapter carries (same signature as the NumPy one).
ENTRIES = {op.name: _entry(op) for op in OPERATIONS.values() if "dask" in op.frameworks}
globals().update(ENTRIES)

route.register("dask", sys.modules[__name__])

__all__ = ["METHODS", "apply", *sorted(ENTRIES)]
