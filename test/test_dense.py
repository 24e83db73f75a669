"""Dense k x k transitions: a vector state through every stage and every backend here."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.runtime import REGISTRY



def _available(name):
    avail = REGISTRY[name].availability()
    if not avail.ok:
        pytest.skip(f"backend {name!r} unavailable: {avail.reason}")


@scanweaver.recurrence(state_size=2)
def biquad(h, a1, a2, b0, x):
    """A second-order IIR section in companion form: y_t = a1 y_{t-1} + a2 y_{t-2} + b0 x_t."""
    return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])


@scanweaver.recurrence(state_size=3)
def mixed(h, c, s, x, w):
    """A damped rotation of (h0, h1), h2 integrates h0; the output reads the new and the old state."""
    M = np.array([[c, -s, 0.0], [s, c, 0.0], [1.0, 0.0, 0.9]], dtype=object)
    hn = M @ h + np.array([x, 0.0, 0.0], dtype=object)
    return hn, w * hn[0] + hn[2] - 0.5 * h[1]


def loop(A, U, h0, reset=None, reverse=False, out=None):
    """h_t = A_t h_{t-1} + U_t per lane in float64 (A: (lanes, L, k, k), U: (lanes, L, k))."""
    lanes, L, k = U.shape
    h = h0.copy()
    hs = np.empty((lanes, L, k))
    prev = np.empty((lanes, L, k))
    for t in (range(L - 1, -1, -1) if reverse else range(L)):
        a = A[:, t] if reset is None else np.where(reset[:, t, None, None], 0.0, A[:, t])
        prev[:, t] = h
        h = np.einsum("lij,lj->li", a, h) + U[:, t]
        hs[:, t] = h
    return hs, prev, h


def biquad_case(rng, lanes, L):
    ops = [rng.uniform(0.3, 0.6, (lanes, L)), rng.uniform(-0.3, 0.3, (lanes, L)),
           rng.standard_normal((lanes, L)), rng.standard_normal((lanes, L))]
    A = np.zeros((lanes, L, 2, 2))
    A[..., 0, 0], A[..., 0, 1], A[..., 1, 0] = ops[0], ops[1], 1.0
    U = np.zeros((lanes, L, 2))
    U[..., 0] = ops[2] * ops[3]
    return ops, A, U


def test_biquad_lowers_to_a_companion_matrix():
    text = str(biquad.lower(backend="numpy", schedule="chunked"))
    assert "kind=dense state=2" in text
    assert "A = [[a1, a2], [1, 0]]" in text
    assert "combine((A2, U2), (A1, U1)) = (A2 @ A1, A2 @ U1 + U2)" in text


CASES = [("numpy", "sequential", {}), ("numpy", "chunked", {"chunk": 7}), ("numpy", "blelloch", {"workgroup_size": 4}),
         ("numpy", "reduce_then_scan", {}), ("cpu", "sequential", {}), ("cpu", "chunked", {"chunk": 16}),
         ("cpu", "chunked", {}), ("opencl", "sequential", {})]


@pytest.mark.parametrize("backend, schedule, cfg", CASES)
@pytest.mark.parametrize("L", [1, 37, 130])
def test_biquad_matches_the_loop(rng, backend, schedule, cfg, L):
    _available(backend)
    ops, A, U = biquad_case(rng, 5, L)
    h0 = rng.standard_normal((5, 2))
    reset = rng.random((5, L)) < 0.1
    for reverse in (False, True):
        hs, _, h_last = loop(A, U, h0, reset, reverse)
        y, hl = biquad(*ops, h0=h0, reset=reset, reverse=reverse, return_state=True, backend=backend,
                       schedule=schedule, **cfg)
        np.testing.assert_allclose(y, hs[..., 0], rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(hl, h_last, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("backend", ["numpy", "cpu", "opencl"])
def test_output_of_new_and_old_state_float32(rng, backend):
    _available(backend)
    lanes, L = 3, 200
    th = rng.uniform(0, 0.3, (lanes, L))
    r = rng.uniform(0.8, 0.99, (lanes, L))
    c, s = r * np.cos(th), r * np.sin(th)
    x, w = rng.standard_normal((lanes, L)), rng.standard_normal((lanes, L))
    A = np.zeros((lanes, L, 3, 3))
    A[..., 0, 0], A[..., 0, 1], A[..., 1, 0], A[..., 1, 1] = c, -s, s, c
    A[..., 2, 0], A[..., 2, 2] = 1.0, 0.9
    U = np.zeros((lanes, L, 3))
    U[..., 0] = x
    hs, prev, _ = loop(A, U, np.zeros((lanes, 3)))
    expect = w * hs[..., 0] + hs[..., 2] - 0.5 * prev[..., 1]
    f32 = [v.astype(np.float32) for v in (c, s, x, w)]
    y = mixed(*f32, backend=backend)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, expect, rtol=2e-4, atol=2e-4 * np.abs(expect).max())


def test_split_scan_with_carried_state_equals_the_whole(rng):
    ops, _, _ = biquad_case(rng, 4, 90)
    whole = biquad(*ops, backend="cpu" if REGISTRY["cpu"].availability().ok else "numpy")
    y1, h = biquad(*(o[:, :40] for o in ops), return_state=True, backend="numpy")
    y2 = biquad(*(o[:, 40:] for o in ops), h0=h, backend="numpy")
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), whole, rtol=1e-12, atol=1e-12)


def test_dense_errors_are_explained(rng):
    ops, _, _ = biquad_case(rng, 2, 10)
    with pytest.raises(ScanInputError, match=r"h0 has shape \(2,\); it needs .*state size 2: \(2, 2\)"):
        biquad(*ops, h0=np.zeros(2), backend="numpy")
    with pytest.raises(ScanInputError, match="'hybrid' does not support dense"):
        biquad(*ops, backend="numpy", schedule="hybrid")
    with pytest.raises(ScanInputError, match="state_size must be an int from 1 to 64"):
        scanweaver.recurrence(lambda h, a: h, state_size=65)
    with pytest.raises(scanweaver.ScanWeaverError, match="sequence of 2 components"):
        scanweaver.recurrence(lambda h, a: a * h[0], state_size=2)


def test_large_states_run_on_numpy_and_are_refused_by_compiled_targets(rng):
    k = 9

    @scanweaver.recurrence(state_size=k)
    def shift(h, a, x):
        return [a * h[0] + x] + [h[j - 1] for j in range(1, k)]

    a, x = rng.uniform(0.5, 0.9, (2, 30)), rng.standard_normal((2, 30))
    y = shift(a, x, backend="numpy")
    h = np.zeros(2)
    for t in range(30):
        h = a[:, t] * h + x[:, t]
        np.testing.assert_allclose(y[:, t], h, rtol=1e-12)
    if REGISTRY["cpu"].availability().ok:
        with pytest.raises(ValueError, match="dense state of size 9 exceeds 8"):
            shift(a, x, backend="cpu")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_dense_cuda_kernel_compiles(tmp_path):
    from scanweaver.targets.gpu import emit_source

    src = emit_source(biquad.lower(backend="cuda", schedule="sequential"), "cuda")
    path = tmp_path / "dense.cu"
    path.write_text(src)
    out = subprocess.run(["nvcc", "-ptx", str(path), "-o", str(tmp_path / "dense.ptx")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
