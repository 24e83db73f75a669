"""Property tests: every schedule of every available backend equals the float64 loop on random problems,
and a scan split in two with the carry passed through (return_state -> h0) equals the whole scan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scanweaver
from scanweaver.runtime import REGISTRY
from scanweaver.schedules import get_schedule
from conftest import loop_reference

BACKENDS = ("numpy", "cpu", "opencl", "cuda", "julia")
PAIRS = [(b, s) for b in BACKENDS for s in (REGISTRY[b].schedules if b in REGISTRY else ("-",))]
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def small_config(schedule: str) -> dict:
    """The smallest listed value of every tunable (chunk 16), so short problems span several blocks."""
    cfg = {t.name: min(t.values) for t in get_schedule(schedule).tunables}
    return {**cfg, "chunk": 16} if "chunk" in cfg else cfg


def need(name: str) -> None:
    if name not in REGISTRY:
        pytest.skip(f"backend {name!r} is not part of this build (no module registers it)")
    avail = REGISTRY[name].availability()
    if not avail.ok:
        pytest.skip(f"backend {name!r} unavailable: {avail.reason}")


@st.composite
def problems(draw, max_L: int = 150):
    """A random (batch, L) problem: non-uniform data, sparse or dense resets, reverse or not."""
    batch = draw(st.sampled_from([(1,), (3,), (2, 2), (9,)]))
    L = draw(st.one_of(st.integers(1, 9), st.integers(10, max_L)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = (*batch, L)
    ops = {"a": rng.uniform(draw(st.sampled_from([0.0, 0.5, 0.9])), 1.0, shape),
           "b": rng.standard_normal(shape), "x": rng.standard_normal(shape)}
    density = draw(st.sampled_from([0.0, 0.05, 0.5]))
    return ops, rng.standard_normal(batch), rng.random(shape) < density, draw(st.booleans())


@pytest.mark.parametrize("backend, schedule", PAIRS)
@SETTINGS
@given(problem=problems())
def test_schedule_equals_the_loop(backend, schedule, problem):
    need(backend)
    ops, h0, reset, reverse = problem
    y, h = scanweaver.selective_scan(**ops, h0=h0, reset=reset, reverse=reverse, return_state=True,
                                     backend=backend, schedule=schedule, **small_config(schedule))
    ey, eh = loop_reference(**ops, h0=h0, reset=reset, reverse=reverse)
    np.testing.assert_allclose(y, ey, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(h, eh, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(problem=problems(), cut=st.floats(0.0, 1.0))
def test_split_with_carry_equals_whole(backend, problem, cut):
    need(backend)
    ops, h0, reset, reverse = problem
    L = ops["a"].shape[-1]
    k = int(round(cut * L))
    whole, h_whole = scanweaver.selective_scan(**ops, h0=h0, reset=reset, reverse=reverse, return_state=True,
                                               backend=backend)
    head, tail = slice(0, k), slice(k, L)
    first, second = (tail, head) if reverse else (head, tail)
    y1, h1 = scanweaver.selective_scan(**{n: v[..., first] for n, v in ops.items()}, h0=h0,
                                       reset=reset[..., first], reverse=reverse, return_state=True, backend=backend)
    y2, h2 = scanweaver.selective_scan(**{n: v[..., second] for n, v in ops.items()}, h0=h1,
                                       reset=reset[..., second], reverse=reverse, return_state=True, backend=backend)
    y = np.concatenate([y2, y1] if reverse else [y1, y2], axis=-1)
    np.testing.assert_allclose(y, whole, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h2, h_whole, rtol=1e-12, atol=1e-12)
