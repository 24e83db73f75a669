"""cu_seqlens packed sequences and the log-space front end, against plain loops."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver import log_scan
from scanweaver.runtime import REGISTRY
from conftest import loop_reference, make_operands

BACKENDS = ("numpy", "cpu", "opencl", "cuda", "julia")


def need(name: str) -> None:
    if name not in REGISTRY:
        pytest.skip(f"backend {name!r} is not part of this build (no module registers it)")
    avail = REGISTRY[name].availability()
    if not avail.ok:
        pytest.skip(f"backend {name!r} unavailable: {avail.reason}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_cu_seqlens_equals_scanning_each_sequence(rng, backend, reverse):
    need(backend)
    cu = [0, 1, 4, 40, 41, 97]
    ops = make_operands(rng, (3, cu[-1]))
    h0 = rng.standard_normal(3)
    for sched in REGISTRY[backend].schedules:
        y, h = scanweaver.selective_scan(**ops, h0=h0, cu_seqlens=np.array(cu), reverse=reverse,
                                         return_state=True, backend=backend, schedule=sched)
        first, last = (len(cu) - 2, 0) if reverse else (0, len(cu) - 2)
        for k, (s, e) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
            part = {n: v[:, s:e] for n, v in ops.items()}
            ey, eh = loop_reference(**part, h0=h0 if k == first else None, reverse=reverse)
            np.testing.assert_allclose(y[:, s:e], ey, rtol=1e-10, atol=1e-10, err_msg=f"{sched} seq {k}")
            if k == last:
                np.testing.assert_allclose(h, eh, rtol=1e-10, atol=1e-10)


def test_cu_seqlens_merges_with_a_reset_mask(rng):
    ops = make_operands(rng, (2, 30))
    reset = np.zeros((2, 30), bool)
    reset[0, 12] = True
    y = scanweaver.selective_scan(**ops, reset=reset, cu_seqlens=[0, 20, 30], backend="numpy")
    both = reset.copy()
    both[:, 20] = True
    np.testing.assert_allclose(y, loop_reference(**ops, reset=both)[0], rtol=1e-12)


def test_cu_seqlens_on_a_recurrence(rng):
    @scanweaver.recurrence
    def ema(h, alpha, x):
        return alpha * h + (1 - alpha) * x

    alpha, x = rng.uniform(0.1, 0.9, (4, 25)), rng.standard_normal((4, 25))
    y = ema(alpha, x, cu_seqlens=(0, 10, 25), backend="numpy")
    assert ema.last.stages.affine.features.has_reset
    np.testing.assert_allclose(y[:, 10:], ema(alpha[:, 10:], x[:, 10:], backend="numpy"), rtol=1e-12)


@pytest.mark.parametrize("L", [1, 2, 63, 64, 65, 700])
@pytest.mark.parametrize("chunk", [2, 5, 64])
def test_log_scan_matches_the_loop(rng, L, chunk):
    la = rng.uniform(-2.0, 0.1, (3, L))
    x = rng.standard_normal((3, L))
    h0 = rng.standard_normal(3)
    reset = rng.random((3, L)) < 0.05
    for reverse in (False, True):
        h, hl = log_scan(la, x, h0=h0, reset=reset, reverse=reverse, return_state=True, chunk=chunk)
        ey, eh = loop_reference(np.exp(la), np.ones_like(x), x, h0=h0, reset=reset, reverse=reverse)
        np.testing.assert_allclose(h, ey, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(hl, eh, rtol=1e-11, atol=1e-11)



def test_log_scan_chunk_longer_than_the_sequence_is_one_chunk(rng):
    """chunk=10**9 allocated a (chunk, chunk) mask (a MemoryError of 888 PiB) for a sequence of 17 steps."""
    la, x = rng.uniform(-1.0, 0.0, (3, 17)), rng.standard_normal((3, 17))
    np.testing.assert_allclose(log_scan(la, x, chunk=10**9), log_scan(la, x, chunk=17), rtol=1e-15)
    np.testing.assert_allclose(log_scan(la, x, chunk=2**64), log_scan(la, x), rtol=1e-12)

def test_log_scan_minus_inf_is_a_zero_gate(rng):
    la = np.log(rng.uniform(0.2, 1.0, (2, 9)))
    la[:, 4] = -np.inf
    x = rng.standard_normal((2, 9))
    h = log_scan(la, x, chunk=3)
    assert np.all(np.isfinite(h))
    np.testing.assert_allclose(h[:, 4:], log_scan(la[:, 4:], x[:, 4:]), rtol=1e-12)



@pytest.mark.parametrize("chunk", [2, 3, 64])
def test_log_scan_non_finite_values_propagate_as_in_the_loop(rng, chunk):
    """A NaN or inf x_t reached the earlier steps of its chunk (a weight of 0 times NaN), and growing gates
    whose decay overflowed made a zero carry NaN (inf * 0): the loop keeps both finite."""
    for case in ("nan x", "inf x", "nan gate", "growth"):
        la, x = rng.uniform(-1.0, 0.0, (3, 40)), rng.standard_normal((3, 40))
        if case == "growth":
            la[:] = 30.0
            x = rng.uniform(0.5, 1.0, (3, 40))  # one sign: the loop's overflow is inf, and so is the closed form's
        else:
            (x if case.endswith("x") else la)[1, 17] = np.inf if case == "inf x" else np.nan
        with np.errstate(all="ignore"):
            h = log_scan(la, x, chunk=chunk)
            want, _ = loop_reference(np.exp(la), np.ones_like(x), x)
        np.testing.assert_array_equal(np.isnan(h), np.isnan(want), err_msg=case)
        np.testing.assert_array_equal(np.isinf(h), np.isinf(want), err_msg=case)
        finite = np.isfinite(want)
        np.testing.assert_allclose(h[finite], want[finite], rtol=1e-11, atol=1e-11, err_msg=case)

@pytest.mark.parametrize("chunk", [2, 5, 64])
def test_log_scan_overflow_is_the_loops_inf(rng, chunk):
    """Once a state overflowed, the closed form added two overflowed weights of opposite sign (inf - inf) or an
    overflowed weight times an input of 0 (inf * 0): NaN where the loop carries +-inf."""
    for case in ("mixed signs", "zero input", "+inf gate", "reset after overflow"):
        la, x = np.full((3, 40), 30.0), rng.standard_normal((3, 40))
        reset = None
        if case == "zero input":
            x = rng.uniform(0.5, 1.0, (3, 40))
            x[:, 20:] = 0.0
        elif case == "+inf gate":
            x = rng.uniform(0.5, 1.0, (3, 40))
            la[:, 5] = np.inf
        elif case == "reset after overflow":
            reset = np.zeros((3, 40), bool)
            reset[:, 33] = True
        for dtype in (np.float64, np.float32):
            with np.errstate(all="ignore"):
                h = log_scan(la.astype(dtype), x.astype(dtype), reset=reset, chunk=chunk)
                gate = np.exp(la.astype(dtype))
                if reset is not None:
                    gate[reset] = 0
                want, state = np.empty((3, 40), dtype), np.zeros(3, dtype)
                for t in range(40):  # the loop in the operands' precision
                    state = gate[:, t] * state + x[:, t].astype(dtype)
                    want[:, t] = state
            assert np.isinf(want).any(), case
            msg = f"{case}, {np.dtype(dtype).name}"
            np.testing.assert_array_equal(np.isnan(h), np.isnan(want), err_msg=msg)
            np.testing.assert_array_equal(np.isposinf(h), np.isposinf(want), err_msg=msg)
            np.testing.assert_array_equal(np.isneginf(h), np.isneginf(want), err_msg=msg)
            finite = np.isfinite(want)
            np.testing.assert_allclose(h[finite], want[finite], rtol=1e-5 if dtype == np.float32 else 1e-11,
                                       err_msg=msg)


def test_log_space_is_more_accurate_for_near_one_gates(rng):
    L = 20000
    la = (-np.exp(rng.uniform(np.log(1e-7), np.log(1e-5), (2, L)))).astype(np.float32)
    x = rng.standard_normal((2, L)).astype(np.float32)
    ref = loop_reference(np.exp(la.astype(np.float64)), np.ones((2, L)), x)[0]

    @scanweaver.recurrence
    def exp_gate(h, log_a, x):
        return np.exp(log_a) * h + x

    scale = np.abs(ref).max()
    err_direct = np.abs(exp_gate(la, x, backend="numpy", schedule="sequential") - ref).max() / scale
    err_log = np.abs(log_scan(la, x) - ref).max() / scale
    assert err_log < 2e-6 < err_direct
    assert err_log * 10 < err_direct


def test_log_scan_float16_accumulates_in_float32(rng):
    la = rng.uniform(-0.05, 0.0, (2, 500)).astype(np.float16)
    x = rng.standard_normal((2, 500)).astype(np.float16)
    h = log_scan(la, x)
    assert h.dtype == np.float16
    ref = loop_reference(np.exp(la.astype(np.float64)), np.ones((2, 500)), x)[0]
    np.testing.assert_allclose(h, ref, rtol=2.0**-11, atol=1e-6 * np.abs(ref).max())
