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

from .graph import METHODS
from .mamba import mamba_selective_scan
from .scan import apply, selective_scan

__all__ = ["METHODS", "apply", "mamba_selective_scan", "selective_scan"]
