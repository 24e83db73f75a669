"""Property tests of the decode steps and of ``log_scan``: chained over T tokens, a step equals the float64 loop.

Each example draws one problem (batch, T from 1 to 12, grouped heads, K, V, dtype, l2 normalisation, log decays
from near 0 to strongly negative and exact resets, beta 0 to 2 where the family takes it) and runs the step
function token by token from the initial state; the outputs and the final state must equal the float64 loop of
the recurrence (``delta_family.loop``, written from the definitions), or the call must raise
``ScanInputError`` naming an argument.  The matrix-state steps (``linear_attention_step``, ``rwkv6_step``,
``mamba2_step``) are held to ``matrix_loops``' loops the same way, and ``log_scan`` to a loop of
``h_t = exp(log_a_t) h_{t-1} + x_t`` with resets, ``-inf`` gates and growth.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scanweaver
from scanweaver import ScanInputError
from delta_family import PUBLIC, loop, problem
from matrix_loops import la_loop, mamba2_loop

#: The step's positional operands after the state, per operation (the problem's array names).
OPERANDS = {"delta_rule": "q k v beta", "rwkv7": "q g k v a b"}
TOL = {"float64": 1e-9, "float32": 2e-4}


@st.composite
def _steps(draw, op):
    hq = draw(st.sampled_from((1, 2)))
    shape = {"batch": draw(st.integers(1, 3)), "T": draw(st.integers(1, 12)), "Hq": hq,
             "H": hq * draw(st.sampled_from((1, 2))), "K": draw(st.integers(1, 7)), "V": draw(st.integers(1, 6))}
    lo = draw(st.sampled_from((-30.0, -2.0, -1e-3)))
    return shape, lo, draw(st.sampled_from(("float64", "float32"))), draw(st.booleans()), draw(st.booleans()), \
        draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("op", sorted(PUBLIC))
@settings(max_examples=8, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_chained_steps_equal_the_loop(op, data):
    shape, lo, dtype, l2norm, reset, seed = data.draw(_steps(op))
    rng = np.random.default_rng(seed)
    family = PUBLIC[op]
    l2norm = l2norm and op != "rwkv7"
    _, a, _ = problem(rng, family, lo=lo, hi=min(-1e-4, lo / 10), dtype=dtype, l2norm=l2norm, **shape)
    if reset and "g" in a:
        a["g"][:, rng.integers(0, shape["T"])] = -np.inf  # an exact reset at one token
    if "beta" in a:
        a["beta"][..., :1] = rng.choice([0.0, 2.0])  # the extremes delta rules allow
    scale = 1.0 if op == "rwkv7" else shape["K"] ** -0.5
    want_o, want_h = loop(family, a, scale, l2norm)
    kw = {} if op == "rwkv7" else {"use_qk_l2norm_in_kernel": l2norm}
    step = getattr(scanweaver, op + "_step")
    S = a["h0"]
    outs = []
    try:
        for t in range(shape["T"]):
            o, S = step(S, *(np.ascontiguousarray(a[n][:, t]) for n in OPERANDS.get(op, "q k v g beta").split()),
                        **kw)
            outs.append(np.asarray(o, np.float64))
    except ScanInputError as e:
        assert re.search(r"\b(state|q|k|v|g|beta|a|b|r|w)\b", str(e)), e
        return
    got = np.stack(outs, axis=1)
    big = max(1.0, float(np.abs(want_o).max()), float(np.abs(want_h).max()))
    assert np.isfinite(got).all() and np.isfinite(S).all()
    assert np.abs(got - want_o).max() <= TOL[dtype] * big, (op, shape, dtype)
    assert np.abs(np.asarray(S, np.float64) - want_h).max() <= TOL[dtype] * big, (op, shape, dtype)


@settings(max_examples=10, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(batch=st.integers(1, 3), T=st.integers(1, 10), H=st.integers(1, 3), K=st.integers(1, 6), V=st.integers(1, 5),
       lo=st.sampled_from((-30.0, -1.0, -1e-3)), reset=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_chained_matrix_steps_equal_the_loops(batch, T, H, K, V, lo, reset, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, batch, T, H, K))
    v = rng.normal(size=(batch, T, H, V))
    g = -np.exp(rng.uniform(np.log(-lo / 100), np.log(-lo), (batch, T, H, K)))
    if reset:
        g[:, rng.integers(0, T)] = -np.inf
    h0 = rng.normal(size=(batch, H, K, V))
    want_o, want_h = la_loop(q, k, v, g, K ** -0.5, h0)
    S, outs = h0, []
    for t in range(T):
        o, S = scanweaver.linear_attention_step(S, q[:, t], k[:, t], v[:, t], g=g[:, t])
        outs.append(np.asarray(o))
    assert np.abs(np.stack(outs, 1) - want_o).max() <= 1e-9 * max(1.0, float(np.abs(want_o).max()))
    assert np.abs(np.asarray(S) - want_h).max() <= 1e-9 * max(1.0, float(np.abs(want_h).max()))
    u = rng.normal(size=(H, K))  # RWKV-6: the bonus u read with the current token, w the log decay
    want_o, want_h = la_loop(q, k, v, g, K ** -0.5, h0, bonus=u)
    S, outs = h0, []
    for t in range(T):
        o, S = scanweaver.rwkv6_step(S, q[:, t], k[:, t], v[:, t], g[:, t], u)
        outs.append(np.asarray(o))
    assert np.abs(np.stack(outs, 1) - want_o).max() <= 1e-9 * max(1.0, float(np.abs(want_o).max()))
    assert np.abs(np.asarray(S) - want_h).max() <= 1e-9 * max(1.0, float(np.abs(want_h).max()))
    # Mamba-2: x (batch, T, H, P), dt (batch, T, H), A (H,), B and C (batch, T, G, N), state (batch, H, P, N)
    P, N = V, K
    x = rng.normal(size=(batch, T, H, P))
    dt = rng.uniform(0.0, 2.0, (batch, T, H))
    A = -np.exp(rng.uniform(-3, 1, H))
    B, C = rng.normal(size=(2, batch, T, 1, N))
    D = rng.normal(size=H)
    s0 = rng.normal(size=(batch, H, P, N))
    want_y, want_s = mamba2_loop(x, dt, A, B, C, D=D, h0=s0)
    S, ys = s0, []
    for t in range(T):
        y, S = scanweaver.mamba2_step(S, x[:, t], dt[:, t], A, B[:, t], C[:, t], D=D)
        ys.append(np.asarray(y))
    assert np.abs(np.stack(ys, 1) - want_y).max() <= 1e-9 * max(1.0, float(np.abs(want_y).max()))
    assert np.abs(np.asarray(S) - want_s).max() <= 1e-9 * max(1.0, float(np.abs(want_s).max()))


@settings(max_examples=12, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(lanes=st.integers(1, 4), L=st.integers(1, 300), chunk=st.integers(2, 70), growth=st.booleans(),
       reverse=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_log_scan_equals_the_loop(lanes, L, chunk, growth, reverse, seed):
    rng = np.random.default_rng(seed)
    log_a = rng.uniform(-3.0, 0.05 if growth else 0.0, (lanes, L))
    log_a[:, rng.integers(0, L)] = -np.inf
    x = rng.normal(size=(lanes, L))
    h0 = rng.normal(size=lanes)
    reset = rng.random((lanes, L)) < 0.05
    h, y = h0.copy(), np.zeros((lanes, L))
    for t in (range(L - 1, -1, -1) if reverse else range(L)):
        a = np.where(reset[:, t], 0.0, np.exp(log_a[:, t]))
        h = a * h + x[:, t]
        y[:, t] = h
    got, last = scanweaver.log_scan(log_a, x, h0=h0, reset=reset, reverse=reverse, return_state=True, chunk=chunk)
    big = max(1.0, float(np.abs(y).max()))
    assert np.isfinite(got).all()
    assert np.abs(got - y).max() <= 1e-9 * big
    assert np.abs(last - h).max() <= 1e-9 * big
