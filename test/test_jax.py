"""JAX: jax.grad of our ops against jax.grad of lax.scan implementations, inside jit and vmap."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is an optional extra: pip install 'scanweaver[jax]'")

import jax.numpy as jnp  # noqa: E402

import scanweaver  # noqa: E402
import scanweaver.jax as swj  # noqa: E402


@scanweaver.recurrence
def gated(h, delta, A, x):
    g = np.exp(delta * A)
    return g * h + (1 - g) * x


@scanweaver.recurrence(state_size=2)
def biquad(h, a1, a2, b0, x):
    return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])


def scan_ref(a, u, c=None, h0=None, reset=None, reverse=False):
    """h_t = a_t h_{t-1} + u_t with lax.scan over the last axis; returns (y, h_last)."""
    if reset is not None:
        a = jnp.where(reset, 0.0, a)
    h0 = jnp.zeros(a.shape[:-1], a.dtype) if h0 is None else h0

    def step(h, au):
        h = au[0] * h + au[1]
        return h, h

    h_last, hs = jax.lax.scan(step, h0, (jnp.moveaxis(a, -1, 0), jnp.moveaxis(u, -1, 0)), reverse=reverse)
    hs = jnp.moveaxis(hs, 0, -1)
    return (hs if c is None else c * hs), h_last


def _ops(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.uniform(0.5, 1.0, shape), jnp.float32),
            *(jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(3)))


def _close(got, want, tol=2e-5):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


@pytest.mark.parametrize("feature", ["plain", "h0", "reverse", "reset", "all"])
def test_grad_matches_lax_scan_under_jit(feature):
    a, b, x, c = _ops((2, 3, 33))
    rng = np.random.default_rng(1)
    h0 = jnp.asarray(rng.standard_normal((2, 3)), jnp.float32) if feature in ("h0", "all") else None
    reset = jnp.asarray(rng.random((2, 3, 33)) < 0.1) if feature in ("reset", "all") else None
    reverse = feature in ("reverse", "all")
    w = jnp.asarray(rng.standard_normal((2, 3)), jnp.float32)

    def ours(a, b, x, c, h0):
        y, h = swj.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=reverse, return_state=True)
        return jnp.sum(y * y) + jnp.sum(w * h)

    def ref(a, b, x, c, h0):
        y, h = scan_ref(a, b * x, c, h0, reset, reverse)
        return jnp.sum(y * y) + jnp.sum(w * h)

    argnums = (0, 1, 2, 3, 4) if h0 is not None else (0, 1, 2, 3)
    got = jax.jit(jax.value_and_grad(ours, argnums))(a, b, x, c, h0)
    want = jax.jit(jax.value_and_grad(ref, argnums))(a, b, x, c, h0)
    _close(got, want, 1e-4)


def test_vmap_of_grad_and_of_forward():
    a, b, x, c = _ops((4, 3, 17), seed=2)

    def loss(a, b, x, c):
        return jnp.sum(swj.selective_scan(a, b, x, c) ** 2)

    def loss_ref(a, b, x, c):
        return jnp.sum(scan_ref(a, b * x, c)[0] ** 2)

    _close(jax.vmap(jax.grad(loss, (0, 3)))(a, b, x, c), jax.vmap(jax.grad(loss_ref, (0, 3)))(a, b, x, c), 1e-4)
    _close(jax.jit(jax.vmap(lambda a: swj.selective_scan(a, b[0], x[0], c[0])))(a),
           jax.vmap(lambda a: scan_ref(a, b[0] * x[0], c[0])[0])(a))


def test_expression_gates_and_dense_transitions():
    rng = np.random.default_rng(4)
    shape = (3, 21)
    delta = jnp.asarray(rng.uniform(0.05, 0.5, shape), jnp.float32)
    A = jnp.asarray(-rng.uniform(0.5, 2.0, shape), jnp.float32)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    g = jnp.exp(delta * A)
    got = jax.jit(jax.grad(lambda d, A, x: jnp.sum(gated.jax(d, A, x) ** 2), (0, 1, 2)))(delta, A, x)
    want = jax.grad(lambda d, A, x: jnp.sum(scan_ref(jnp.exp(d * A), (1 - jnp.exp(d * A)) * x)[0] ** 2),
                    (0, 1, 2))(delta, A, x)
    assert g.shape == shape
    _close(got, want, 1e-4)

    a1, a2 = (jnp.asarray(rng.uniform(lo, hi, shape), jnp.float32) for lo, hi in ((0.3, 0.6), (-0.3, 0.3)))

    def dense_ref(a1, a2, x):
        def step(h, v):
            n0 = v[0] * h[0] + v[1] * h[1] + v[2]
            return jnp.stack([n0, h[0]]), n0
        _, ys = jax.lax.scan(step, jnp.zeros((2, shape[0])), (a1.T, a2.T, x.T))
        return ys.T

    got = jax.jit(jax.grad(lambda *t: jnp.sum(swj.apply(biquad, *t, jnp.ones(shape)) ** 2), (0, 1, 2)))(a1, a2, x)
    want = jax.grad(lambda a1, a2, x: jnp.sum(dense_ref(a1, a2, x) ** 2), (0, 1, 2))(a1, a2, x)
    _close(got, want, 1e-4)


def test_float64_with_x64():
    with jax.enable_x64(True):
        a, b, x, c = (v.astype(jnp.float64) for v in _ops((2, 40), seed=5))
        got = jax.grad(lambda a: jnp.sum(swj.selective_scan(a, b, x, c, states="save") ** 2))(a)
        want = jax.grad(lambda a: jnp.sum(scan_ref(a, b * x, c)[0] ** 2))(a)
        assert got.dtype == jnp.float64
        _close(got, want, 1e-10)


def test_plain_api_takes_jax_arrays_under_jit():
    a, b, x, c = _ops((2, 3, 25), seed=9)
    y = scanweaver.selective_scan(a, b, x, c)
    assert isinstance(y, jax.Array)
    _close(y, scan_ref(a, b * x, c)[0])
    g = jax.jit(jax.grad(lambda a: jnp.sum(scanweaver.selective_scan(a, b, x, c) ** 2)))(a)
    _close(g, jax.grad(lambda a: jnp.sum(scan_ref(a, b * x, c)[0] ** 2))(a), 1e-4)
    torch = pytest.importorskip("torch", reason="mixing needs PyTorch installed")
    with pytest.raises(scanweaver.ScanInputError, match="mix PyTorch tensors and JAX arrays"):
        scanweaver.selective_scan(a, torch.ones(2, 3, 25), x)


def test_vmap_of_the_named_operations_runs_them_per_element():
    """The named operations check their inputs' dimensions, so a vmapped call hands them one element at a time
    (before, the callback got the batch axis too and the call was refused for a 5-D q the caller never passed)."""
    rng = np.random.default_rng(11)
    E, B, T, H, K = 3, 1, 5, 2, 3
    q = jnp.asarray(rng.standard_normal((E, B, T, H, K)), jnp.float32)
    g = jnp.asarray(-rng.uniform(0.1, 1, (B, T, H)), jnp.float32)  # shared: not batched
    beta = jnp.asarray(rng.uniform(0, 1, (E, B, T, H)), jnp.float32)

    def loss(q, beta):
        o, S = swj.gated_delta_rule(q, q, q, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
        return jnp.sum(o ** 2) + jnp.sum(S)

    got = jax.jit(jax.vmap(jax.value_and_grad(loss, (0, 1))))(q, beta)
    want = [jax.value_and_grad(loss, (0, 1))(q[i], beta[i]) for i in range(E)]
    _close(got, jax.tree.map(lambda *xs: jnp.stack(xs), *want), 1e-5)
    o = jax.vmap(lambda q: swj.linear_attention(q, q, q, g_head=g)[0])(q)
    _close(o, jnp.stack([swj.linear_attention(q[i], q[i], q[i], g_head=g)[0] for i in range(E)]))


def test_a_second_derivative_is_refused_by_name():
    """jax.grad of jax.grad raises ScanWeaver's message, not JAX's about callbacks and JVP."""
    a, b, x, c = _ops((2, 9), seed=12)
    grad = jax.grad(lambda a: jnp.sum(swj.selective_scan(a, b, x, c) ** 2))
    assert grad(a).shape == a.shape
    with pytest.raises(scanweaver.ScanWeaverError, match="second derivatives are not supported"):
        jax.grad(lambda a: jnp.sum(grad(a)))(a)


def test_a_traced_scale_is_refused_as_one_known_when_the_call_is_made():
    q = jnp.ones((1, 3, 1, 2), jnp.float32)
    g, beta = -jnp.ones((1, 3, 1), jnp.float32), jnp.ones((1, 3, 1), jnp.float32)
    with pytest.raises(scanweaver.ScanInputError, match=r"^gated_delta_rule: scale must be a real number or None, "
                                                        r"known when the call is made \(not traced"):
        jax.jit(lambda q, s: swj.gated_delta_rule(q, q, q, g, beta, scale=s)[0])(q, 0.5)
    got = jax.jit(lambda q: swj.gated_delta_rule(q, q, q, g, beta, scale=0.5)[0])(q)  # a Python number is fine
    assert got.shape == q.shape
