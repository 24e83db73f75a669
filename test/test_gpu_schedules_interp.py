"""The NumPy interpreter of the GPU schedule ops (hybrid, reduce_then_scan, lookback) equals the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from conftest import loop_reference, make_operands
from scanweaver.schedules import lookback

CASES = [
    ("hybrid", {"workgroup_size": 32, "items_per_thread": 3, "lanes_per_group": 1}, 96),
    ("hybrid", {"workgroup_size": 64, "items_per_thread": 2, "lanes_per_group": 4}, 32),
    ("hybrid", {"workgroup_size": 128, "items_per_thread": 1, "lanes_per_group": 1}, 128),
    ("reduce_then_scan", {"workgroup_size": 32, "items_per_thread": 2, "tiles_per_block": 3}, 192),
    ("lookback", {"workgroup_size": 32, "items_per_thread": 1}, 32),
]


@pytest.mark.parametrize("schedule, cfg, capacity", CASES)
@pytest.mark.parametrize("reverse", [False, True])
def test_interpreter_matches_loop(rng, schedule, cfg, capacity, reverse):
    for L in sorted({1, 2, 31, 64, capacity + 1, (lookback.INTERPRETER_LAG + 3) * capacity + 7}):
        ops = make_operands(rng, (2, 3, L))
        h0 = rng.standard_normal((2, 3))
        reset = rng.random((2, 3, L)) < 0.1
        y, hl = scanweaver.selective_scan(**ops, h0=h0, reset=reset, reverse=reverse, return_state=True,
                                          backend="numpy", schedule=schedule, **cfg)
        ey, eh = loop_reference(**ops, h0=h0, reset=reset, reverse=reverse)
        np.testing.assert_allclose(y, ey, rtol=1e-12, atol=1e-12, err_msg=f"{schedule} L={L}")
        np.testing.assert_allclose(hl, eh, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("schedule, cfg, capacity", CASES[:1] + CASES[3:])
def test_ops_are_printed_in_the_schedule_stage(schedule, cfg, capacity):
    text = str(scanweaver.api.SELECTIVE.lower(backend="numpy", schedule=schedule, **cfg))
    assert f"{schedule}." in text and "IR after schedule" in text


def test_lanes_per_group_larger_than_workgroup_is_rejected(rng):
    ops = make_operands(rng, (2, 8))
    with pytest.raises(scanweaver.ScanInputError, match="lanes_per_group=64 exceeds workgroup_size=32"):
        scanweaver.selective_scan(**ops, backend="numpy", schedule="hybrid", workgroup_size=32, lanes_per_group=64)


def test_items_per_thread_bound_is_explained(rng):
    ops = make_operands(rng, (2, 8))
    with pytest.raises(scanweaver.ScanInputError, match="items_per_thread=65 is invalid"):
        scanweaver.selective_scan(**ops, backend="numpy", schedule="lookback", items_per_thread=65)
