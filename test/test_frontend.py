"""Tracing and affine normalisation: what is accepted, what is rejected and why."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver import NotAffineError, ScanWeaverError
from scanweaver.passes import lower
from scanweaver.frontend import trace


def affine_of(step):
    return lower(trace(step)).affine


def test_selective_normal_form():
    def step(h, a, b, x, c):
        h = a * h + b * x
        return h, c * h

    aff = affine_of(step)
    assert (str(aff.A), str(aff.U)) == ("a", "b * x")
    assert (str(aff.output.new), str(aff.output.old), str(aff.output.const)) == ("c", "0", "0")


def test_gate_inside_step_and_distribution():
    def step(h, delta, A, x):
        g = np.exp(delta * A)
        return g * (h - x) + x + 2 * h

    aff = affine_of(step)
    assert str(aff.A) == "exp(delta * A) + 2"
    assert str(aff.U) == "(exp(delta * A) * -x) + x"


def test_division_by_free_terms_and_sigmoid_softplus():
    def step(h, z, x, d):
        return (h * scanweaver.sigmoid(z) + scanweaver.softplus(x)) / (1 + d)

    aff = affine_of(step)
    assert str(aff.A) == "sigmoid(z) / (1 + d)"
    assert str(aff.U) == "softplus(x) / (1 + d)"


def test_output_may_read_old_and_new_state():
    def step(h, a, x, c, e):
        hn = a * h + x
        return hn, c * hn + e * h + 3.0

    out = affine_of(step).output
    assert (str(out.new), str(out.old), str(out.const)) == ("c", "e", "3")


@pytest.mark.parametrize(
    "step, quoted",
    [
        (lambda h, a: a * h * h, "(a * h) * h"),
        (lambda h, a: np.exp(h) + a, "exp(h)"),
        (lambda h, a: a * h / h, "(a * h) / h"),
        (lambda h, a: a / (h + 1.0), "a / (h + 1)"),
        (lambda h, a: np.tanh(a * h), "tanh(a * h)"),
        (lambda h, a: h ** 2 + a, "pow(h, 2)"),
    ],
)
def test_not_affine_quotes_the_subexpression(step, quoted):
    with pytest.raises(NotAffineError) as info:
        scanweaver.recurrence(step)
    assert f"`{quoted}`" in str(info.value)


def test_state_in_a_condition_is_not_affine():
    def step(h, a, x):
        if h > 0:
            return a * h
        return x

    with pytest.raises(NotAffineError, match="condition"):
        scanweaver.recurrence(step)


def test_state_truthiness_is_not_affine():
    def step(h, a):
        return a * h if h else a

    with pytest.raises(NotAffineError, match="condition"):
        scanweaver.recurrence(step)


def test_bad_step_signatures_are_explained():
    with pytest.raises(ScanWeaverError, match="at least one operand"):
        scanweaver.recurrence(lambda h: h)
    with pytest.raises(ScanWeaverError, match=r"\*args"):
        scanweaver.recurrence(lambda h, *xs: h)
    with pytest.raises(ScanWeaverError, match="tuple of 3"):
        scanweaver.recurrence(lambda h, a: (h, h, h))
    with pytest.raises(ScanWeaverError, match="not supported inside a step"):
        scanweaver.recurrence(lambda h, a: np.sinh(a) * h)


def test_weighted_prefix_goes_through_the_same_path(rng):
    @scanweaver.recurrence
    def weighted_prefix(h, alpha, beta):
        return alpha * h + beta

    alpha = rng.uniform(0.2, 1.1, (3, 41))
    beta = rng.standard_normal((3, 41))
    y = weighted_prefix(alpha, beta, backend="numpy")
    h, expect = np.zeros(3), np.empty((3, 41))
    for t in range(41):
        h = alpha[:, t] * h + beta[:, t]
        expect[:, t] = h
    np.testing.assert_allclose(y, expect, rtol=1e-12)
    assert str(weighted_prefix.stages.affine.U) == "beta"


def test_gated_recurrence_runs_with_functions(rng):
    @scanweaver.recurrence
    def gated(h, delta, A, x, z):
        g = np.exp(delta * A)
        return g * h + (1 - g) * x, scanweaver.silu(z) * h

    delta, x, z = (rng.standard_normal((2, 19)) for _ in range(3))
    A = -rng.uniform(0.1, 2.0, (2, 19))
    y = gated(np.abs(delta), A, x, z, backend="numpy")
    h, expect = np.zeros(2), np.empty((2, 19))
    for t in range(19):
        g = np.exp(np.abs(delta[:, t]) * A[:, t])
        h_new = g * h + (1 - g) * x[:, t]
        expect[:, t] = z[:, t] / (1 + np.exp(-z[:, t])) * h
        h = h_new
    np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-14)


def test_recurrence_broadcasts_operands(rng):
    @scanweaver.recurrence
    def ema(h, alpha, x):
        return alpha * h + (1 - alpha) * x

    x = rng.standard_normal((4, 25))
    y = ema(np.full((4, 1), 0.9), x, backend="numpy")
    y2 = ema(np.full((4, 25), 0.9), x, backend="numpy")
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(scanweaver.ScanInputError, match="do not broadcast"):
        ema(np.ones((3, 25)), x, backend="numpy")
