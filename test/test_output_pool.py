"""Outputs and gradients of the matrix-state, delta-rule and Mamba-1 kernels come from the host pool
(:func:`scanweaver.runtime.host_pool.host_output`) on NumPy operands: an array the caller holds is never handed out
again, a dropped one is (its pages already touched, no first-touch faults), and gradients computed into reused
buffers (filled with garbage by the caller before dropping them) equal the first call's: nothing stale leaks in."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver import matrix
from scanweaver.ops.delta_rule import kernels as delta_kernels
from scanweaver.ops.delta_rule.operands import operands as delta_operands
from scanweaver.ops.mamba1 import kernels as mamba_kernels
from scanweaver.ops.mamba1.operands import prepare as mamba_operands
from scanweaver.runtime import REGISTRY, host_pool

needs_cpu = pytest.mark.skipif(not REGISTRY.get("cpu").availability().ok,
                               reason="the cpu backend needs a C compiler")


def _pooled_outputs_check(forward, backward, big=("dq", "dk", "dv")):
    """Shared by the matrix-state and delta-rule tests below: ``forward() -> o`` and ``backward() -> {name: grad}``
    with NumPy operands large enough for the host pool (at least the gradients ``big``)."""
    o1 = forward()
    want = o1.copy()
    o2 = forward()
    assert o1.ctypes.data != o2.ctypes.data, "an output the caller holds was handed out again"
    np.testing.assert_array_equal(o1, want)
    address = o2.ctypes.data
    del o2
    o3 = forward()
    assert o3.ctypes.data == address, "a dropped output was not reused"
    np.testing.assert_array_equal(o3, want)
    g1 = backward()
    want_g = {n: x.copy() for n, x in g1.items() if x is not None}
    held = {n: x.ctypes.data for n, x in g1.items() if x is not None and x.nbytes >= host_pool.POOL_MIN_BYTES}
    assert set(big) <= set(held)
    for x in g1.values():  # what a stale buffer would add to the next call's gradients
        if x is not None:
            x[...] = 1e3
    del g1, x
    g2 = backward()
    assert {n: g2[n].ctypes.data for n in held} == held, "the dropped gradients were not reused"
    for n, x in want_g.items():
        np.testing.assert_array_equal(g2[n], x, err_msg=f"{n} of a reused buffer")


def _qkv(rng, B=1, T=512, H=4, K=32, V=32):
    q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    assert v.nbytes >= host_pool.POOL_MIN_BYTES
    return q, k / np.sqrt(K), v


@needs_cpu
def test_matrix_state_outputs_come_from_the_pool_and_are_reused_only_once_dropped():
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng)
    g = np.log(rng.uniform(0.9, 0.999, q.shape)).astype(np.float32)
    ops = matrix.operands("test", q, k, v, g, decay="key")
    do = rng.standard_normal(v.shape).astype(np.float32)
    _pooled_outputs_check(lambda: matrix.forward(ops, backend="cpu")[0],
                          lambda: matrix.backward(ops, do, backend="cpu"))


@needs_cpu
def test_delta_rule_outputs_come_from_the_pool_and_are_reused_only_once_dropped():
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    g = -rng.uniform(0.01, 0.3, v.shape[:3]).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, v.shape[:3]).astype(np.float32)
    ops = delta_operands("test", "gated_delta_rule", q, k, v, g=g, beta=beta)
    do = rng.standard_normal(v.shape).astype(np.float32)
    _pooled_outputs_check(lambda: delta_kernels.forward(ops, backend="cpu")[0],
                          lambda: delta_kernels.backward(ops, do, backend="cpu"))


@needs_cpu
def test_mamba1_outputs_come_from_the_pool_and_are_reused_only_once_dropped():
    rng = np.random.default_rng(13)
    batch, D, N, L = 2, 64, 8, 512
    u, delta = rng.standard_normal((batch, D, L)).astype(np.float32), rng.uniform(0.01, 0.1, (batch, D, L))
    A = -rng.uniform(0.5, 2.0, (D, N)).astype(np.float32)
    B, C = (rng.standard_normal((batch, N, L)).astype(np.float32) for _ in range(2))
    ops = mamba_operands(u, delta.astype(np.float32), A, B, C, D=rng.standard_normal(D).astype(np.float32))
    assert u.nbytes >= host_pool.POOL_MIN_BYTES
    dout = rng.standard_normal(u.shape).astype(np.float32)
    _pooled_outputs_check(lambda: mamba_kernels.forward(ops, backend="cpu")[0],
                          lambda: mamba_kernels.backward(ops, dout, backend="cpu"), big=("du", "ddelta"))
