"""Auto-tuning with Kernel Tuner, and the store of tuned configurations.

``scanweaver.tune(...)`` runs Kernel Tuner over a backend's search space and
records the best configuration; every later scan call finds it through
:func:`store.lookup`.  Only :mod:`.store` is imported with ``scanweaver``;
Kernel Tuner is imported when a tune starts (``pip install scanweaver[tune]``).
"""

from __future__ import annotations

from . import store


def tune(recurrence=None, **kwargs):
    """Tunes a recurrence on a backend; see :func:`scanweaver.tuning.kt.tune`.

    Example:
        >>> import scanweaver
        >>> report = scanweaver.tune(backend="cpu", shape=(64, 1024), max_fevals=4)  # doctest: +SKIP
        >>> print(report.table())  # doctest: +SKIP
    """
    from .kt import tune as _tune

    return _tune(recurrence, **kwargs)


__all__ = ["store", "tune"]
