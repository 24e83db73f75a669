"""Gates written with NumPy functions of the inputs (comparisons, np.where, np.clip, abs), and clear errors for
what a step cannot do (float(), math.*, conditions on the state)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import NotAffineError, ScanWeaverError
from scanweaver.runtime import REGISTRY


def _loop(g, x):
    h = np.zeros(g.shape[0])
    ys = []
    for t in range(g.shape[1]):
        a = np.minimum(np.maximum(g[:, t], 0.0), 0.99)
        b = np.where(x[:, t] > 0, x[:, t], 0.1 * x[:, t])
        h = a * h + np.maximum(b, -0.5) + np.abs(g[:, t]) * (x[:, t] <= 0.3)
        ys.append(h)
    return np.stack(ys, -1)


@scanweaver.recurrence
def gated(h, g, x):
    a = np.clip(g, 0.0, 0.99)
    b = np.where(x > 0, x, 0.1 * x)
    return a * h + np.maximum(b, -0.5) + abs(g) * (x <= 0.3)


@pytest.mark.parametrize("backend", ["numpy", "cpu", "opencl"])
def test_comparisons_where_clip_and_abs_of_inputs_are_gates(rng, backend):
    if not REGISTRY.get(backend).availability().ok:
        pytest.skip(f"backend {backend} is not available here: {REGISTRY.get(backend).availability().reason}")
    g, x = rng.uniform(-1, 2, (3, 77)), rng.normal(size=(3, 77))
    x[0, :5] = 0.3  # ties of the comparisons
    np.testing.assert_allclose(gated(g, x, backend=backend), _loop(g, x), rtol=1e-12, atol=1e-12)


def test_the_gates_have_gradients(rng):
    torch = pytest.importorskip("torch")
    g = torch.tensor(rng.uniform(-1, 2, (2, 19)), requires_grad=True)
    x = torch.tensor(rng.normal(size=(2, 19)) + 0.05, requires_grad=True)
    assert torch.autograd.gradcheck(lambda g_, x_: gated(g_, x_), (g, x))


def test_nan_conditions_follow_numpy(rng):
    g, x = rng.uniform(0, 1, (1, 6)), rng.normal(size=(1, 6))
    x[0, 2] = np.nan

    @scanweaver.recurrence
    def step(h, g, x):
        return g * h + np.where(x != x, 7.0, 1.0)

    def loop(be):
        return step(g, x, backend=be)

    want = np.zeros(6)
    h = 0.0
    for t in range(6):
        h = g[0, t] * h + (7.0 if np.isnan(x[0, t]) else 1.0)
        want[t] = h
    np.testing.assert_allclose(loop("numpy")[0], want)
    np.testing.assert_allclose(loop("cpu")[0], want)


@pytest.mark.parametrize("step,error,text", [
    (lambda h, a: math.exp(a) * h, ScanWeaverError, "use NumPy functions"),
    (lambda h, a: float(a) * h, ScanWeaverError, "float()"),
    (lambda h, a: abs(h) * a, NotAffineError, "abs(h)"),
    (lambda h, a: a * math.exp(h), NotAffineError, "of the state"),
    (lambda h, a: a * h if h > 0 else h, NotAffineError, "h > 0"),
    (lambda h, a: np.where(h > 0, a, 0.0) + h, NotAffineError, "h > 0"),
])
def test_what_a_step_cannot_do_is_named(step, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        scanweaver.recurrence(step)


def test_dask_apply_broadcasts_scalar_operands(rng):
    da = pytest.importorskip("dask.array")
    import scanweaver.dask

    d = rng.uniform(0, 1, (4, 70))
    x = rng.normal(size=(4, 70))

    @scanweaver.recurrence
    def ema(h, delta, A, x):
        g = np.exp(delta * A)
        return g * h + (1 - g) * x

    y = scanweaver.dask.apply(ema, da.from_array(d, chunks=(2, 30)), -1.0, da.from_array(x, chunks=(2, 30)),
                              backend="numpy")
    np.testing.assert_allclose(y.compute(), ema(d, -1.0, x, backend="numpy"), rtol=1e-12)
