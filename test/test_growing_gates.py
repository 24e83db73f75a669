"""Growing transitions (|a| > 1) whose products over a block overflow while the state stays finite.

A block's aggregate (A, U) applied to its carry h is A*h + U; when the product A overflows to inf and the
carry is exactly zero (no input yet), inf * 0 would be NaN and spread to every later output.  Every chained
scan applies carries through one guard (``sw_carry`` in the C-family kernels, ``Diagonal.carry`` in the
reference interpreter), and the C split path scans a tile again from a carry that is not zero when its product
overflowed.  Each answer is checked against a float64 loop of the recurrence.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.runtime import REGISTRY


def _backend(name: str):
    cls = REGISTRY.get(name, None)
    if cls is None or not cls.availability().ok:
        pytest.skip(f"backend {name!r} unavailable: {cls.availability().reason if cls else 'not registered'}")
    return cls


def _loop(a, b, x, c, reset=None):
    """h_t = a_t h_{t-1} + b_t x_t (h = 0 at a reset before the step), y_t = c_t h_t, in float64."""
    a, b, x, c = (v.astype(np.float64) for v in (a, b, x, c))
    h, y = np.zeros(a.shape[0]), np.empty(a.shape)
    for t in range(a.shape[1]):
        at = a[:, t] if reset is None else np.where(reset[:, t], 0.0, a[:, t])
        h = at * h + b[:, t] * x[:, t]
        y[:, t] = c[:, t] * h
    return y


def _late_inputs(lanes: int, L: int, quiet: int, growth: float = 1.05):
    """a = growth everywhere, inputs only after ``quiet`` steps (the answer near 1e21 at L = 4096)."""
    rng = np.random.default_rng(L + lanes)
    a = np.full((lanes, L), growth, np.float32)
    b, x = np.zeros((lanes, L), np.float32), np.zeros((lanes, L), np.float32)
    b[:, quiet:] = rng.uniform(0.5, 1.5, (lanes, L - quiet))
    x[:, quiet:] = rng.standard_normal((lanes, L - quiet))
    c = rng.uniform(0.5, 1.5, (lanes, L)).astype(np.float32)
    return a, b, x, c


def _check(y, want):
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all(), f"{int((~np.isfinite(y)).sum())} of {y.size} outputs not finite"
    err = np.abs(y - want).max() / np.abs(want).max()
    assert err < 1e-3, err


#: Two threads on the CPU, so that one lane is split into tiles (the chained carries).
THREADS = {"cpu": {"threads": 2}}


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("backend", ["numpy", "cpu", "opencl"])
def test_every_schedule_on_zero_carries_of_overflowed_products(backend, lanes):
    cls = _backend(backend)
    a, b, x, c = _late_inputs(lanes, 4096, 3096)
    want = _loop(a, b, x, c)
    assert np.isfinite(want).all() and np.abs(want).max() > 1e20
    for schedule in ("auto", *cls.schedules):
        _check(scanweaver.selective_scan(a, b, x, c, backend=backend, schedule=schedule,
                                         **THREADS.get(backend, {})), want)


@pytest.mark.parametrize("backend", ["numpy", "cpu", "opencl"])
def test_a_reset_before_an_overflowed_product(backend):
    """A reset (A = 0) composed with a product that overflowed is a zero product, not inf * 0."""
    cls = _backend(backend)
    a, b, x, c = _late_inputs(1, 4096, 3096)
    b[:, :5], x[:, :5] = 1.0, 1e-30  # a tiny start that grows to about 50 by the reset
    reset = np.zeros(a.shape, bool)
    reset[:, 1500] = True
    want = _loop(a, b, x, c, reset)
    for schedule in ("auto", *cls.schedules):
        _check(scanweaver.selective_scan(a, b, x, c, reset=reset, backend=backend, schedule=schedule,
                                         **THREADS.get(backend, {})), want)


@pytest.mark.parametrize("chunk", [256, 2048])
def test_cpu_split_tiles_rescan_a_nonzero_carry_of_an_overflowed_product(chunk):
    """One lane over two threads: a tile whose product overflows, entered with a tiny carry that is not zero,
    takes its carry-out from its own scan (1e-38 * 1.05^3599 is about 2e38, finite in float32)."""
    _backend("cpu")
    L = 3600
    a = np.full((1, L), 1.05, np.float32)
    b, x = np.zeros((1, L), np.float32), np.zeros((1, L), np.float32)
    b[0, 0], x[0, 0] = 1.0, 1e-38
    c = np.ones((1, L), np.float32)
    want = _loop(a, b, x, c)
    y = scanweaver.selective_scan(a, b, x, c, backend="cpu", schedule="chunked", chunk=chunk, threads=2)
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all()
    assert np.max(np.abs(y - want) / want) < 1e-3


def test_cpu_split_tiles_on_zero_carries_of_overflowed_products():
    """The issue's case on the C backend's split layout: one long lane's tiles chained over two threads."""
    _backend("cpu")
    a, b, x, c = _late_inputs(1, 65536, 64536)
    want = _loop(a, b, x, c)
    for chunk in (1024, 8192):
        _check(scanweaver.selective_scan(a, b, x, c, backend="cpu", schedule="chunked", chunk=chunk, threads=2), want)


@scanweaver.recurrence(state_size=2)
def biquad(h, a1, a2, b0, x):
    """y_t = a1 y_{t-1} + a2 y_{t-2} + b0 x_t in companion form (dense 2 x 2 transitions)."""
    return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])


@pytest.mark.parametrize("lanes", [1, 4])
def test_dense_chunked_on_zero_carries_of_overflowed_products(lanes):
    """The dense chunked forms (stripes and split tiles) apply carries with the zero entries left out."""
    _backend("cpu")
    L, rng = 20000, np.random.default_rng(lanes)
    a1 = rng.uniform(1.04, 1.06, (lanes, L)).astype(np.float32)
    a2 = rng.uniform(-0.01, 0.01, (lanes, L)).astype(np.float32)
    b0, x = np.zeros((lanes, L), np.float32), np.zeros((lanes, L), np.float32)
    b0[:, -900:], x[:, -900:] = 1.0, rng.standard_normal((lanes, 900))
    h, want = np.zeros((lanes, 2)), np.empty((lanes, L))
    for t in range(L):
        h = np.stack([a1[:, t] * h[:, 0] + a2[:, t] * h[:, 1] + b0[:, t] * x[:, t], h[:, 0]], axis=1)
        want[:, t] = h[:, 0]
    assert np.isfinite(want).all() and np.abs(want).max() > 1e15
    for threads in (1, 2):
        _check(biquad(a1, a2, b0, x, backend="cpu", schedule="chunked", threads=threads), want)
