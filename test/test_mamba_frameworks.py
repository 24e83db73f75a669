"""The fused Mamba-1 scan in PyTorch and JAX: gradcheck in float64, float32 against autograd through a plain
loop, every B/C layout and option, torch.compile, jax.jit/grad, and the public call returning the caller's type."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install 'scanweaver[torch]'")

import scanweaver  # noqa: E402
import scanweaver.torch as swt  # noqa: E402
from scanweaver.runtime import REGISTRY  # noqa: E402

BACKENDS = [b for b in ("cpu", "numpy") if REGISTRY[b].availability().ok]
SHAPES = {"step": lambda b, g, d, n, L: (b, n, L), "group": lambda b, g, d, n, L: (b, g, n, L),
          "fixed": lambda b, g, d, n, L: (d, n)}


def torch_loop(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, h0=None, cu_seqlens=None):
    """Mamba-1 as a plain PyTorch loop over t (autograd differentiates it); ``(y, h_last)``."""
    batch, dim, L = u.shape
    dt = delta if delta_bias is None else delta + delta_bias[:, None]
    if delta_softplus:
        dt = torch.nn.functional.softplus(dt)
    starts = set() if cu_seqlens is None else set(list(cu_seqlens)[1:-1])

    def at(M, t):
        if M.dim() == 2:
            return M[None]
        M = M if M.dim() == 4 else M[:, None]
        return M[:, :, :, t].repeat_interleave(dim // M.shape[1], dim=1)

    h = torch.zeros(batch, dim, A.shape[1], dtype=u.dtype) if h0 is None else h0
    ys = []
    for t in range(L):
        a = torch.exp(dt[:, :, t, None] * A)
        if t in starts:
            a = torch.zeros_like(a)
        h = a * h + (dt[:, :, t] * u[:, :, t])[..., None] * at(B, t)
        ys.append((at(C, t) * h).sum(-1))
    y = torch.stack(ys, -1)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * torch.nn.functional.silu(z)
    return y, h


def leaves(rng, batch, dim, N, L, bshape, cshape, dtype=torch.float64, extras=True, groups=2):
    def t(v):
        return torch.tensor(v, dtype=dtype, requires_grad=True)

    ins = {"u": t(rng.standard_normal((batch, dim, L))), "delta": t(rng.uniform(-1, 1, (batch, dim, L))),
           "A": t(-rng.uniform(0.3, 2.0, (dim, N))),
           "B": t(rng.standard_normal(SHAPES[bshape](batch, groups, dim, N, L))),
           "C": t(rng.standard_normal(SHAPES[cshape](batch, groups, dim, N, L)))}
    if extras:
        ins.update(D=t(rng.standard_normal(dim)), z=t(rng.standard_normal((batch, dim, L))),
                   delta_bias=t(rng.uniform(-0.5, 0.5, dim)), h0=t(rng.standard_normal((batch, dim, N))))
    return ins


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bshape, cshape, extras", [("step", "step", True), ("group", "fixed", True),
                                                    ("fixed", "group", False), ("step", "step", False)])
def test_gradcheck_float64(backend, bshape, cshape, extras):
    rng = np.random.default_rng(5)
    ins = leaves(rng, 2, 4, 3, 7, bshape, cshape, extras=extras)
    names = list(ins)
    cu = [0, 3, 7] if extras else None
    tunables = {"chunk": 16} if backend == "cpu" else {}  # tiles of 16 steps: the 7 steps are one partial tile

    def f(*args):
        y, h = swt.mamba_selective_scan(**dict(zip(names, args, strict=True)), delta_softplus=True,
                                        return_state=True, cu_seqlens=cu, backend=backend, **tunables)
        return y, h

    assert torch.autograd.gradcheck(f, tuple(ins.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64_without_softplus(backend):
    """delta used as given (no softplus, no delta_bias): its gradient skips the softplus derivative."""
    rng = np.random.default_rng(8)
    ins = leaves(rng, 2, 4, 3, 7, "step", "fixed", extras=True)
    ins.pop("delta_bias")
    with torch.no_grad():
        ins["delta"].copy_(ins["delta"].abs() + 0.05)  # positive steps, as softplus would give
    names = list(ins)

    def f(*args):
        return swt.mamba_selective_scan(**dict(zip(names, args, strict=True)), delta_softplus=False,
                                        return_state=True, backend=backend)

    assert torch.autograd.gradcheck(f, tuple(ins.values()), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_float32_matches_autograd_through_a_loop():
    """float32 gradients against PyTorch autograd through the plain loop, in float32 and (the truth) float64:
    ours stay within 2e-4 of the truth, about the float32 loop's own error."""
    rng = np.random.default_rng(7)
    batch, dim, N, L = 2, 24, 16, 300
    ins = leaves(rng, batch, dim, N, L, "step", "step", dtype=torch.float32)
    loop32 = {k: v.detach().clone().requires_grad_(True) for k, v in ins.items()}
    loop64 = {k: v.detach().double().requires_grad_(True) for k, v in ins.items()}
    dy = torch.randn(batch, dim, L, dtype=torch.float64)
    y, h = swt.mamba_selective_scan(**ins, delta_softplus=True, return_state=True)
    assert y.dtype == torch.float32
    for (yy, hh) in ((y, h), torch_loop(**loop32, delta_softplus=True), torch_loop(**loop64, delta_softplus=True)):
        ((yy.double() * dy).sum() + hh.double().sum()).backward()
    ey = torch_loop(**{k: v.detach() for k, v in loop64.items()}, delta_softplus=True)[0]
    assert float((y.detach().double() - ey).abs().max() / ey.abs().max()) < 1e-5
    for k in ins:
        truth = loop64[k].grad
        ours = float((ins[k].grad.double() - truth).abs().max() / truth.abs().max())
        theirs = float((loop32[k].grad.double() - truth).abs().max() / truth.abs().max())
        assert ours < max(2e-4, 4 * theirs), f"{k}: ours {ours:.2e}, the float32 loop {theirs:.2e}"


def test_compiles_with_torch_compile_and_trains():
    rng = np.random.default_rng(9)
    ins = leaves(rng, 1, 8, 4, 33, "step", "step", dtype=torch.float32, extras=False)

    def loss(u, delta, A, B, C):
        return swt.mamba_selective_scan(u, delta, A, B, C, delta_softplus=True).square().mean()

    compiled = torch.compile(loss, fullgraph=True)
    eager = loss(*ins.values())
    got = compiled(*ins.values())
    assert torch.allclose(eager, got)
    got.backward()
    assert all(v.grad is not None and torch.isfinite(v.grad).all() for v in ins.values())


def test_public_call_takes_tensors_and_returns_tensors():
    rng = np.random.default_rng(3)
    ins = leaves(rng, 1, 4, 3, 11, "step", "step", extras=False)
    y = scanweaver.mamba_selective_scan(**ins, delta_softplus=True)
    assert isinstance(y, torch.Tensor) and y.requires_grad
    y.sum().backward()
    assert ins["A"].grad.shape == (4, 3)
    ref = scanweaver.mamba_selective_scan(**{k: v.detach().numpy() for k, v in ins.items()}, delta_softplus=True)
    np.testing.assert_allclose(y.detach().numpy(), ref, rtol=1e-12)


def test_jax_grad_matches_a_lax_scan_under_jit():
    jax = pytest.importorskip("jax", reason="JAX is an optional extra: pip install 'scanweaver[jax]'")
    with jax.enable_x64(True):
        _jax_check(jax)


def _jax_check(jax):
    import jax.numpy as jnp

    import scanweaver.jax as swj

    rng = np.random.default_rng(4)
    batch, dim, N, L, G = 2, 6, 3, 17, 3
    u, delta, z = (jnp.asarray(rng.standard_normal((batch, dim, L))) for _ in range(3))
    A = jnp.asarray(-rng.uniform(0.3, 2, (dim, N)))
    B = jnp.asarray(rng.standard_normal((batch, G, N, L)))
    C = jnp.asarray(rng.standard_normal((dim, N)))
    D, bias = jnp.asarray(rng.standard_normal(dim)), jnp.asarray(rng.uniform(-0.5, 0.5, dim))

    h0 = jnp.asarray(rng.standard_normal((batch, dim, N)))

    def ref(u, delta, A, B, C, D, z, bias, h0, gate=True):
        dt = jax.nn.softplus(delta + bias[:, None])
        Bd = jnp.repeat(B, dim // G, axis=1)  # (batch, dim, N, L)

        def step(h, t):
            h = jnp.exp(dt[:, :, t, None] * A) * h + (dt[:, :, t] * u[:, :, t])[..., None] * Bd[..., t]
            return h, (C[None] * h).sum(-1)

        h, ys = jax.lax.scan(step, h0, jnp.arange(L))
        y = jnp.moveaxis(ys, 0, -1) + D[:, None] * u
        return (y * jax.nn.silu(z) if gate else y), h

    def ours(u, delta, A, B, C, D, z, bias, h0):
        return swj.mamba_selective_scan(u, delta, A, B, C, D, z, bias, True, True, h0=h0)

    def loss(f):  # every output term: y weighted, and the final state
        return lambda *a: (f(*a)[0] * w).sum() + (f(*a)[1] * v).sum()

    args = (u, delta, A, B, C, D, z, bias, h0)
    argnums = tuple(range(len(args)))
    w = jnp.asarray(rng.standard_normal((batch, dim, L)))
    v = jnp.asarray(rng.standard_normal((batch, dim, N)))
    g_ours = jax.jit(jax.grad(loss(ours), argnums=argnums))(*args)
    g_ref = jax.grad(loss(ref), argnums=argnums)(*args)
    for i, (a, b) in enumerate(zip(g_ours, g_ref, strict=True)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-9, err_msg=f"arg {argnums[i]}")
    y = scanweaver.mamba_selective_scan(*args[:5], D=D, delta_bias=bias, delta_softplus=True)
    assert isinstance(y, jax.Array)
    want = ref(*args[:6], z, bias, jnp.zeros((batch, dim, N)), gate=False)[0]
    np.testing.assert_allclose(np.asarray(y), np.asarray(want), rtol=1e-10, atol=1e-10)
