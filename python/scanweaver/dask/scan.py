"""``scanweaver.dask.apply`` and ``selective_scan``: any recurrence over Dask arrays, lazily.

The operands are checked (dtype, shape, broadcasting) with the same rules and
messages as the in-memory API, brought to one chunking (the operands'
own when they agree), and handed to :func:`.graph.build` with a
:class:`~.blocks.RecurrenceBlocks` kernel.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.recurrence import Recurrence
from ..arrays import as_array, compute_dtype, result_dtype, seqlens_positions
from ..errors import ScanInputError, ScanWeaverError, api_boundary
from .blocks import RecurrenceBlocks
from .graph import Layout, build, choose, parallelism


def require_dask():
    """``dask.array``, or an error that says how to install it."""
    try:
        import dask.array as da
    except ImportError as exc:
        raise ScanWeaverError(f"scanweaver.dask: Dask is not installed ({exc}); install the extra: "
                              "pip install scanweaver[dask]") from None
    return da


def as_dask(api: str, name: str, value):
    """``value`` as a Dask array of a supported dtype with known chunk sizes (NumPy arrays become one chunk)."""
    da = require_dask()
    arr = value if isinstance(value, da.Array) else da.asarray(as_array(api, name, value))
    as_array(api, name, np.empty(0, arr.dtype))  # the in-memory API's dtype rule and message
    if any(math.isnan(c) for cs in arr.chunks for c in cs):
        raise ScanInputError(f"{api}: {name} has unknown chunk sizes {arr.chunks}; call "
                             f"{name}.compute_chunk_sizes() first")
    return arr


def unify(arrays: list, ndim: int) -> list:
    """``arrays`` (all ``ndim``-dimensional) rechunked to one common chunking (none when they agree)."""
    from dask.array.core import unify_chunks

    ind = tuple(range(ndim))
    _, out = unify_chunks(*[v for a in arrays for v in (a, ind)], warn=False)
    return list(out)


def _shape(api: str, ops: dict, broadcast: bool) -> tuple[int, ...]:
    """The operands' common shape ``(..., L)``: broadcast as the in-memory call does (scalars included) for a
    recurrence that broadcasts, else one shape shared by all."""
    if all(a.ndim == 0 for a in ops.values()) or (not broadcast and any(a.ndim == 0 for a in ops.values())):
        n = next(n for n, a in ops.items() if a.ndim == 0)
        raise ScanInputError(f"{api}: {n} is a scalar; operands need layout (..., L), scanned over the last axis"
                             f"{'' if broadcast else ' (every operand of this recurrence has that shape)'}")
    shapes = {n: tuple(a.shape) for n, a in ops.items()}
    desc = ", ".join(f"{n}{s}" for n, s in shapes.items())
    if broadcast:
        try:
            return tuple(np.broadcast_shapes(*shapes.values()))
        except ValueError:
            raise ScanInputError(f"{api}: operand shapes do not broadcast together: {desc}") from None
    shape = next(iter(shapes.values()))
    if any(s != shape for s in shapes.values()):
        raise ScanInputError(f"{api}: operands must all have the same shape (..., L); got {desc}")
    return shape


def _h0(api: str, h0, batch_chunks: tuple, state_size: int, dtype: np.dtype):
    h = as_dask(api, "h0", h0)
    if h.dtype.kind not in ("fiuc" if dtype.kind == "c" else "fiu"):
        raise ScanInputError(f"{api}: h0 has dtype {h.dtype}; it needs a real float dtype")
    want = tuple(sum(c) for c in batch_chunks) + ((state_size,) if state_size > 1 else ())
    if tuple(h.shape) != want:
        raise ScanInputError(f"{api}: h0 has shape {tuple(h.shape)}; it needs the operands' leading shape"
                             f"{'' if state_size == 1 else f' plus the state size {state_size}'}: {want}")
    return h.rechunk(batch_chunks + (((state_size,),) if state_size > 1 else ()))


def _reset(api: str, reset, shape: tuple, chunks: tuple):
    da = require_dask()
    r = reset if isinstance(reset, da.Array) else da.asarray(np.asarray(reset))
    if tuple(r.shape) != shape:
        raise ScanInputError(f"{api}: reset has shape {tuple(r.shape)}; it needs the operands' shape {shape}")
    if r.dtype != np.bool_ and r.dtype.kind not in "iu":
        raise ScanInputError(f"{api}: reset has dtype {r.dtype}; it needs a boolean mask")
    return (r != 0).rechunk(chunks)


@api_boundary
def apply(rec: Recurrence, *args, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
          cu_seqlens=None, backend: str = "auto", schedule: str = "auto", config="auto", method: str = "auto",
          **kwargs):
    """Runs ``rec`` over Dask arrays: a lazy ``y`` with the operands' chunking (along L and the lanes).

    Blocks along L are joined by carries (:mod:`scanweaver.dask.graph` explains
    the methods); every block runs the in-memory scan on the worker that holds
    it, on that worker's best backend with its tuned configurations.

    Args:
        rec: a :class:`~scanweaver.Recurrence`.
        *args: operands (Dask or NumPy arrays) in the order of ``rec.inputs``, or by name as keywords.
        h0: initial state ``(...)`` (``(..., k)`` for a vector state), Dask or NumPy.
        reset: boolean mask ``(..., L)``; True starts a new segment (within or across blocks).
        reverse: scan from the end.
        return_state: also return the final state (lazy).
        cu_seqlens: offsets ``[0, ..., L]`` of sequences packed along L.
        backend, schedule, config: as for the in-memory call, on every block (``auto``: each worker's best).
        method: ``auto``, ``chain``, ``rescan`` or ``correct``.
        **kwargs: operands by name, or tunables such as ``threads=1``.

    Returns:
        ``y`` (a ``dask.array.Array``), or ``(y, h_last)``.

    Example:
        >>> import dask.array as da, numpy as np, scanweaver, scanweaver.dask
        >>> @scanweaver.recurrence
        ... def ema(h, alpha, x):
        ...     return alpha * h + (1 - alpha) * x
        >>> x = da.ones((2, 10), chunks=(1, 4))
        >>> y = scanweaver.dask.apply(ema, np.full((1, 1), 0.5), x, backend="numpy")
        >>> y.chunks, float(y[0, -1].compute())
        (((1, 1), (4, 4, 2)), 0.9990234375)
    """
    if not isinstance(rec, Recurrence):
        raise ScanInputError(f"scanweaver.dask.apply: expected a scanweaver.Recurrence, got {type(rec).__name__}")
    api = f"{rec.name} (dask)"
    operands, tunables = rec._bind(args, kwargs)
    ops = {n: as_dask(api, n, v) for n, v in operands.items()}
    shape = _shape(api, ops, rec.broadcast)
    arrays = list(ops.values())
    if rec.broadcast:
        da = require_dask()
        arrays = list(da.broadcast_arrays(*arrays))
    arrays = unify(arrays, len(shape))
    chunks = arrays[0].chunks
    dtype = compute_dtype(a.dtype for a in ops.values())
    out_dtype = result_dtype(a.dtype for a in ops.values())
    if reset is not None:
        arrays.append(_reset(api, reset, shape, chunks))
    k = rec.state_size
    state_chunks = chunks[:-1] + (((k,),) if k > 1 else ())
    state_axes = tuple(range(len(shape) - 1)) + ((None,) if k > 1 else ())
    h0a = _h0(api, h0, chunks[:-1], k, dtype) if h0 is not None else None
    positions = seqlens_positions(api, cu_seqlens, shape[-1], bool(reverse)) if cu_seqlens is not None else None
    if backend != "auto":
        from ..runtime import get_backend

        get_backend(backend, require_available=False)  # an unknown name fails here, not on a worker
    kernel = RecurrenceBlocks(rec, dtype.name, out_dtype.name, bool(reverse), reset is not None,
                              {"backend": backend, "schedule": schedule, "config": config, **tunables})
    rows = math.prod(len(c) for c in chunks[:-1])
    chosen = choose(method, rows, len(chunks[-1]), parallelism(), kernel.correctable)
    axes = tuple(range(len(shape)))
    layout = Layout([(a, axes) for a in arrays], chunks, out_dtype, (h0a, state_axes) if h0a is not None else None,
                    state_chunks, state_axes, dtype)
    from dask.base import tokenize

    token = tokenize(rec.name, rec.inputs, rec.signature(dtype.name), k, [a.name for a in arrays],
                     h0a.name if h0a is not None else None, bool(reverse), positions, chosen,
                     sorted(kernel.call.items(), key=str), out_dtype.str)
    return build(kernel, layout, name=rec.name.replace("_", "-"), token=token, method=chosen, reverse=bool(reverse),
                 resets=positions, return_state=return_state)
