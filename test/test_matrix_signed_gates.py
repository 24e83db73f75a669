"""Matrix-state steps whose gate may be negative: ``a*S`` lowered through ``log|a|`` with the signs carried.

Each answer is checked against the step itself run in float64 on plain NumPy values, one step at a time,
per batch row, head and packed sequence (the step is the recurrence's definition).
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.runtime import REGISTRY

RNG = np.random.default_rng(37)


@scanweaver.recurrence(state_shape=("K", "V"))
def scalar_gate(S, q, k, v, a):
    return a * S + np.outer(k, v), q @ S


@scanweaver.recurrence(state_shape=("K", "V"))
def scalar_gate_after(S, q, k, v, a):
    S = a * S + np.outer(k, v)
    return S, q @ S


@scanweaver.recurrence(state_shape=("K", "V"))
def row_gate(S, q, k, v, a):
    return a[:, None] * S + np.outer(k, v), q @ S


@scanweaver.recurrence(state_shape=("K", "V"))
def row_gate_after(S, q, k, v, a):
    S = a[:, None] * S + np.outer(k, v)
    return S, q @ S


@scanweaver.recurrence(state_shape=("K", "V"))
def column_gate(S, k, v, a, c):  # a decay over the columns read by S @ c: the transposed form
    S = S * a[None, :] + np.outer(k, v)
    return S, S @ c


def oracle(step, args, h0=None, cu_seqlens=None, reverse=False):
    """The step run in float64 per (batch row, head, sequence), in scan order (operands ``(batch, T, H[, n])``)."""
    batch, T, H = args[0].shape[:3]
    cs = [0, T] if cu_seqlens is None else list(cu_seqlens)
    y, states = None, []
    for b in range(batch):
        for i in range(len(cs) - 1):
            row = b if cu_seqlens is None else i
            per_head = []
            for h in range(H):
                S = None if h0 is None else h0[row, h].astype(np.float64)
                steps = range(cs[i], cs[i + 1])
                for t in (reversed(steps) if reverse else steps):
                    vals = [a[b, t, h].astype(np.float64) for a in args]
                    if S is None:
                        S = np.zeros(_state_shape(step, vals))
                    S, out = step.step(S, *vals)
                    if y is None:
                        y = np.zeros((batch, T, H, np.size(out)))
                    y[b, t, h] = out
                per_head.append(S)
            states.append(per_head)
    return y, states


def _state_shape(step, vals):
    rows = cols = None
    for name, val in zip(step.inputs, vals, strict=True):
        axes = step.ir.operand_axes.get(name, ())
        if axes == (step.state_shape[0],):
            rows = np.size(val)
        elif axes == (step.state_shape[1],):
            cols = np.size(val)
    return rows, cols


def _gates(shape, zeros=True):
    a = RNG.uniform(-1, 1, shape)
    if zeros:
        a.flat[:: 7] = 0.0  # resets, exactly
    return a


def _need(backend):
    cls = REGISTRY.get(backend, None)
    if cls is None or not cls.availability().ok:
        pytest.skip(f"backend {backend!r} unavailable: {cls.availability().reason if cls else 'not registered'}")


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("step", [scalar_gate, scalar_gate_after, row_gate, row_gate_after])
def test_gates_of_either_sign_match_the_step(step, backend):
    _need(backend)
    B, T, H, K, V = 2, 13, 3, 4, 5
    q, k = RNG.normal(size=(2, B, T, H, K))
    v = RNG.normal(size=(B, T, H, V))
    a = _gates((B, T, H, K) if step in (row_gate, row_gate_after) else (B, T, H))
    h0 = RNG.normal(size=(B, H, K, V))
    y, h = step(q, k, v, a, h0=h0, return_state=True, backend=backend)
    want, states = oracle(step, [q, k, v, a], h0=h0)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, np.array(states), rtol=1e-10, atol=1e-10)
    assert "signs of a carried" in step.stages()["matrix_state"]


@pytest.mark.parametrize("reverse", [False, True])
def test_packed_sequences_with_empty_ones_and_reverse(reverse):
    T, H, K, V = 11, 2, 3, 4
    cu = [0, 0, 4, 4, 11]
    q, k = RNG.normal(size=(2, 1, T, H, K))
    v = RNG.normal(size=(1, T, H, V))
    a = _gates((1, T, H, K))
    h0 = RNG.normal(size=(4, H, K, V))
    y, h = row_gate_after(q, k, v, a, h0=h0, cu_seqlens=cu, reverse=reverse, return_state=True, backend="numpy")
    want, states = oracle(row_gate_after, [q, k, v, a], h0=h0, cu_seqlens=cu, reverse=reverse)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, np.array(states), rtol=1e-10, atol=1e-10)


def test_a_gate_over_the_columns_read_by_s_at_c():
    B, T, H, K, V = 1, 9, 2, 3, 4
    k = RNG.normal(size=(B, T, H, K))
    v, c = RNG.normal(size=(2, B, T, H, V))
    a = _gates((B, T, H, V))
    y, h = column_gate(k, v, a, c, return_state=True)
    want, states = oracle(column_gate, [k, v, a, c])
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, np.array(states), rtol=1e-10, atol=1e-10)


def test_positive_gates_run_unchanged():
    """A gate without a negative entry skips the sign bookkeeping and gives the same answer as before."""
    q, k = RNG.normal(size=(2, 1, 7, 2, 3))
    v, a = RNG.normal(size=(1, 7, 2, 4)), RNG.uniform(0.1, 1, (1, 7, 2))
    y = scalar_gate_after(q, k, v, a)
    o, _ = scanweaver.linear_attention(q, k, v, g_head=np.log(a), scale=1.0)
    np.testing.assert_allclose(y, o, rtol=1e-12, atol=1e-12)


def test_torch_gradients_through_a_signed_gate():
    torch = pytest.importorskip("torch")
    B, T, H, K, V = 1, 10, 2, 3, 4
    arrays = [RNG.normal(size=(B, T, H, K)), RNG.normal(size=(B, T, H, K)), RNG.normal(size=(B, T, H, V)),
              RNG.uniform(-1, 1, (B, T, H, K))]
    got = [torch.tensor(x, requires_grad=True) for x in arrays]
    ref = [torch.tensor(x, requires_grad=True) for x in arrays]
    y = row_gate_after(*got)
    q, k, v, a = ref
    S, outs = torch.zeros(B, H, K, V, dtype=torch.float64), []
    for t in range(T):  # S_t = a_t[:, None] * S_{t-1} + k_t v_t^T, y_t = q_t S_t
        S = a[:, t, :, :, None] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    want = torch.stack(outs, 1)
    w = torch.tensor(RNG.normal(size=want.shape))
    (y * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)
    for x, r in zip(got, ref, strict=True):
        torch.testing.assert_close(x.grad, r.grad, rtol=1e-8, atol=1e-8)


def test_jax_signed_gate_under_jit():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    B, T, H, K, V = 1, 8, 2, 3, 4
    q, k = RNG.normal(size=(2, B, T, H, K)).astype(np.float32)
    v = RNG.normal(size=(B, T, H, V)).astype(np.float32)
    a = RNG.uniform(-1, 1, (B, T, H)).astype(np.float32)
    y = jax.jit(lambda *xs: scalar_gate_after(*xs))(*(jnp.asarray(x) for x in (q, k, v, a)))
    want, _ = oracle(scalar_gate_after, [q, k, v, a])
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4)
