"""PyTorch: gradcheck of every differentiable argument, float32 against autograd through a loop,
torch.compile, zero-copy CPU tensors, and a small model trained with our op and with the loop."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install 'scanweaver[torch]'")

import scanweaver  # noqa: E402
import scanweaver.torch as swt  # noqa: E402
from scanweaver.runtime import REGISTRY  # noqa: E402


def _backends():
    return [b for b in ("numpy", "cpu") if REGISTRY[b].availability().ok]


@scanweaver.recurrence
def gated(h, delta, A, x, z):
    g = np.exp(delta * A)
    return g * h + (1 - g) * x, scanweaver.sigmoid(z) * h


@scanweaver.recurrence(state_size=2)
def biquad(h, a1, a2, b0, x):
    return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])


def loop_scan(a, b, x, c=None, h0=None, reset=None, reverse=False):
    """The selective scan as a plain PyTorch loop (autograd differentiates it)."""
    L = a.shape[-1]
    h = torch.zeros(a.shape[:-1], dtype=a.dtype) if h0 is None else h0
    ys = [None] * L
    for t in (range(L - 1, -1, -1) if reverse else range(L)):
        at = a[..., t] if reset is None else torch.where(reset[..., t], torch.zeros_like(a[..., t]), a[..., t])
        h = at * h + b[..., t] * x[..., t]
        ys[t] = h if c is None else c[..., t] * h
    return torch.stack(ys, dim=-1), h


def _leaf(rng, shape, low=None, high=None, dtype=torch.float64):
    v = rng.uniform(low, high, shape) if low is not None else rng.standard_normal(shape)
    return torch.tensor(v, dtype=dtype, requires_grad=True)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("feature", ["plain", "no_c", "h0", "reverse", "reset", "cu_seqlens", "return_state",
                                     "all"])
def test_gradcheck_selective_scan(backend, feature):
    rng = np.random.default_rng(11)
    shape = (2, 2, 9)
    a, b, x, c = _leaf(rng, shape, 0.5, 1.0), _leaf(rng, shape), _leaf(rng, shape), _leaf(rng, shape)
    kw: dict = {"backend": backend}
    if feature in ("h0", "all"):
        kw["h0"] = _leaf(rng, shape[:-1])
    if feature in ("reverse", "all"):
        kw["reverse"] = True
    if feature in ("reset", "all"):
        kw["reset"] = torch.tensor(rng.random(shape) < 0.2)
    if feature == "cu_seqlens":
        kw["cu_seqlens"] = [0, 4, 9]
    if feature in ("return_state", "all"):
        kw["return_state"] = True
    inputs = (a, b, x) if feature == "no_c" else (a, b, x, c)
    h0 = kw.pop("h0", None)

    def fn(*args):
        *ops, h = args if h0 is not None else (*args, None)
        return swt.selective_scan(*ops, h0=h, **kw)

    # Full Jacobians for the case with every feature, random projections (fast_mode) for the others.
    assert torch.autograd.gradcheck(fn, (*inputs, *((h0,) if h0 is not None else ())), eps=1e-6, atol=1e-7,
                                    fast_mode=feature != "all")


@pytest.mark.parametrize("rec, ops", [
    (gated, lambda rng, s: [_leaf(rng, s, 0.05, 0.5), _leaf(rng, s, -2.0, -0.5), _leaf(rng, s), _leaf(rng, s)]),
    (biquad, lambda rng, s: [_leaf(rng, s, 0.3, 0.6), _leaf(rng, s, -0.3, 0.3), _leaf(rng, s), _leaf(rng, s)]),
], ids=["expression-gates", "dense-2x2"])
@pytest.mark.parametrize("states", ["recompute", "save"])
@pytest.mark.parametrize("variant", ["h0-reset-state", "reverse", "cu_seqlens", "plain"])
def test_gradcheck_recurrences(rec, ops, states, variant):
    rng = np.random.default_rng(5)
    shape = (2, 7)
    args = ops(rng, shape)
    k = rec.state_size
    h0 = None if variant == "plain" else _leaf(rng, (2,) if k == 1 else (2, k))
    kw = {"h0-reset-state": {"reset": torch.tensor(rng.random(shape) < 0.2), "return_state": True},
          "reverse": {"reverse": True, "return_state": True}, "cu_seqlens": {"cu_seqlens": [0, 3, 7]},
          "plain": {}}[variant]

    def fn(*tensors):
        if h0 is None:
            return swt.apply(rec, *tensors, states=states, **kw)
        return swt.apply(rec, *tensors[:-1], h0=tensors[-1], states=states, **kw)

    inputs = (*args,) if h0 is None else (*args, h0)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)
    y = rec.torch(*args, h0=h0, **{n: v for n, v in kw.items() if n != "return_state"})
    got = fn(*inputs)
    assert torch.allclose(y, got[0] if kw.get("return_state") else got)


def test_broadcast_operand_gradient_is_summed():
    rng = np.random.default_rng(2)
    A = _leaf(rng, (3, 1), -2.0, -0.5)
    args = [_leaf(rng, (2, 3, 6), 0.05, 0.5), A, _leaf(rng, (2, 3, 6)), _leaf(rng, (6,))]
    assert torch.autograd.gradcheck(lambda *t: swt.apply(gated, *t), args, eps=1e-6, atol=1e-7)


def test_float32_long_sequence_matches_autograd_through_a_loop():
    """L = 4096 in float32: forward and every gradient against autograd through the plain loop."""
    rng = np.random.default_rng(0)
    shape, L = (2, 4), 4096
    a = torch.tensor(rng.uniform(0.9, 1.0, (*shape, L)), dtype=torch.float32, requires_grad=True)
    b, x, c = (torch.tensor(rng.standard_normal((*shape, L)), dtype=torch.float32, requires_grad=True)
               for _ in range(3))
    h0 = torch.tensor(rng.standard_normal(shape), dtype=torch.float32, requires_grad=True)
    dy = torch.tensor(rng.standard_normal((*shape, L)), dtype=torch.float32)
    inputs = (a, b, x, c, h0)
    y, h = swt.selective_scan(a, b, x, c, h0=h0, return_state=True)
    ours = torch.autograd.grad((y * dy).sum() + h.sum(), inputs)
    y_ref, h_ref = loop_scan(a, b, x, c, h0=h0)
    want = torch.autograd.grad((y_ref * dy).sum() + h_ref.sum(), inputs)
    assert torch.allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    for name, g, w in zip(["a", "b", "x", "c", "h0"], ours, want, strict=True):
        rel = float((g - w).norm() / w.norm())
        assert rel < 1e-4, f"d{name}: relative error {rel:.2e}"


def test_torch_compile_fullgraph_and_opcheck():
    rng = np.random.default_rng(3)
    a = _leaf(rng, (2, 16), 0.5, 1.0, torch.float32)
    b, x, c = (_leaf(rng, (2, 16), dtype=torch.float32) for _ in range(3))
    h0 = _leaf(rng, (2,), dtype=torch.float32)

    def model(a, b, x, c, h0):
        y, h = swt.selective_scan(a, b, x, c, h0=h0, reverse=True, return_state=True)
        return (y * y).sum() + h.sum()

    eager = torch.autograd.grad(model(a, b, x, c, h0), (a, b, x, c, h0))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(a, b, x, c, h0), (a, b, x, c, h0))
    for g, w in zip(got, eager, strict=True):
        torch.testing.assert_close(g, w)
    opts = scanweaver.ops.scan.grad.scan_options(scanweaver.api.SELECTIVE)
    torch.library.opcheck(swt._forward, ("scan", [a, b, x, c], [True] * 4 + [False, False], repr(opts)))


def test_cpu_tensors_are_not_copied(monkeypatch):
    """The kernels read the tensors' own memory, and y is a tensor over the kernel's output buffer."""
    from scanweaver.runtime.cpu_backend import CpuBackend

    if not CpuBackend.availability().ok:
        pytest.skip("cpu backend unavailable")
    seen = {}
    real = CpuBackend.run

    def spy(self, stages, arrays):
        y, h = real(self, stages, arrays)
        seen.update({n: v.ctypes.data for n, v in arrays.inputs.items()}, y=y.ctypes.data)
        return y, h

    monkeypatch.setattr(CpuBackend, "run", spy)
    a, b, x, c = (torch.rand(4, 64) for _ in range(4))
    y = swt.selective_scan(a, b, x, c, backend="cpu")
    assert seen["a"] == a.data_ptr() and seen["c"] == c.data_ptr()
    assert seen["y"] == y.data_ptr()
    a.mul_(0.5)  # write-through: the next call sees the tensor's new contents
    torch.testing.assert_close(swt.selective_scan(a, b, x, c, backend="cpu"),
                               loop_scan(a, b, x, c)[0], rtol=1e-5, atol=1e-5)


def test_bfloat16_and_errors():
    a = torch.full((1, 8), 0.5, dtype=torch.bfloat16, requires_grad=True)
    b = x = torch.ones(1, 8, dtype=torch.bfloat16)
    y = swt.selective_scan(a, b, x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert a.grad.dtype == torch.bfloat16 and torch.isfinite(a.grad).all()
    with pytest.raises(scanweaver.ScanInputError, match="states must be one of"):
        swt.selective_scan(a, b, x, states="keep")
    with pytest.raises(scanweaver.ScanInputError, match="takes 4 operands"):
        swt.apply(gated, a, b)


def test_a_second_derivative_is_refused_by_name():
    """A gradient taken with create_graph=True differentiates once; differentiating it again raises ScanWeaver's
    message (second derivatives are not supported), not PyTorch's about a missing autograd formula."""
    q = torch.randn(1, 3, 1, 2, dtype=torch.float64, requires_grad=True)
    g, beta = -torch.rand(1, 3, 1, dtype=torch.float64), torch.rand(1, 3, 1, dtype=torch.float64)
    o, _ = swt.gated_delta_rule(q, q, q, g, beta)
    (dq,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    assert dq.shape == q.shape
    with pytest.raises(scanweaver.ScanWeaverError, match="second derivatives are not supported.*gated_delta_rule"):
        dq.sum().backward()


def test_torch_func_transforms_are_refused_by_name():
    """torch.func.grad and vmap met PyTorch's message about an autograd.Function the caller never wrote."""
    q = torch.randn(1, 3, 1, 2, dtype=torch.float64)
    g, beta = -torch.rand(1, 3, 1, dtype=torch.float64), torch.rand(1, 3, 1, dtype=torch.float64)
    with pytest.raises(scanweaver.ScanInputError, match="gated_delta_rule does not run under torch.func transforms"):
        torch.func.grad(lambda q: swt.gated_delta_rule(q, q, q, g, beta)[0].sum())(q)
    with pytest.raises(scanweaver.ScanInputError, match="does not run under torch.func transforms"):
        torch.func.vmap(lambda a: swt.selective_scan(a, a, a))(torch.rand(2, 1, 4, dtype=torch.float64))


def test_small_model_trains_like_the_reference_loop():
    """A linear-RNN layer with a linear head, trained by Adam on a synthetic task: our op and the
    plain loop reach the same loss (the gradients are usable, not only equal on one input)."""

    class Layer(torch.nn.Module):
        def __init__(self, scan):
            super().__init__()
            torch.manual_seed(0)
            self.gate = torch.nn.Linear(2, 8)
            self.inp = torch.nn.Linear(2, 8)
            self.out = torch.nn.Linear(8, 1)
            self.scan = scan

        def forward(self, u):  # u: (batch, L, 2)
            a = torch.sigmoid(self.gate(u)).transpose(1, 2)
            x = self.inp(u).transpose(1, 2)
            h = self.scan(a, torch.ones_like(x), x)
            return self.out(h.transpose(1, 2)).squeeze(-1)

    g = torch.Generator().manual_seed(1)
    u = torch.randn(8, 32, 2, generator=g)
    target = torch.cumsum(u[..., 0], dim=1) * 0.1 + 0.5 * u[..., 1]

    def train(scan):
        model = Layer(scan)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)
        for _ in range(200):
            opt.zero_grad()
            loss = torch.mean((model(u) - target) ** 2)
            loss.backward()
            opt.step()
        return float(loss.detach())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a thread team per op only costs time on a shared machine
    try:
        ours = train(lambda a, b, x: swt.selective_scan(a, b, x))
        ref = train(lambda a, b, x: loop_scan(a, b, x)[0])
    finally:
        torch.set_num_threads(threads)
    initial = float(torch.mean(target ** 2))
    assert ours < 0.1 * initial
    assert ours == pytest.approx(ref, rel=0.05)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the cuda path runs where a GPU is")
def test_cuda_tensors_run_on_the_cuda_backend():
    a = torch.rand(4, 256, device="cuda", requires_grad=True)
    b, x, c = (torch.randn(4, 256, device="cuda") for _ in range(3))
    y = swt.selective_scan(a, b, x, c)
    assert y.device.type == "cuda"
    y.sum().backward()
    ref = loop_scan(a.detach().cpu().requires_grad_(), b.cpu(), x.cpu(), c.cpu())[0]
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_plain_api_takes_tensors_and_returns_tensors_with_gradients():
    rng = np.random.default_rng(8)
    a = _leaf(rng, (2, 12), 0.5, 1.0, torch.float32)
    b, x, c = (_leaf(rng, (2, 12), dtype=torch.float32) for _ in range(3))
    y, h = scanweaver.selective_scan(a, b, x, c, return_state=True)
    assert isinstance(y, torch.Tensor) and isinstance(h, torch.Tensor)
    (y.sum() + h.sum()).backward()
    y_ref, h_ref = loop_scan(a, b, x, c)
    want = torch.autograd.grad(y_ref.sum() + h_ref.sum(), (a, b, x, c))
    for t, w in zip((a, b, x, c), want, strict=True):
        torch.testing.assert_close(t.grad, w, rtol=1e-5, atol=1e-5)
    z = gated(torch.full((2, 12), 0.1), torch.full((2, 12), -1.0), x.detach(), c.detach())
    assert isinstance(z, torch.Tensor) and z.shape == (2, 12)
    with pytest.raises(scanweaver.ScanInputError, match="out must be a torch.Tensor or None; got ndarray"):
        scanweaver.selective_scan(a, b, x, out=np.empty((2, 12), np.float32))


def test_documented_training_example_computes_gradients():
    from doc_examples import namespace_after

    pytest.importorskip("jax", reason="the training example uses JAX too")
    namespace = namespace_after('grads = ')
    assert namespace["A"].grad.shape == (64, 1) and namespace["h0"].grad.shape == (4, 64)
    assert set(namespace["grads"]) == {"a", "b", "x", "c"}


def test_training_steps_reuse_their_buffers():
    """y and the gradients of one step are handed back to the next once nothing refers to them."""
    a = torch.rand(3, 40, requires_grad=True)
    b, x, c = (torch.randn(3, 40, requires_grad=True) for _ in range(3))
    seen = []
    for _ in range(3):
        for t in (a, b, x, c):
            t.grad = None
        y = swt.selective_scan(a, b, x, c)
        y_ptr = y.data_ptr()
        (y * y).sum().backward()
        del y
        seen.append((y_ptr, a.grad.data_ptr(), c.grad.data_ptr()))
    assert seen[1] == seen[2]
    y_ref = loop_scan(a, b, x, c)[0]
    want = torch.autograd.grad((y_ref * y_ref).sum(), (a, c))
    torch.testing.assert_close(a.grad, want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(c.grad, want[1], rtol=1e-4, atol=1e-4)


def test_repeated_forwards_use_the_call_plan_and_prepare_only_for_the_backward(monkeypatch):
    """A forward that recomputes its states needs nothing prepared: it is the plain call (and its plan);
    the backward prepares the call once.  Results equal the prepared path's."""
    from scanweaver.core import autodiff

    rng = np.random.default_rng(5)
    a, b, x, c = (torch.tensor(v) for v in (rng.uniform(0.5, 1.0, (2, 3, 40)), *rng.standard_normal((3, 2, 3, 40))))
    h0 = torch.tensor(rng.standard_normal((2, 3)))
    want = swt.selective_scan(a, b, x, c, h0=h0, return_state=True, states="save")  # the prepared path
    calls = []
    real = autodiff.prepare_call
    monkeypatch.setattr(autodiff, "prepare_call", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    for _ in range(3):
        got = swt.selective_scan(a, b, x, c, h0=h0, return_state=True)
    assert calls == []
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    a.requires_grad_(True)
    y = swt.selective_scan(a, b, x, c, h0=h0)
    assert calls == []
    y.sum().backward()
    assert calls == [1] and a.grad is not None and bool(torch.isfinite(a.grad).all())


def test_tensors_on_two_devices_are_refused_like_pytorchs_own_operations():
    """A meta q beside CPU k, v, g returned a meta result; a meta cu_seqlens raised PyTorch's NotImplementedError."""
    from scanweaver.errors import ScanInputError

    q, k, v = torch.randn(3, 1, 5, 2, 3, dtype=torch.float64)
    with pytest.raises(ScanInputError, match=r"linear_attention got tensors on cpu, meta; pass them all on one"):
        swt.linear_attention(q.to("meta"), k, v)
    with pytest.raises(ScanInputError, match=r"cu_seqlens is a meta tensor, and its values are needed"):
        swt.linear_attention(q, k, v, cu_seqlens=torch.tensor([0, 2, 5], device="meta"))
    o, _ = swt.linear_attention(q.to("meta"), k.to("meta"), v.to("meta"))  # shapes alone: one device
    assert o.device.type == "meta" and o.shape == (1, 5, 2, 3)
    o, _ = swt.linear_attention(q, k, v, scale=torch.tensor(0.5))  # a 0-d CPU tensor stands beside any device
    assert o.shape == (1, 5, 2, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_a_float_cu_seqlens_tensor_is_refused_with_its_own_dtype(dtype):
    """A float32 cu_seqlens tensor was reported as float64 (its values went through Python floats)."""
    from scanweaver.errors import ScanInputError

    q = torch.randn(1, 5, 2, 3, dtype=torch.float64)
    name = str(dtype).removeprefix("torch.")
    for cu in (torch.tensor([0, 2, 5], dtype=dtype), torch.tensor([[0, 2, 5]], dtype=dtype)):
        with pytest.raises(ScanInputError, match=rf"^linear_attention: cu_seqlens must be 1-D integers .*; got shape "
                                                 rf"\({', '.join(map(str, cu.shape))},?\), dtype {name}$"):
            swt.linear_attention(q, q, q, cu_seqlens=cu)
    o, _ = swt.linear_attention(q, q, q, cu_seqlens=torch.tensor([0, 2, 5]))  # integers still run
    assert o.shape == q.shape
