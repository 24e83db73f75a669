"""Regression tests of odd inputs: ``out=`` aliasing, hostile names, ints, byte order and huge expressions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import scanweaver
from conftest import loop_reference
from scanweaver import ScanInputError
from scanweaver.runtime.base import REGISTRY

#: The backends that run here (cuda is only emitted, in the name test).
BACKENDS = [b for b in ("numpy", "cpu", "opencl") if REGISTRY[b].availability().ok]
SHAPE = (4, 96)


def _ops(rng, dtype=np.float32):
    a = rng.uniform(0.5, 1.0, SHAPE).astype(dtype)
    b, x, c = (rng.standard_normal(SHAPE).astype(dtype) for _ in range(3))
    return a, b, x, c


# -- item: out= overlapping h0 or any other buffer -------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("alias", ["h0", "operand b", "reset"])
def test_out_overlapping_any_input_is_refused_on_every_path(rng, backend, alias):
    """The full path, a repeated call (its plan) and an explicit plan all refuse it; nothing is written."""
    a, b, x, c = _ops(rng)
    store = np.zeros((SHAPE[0], SHAPE[1] + 1), np.float32)
    out = store[:, :SHAPE[1]].copy()
    kwargs = {}
    if alias == "h0":
        kwargs["h0"] = out.reshape(-1)[5:5 + SHAPE[0]]  # h0 is a (contiguous) view into out
    elif alias == "operand b":
        b = out
        b[...] = rng.standard_normal(SHAPE)
    else:
        raw = out.view(np.uint8).reshape(-1)[:out.size]  # the mask's bytes are out's first floats
        raw[...] = 0
        kwargs["reset"] = raw.view(bool).reshape(SHAPE)
    before = out.copy()
    for _ in range(3):  # the first call builds no plan; repeated calls would find one
        with pytest.raises(ScanInputError, match=f"out overlaps {alias}"):
            scanweaver.selective_scan(a, b, x, c, out=out, backend=backend, **kwargs)
    np.testing.assert_array_equal(out, before)
    p = scanweaver.plan(scanweaver.selective_scan, SHAPE, h0="h0" in kwargs, reset="reset" in kwargs,
                        backend=backend)
    with pytest.raises(ScanInputError, match=f"out overlaps {alias}"):
        p(a, b, x, c, out=out, **kwargs)
    np.testing.assert_array_equal(out, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_repeated_call_with_a_separate_out_still_runs_from_its_plan(rng, backend):
    a, b, x, c = _ops(rng)
    h0 = rng.standard_normal(SHAPE[0]).astype(np.float32)
    out = np.empty(SHAPE, np.float32)
    for _ in range(3):
        y = scanweaver.selective_scan(a, b, x, c, h0=h0, out=out, backend=backend)
    assert y is out
    np.testing.assert_allclose(out, loop_reference(a, b, x, c, h0=h0)[0], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "cpu"])
def test_a_plan_off_the_cpu_checks_out_like_the_full_path(rng, backend):
    a, b, x, c = _ops(rng)
    p = scanweaver.plan(scanweaver.selective_scan, SHAPE, backend=backend)
    ro = np.empty(SHAPE, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ScanInputError, match="writeable"):
        p(a, b, x, c, out=ro)
    with pytest.raises(ScanInputError, match="overlaps operand a"):
        p(a, b, x, c, out=a)


# -- item: names pasted into source ----------------------------------------------------------------------------

EVIL = "ema */ int sw_injected(void) { return 1337; } /*"


def test_a_name_that_is_not_an_identifier_is_refused():
    with pytest.raises(ScanInputError, match="name must be an identifier"):
        scanweaver.recurrence(lambda h, a, x: a * h + x, name=EVIL)
    with pytest.raises(ScanInputError, match="name must be an identifier"):
        scanweaver.recurrence(lambda h, a, x: a * h + x, name=42)


def test_a_hostile_function_name_is_sanitised_and_cannot_inject_code(rng):
    def step(h, a, x):
        return a * h + x

    step.__name__ = EVIL
    rec = scanweaver.recurrence(step)
    assert "*/" not in rec.name and " " not in rec.name
    a, _, x, _ = _ops(rng)
    np.testing.assert_allclose(rec(a, x, backend="numpy"), loop_reference(a, np.ones_like(a), x)[0], rtol=1e-4,
                               atol=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "opencl", "cuda"])
def test_every_emitter_escapes_the_name_it_prints(backend):
    """Stages whose name bypassed the front end: the emitted source holds no injected code."""
    from scanweaver.runtime.base import get_backend

    rec = scanweaver.recurrence(lambda h, a, x: a * h + x, name="ema")
    stages = rec.lower(backend="numpy")
    evil = dataclasses.replace(stages, affine=dataclasses.replace(stages.affine, name=EVIL), kernel=None)
    source = get_backend(backend, require_available=False).emit(evil).kernel
    assert "sw_injected" in source  # the name is still shown, as text
    assert "int sw_injected(void)" not in source and "*/ int" not in source


def test_the_cpu_backward_emitter_escapes_the_name():
    from scanweaver.passes.adjoint import adjoint
    from scanweaver.targets.c_backward import render_backward

    rec = scanweaver.recurrence(lambda h, a, x: a * h + x, name="ema")
    affine = dataclasses.replace(rec.lower(backend="numpy").affine, name=EVIL)
    source = render_backward(adjoint(affine, ("a", "x")))
    assert "*/ int" not in source


# -- item: bad input gets a clear error (ints, byte order, huge expressions) -----------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_ints_are_numbers_like_floats(rng, backend):
    decay = scanweaver.recurrence(lambda h, a, x: a * h + x, name="decay")
    _, _, x, _ = _ops(rng)
    half = np.full(SHAPE, 0.5, np.float32)
    y = decay(half, 2, backend=backend)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, loop_reference(half, np.ones(SHAPE), np.full(SHAPE, 2.0))[0], rtol=1e-5)
    np.testing.assert_allclose(decay(1, x, backend=backend), np.cumsum(x, axis=-1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ScanInputError, match="cannot be read as an array"):
        decay(10 ** 400, x, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [">f4", ">f8"])
def test_big_endian_arrays_are_converted(rng, backend, dtype):
    ops = _ops(rng, np.float64)
    big = [v.astype(dtype) for v in ops]
    y = scanweaver.selective_scan(*big, backend=backend)
    assert y.dtype == np.dtype(dtype).newbyteorder("=")
    np.testing.assert_allclose(y, loop_reference(*ops)[0], rtol=2e-4, atol=2e-4)
    u, delta = (np.abs(v[:1, :8].reshape(1, 1, 8)).astype(">f4") for v in ops[:2])
    A = -np.ones((1, 2), ">f4")
    B = C = np.ones((1, 2, 8), ">f4")
    got = scanweaver.mamba_selective_scan(u, delta, A, B, C, backend="numpy")
    want = scanweaver.mamba_selective_scan(*(v.astype(np.float32) for v in (u, delta, A, B, C)), backend="numpy")
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_repeated_squares_are_refused_quickly_with_a_clear_error():
    def step(h, a, x):
        g = a
        for _ in range(20):
            g = g * g
        return g * h + x

    with pytest.raises(ScanInputError, match="expand to 2097155"):
        scanweaver.recurrence(step)


def test_a_long_chain_is_refused_with_a_clear_error_not_a_recursion_error():
    def step(h, a, x):
        g = x
        for _ in range(2000):
            g = g * a + x
        return a * h + g

    with pytest.raises(ScanInputError, match="nest 4002 operations deep"):
        scanweaver.recurrence(step)


def test_a_chain_within_the_budget_runs(rng):
    n = 60

    def step(h, a, x):
        g = x
        for _ in range(n):
            g = g * 0.5 + x
        return a * h + g

    rec = scanweaver.recurrence(step)
    a, _, x, _ = _ops(rng)
    g = x * (2.0 - 0.5 ** n)
    np.testing.assert_allclose(rec(a, x, backend="cpu" if "cpu" in BACKENDS else "numpy"),
                               loop_reference(a, np.ones_like(a), g)[0], rtol=1e-4, atol=1e-4)


# -- item: an empty key or value axis of a matrix state; a tunable's allowed range -------------------------------


@pytest.mark.parametrize("op", ["linear_attention", "gated_delta_rule"])
@pytest.mark.parametrize("empty", ["K", "V"])
def test_an_empty_state_axis_is_named_not_reported_as_a_head_mismatch(rng, op, empty):
    B, T, H = 1, 6, 2
    K, V = (0, 3) if empty == "K" else (3, 0)
    q = rng.standard_normal((B, T, H, K)).astype(np.float32)
    v = rng.standard_normal((B, T, H, V)).astype(np.float32)
    extra = () if op == "linear_attention" else (-np.ones((B, T, H), np.float32), np.full((B, T, H), 0.5, np.float32))
    with pytest.raises(ScanInputError) as info:
        getattr(scanweaver, op)(q, q.copy(), v, *extra)
    msg = str(info.value)
    name = "q" if empty == "K" else "v"
    assert f"{name} has shape {(B, T, H, K) if empty == 'K' else (B, T, H, V)}" in msg
    assert f"({empty}, the state's" in msg and "heads" not in msg


@pytest.mark.parametrize("value", [3, 2, 1024])
def test_a_power_of_two_tunable_states_the_range_it_allows(rng, value):
    """block_v must be a power of two from 4 to 512: 3 (not a power) and 2, 1024 (out of range) say so."""
    q = rng.standard_normal((1, 4, 1, 4)).astype(np.float32)
    g, beta = -np.ones((1, 4, 1), np.float32), np.full((1, 4, 1), 0.5, np.float32)
    with pytest.raises(ScanInputError, match=rf"block_v={value} is invalid: it must be a power of two from 4 to 512"):
        scanweaver.gated_delta_rule(q, q.copy(), q.copy(), g, beta, backend="cpu", block_v=value)
