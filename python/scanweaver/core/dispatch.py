"""Which backend a call runs on, and whether it can: the checks every entry point shares.

:func:`pick_backend` resolves ``backend=`` (``auto``: the best available
backend for the dtype and transition kind); :func:`check_dtype`,
:func:`check_kind` and :func:`check_out` raise :class:`ScanInputError`
naming what the backend runs and which backends would.

Example:
    >>> from scanweaver.core.dispatch import pick_backend
    >>> pick_backend("numpy").name
    'numpy'
"""

from __future__ import annotations

import warnings

import numpy as np

from ..arrays import check_overlap
from ..errors import BackendUnavailable, ScanInputError
from ..runtime import REGISTRY, Backend, device_arrays, get_backend
from ..schedules import get_schedule

_warned: set[str] = set()


def pick_backend(name: str, dtype: str | None = None, kind: str = "diagonal") -> Backend:
    """Resolves ``backend=`` to an instance; ``auto`` takes the best available one.

    ``auto`` falls back to ``numpy`` with one warning that says why the
    preferred backend (``cpu``) cannot run.  With ``dtype``, ``auto`` only
    considers backends that list it in ``Backend.dtypes``.
    """
    if name != "auto":
        return get_backend(name)
    ranked = sorted((c for c in REGISTRY.values() if c.auto_priority >= 0 and (dtype is None or dtype in c.dtypes)
                     and kind in c.kinds), key=lambda c: -c.auto_priority)
    skipped: list[tuple[str, str]] = []
    for cls in ranked:
        avail = cls.availability()
        if avail.ok:
            if skipped and cls.name == "numpy" and "numpy" not in _warned:
                _warned.add("numpy")
                why = "; ".join(f"{n}: {r}" for n, r in skipped)
                warnings.warn(f"scanweaver: falling back to the numpy backend ({why})", RuntimeWarning, stacklevel=3)
            return get_backend(cls.name)
        if cls.name == "cpu":
            skipped.append((cls.name, avail.reason))
    raise BackendUnavailable("backend 'auto': no backend is available")


def check_dtype(api: str, be: Backend, dtype: str) -> None:
    """Raises :class:`ScanInputError` when backend ``be`` cannot accumulate in ``dtype``."""
    if dtype in be.dtypes:
        return
    others = sorted(n for n, c in REGISTRY.items() if dtype in c.dtypes)
    ready = [n for n in others if REGISTRY[n].availability().ok]
    fix = f"use backend={(ready or others)[0]!r} (backends with {dtype}: {', '.join(others)})" if others else \
        "no backend supports it"
    raise ScanInputError(
        f"{api}: backend {be.name!r} does not support dtype {dtype} (it runs {', '.join(be.dtypes)}); {fix}"
    )


def check_out(api: str, out: object, shape: tuple[int, ...], arrays, given: dict[str, object] | None = None) \
        -> np.ndarray | None:
    """Validates ``out=``; returns the ``(lanes, L)`` view a backend may write into, or ``None``
    when ``y`` must be computed aside and copied in (half-precision results, an unaligned ``out``).

    ``given`` names the caller's own arguments (operands, ``h0``, ``reset``): ``out`` must overlap none
    of them, nor the prepared arrays."""
    if given:
        check_overlap(api, out, given)
    if device_arrays.on_device(arrays):
        return device_arrays.check_out(api, out, shape, arrays)
    want = np.dtype(arrays.out_dtype or arrays.dtype)
    if not isinstance(out, np.ndarray) or not all(isinstance(a, np.ndarray) for a in arrays.inputs.values()):
        raise ScanInputError(f"{api}: out must be a NumPy array, and is for NumPy operands; got "
                             f"{type(out).__name__}")
    if out.shape != shape or out.dtype != want:
        raise ScanInputError(f"{api}: out has shape {out.shape} and dtype {out.dtype}; it needs shape {shape} "
                             f"and dtype {want}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ScanInputError(f"{api}: out must be C-contiguous and writeable")
    check_overlap(api, out, {**{f"operand {n}": a for n, a in arrays.inputs.items()}, "h0": arrays.h0,
                             "reset": arrays.reset})
    direct = want == arrays.dtype and out.flags.aligned  # else y is computed aside and copied in
    return out.reshape(arrays.lanes, arrays.L) if direct else None


def check_kind(api: str, be: Backend, kind: str) -> None:
    """Raises :class:`ScanInputError` when backend ``be`` cannot run ``kind`` transitions."""
    if kind in be.kinds:
        return
    others = sorted(n for n, c in REGISTRY.items() if kind in c.kinds)
    raise ScanInputError(f"{api}: backend {be.name!r} does not run {kind} transitions; "
                         f"backends that do: {', '.join(others)}")


def _tuned(backend: Backend, rec, dtype: str, lanes: int, L: int):
    """The stored tuned (schedule, config) for this problem, or ``None``."""
    try:
        from ..tuning import store
    except ImportError:
        return None
    return store.lookup(backend=backend.name, device=backend.availability().device,
                        signature=rec.signature(dtype), dtype=dtype, lanes=lanes, L=L)


def resolve(rec, be: Backend, schedule: str, config, tunables: dict, dtype: str, lanes: int, L: int):
    """``(schedule, config, source)`` a call of ``rec`` on ``be`` runs: the caller's, the tuned store's
    (``source == "tuned"``), else the backend's documented defaults."""
    api = rec.name
    if schedule != "auto":
        get_schedule(schedule)
        if schedule not in be.schedules:
            raise ScanInputError(
                f"{api}: schedule {schedule!r} is not supported by backend {be.name!r}; "
                f"it supports {', '.join(be.schedules)}"
            )
    source = "explicit" if tunables else "default"
    cfg: dict = {}
    if isinstance(config, dict):
        cfg, source = dict(config), "explicit"
    elif config == "auto" and not tunables and be.availability().ok:
        hit = _tuned(be, rec, dtype, lanes, L)
        if hit is not None and (schedule == "auto" or hit[0] == schedule):
            schedule, cfg, source = hit[0], dict(hit[1]), "tuned"
    elif config not in ("auto", "default"):
        raise ScanInputError(f"{api}: config must be 'auto', 'default' or a dict, got {config!r}")
    if schedule == "auto":
        schedule = be.default_schedule_for(rec.kind, lanes, L, tunables=tunables)
    if source == "default" or source == "explicit":
        cfg = {**be.default_config(schedule, lanes, L, dtype), **cfg, **tunables}
    cfg.pop("schedule", None)
    bad = next((k for k, v in cfg.items() if not _hashable(v)), None)
    if bad is not None:  # e.g. chunk=[64]: the tunable's own rule explains, else say what a tunable is
        from ..passes.materialize_schedule import resolve_config

        resolve_config(schedule, cfg, rec.name, be.extra_tunables)
        raise ScanInputError(f"{rec.name}: tunable {bad}={cfg[bad]!r} must be a number, a boolean or a string")
    return schedule, cfg, source


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True
