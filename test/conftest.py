"""Shared fixtures: an isolated per-test-session cache directory, random operands, the backends."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

# Every compiled kernel and tuned store of the test run goes to a fresh directory.
os.environ.setdefault("SCANWEAVER_CACHE_DIR", tempfile.mkdtemp(prefix="scanweaver-test-cache-"))
# A shared store named in the environment must not receive (or serve) the tests' tuned entries.
os.environ.pop("SCANWEAVER_TUNED", None)


@pytest.fixture
def rng():
    """A seeded generator: non-uniform data, reproducible failures."""
    return np.random.default_rng(1234)


def make_operands(rng, shape, dtype=np.float64, with_c=True):
    """Bounded gates a in (0.5, 1) and standard-normal b, x, c."""
    ops = {
        "a": rng.uniform(0.5, 1.0, shape).astype(dtype),
        "b": rng.standard_normal(shape).astype(dtype),
        "x": rng.standard_normal(shape).astype(dtype),
    }
    if with_c:
        ops["c"] = rng.standard_normal(shape).astype(dtype)
    return ops


def loop_reference(a, b, x, c=None, h0=None, reset=None, reverse=False):
    """The selective scan written as the plainest possible float64 loop."""
    a, b, x = (np.asarray(v, np.float64) for v in (a, b, x))
    L = a.shape[-1]
    h = np.zeros(a.shape[:-1]) if h0 is None else np.asarray(h0, np.float64).copy()
    y = np.empty(a.shape)
    order = range(L - 1, -1, -1) if reverse else range(L)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs propagate on purpose
        for t in order:
            at = a[..., t] if reset is None else np.where(reset[..., t], 0.0, a[..., t])
            h = at * h + b[..., t] * x[..., t]
            y[..., t] = h if c is None else np.asarray(c, np.float64)[..., t] * h
    return y, h


@pytest.fixture(scope="session")
def cpu():
    """The ``cpu`` backend (emitted C), or a skip naming why it is unavailable (no C compiler)."""
    from scanweaver.runtime import get_backend

    be = get_backend("cpu")
    if not be.availability().ok:
        pytest.skip(f"cpu backend unavailable: {be.availability().reason}")
    return be


#: The backend the GPU kernels' tests run on: ``opencl`` (PoCL here, the same kernel text as CUDA); a GPU machine
#: sets ``SCANWEAVER_TEST_GPU_BACKEND=cuda`` to run the same tests on the device (``bench/gpu_session.py``).
GPU_TEST_BACKEND = os.environ.get("SCANWEAVER_TEST_GPU_BACKEND", "opencl")


def gpu_backend():
    """The GPU kernels' test backend (:data:`GPU_TEST_BACKEND`), or a skip naming why it cannot run here."""
    from scanweaver.runtime import REGISTRY, get_backend

    cls = REGISTRY.get(GPU_TEST_BACKEND)
    if not cls.availability().ok:
        pytest.skip(f"backend {GPU_TEST_BACKEND!r} unavailable: {cls.availability().reason}")
    return get_backend(GPU_TEST_BACKEND)


@pytest.fixture(scope="session")
def gpu():
    """:func:`gpu_backend` as a fixture."""
    return gpu_backend()


def no_wider(got, rec, what):
    """Each of ``got``'s gradients non-finite only where ``rec``'s is, and equal to it (float64 rounding) elsewhere."""
    for n, want in rec.items():
        fin = np.isfinite(want)
        wider = fin & ~np.isfinite(got[n])
        assert not wider.any(), f"{what}: {n} non-finite at {np.argwhere(wider).tolist()[:4]}, the recurrence's not"
        scale = float(np.abs(want[fin]).max()) if fin.any() else 0.0
        np.testing.assert_allclose(got[n][fin], want[fin], rtol=1e-9, atol=1e-12 * scale,
                                   err_msg=f"{what}: {n}")
