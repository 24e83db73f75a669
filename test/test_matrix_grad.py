"""Gradients of the matrix-state operations: torch gradcheck (float64) of every differentiable argument,
torch.compile, jax.grad under jit against jax.grad of a lax.scan definition, and the decode steps."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver

torch = pytest.importorskip("torch")
swt = pytest.importorskip("scanweaver.torch")

RNG = np.random.default_rng(7)


def _t(a, grad=True):
    return torch.tensor(np.asarray(a), dtype=torch.float64, requires_grad=grad)


def _check(fn, inputs):
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["g", "g_head", "decay"])
def test_linear_attention_gradcheck(kind):
    B, T, H, Hq, K, V = 1, 5, 2, 1, 3, 2
    q, k = (_t(RNG.normal(size=(B, T, Hq, K))) for _ in range(2))
    v = _t(RNG.normal(size=(B, T, H, V)))
    gshape = {"g": (B, T, H, K), "g_head": (B, T, H), "decay": (H,)}[kind]
    g = _t(-RNG.uniform(0.05, 1.5, gshape))
    h0 = _t(RNG.normal(size=(B, H, K, V)))

    def fn(q, k, v, g, h0):
        o, h = swt.linear_attention(q, k, v, **{kind: g}, initial_state=h0, output_final_state=True, scale=0.6)
        return o, h

    _check(fn, (q, k, v, g, h0))


def test_linear_attention_gradcheck_packed_reverse():
    cu = [0, 2, 5]
    q, k, g = (_t(RNG.normal(size=(1, 5, 2, 3))) for _ in range(3))
    v, h0 = _t(RNG.normal(size=(1, 5, 2, 2))), _t(RNG.normal(size=(2, 2, 3, 2)))

    def fn(q, k, v, g, h0):
        return swt.linear_attention(q, k, v, g=-torch.nn.functional.softplus(g), initial_state=h0,
                                    output_final_state=True, cu_seqlens=cu, reverse=True)

    _check(fn, (q, k, v, g, h0))


def test_rwkv6_gradcheck():
    r, k = (_t(RNG.normal(size=(1, 4, 2, 3))) for _ in range(2))
    v, w = _t(RNG.normal(size=(1, 4, 2, 2))), _t(-RNG.uniform(0.05, 1.5, (1, 4, 2, 3)))
    u, h0 = _t(RNG.normal(size=(2, 3))), _t(RNG.normal(size=(1, 2, 3, 2)))
    _check(lambda *a: swt.rwkv6(*a[:5], initial_state=a[5], output_final_state=True), (r, k, v, w, u, h0))


@pytest.mark.parametrize("D_shape", [(2,), (2, 3)])
def test_mamba2_gradcheck(D_shape):
    b, L, H, P, G, N = 1, 5, 2, 3, 1, 2
    x, z = _t(RNG.normal(size=(b, L, H, P))), _t(RNG.normal(size=(b, L, H, P)))
    dt = _t(RNG.normal(size=(b, L, H)))
    A, bias = _t(-RNG.uniform(0.5, 1.5, H)), _t(RNG.normal(size=H))
    B, C = _t(RNG.normal(size=(b, L, G, N))), _t(RNG.normal(size=(b, L, G, N)))
    D, h0 = _t(RNG.normal(size=D_shape)), _t(RNG.normal(size=(b, H, P, N)))

    def fn(x, dt, A, B, C, D, z, bias, h0):
        return swt.mamba2_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, dt_limit=(0.2, 1.2),
                               initial_states=h0, return_final_states=True)

    _check(fn, (x, dt, A, B, C, D, z, bias, h0))


def test_ported_calls_gradcheck():
    """simple_gla (g and g_gamma), retention and state_v_first (cotangents of the V-first final state too)."""
    B, T, H, K, V = 1, 5, 2, 3, 2
    q, k = (_t(RNG.normal(size=(B, T, H, K))) for _ in range(2))
    v, h0 = _t(RNG.normal(size=(B, T, H, V))), _t(RNG.normal(size=(B, H, K, V)))
    g, g_gamma = _t(-RNG.uniform(0.05, 1.5, (B, T, H))), _t(-RNG.uniform(0.05, 1.5, H))
    _check(lambda q, k, v, g, h0: scanweaver.simple_gla(q, k, v, g, None, 0.8, h0, True), (q, k, v, g, h0))
    _check(lambda q, k, v, g, h0: scanweaver.simple_gla(q, k, v, None, g, None, h0, True), (q, k, v, g_gamma, h0))
    _check(lambda q, k, v, h0: scanweaver.retention(q, k, v, None, h0, True), (q, k, v, h0))
    gk, hv = _t(-RNG.uniform(0.05, 1.5, (B, T, H, K))), _t(RNG.normal(size=(B, H, V, K)))
    _check(lambda q, k, v, g, h0: scanweaver.linear_attention(q, k, v, g, None, h0, True, True), (q, k, v, gk, hv))


def test_mamba2_seq_idx_and_varlen_gradcheck():
    b, L, H, P, G, N = 2, 6, 2, 2, 1, 2
    x, dt = _t(RNG.normal(size=(b, L, H, P))), _t(RNG.normal(size=(b, L, H)))
    A, bias = _t(-RNG.uniform(0.5, 1.5, H)), _t(RNG.normal(size=H))
    B, C = _t(RNG.normal(size=(b, L, G, N))), _t(RNG.normal(size=(b, L, G, N)))
    D, h0 = _t(RNG.normal(size=H)), _t(RNG.normal(size=(b, H, P, N)))
    seq = torch.tensor([[0, 0, 1, 1, 1, 2], [4, 4, 4, 4, 0, 0]])

    def fn(x, dt, A, B, C, D, bias, h0):
        return scanweaver.mamba2_scan(x, dt, A, B, C, 64, D, None, bias, h0, seq, None, True, return_final_states=True)

    _check(fn, (x, dt, A, B, C, D, bias, h0))
    cu = [0, 2, 2, 6]

    def varlen(x, dt, A, B, C, h0):
        return scanweaver.mamba2_scan(x, dt, A, B, C, None, None, None, None, h0, seq[:1], cu,
                                      return_final_states=True, return_varlen_states=True)

    h0s = _t(RNG.normal(size=(3, H, P, N)))
    _check(varlen, (x[:1].detach().requires_grad_(), dt[:1].detach().requires_grad_(), A,
                    B[:1].detach().requires_grad_(), C[:1].detach().requires_grad_(), h0s))


def test_mamba2_clamp_stops_the_gradient():
    b, L, H, P, N = 1, 4, 2, 2, 3
    dt = _t(np.full((b, L, H), 5.0))  # softplus(5) ~ 5.007, clamped to 1.0: no gradient
    x, B, C = _t(RNG.normal(size=(b, L, H, P)), False), *(_t(RNG.normal(size=(b, L, 1, N)), False) for _ in "BC")
    y = swt.mamba2_scan(x, dt, _t(-np.ones(H), False), B, C, dt_softplus=True, dt_limit=(0.0, 1.0))
    y.sum().backward()
    assert torch.count_nonzero(dt.grad) == 0


def test_public_call_on_tensors_and_torch_compile():
    q, k, v = (torch.randn(1, 9, 2, 4) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(1, 9, 2, 4)).requires_grad_()
    o, _ = scanweaver.linear_attention(q, k, v, g=g)  # tensors go to scanweaver.torch
    assert isinstance(o, torch.Tensor)
    o.square().sum().backward()
    want = g.grad.clone()
    g.grad = None

    @torch.compile(fullgraph=True, backend="aot_eager")
    def loss(q, k, v, g):
        return swt.linear_attention(q, k, v, g=g)[0].square().sum()

    loss(q, k, v, g).backward()
    torch.testing.assert_close(g.grad, want)


def test_torch_steps_are_differentiable():
    S = torch.randn(2, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    x, dt = torch.randn(2, 2, 4, dtype=torch.float64), torch.randn(2, 2, dtype=torch.float64)
    A = -torch.rand(2, dtype=torch.float64)
    B, C = torch.randn(2, 1, 3, dtype=torch.float64), torch.randn(2, 1, 3, dtype=torch.float64)
    S = torch.randn(2, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    y, S1 = scanweaver.mamba2_step(S, x, dt, A, B, C, dt_softplus=True)
    (y.sum() + S1.sum()).backward()
    assert S.grad.shape == S.shape


# --- JAX ----------------------------------------------------------------------------------------------------------

def _jax():
    return pytest.importorskip("jax")  # float32 (x64 stays off: it is process-wide)


def _f32(a):
    import jax.numpy as jnp

    return jnp.asarray(a, dtype=jnp.float32)


def _la_scan(jnp, jax, q, k, v, g, h0, scale):
    """GLA as a lax.scan over t (the definition jax.grad differentiates)."""
    def step(S, xs):
        qt, kt, vt, gt = xs
        S = jnp.exp(gt)[..., None] * S + kt[..., :, None] * vt[..., None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", qt, S)

    sw = lambda a: jnp.swapaxes(a, 0, 1)  # noqa: E731
    S, o = jax.lax.scan(step, h0, (sw(q), sw(k), sw(v), sw(g)))
    return sw(o), S


def test_jax_linear_attention_grad_under_jit():
    jax = _jax()
    import jax.numpy as jnp
    import scanweaver.jax as swj

    B, T, H, K, V = 2, 7, 2, 3, 4
    q, k, g = (_f32(RNG.normal(size=(B, T, H, K))) for _ in range(3))
    g = -jax.nn.softplus(g)
    v, h0 = _f32(RNG.normal(size=(B, T, H, V))), _f32(RNG.normal(size=(B, H, K, V)))
    w = _f32(RNG.normal(size=(B, T, H, V)))

    def ours(q, k, v, g, h0):
        o, h = swj.linear_attention(q, k, v, g=g, initial_state=h0, output_final_state=True)
        return (o * w).sum() + (h ** 2).sum()

    def ref(q, k, v, g, h0):
        o, h = _la_scan(jnp, jax, q, k, v, g, h0, K ** -0.5)
        return (o * w).sum() + (h ** 2).sum()

    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3, 4)))(q, k, v, g, h0)
    want = jax.jit(jax.grad(ref, argnums=(0, 1, 2, 3, 4)))(q, k, v, g, h0)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)


def test_jax_mamba2_grad_under_jit():
    jax = _jax()
    import jax.numpy as jnp
    import scanweaver.jax as swj

    b, L, H, P, G, N = 1, 6, 2, 3, 1, 4
    x, z = (_f32(RNG.normal(size=(b, L, H, P))) for _ in range(2))
    dt, A = _f32(RNG.normal(size=(b, L, H))), _f32(-RNG.uniform(0.5, 2, H))
    B, C = (_f32(RNG.normal(size=(b, L, G, N))) for _ in range(2))
    D, bias = _f32(RNG.normal(size=H)), _f32(RNG.normal(size=H))

    def ours(x, dt, A, B, C, D, z, bias):
        return (swj.mamba2_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True) ** 2).sum()

    def ref(x, dt, A, B, C, D, z, bias):
        d = jax.nn.softplus(dt + bias)

        def step(S, xs):
            xt, dtt, Bt, Ct = xs
            S = jnp.exp(dtt * A)[..., None, None] * S + (dtt[..., None] * xt)[..., None] * Bt[:, :, None, :]
            return S, jnp.einsum("bhpn,bhn->bhp", S, jnp.broadcast_to(Ct, (b, H, N)))

        sw = lambda a: jnp.swapaxes(a, 0, 1)  # noqa: E731
        _, y = jax.lax.scan(step, jnp.zeros((b, H, P, N)), (sw(x), sw(d), sw(B), sw(C)))
        y = sw(y) + D[:, None] * x
        return ((y * jax.nn.silu(z)) ** 2).sum()

    args = (x, dt, A, B, C, D, z, bias)
    got = jax.jit(jax.grad(ours, argnums=tuple(range(8))))(*args)
    want = jax.jit(jax.grad(ref, argnums=tuple(range(8))))(*args)
    for a, b_ in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=2e-4, atol=2e-4)


def test_jax_ported_calls_grad_under_jit():
    """scanweaver.jax.simple_gla / retention (decays from the options) against jax.grad of a lax.scan definition."""
    jax = _jax()
    import jax.numpy as jnp
    import scanweaver.jax as swj

    B, T, H, K, V = 1, 6, 3, 2, 3
    q, k = (_f32(RNG.normal(size=(B, T, H, K))) for _ in range(2))
    v, w = (_f32(RNG.normal(size=(B, T, H, V))) for _ in range(2))
    h0 = _f32(RNG.normal(size=(B, H, K, V)))
    g_gamma = _f32(-RNG.uniform(0.05, 1, H))
    retnet = jnp.log(1 - 2.0 ** (-5.0 - jnp.arange(H, dtype=jnp.float32)))
    full = lambda g: jnp.broadcast_to(g[None, None, :, None], (B, T, H, K))  # noqa: E731

    def loss(o, h):
        return (o * w).sum() + (h ** 2).sum()

    cases = [(lambda q, k, v, g, h0: loss(*swj.simple_gla(q, k, v, None, g, None, h0, True)),
              lambda q, k, v, g, h0: loss(*_la_scan(jnp, jax, q, k, v, full(g), h0, K ** -0.5))),
             (lambda q, k, v, g, h0: loss(*swj.retention(q, k, v, None, h0, True)) + 0 * g.sum(),
              lambda q, k, v, g, h0: loss(*_la_scan(jnp, jax, q, k, v, full(retnet), h0, K ** -0.5)) + 0 * g.sum())]
    for ours, ref in cases:
        got = jax.jit(jax.grad(ours, argnums=(0, 1, 2, 3, 4)))(q, k, v, g_gamma, h0)
        want = jax.jit(jax.grad(ref, argnums=(0, 1, 2, 3, 4)))(q, k, v, g_gamma, h0)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)


def test_float32_gradients_at_2048_against_autograd_through_the_peers():
    """L = 2048, float32: our gradients against autograd through fla's naive_recurrent_gla and mamba-ssm's
    ssd_minimal_discrete; the largest error relative to each gradient's largest entry is printed and bounded."""
    import matrix_peers as peers

    gla, ref = peers.fla("gla/naive"), peers.mamba_ref()
    if gla is None:
        pytest.skip(peers.FLA_WHY)
    T, H, K, V = 2048, 2, 8, 8
    rng = np.random.default_rng(3)
    gen = torch.Generator().manual_seed(3)  # every input seeded: the bounds below hold for these inputs

    def f32(shape, scale=1.0, req=True):
        return torch.tensor(rng.normal(size=shape) * scale, dtype=torch.float32, requires_grad=req)

    q, k, v = f32((1, T, H, K)), f32((1, T, H, K)), f32((1, T, H, V))
    g = (-torch.rand(1, T, H, K, generator=gen) * 0.2).requires_grad_()
    w = torch.randn(1, T, H, V, generator=gen)
    errors = {}

    def compare(name, ours, theirs, inputs):
        got = torch.autograd.grad((ours * w).sum(), inputs)
        want = torch.autograd.grad((theirs * w).sum(), inputs)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            errors[f"{name}.{i}"] = float((a - b).abs().max() / b.abs().max())

    compare("gla", swt.linear_attention(q, k, v, g=g)[0], gla.naive_recurrent_gla(q, k, v, g)[0], (q, k, v, g))
    if ref is not None:
        P, N = V, K
        x, B, C = f32((1, T, H, P)), f32((1, T, H, N), 0.3), f32((1, T, H, N), 0.3)
        dt = (torch.rand(1, T, H, generator=gen) * 0.1 + 0.01).requires_grad_()
        A = (-torch.rand(H, generator=gen) - 0.5).requires_grad_()
        Bg, Cg = B[:, :, :1], C[:, :, :1]
        ours = swt.mamba2_scan(x, dt, A, Bg, Cg)
        theirs = ref["ssd_minimal_discrete"](x * dt[..., None], A * dt, Bg.expand(-1, -1, H, -1),
                                             Cg.expand(-1, -1, H, -1), 64)[0]
        compare("mamba2", ours, theirs, (x, dt, A, Bg, Cg))
    print("relative gradient errors at L = 2048:", {k: f"{v:.1e}" for k, v in errors.items()})
    # The decays' gradients (gla.3: g; mamba2.1, mamba2.2: dt, A) are running sums over T of products of the
    # state and its adjoint (the C kernels take them as reverse sums of q.dq - k.dk): float32 rounding grows
    # with T there, about 2e-5 at T = 2048; every other gradient stays near 1e-6.
    decays = {"gla.3", "mamba2.1", "mamba2.2"}
    assert max(v for k, v in errors.items() if k not in decays) < 1e-5, errors
    assert max(v for k, v in errors.items() if k in decays) < 1e-4, errors
