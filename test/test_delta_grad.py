"""Gradients of the public delta-rule operations through ``scanweaver.torch`` and ``scanweaver.jax``:
torch.autograd.gradcheck in float64 of every differentiable argument (the initial state and through the final
state, through the in-kernel l2 normalisation); gradients at lengths that straddle the backward's checkpoints
against autograd through a float64 PyTorch loop of each recurrence (``delta_family.torch_loop``); fla 0.6's naive
references through the public call with fla's positional arguments, outputs and autograd gradients; float32
gradients at T = 2048 against autograd through fla's naive references (errors printed and bounded);
torch.compile(fullgraph=True); jax.grad under jit against jax.grad of a lax.scan written here."""

from __future__ import annotations

import numpy as np
import pytest
from delta_family import PUBLIC, call_public, problem, torch_loop

import scanweaver
from scanweaver.runtime import REGISTRY

torch = pytest.importorskip("torch")
swt = pytest.importorskip("scanweaver.torch")

OPS = tuple(PUBLIC)
#: The fused operation's names of each public operation's array arguments, in fla's positional order.
ARGS = {"delta_rule": ("q", "k", "v", "beta"), "gated_delta_rule": ("q", "k", "v", "g", "beta"),
        "kda": ("q", "k", "v", "g", "beta"), "rwkv7": ("q", "g", "k", "v", "a", "b")}


def _leaves(a, dtype=torch.float64):
    return {n: torch.tensor(np.asarray(x, np.float64), dtype=dtype, requires_grad=True) for n, x in a.items()
            if n not in ("cu_seqlens", "dhlast")}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_gradcheck_every_argument(op, packed):
    rng = np.random.default_rng(21)
    l2norm = op != "rwkv7"
    kw = {"seqlens": (2, 0, 3)} if packed else {"batch": 1, "T": 5}
    _, a, _ = problem(rng, PUBLIC[op], H=2, Hq=1, K=3, V=2, l2norm=l2norm, **kw)
    leaves = _leaves(a)
    names = [*ARGS[op], "h0"]

    def fn(*xs):
        t = {**dict(zip(names, xs, strict=True)), "cu_seqlens": a.get("cu_seqlens")}
        return call_public(swt.__dict__[op], op, t, 0.6, l2norm)

    assert torch.autograd.gradcheck(fn, tuple(leaves[n] for n in names), eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradcheck_through_beta_logits_and_the_v_first_state():
    rng = np.random.default_rng(22)
    _, a, _ = problem(rng, "kda", batch=1, T=4, H=2, Hq=1, K=3, V=2)
    t = _leaves({**a, "beta": rng.normal(size=a["beta"].shape), "h0": np.swapaxes(a["h0"], -1, -2)})

    def fn(q, k, v, g, beta, h0):
        return swt.kda(q, k, v, g, beta, 0.5, h0, True, True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True,
                       state_v_first=True)

    assert torch.autograd.gradcheck(fn, tuple(t[n] for n in ("q", "k", "v", "g", "beta", "h0")), eps=1e-6,
                                    atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 7, 8, 9, 17])
@pytest.mark.parametrize("op", OPS)
def test_gradients_straddling_the_checkpoints_match_autograd_of_the_loop(op, T):
    if not REGISTRY.get("cpu").availability().ok:
        pytest.skip(f"cpu backend unavailable: {REGISTRY.get('cpu').availability().reason}")
    rng = np.random.default_rng(T)
    l2norm = op != "rwkv7"
    _, a, _ = problem(rng, PUBLIC[op], batch=2, T=T, H=4, Hq=2, K=5, V=3, l2norm=l2norm, lo=-4.0, hi=-1e-3)
    w_o, w_h = rng.normal(size=(2, T, 4, 3)), rng.normal(size=(2, 4, 5, 3))
    want_t = _leaves(a)
    o, h = torch_loop(PUBLIC[op], want_t, 0.8, l2norm)
    ((o * torch.tensor(w_o)).sum() + (h * torch.tensor(w_h)).sum()).backward()
    for checkpoint in (4, 8):
        got_t = _leaves(a)
        o, h = call_public(swt.__dict__[op], op, got_t, 0.8, l2norm, backend="cpu", checkpoint=checkpoint)
        ((o * torch.tensor(w_o)).sum() + (h * torch.tensor(w_h)).sum()).backward()
        for n, leaf in got_t.items():
            np.testing.assert_allclose(leaf.grad.numpy(), want_t[n].grad.numpy(), rtol=1e-9, atol=1e-11,
                                       err_msg=f"{n}, checkpoint {checkpoint}")


# ---- flash-linear-attention's naive references --------------------------------------------------------------------


def fla_naive(op, t, scale):
    """fla 0.6's naive reference of ``op`` on tensors ``t`` (the fused operation's names), fla's positional order:
    ``(o, final state)``."""
    import matrix_peers as peers

    mod = peers.fla({"delta_rule": "delta_rule/naive", "gated_delta_rule": "gated_delta_rule/naive",
                     "kda": "kda/naive", "rwkv7": "generalized_delta_rule/dplr/naive"}[op])
    if mod is None:
        pytest.skip(peers.FLA_WHY)
    if op == "gated_delta_rule":
        return mod.naive_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], t["beta"], t["g"], scale, t["h0"], True)
    if op == "kda":
        return mod.naive_recurrent_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], scale, t["h0"], True)
    bh = {n: x.transpose(1, 2) for n, x in t.items() if n != "h0"}  # (B, H, T, ...) and the scale K**-0.5 built in
    if op == "delta_rule":
        o, h = mod.delta_rule_recurrence(bh["q"], bh["k"], bh["v"], bh["beta"], t["h0"], True)
    else:
        o, h = mod.dplr_recurrence(bh["q"], bh["k"], bh["v"], bh["a"], bh["b"], bh["g"], t["h0"], True)
    return o.transpose(1, 2), h


@pytest.fixture
def one_thread():
    """PyTorch on one thread: fla's naive references launch thousands of tiny ops, which two threads on a busy
    machine ran 12x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _against_fla(op, T, K, V, seed):
    """``{name: (ours, fla's)}`` of o, the final state and the gradient of every leaf, float32, the public call
    with fla's positional arguments on one side and fla's naive reference on the other (scale K**-0.5)."""
    rng = np.random.default_rng(seed)
    H = 2
    _, a, _ = problem(rng, PUBLIC[op], batch=1, T=T, H=H * (2 if op == "kda" else 1), Hq=H, K=K, V=V, lo=-5.0,
                      hi=-1e-3, dtype="float32")
    w_o = torch.tensor(rng.normal(size=a["v"].shape), dtype=torch.float32)
    w_h = torch.tensor(rng.normal(size=a["h0"].shape), dtype=torch.float32)
    out = {}
    for side in ("ours", "fla"):
        t = _leaves(a, torch.float32)
        if side == "ours":
            o, h = call_public(getattr(scanweaver, op), op, t, K ** -0.5)  # tensors: routed to scanweaver.torch
        else:
            o, h = fla_naive(op, t, K ** -0.5)
        ((o * w_o).sum() + (h * w_h).sum()).backward()
        for n, x in (("o", o), ("state", h), *((f"d{n}", leaf.grad) for n, leaf in t.items())):
            out.setdefault(n, {})[side] = x.detach().numpy()
    return out


@pytest.mark.parametrize("op", OPS)
def test_public_call_matches_fla_naive_references(op, one_thread):
    for name, pair in _against_fla(op, 33, 8, 6, 17).items():
        ref = pair["fla"]
        np.testing.assert_allclose(pair["ours"], ref, rtol=0, atol=3e-5 * max(1.0, np.abs(ref).max()), err_msg=name)


@pytest.mark.parametrize("op", OPS)
def test_float32_gradients_at_2048_against_autograd_through_fla(op, one_thread):
    """T = 2048, float32: the largest error relative to each output's or gradient's largest entry, printed and
    bounded (both sides accumulate in float32; fla's in a different order)."""
    errors = {}
    for name, pair in _against_fla(op, 2048, 16, 16, 31).items():
        ref = pair["fla"]
        errors[name] = float(np.abs(pair["ours"] - ref).max() / max(np.abs(ref).max(), 1e-30))
    print(f"\n{op} T=2048 float32, max |ours - fla| / max |fla|: "
          + ", ".join(f"{n} {e:.1e}" for n, e in errors.items()))
    assert max(errors.values()) < 1e-5, errors


# ---- torch.compile --------------------------------------------------------------------------------------------------

FIRST_CALL_COMPILED = """
import numpy as np, torch, scanweaver, scanweaver.torch as swt
rng = np.random.default_rng(0)
t = lambda *s: torch.tensor(rng.normal(size=s), dtype=torch.float32, requires_grad=True)
q, k, v, g = t(1, 8, 1, 4), t(1, 8, 1, 4), t(1, 8, 1, 3), t(1, 8, 1, 4)
gh = torch.tensor(-rng.uniform(0.1, 1, (1, 8, 1)), dtype=torch.float32, requires_grad=True)
beta = torch.tensor(rng.uniform(0, 1, (1, 8, 1)), dtype=torch.float32, requires_grad=True)
def loss(q, k, v, g, gh, beta):
    o, s = swt.gated_delta_rule(q, k, v, gh, beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o2, _ = scanweaver.linear_attention(q, k, v, g=-torch.nn.functional.softplus(g))
    return o.square().sum() + s.sum() + o2.sum()
torch.compile(loss, fullgraph=True, backend="aot_eager")(q, k, v, g, gh, beta).backward()
print("ok", float(q.grad.abs().sum()) > 0)
"""


def test_torch_compile_fullgraph_on_the_processs_first_call():
    """An operation's first call in a process may be a compiled one, through ``scanweaver.torch`` or (once that is
    imported) a plain call: its checks are traced then (a cached property's lock in them broke fullgraph=True
    until an eager call had filled it)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", FIRST_CALL_COMPILED], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["ok", "True"], proc.stderr[-3000:]


@pytest.mark.parametrize("op", OPS)
def test_torch_compile_fullgraph(op):
    rng = np.random.default_rng(41)
    l2norm = op != "rwkv7"
    _, a, _ = problem(rng, PUBLIC[op], batch=1, T=9, H=2, Hq=1, K=4, V=3, l2norm=l2norm, dtype="float32")
    names = [*ARGS[op], "h0"]

    def loss(*xs):
        o, h = call_public(swt.__dict__[op], op, dict(zip(names, xs, strict=True)), 0.5, l2norm)
        return o.square().sum() + h.sum()

    eager = _leaves(a, torch.float32)
    loss(*(eager[n] for n in names)).backward()
    compiled = _leaves(a, torch.float32)
    torch.compile(loss, fullgraph=True, backend="aot_eager")(*(compiled[n] for n in names)).backward()
    for n in names:
        torch.testing.assert_close(compiled[n].grad, eager[n].grad, msg=n)


def test_bfloat16_tensors_store_bfloat16_and_train():
    t = {n: x.to(torch.bfloat16).detach().requires_grad_() for n, x in _leaves(
        problem(np.random.default_rng(42), "gated", batch=1, T=12, K=8, V=4, h0=False)[1]).items()}
    o, h = swt.gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], None, None, True, True)
    assert o.dtype == torch.bfloat16 and h.dtype == torch.float32
    (o.float().square().sum() + h.sum()).backward()
    assert all(x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad.float()).all() for x in t.values())


# ---- JAX ------------------------------------------------------------------------------------------------------------


def _jax_scan(jnp, jax, op, x, scale):
    """The recurrence as a lax.scan over t (the definition jax.grad differentiates); x: the fused names, q/k heads
    repeated to the value heads by the caller."""
    def step(S, xs):
        if op == "rwkv7":
            q, k, v, g, a, b = xs
            S = jnp.exp(g)[..., None] * S + b[..., :, None] * jnp.einsum("bhk,bhkv->bhv", a, S)[..., None, :] \
                + k[..., :, None] * v[..., None, :]
        else:
            q, k, v, g, beta = xs
            q = q / jnp.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
            k = k / jnp.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            if g is not None:
                S = S * (jnp.exp(g)[..., None] if g.ndim == 3 else jnp.exp(g)[..., None, None])
            u = beta[..., None] * (v - jnp.einsum("bhkv,bhk->bhv", S, k))
            S = S + k[..., :, None] * u[..., None, :]
        return S, scale * jnp.einsum("bhk,bhkv->bhv", q, S)

    sw = lambda y: None if y is None else jnp.swapaxes(y, 0, 1)  # noqa: E731
    keys = ("q", "k", "v", "g", "a", "b") if op == "rwkv7" else ("q", "k", "v", "g", "beta")
    S, o = jax.lax.scan(step, x["h0"], tuple(sw(x.get(n)) for n in keys))
    return sw(o), S


@pytest.mark.parametrize("op", OPS)
def test_jax_grad_under_jit_matches_grad_of_a_lax_scan(op):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import scanweaver.jax as swj

    rng = np.random.default_rng(51)
    l2norm = op != "rwkv7"
    _, a, _ = problem(rng, PUBLIC[op], batch=2, T=7, H=4, Hq=2, K=3, V=4, l2norm=l2norm, dtype="float32")
    names = [*ARGS[op], "h0"]
    w = jnp.asarray(rng.normal(size=a["v"].shape), jnp.float32)

    def ours(*xs):
        o, h = call_public(swj.__dict__[op], op, dict(zip(names, xs, strict=True)), 0.7, l2norm)
        return (o * w).sum() + (h ** 2).sum()

    def ref(*xs):
        x = dict(zip(names, xs, strict=True))
        x["q"], x["k"] = (jnp.repeat(x[n], 2, axis=2) for n in ("q", "k"))
        o, h = _jax_scan(jnp, jax, op, x, 0.7)
        return (o * w).sum() + (h ** 2).sum()

    args = [jnp.asarray(a[n]) for n in names]
    got = jax.jit(jax.grad(ours, argnums=tuple(range(len(names)))))(*args)
    want = jax.jit(jax.grad(ref, argnums=tuple(range(len(names)))))(*args)
    for n, g1, g2 in zip(names, got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g1), np.asarray(g2), rtol=2e-4, atol=2e-4, err_msg=n)


def test_jax_offsets_must_be_known_when_the_call_is_made():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import scanweaver.jax as swj

    rng = np.random.default_rng(52)
    _, a, _ = problem(rng, "gated", seqlens=(4, 5), dtype="float32")
    args = [jnp.asarray(a[n]) for n in ("q", "k", "v", "g", "beta")]
    cu = jnp.asarray(a["cu_seqlens"])
    o = jax.jit(lambda *xs: swj.gated_delta_rule(*xs, cu_seqlens=a["cu_seqlens"])[0])(*args)
    np.testing.assert_allclose(np.asarray(o), np.asarray(swj.gated_delta_rule(*args, cu_seqlens=cu)[0]), rtol=1e-6)
    for name in ("cu_seqlens", "cu_seqlens_cpu"):
        with pytest.raises(scanweaver.ScanInputError, match=rf"gated_delta_rule: {name} must be .*known when the "
                                                            "call is made; got DynamicJaxprTracer"):
            jax.jit(lambda c, name=name: swj.gated_delta_rule(*args, **{name: c})[0])(cu)
