"""Filters as dense recurrences: coefficients passed as scalars or one per lane (kept un-materialised),
the striped ``chunked`` kernel on few long lanes, and scipy.signal.lfilter as the reference."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.arrays import prepare
from scanweaver.runtime import REGISTRY


@scanweaver.recurrence(state_size=2)
def biquad(h, b0, b1, b2, a1, a2, x):
    """Direct form II transposed: y = b0 x + z1; z1' = b1 x - a1 y + z2; z2' = b2 x - a2 y."""
    y = b0 * x + h[0]
    return (b1 * x - a1 * y + h[1], b2 * x - a2 * y), y


@scanweaver.recurrence(state_size=3)
def gated(h, p, x):
    """A 3-state recurrence whose matrix uses functions of an operand: the element-by-element path."""
    g = scanweaver.sigmoid(p)
    return (g * h[0] + 0.1 * h[2] + x, 0.5 * h[0] + np.exp(-np.abs(p)) * h[1], 0.3 * h[1] - 0.2 * h[2]), h[1]


def cpu():
    avail = REGISTRY["cpu"].availability()
    if not avail.ok:
        pytest.skip(f"backend 'cpu' unavailable: {avail.reason}")


def filters(rng, lanes):
    """Stable random biquads, one per lane: (b0, b1, b2, a1, a2) each of shape (lanes, 1)."""
    r, theta = rng.uniform(0.5, 0.95, lanes), rng.uniform(0.1, 3.0, lanes)
    a1, a2 = -2 * r * np.cos(theta), r ** 2
    return [*(rng.standard_normal(lanes)[:, None] for _ in range(3)), a1[:, None], a2[:, None]]


def direct(coef, x, h0=None, reverse=False):
    """The biquad run one lane and step at a time in float64."""
    lanes, L = x.shape
    full = [np.broadcast_to(c, x.shape) for c in coef]
    y = np.empty(x.shape)
    z = np.zeros((lanes, 2)) if h0 is None else h0.astype(np.float64).copy()
    for t in (range(L - 1, -1, -1) if reverse else range(L)):
        b0, b1, b2, a1, a2 = (c[:, t] for c in full)
        y[:, t] = b0 * x[:, t] + z[:, 0]
        z = np.stack([b1 * x[:, t] - a1 * y[:, t] + z[:, 1], b2 * x[:, t] - a2 * y[:, t]], axis=1)
    return y, z


def test_scalars_and_per_lane_operands_stay_small():
    x = np.ones((4, 1000))
    arrays = prepare("t", {"a": 0.5, "b": np.arange(4.0)[:, None], "x": x}, broadcast=True, keep_broadcast=True)
    assert arrays.layouts == {"a": "scalar", "b": "lane"}
    assert arrays.inputs["a"].shape == (4, 1000) and arrays.inputs["a"].strides == (0, 0)
    assert arrays.inputs["b"].strides[1] == 0 and arrays.inputs["b"].base.size == 4
    assert np.shares_memory(arrays.inputs["x"], x)
    full = arrays.materialised()
    assert full.layouts == {} and all(v.flags.c_contiguous and v.shape == (4, 1000) for v in full.inputs.values())
    np.testing.assert_array_equal(full.inputs["b"][:, 7], np.arange(4.0))
    assert prepare("t", {"a": 0.5, "x": x}, broadcast=True).layouts == {}  # materialised unless asked


def test_python_numbers_take_the_dtype_of_the_arrays(rng):
    cpu()
    x = rng.standard_normal((2, 500)).astype(np.float32)
    y = biquad(0.2, 0.3, 0.1, -1.6, 0.81, x, backend="cpu")
    assert y.dtype == np.float32 and biquad.last.stages.affine.dtype == "float32"
    assert biquad(np.float64(0.2), 0.3, 0.1, -1.6, 0.81, x, backend="cpu").dtype == np.float64
    want = biquad(*(np.full(x.shape, v, np.float32) for v in (0.2, 0.3, 0.1, -1.6, 0.81)), x, backend="numpy")
    np.testing.assert_allclose(y, want, rtol=2e-4, atol=2e-4 * float(np.abs(want).max()))


def test_scalar_operands_are_explained_where_they_cannot_be():
    with pytest.raises(ScanInputError, match="b0 is a scalar; at least one operand needs layout"):
        biquad(0.1, 0.2, 0.3, 0.4, 0.5, 1.0)
    with pytest.raises(ScanInputError, match="a is a scalar; operands need layout"):
        scanweaver.selective_scan(0.5, np.ones((2, 8)), np.ones((2, 8)))


@pytest.mark.parametrize("backend", ["numpy", "cpu", "opencl"])
def test_coefficients_as_scalars_and_per_lane(rng, backend):
    avail = REGISTRY[backend].availability()
    if not avail.ok:
        pytest.skip(f"backend {backend!r} unavailable: {avail.reason}")
    x = rng.standard_normal((3, 300))
    coef = filters(rng, 3)
    h0 = rng.standard_normal((3, 2))
    want, z = direct(coef, x, h0)
    y, zl = biquad(*coef, x, h0=h0, return_state=True, backend=backend)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(zl, z, rtol=1e-10, atol=1e-10)
    one = [float(c[0, 0]) for c in coef]
    want, _ = direct([np.full((3, 1), c) for c in one], x)
    np.testing.assert_allclose(biquad(*one, x, backend=backend), want, rtol=1e-10, atol=1e-10)
    if backend == "cpu":
        assert dict(biquad.last.stages.affine.features.operands) == dict.fromkeys(("b0", "b1", "b2", "a1", "a2"),
                                                                                  "scalar")


@pytest.mark.parametrize("dtype,tol,reverse", [("float64", 1e-10, False), ("float64", 1e-10, True),
                                               ("float32", 2e-4, True)])
@pytest.mark.parametrize("lanes,L,threads,chunk", [(1, 20011, 2, 256), (1, 5003, 1, 512), (3, 4099, 2, 64),
                                                    (4, 3001, 2, 300), (2, 5, 2, 64)])
def test_striped_chunked_kernel_matches_the_loop(rng, dtype, tol, reverse, lanes, L, threads, chunk):
    """Tiles of many stripes, split over two threads (one or three lanes), lanes over threads (four),
    partial tiles, and fewer positions than one vector (L = 5)."""
    cpu()
    x = rng.standard_normal((lanes, L))
    coef = filters(rng, lanes)
    h0 = rng.standard_normal((lanes, 2))
    want, z = direct(coef, x.astype(dtype).astype(np.float64), h0.astype(dtype), reverse)
    cast = [c.astype(dtype) for c in coef]
    for layout in ("lane", "full"):
        ops = cast if layout == "lane" else [np.ascontiguousarray(np.broadcast_to(c, x.shape)) for c in cast]
        y, zl = biquad(*ops, x.astype(dtype), h0=h0.astype(dtype), reverse=reverse, return_state=True,
                       backend="cpu", schedule="chunked", threads=threads, chunk=chunk)
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(y, want, rtol=tol, atol=tol * scale, err_msg=layout)
        np.testing.assert_allclose(zl, z, rtol=tol, atol=tol * scale, err_msg=layout)


def test_resets_and_functions_in_the_striped_kernel(rng):
    """A varying matrix with resets (vector path, reset mask) and with functions (element-by-element path)."""
    cpu()
    L = 6007
    x, p = rng.standard_normal((2, L)), rng.standard_normal((2, L))
    reset = rng.random((2, L)) < 0.01
    for rec, ops in ((gated, (p, x)), (biquad, (*filters(rng, 2)[:3], p * 0.3, p * 0.1, x))):
        want = rec(*ops, reset=reset, reverse=True, backend="numpy")
        got = rec(*ops, reset=reset, reverse=True, backend="cpu", schedule="chunked", threads=2, chunk=256)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("k", [4, 6])
def test_larger_filters_with_constant_and_varying_matrices(rng, k):
    """Companion-form filters of order k: A from scalars (one matrix power per stripe) or per element."""
    cpu()
    from scanweaver.tools.golden import dense_operands, dense_recurrence

    L = 3001
    poles = rng.uniform(0.3, 0.8, k) * np.exp(1j * rng.uniform(0.2, 2.5, k))
    a = -np.real(np.poly(np.concatenate([poles[: k // 2], poles[: k // 2].conj()])))[1:]
    A = np.zeros((1, L, k, k))
    A[..., 0, :] = a
    A[..., np.arange(1, k), np.arange(k - 1)] = 1.0
    b = np.zeros((1, L, k))
    b[..., 0] = 1.0
    inputs = {"a": A, "b": b, "x": rng.standard_normal((1, L)), "c": np.broadcast_to(np.eye(k)[0], (1, L, k))}
    ops = dense_operands(inputs)
    rec = scanweaver.api.Recurrence(dense_recurrence(k).step, name=f"companion{k}", state_size=k)
    want = rec(**{n: np.ascontiguousarray(v) for n, v in ops.items()}, backend="numpy")
    scalars = {n: (float(v[0, 0]) if n[0] in "abc" else v) for n, v in ops.items()}
    for given in (scalars, {n: np.ascontiguousarray(v) for n, v in ops.items()}):
        got = rec(**given, backend="cpu", schedule="chunked", threads=2, chunk=512)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(want).max())))


def test_biquad_matches_scipy_lfilter(rng):
    signal = pytest.importorskip("scipy.signal", reason="scipy is not installed (pip install scipy)")
    cpu()
    x = rng.standard_normal((2, 50001))
    for coef in filters(rng, 2), filters(rng, 2):
        b, a = [float(c[0, 0]) for c in coef[:3]], [1.0, float(coef[3][0, 0]), float(coef[4][0, 0])]
        want = signal.lfilter(b, a, x, axis=-1)
        got = biquad(*b, *a[1:], x, backend="cpu")
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * float(np.abs(want).max()))
