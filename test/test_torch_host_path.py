"""CPU tensors that need no gradient run as NumPy views, skipping the custom op; everything else still takes it.

A decode loop under ``torch.no_grad()`` calls an operation per token, and the custom op's dispatch cost more
than a one-token kernel (a T = 1 gated_delta_rule call at (1, 16, 64, 64): 241 us through the custom op,
125 us as views).  These tests hold the two paths to the same results for every operation the adapter
carries, and keep gradients, bfloat16, tracing and ``torch.func`` transforms on the custom op.
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import scanweaver.torch as swt  # noqa: E402
from scanweaver.calls.declare import OPERATIONS  # noqa: E402
from scanweaver.errors import ScanInputError  # noqa: E402

B, T, H, K, V = 2, 5, 2, 3, 4


def _problems(rng):
    """Positional arguments and keywords of a small problem for every operation the adapter carries."""
    n = rng.standard_normal
    unit = lambda *s: rng.uniform(0.2, 0.8, s)  # noqa: E731
    logs = lambda *s: np.log(rng.uniform(0.8, 0.99, s))  # noqa: E731
    qkv = [n((B, T, H, K)), n((B, T, H, K)) / 3, n((B, T, H, V))]
    one = [n((B, H, K)), n((B, H, K)) / 3, n((B, H, V))]
    S = n((B, H, K, V))
    return {
        "delta_rule": ((*qkv, unit(B, T, H)), {"output_final_state": True}),
        "gated_delta_rule": ((*qkv, logs(B, T, H), unit(B, T, H)), {"initial_state": S, "output_final_state": True}),
        "kda": ((*qkv, logs(B, T, H, K), unit(B, T, H)), {"output_final_state": True}),
        "linear_attention": ((*qkv,), {"g": logs(B, T, H, K), "output_final_state": True}),
        "retention": ((*qkv,), {"output_final_state": True}),
        "simple_gla": ((*qkv,), {"g": logs(B, T, H), "initial_state": S, "output_final_state": True}),
        "rwkv6": ((qkv[0], qkv[1], qkv[2], logs(B, T, H, K), n((H, K))), {"output_final_state": True}),
        "rwkv7": ((qkv[0], logs(B, T, H, K), qkv[1], qkv[2], -unit(B, T, H, K) / 4, unit(B, T, H, K) / 4),
                  {"output_final_state": True}),
        "mamba2_scan": ((n((B, T, H, V)), unit(B, T, H), -unit(H), n((B, T, 1, K)), n((B, T, 1, K))),
                        {"D": n(H), "return_final_states": True}),
        "mamba_selective_scan": ((n((B, H, T)), unit(B, H, T), -unit(H, K), n((B, K, T)), n((B, K, T))),
                                 {"D": n(H), "return_last_state": True}),
        "selective_scan": ((unit(B, T), n((B, T)), n((B, T)), n((B, T))), {}),
        "delta_rule_step": ((S, *one, unit(B, H)), {}),
        "gated_delta_rule_step": ((S, *one, logs(B, H), unit(B, H)), {}),
        "kda_step": ((S, *one, logs(B, H, K), unit(B, H)), {}),
        "linear_attention_step": ((S, *one), {"g_head": logs(B, H)}),
        "rwkv6_step": ((S, one[0], one[1], one[2], logs(B, H, K), n((H, K))), {}),
        "rwkv7_step": ((S, one[0], logs(B, H, K), one[1], one[2], -unit(B, H, K) / 4, unit(B, H, K) / 4), {}),
        "mamba2_step": ((n((B, H, V, K)), n((B, H, V)), unit(B, H), -unit(H), n((B, 1, K)), n((B, 1, K))), {}),
        "mamba2_state_update": ((n((B, H, V, K)), n((B, H, V)), unit(B, H), -unit(H), n((B, 1, K)), n((B, 1, K))),
                                {}),
    }


PROBLEMS = _problems(np.random.default_rng(0))


def test_every_carried_operation_has_a_problem_here():
    assert set(PROBLEMS) == set(swt.ENTRIES)


def _tensors(values, dtype, grad=False):
    """Tensors of ``values``; with ``grad`` the second requires a gradient (the state, which
    mamba2_state_update changes in place, never does)."""
    return [torch.tensor(v, dtype=dtype, requires_grad=grad and i == 1) for i, v in enumerate(values)]


def _flat(result):
    if isinstance(result, (tuple, list)):
        return [t for r in result for t in _flat(r)]
    return [] if result is None else [result]


def _run(name, dtype, grad):
    args, kwargs = PROBLEMS[name]
    xs = _tensors(args, dtype, grad)
    kw = {k: torch.tensor(v, dtype=dtype) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    return xs, getattr(swt, name)(*xs, **kw)


def _views_taken(fn):
    """How many calls within ``fn()`` ran as NumPy views."""
    taken = []
    real = swt._host_views

    def spy(*a):
        r = real(*a)
        taken.append(r is not None)
        return r

    with mock.patch.object(swt, "_host_views", spy):
        fn()
    return sum(taken)


@pytest.mark.parametrize("name", sorted(PROBLEMS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_no_grad_calls_equal_the_custom_ops(name, dtype):
    """The same call, once needing gradients (the custom op's path) and once under ``no_grad`` (NumPy views):
    equal results, tensors of the same dtypes and shapes; a state updated in place is updated on both."""
    ref_in, ref = _run(name, dtype, grad=True)
    out = []
    with torch.no_grad():
        taken = _views_taken(lambda: out.append(_run(name, dtype, grad=False)))
    assert taken == (OPERATIONS.get(name).recurrence is None)  # a compiled recurrence keeps apply()
    (got_in, got), = out
    ref, got = _flat(ref), _flat(got)
    assert len(ref) == len(got) > 0
    # float16: a step needing gradients is computed by PyTorch's expressions in float16, the views' kernel
    # accumulates in float32, so the two differ by float16 roundings
    tol = {torch.float16: 2e-2, torch.float32: 1e-5}.get(dtype, 1e-12)
    for r, g in zip(ref, got, strict=True):
        assert type(g) is torch.Tensor and g.dtype == r.dtype and g.shape == r.shape and not g.requires_grad
        np.testing.assert_allclose(g.numpy(), r.detach().numpy(), rtol=tol, atol=tol)
    for r, g in zip(ref_in, got_in, strict=True):  # in-place updates (mamba2_state_update's state) happen on both paths
        np.testing.assert_allclose(g.numpy(), r.detach().numpy(), rtol=tol, atol=tol)
    assert not any(np.shares_memory(g.numpy(), x.numpy()) for g in got for x in got_in)  # no output aliases an input


def test_empty_sequences_return_new_tensors():
    """At T = 0 the final state equals the initial one, and is still a tensor of its own (as the custom op's)."""
    args, kwargs = PROBLEMS["simple_gla"]
    xs = [torch.tensor(a[:, :0], dtype=torch.float32) for a in args] + [torch.tensor(kwargs["g"][:, :0])]
    h0 = torch.tensor(kwargs["initial_state"], dtype=torch.float32)
    with torch.no_grad():
        o = []
        assert _views_taken(lambda: o.append(swt.simple_gla(*xs[:3], g=xs[3], initial_state=h0,
                                                            output_final_state=True))) == 1
    out, h = o[0]
    assert out.shape == xs[2].shape and torch.equal(h, h0) and not np.shares_memory(h.numpy(), h0.numpy())


def test_inference_mode_and_grad_free_tensors_take_the_views():
    args, kwargs = PROBLEMS["gated_delta_rule"]
    xs = _tensors(args, torch.float32)
    with torch.inference_mode():
        assert _views_taken(lambda: swt.gated_delta_rule(*xs)) == 1
    assert _views_taken(lambda: swt.gated_delta_rule(*xs)) == 1  # grad mode on, but nothing requires a gradient


def test_gradients_bfloat16_and_meta_tensors_keep_the_custom_op():
    args, _ = PROBLEMS["gated_delta_rule"]
    xs = _tensors(args, torch.float32)
    xs[0].requires_grad_()
    o = []
    assert _views_taken(lambda: o.append(swt.gated_delta_rule(*xs)[0])) == 0
    assert o[0].grad_fn is not None
    o[0].sum().backward()
    assert xs[0].grad is not None and torch.isfinite(xs[0].grad).all()
    with torch.no_grad():  # a parameter under no_grad: views of its data, no graph
        assert _views_taken(lambda: swt.gated_delta_rule(*xs)) == 1
    bf = [x.detach().to(torch.bfloat16) for x in xs]
    with torch.no_grad():
        assert _views_taken(lambda: o.append(swt.gated_delta_rule(*bf)[0])) == 0
    assert o[-1].dtype == torch.bfloat16
    step_args, _ = PROBLEMS["gated_delta_rule_step"]
    meta = [torch.empty(a.shape, device="meta") for a in step_args]
    with torch.no_grad():
        assert _views_taken(lambda: o.append(swt.gated_delta_rule_step(*meta)[0])) == 0
    assert o[-1].device.type == "meta"


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_transforms_and_tracing_keep_the_custom_op():
    args, _ = PROBLEMS["gated_delta_rule_step"]
    xs = _tensors(args, torch.float64)

    def o_sum(q):
        return swt.gated_delta_rule_step(xs[0], q, *xs[2:])[0].sum()

    grads = []
    assert _views_taken(lambda: grads.append(torch.func.grad(o_sum)(xs[1]))) == 0
    q = xs[1].clone().requires_grad_()
    o_sum(q).backward()
    np.testing.assert_allclose(grads[0].numpy(), q.grad.numpy(), rtol=1e-12)
    traced = []
    with torch.no_grad():
        assert _views_taken(lambda: traced.append(torch.jit.trace(o_sum, (xs[1],), check_trace=False))) == 0


def test_errors_of_the_view_path_name_the_tensors():
    args, _ = PROBLEMS["gated_delta_rule"]
    xs = _tensors(args, torch.float32)
    with torch.no_grad():
        with pytest.raises(ScanInputError, match=r"gated_delta_rule: .*v"):
            swt.gated_delta_rule(xs[0], xs[1], xs[2][:, :, :, :2].contiguous()[:, :, :1], xs[3], xs[4])
        with pytest.raises(ScanInputError, match=r"torch\.float32|\.to\(torch"):
            swt.gated_delta_rule(xs[0], xs[1], xs[2].to(torch.int32), xs[3], xs[4])


def _state_update_args():
    args, _ = PROBLEMS["mamba2_state_update"]
    return _tensors(args, torch.float64)


def test_an_in_place_update_through_the_views_is_seen_by_autograd():
    """mamba2_state_update writes the state through a NumPy view: the state's version still moves, so a graph that
    saved the state refuses to differentiate with the changed values (as after PyTorch's own in-place write)."""
    state, *rest = _state_update_args()
    w = torch.ones_like(state, requires_grad=True)
    y = (state * w).sum()  # saves state
    before = state._version
    with torch.no_grad():
        assert _views_taken(lambda: swt.mamba2_state_update(state, *rest)) == 1
    assert state._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_states_pytorch_would_not_write_take_its_path_and_its_errors():
    state, *rest = _state_update_args()
    with torch.inference_mode():
        cache = state.clone()
    with pytest.raises(RuntimeError, match="[Ii]nference"):  # an inference tensor outside inference mode
        swt.mamba2_state_update(cache, *rest)
    with torch.inference_mode():  # inside it: views, written in place
        before = cache.clone()
        assert _views_taken(lambda: swt.mamba2_state_update(cache, *rest)) == 1
        assert not torch.equal(cache, before)
    shared = state[:1].expand(state.shape)  # both batch rows are one memory: written twice at once
    with torch.no_grad(), pytest.raises(RuntimeError, match="single memory location"):
        swt.mamba2_state_update(shared, *rest)


@pytest.mark.parametrize("name", ["mamba2_step", "gated_delta_rule_step"])
def test_forward_mode_tangents_go_through_pytorch(name):
    """Dual tensors require no gradient, but their tangents must come through: no views under forward-mode AD."""
    import torch.autograd.forward_ad as fwAD

    args, _ = PROBLEMS[name]
    xs = _tensors(args, torch.float64)
    fn = getattr(swt, name)
    tangent = torch.ones_like(xs[1])  # of x (mamba2_step) or q
    out = []
    with fwAD.dual_level():
        dual = fwAD.make_dual(xs[1], tangent)
        assert _views_taken(lambda: out.append(fn(xs[0], dual, *xs[2:])[0])) == 0
        got = fwAD.unpack_dual(out[0]).tangent
    assert got is not None
    _, want = torch.func.jvp(lambda x: fn(xs[0], x, *xs[2:])[0], (xs[1],), (tangent,))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


def test_a_scale_tensor_numpy_cannot_view_takes_the_custom_op():
    args, _ = PROBLEMS["gated_delta_rule_step"]
    xs = _tensors(args, torch.float32)
    with torch.no_grad():
        assert _views_taken(lambda: swt.gated_delta_rule_step(*xs, scale=torch.tensor(0.5, dtype=torch.bfloat16))) == 0
        got = swt.gated_delta_rule_step(*xs, scale=torch.tensor(0.5, dtype=torch.bfloat16))[0]
        want = swt.gated_delta_rule_step(*xs, scale=0.5)[0]
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)  # expressions vs the kernel


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64])
def test_steps_refuse_what_their_kernels_refuse_on_every_path(dtype):
    """The steps' PyTorch expressions (gradients, bfloat16) refuse the dtypes the fused kernel refuses."""
    args, _ = PROBLEMS["gated_delta_rule_step"]
    xs = _tensors(args, torch.float32, grad=True)
    xs[2] = xs[2].detach().to(dtype)  # k
    with pytest.raises(ScanInputError, match=f"k has dtype {str(dtype).removeprefix('torch.')}"):
        swt.gated_delta_rule_step(*xs)
    rargs, _ = PROBLEMS["rwkv7_step"]
    rs = _tensors(rargs, torch.float32, grad=True)
    rs[5] = rs[5].detach().to(dtype)  # a
    with pytest.raises(ScanInputError, match=f"a has dtype {str(dtype).removeprefix('torch.')}"):
        swt.rwkv7_step(*rs)
