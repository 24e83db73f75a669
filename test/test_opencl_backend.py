"""OpenCL kernels of every GPU schedule on a real OpenCL device (PoCL in CI), against the oracle.

Small tunables keep each workgroup's capacity small, so short sequences
cross workgroup, tile and block boundaries.  Programs are built once per
source and shared by the tests through the backend instance.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from conftest import loop_reference, make_operands
from scanweaver.runtime import get_backend, REGISTRY

AVAIL = REGISTRY["opencl"].availability()
pytestmark = pytest.mark.skipif(not AVAIL.ok, reason=f"opencl backend unavailable: {AVAIL.reason}")

#: (schedule, tunables, capacity): elements one workgroup (tile / block) covers with these tunables.
CASES = [
    ("sequential", {}, 1),
    ("blelloch", {"workgroup_size": 32}, 64),
    ("hybrid", {"workgroup_size": 64, "items_per_thread": 2, "lanes_per_group": 2}, 64),
    ("reduce_then_scan", {"workgroup_size": 32, "items_per_thread": 2, "tiles_per_block": 2}, 128),
    ("lookback", {"workgroup_size": 32, "items_per_thread": 2}, 64),
]
IDS = [c[0] for c in CASES]
TOL = {"rtol": 2e-4, "atol": 2e-4}


def lengths(capacity: int) -> list[int]:
    """L = 1, odd, a power of two, just above a workgroup's capacity, several workgroups."""
    return sorted({1, 7, 64, capacity + 1, 3 * capacity + 5})


@pytest.mark.parametrize("schedule, cfg, capacity", CASES, ids=IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_features_match_oracle(rng, schedule, cfg, capacity, reverse):
    for lanes in (1, 37):
        for L in lengths(capacity):
            ops = make_operands(rng, (lanes, L), np.float32)
            h0 = rng.standard_normal(lanes).astype(np.float32)
            reset = rng.random((lanes, L)) < 0.1
            y, hl = scanweaver.selective_scan(**ops, h0=h0, reset=reset, reverse=reverse, return_state=True,
                                              backend="opencl", schedule=schedule, **cfg)
            ey, eh = loop_reference(**ops, h0=h0, reset=reset, reverse=reverse)
            assert y.dtype == np.float32 and y.shape == (lanes, L)
            np.testing.assert_allclose(y, ey, **TOL, err_msg=f"{schedule} lanes={lanes} L={L}")
            np.testing.assert_allclose(hl, eh, **TOL, err_msg=f"{schedule} h_last lanes={lanes} L={L}")


@pytest.mark.parametrize("schedule, cfg, capacity", CASES, ids=IDS)
def test_many_lanes(rng, schedule, cfg, capacity):
    ops = make_operands(rng, (300, capacity + 1), np.float32)
    h0 = rng.standard_normal(300).astype(np.float32)
    y = scanweaver.selective_scan(**ops, h0=h0, backend="opencl", schedule=schedule, **cfg)
    np.testing.assert_allclose(y, loop_reference(**ops, h0=h0)[0], **TOL)


@pytest.mark.parametrize("schedule, cfg, capacity", CASES, ids=IDS)
def test_output_is_state_without_h0(rng, schedule, cfg, capacity):
    L = 2 * capacity + 3
    ops = make_operands(rng, (3, 2, L), np.float32, with_c=False)
    y = scanweaver.selective_scan(**ops, backend="opencl", schedule=schedule, **cfg)
    np.testing.assert_allclose(y, loop_reference(**ops)[0], **TOL)


@scanweaver.recurrence
def gated(h, dt, x, w):
    """An exp gate, and an output that reads h_{t-1} as well as h_t."""
    h_new = np.exp(-scanweaver.softplus(dt)) * h + x
    return h_new, w * h_new + 0.5 * h - 0.25 * x


def gated_reference(dt, x, w, h0, reverse):
    a = np.exp(-np.log1p(np.exp(dt.astype(np.float64))))
    h = h0.astype(np.float64).copy()
    y = np.empty(dt.shape)
    for t in (range(dt.shape[1] - 1, -1, -1) if reverse else range(dt.shape[1])):
        hp = h
        h = a[:, t] * h + x[:, t]
        y[:, t] = w[:, t] * h + 0.5 * hp - 0.25 * x[:, t]
    return y, h


@pytest.mark.parametrize("schedule, cfg, capacity", CASES, ids=IDS)
def test_custom_recurrence_reads_previous_state(rng, schedule, cfg, capacity):
    lanes, L = 5, 2 * capacity + 1
    dt, x, w = (rng.standard_normal((lanes, L)).astype(np.float32) for _ in range(3))
    h0 = rng.standard_normal(lanes).astype(np.float32)
    reverse = schedule in ("hybrid", "lookback")
    y, hl = gated(dt, x, w, h0=h0, reverse=reverse, return_state=True, backend="opencl", schedule=schedule,
                  **cfg)
    ey, eh = gated_reference(dt, x, w, h0, reverse)
    np.testing.assert_allclose(y, ey, **TOL)
    np.testing.assert_allclose(hl, eh, **TOL)


def test_float64_accumulates_in_float64(rng):
    if not get_backend("opencl").queue.device.double_fp_config:
        pytest.skip("the OpenCL device has no float64")
    ops = make_operands(rng, (3, 200))
    y = scanweaver.selective_scan(**ops, backend="opencl", schedule="hybrid", workgroup_size=32,
                                  items_per_thread=2)
    assert y.dtype == np.float64
    np.testing.assert_allclose(y, loop_reference(**ops)[0], rtol=1e-11, atol=1e-11)


def test_default_schedule_and_config(rng):
    ops = make_operands(rng, (6, 300), np.float32)
    y = scanweaver.selective_scan(**ops, backend="opencl")
    info = scanweaver.api.SELECTIVE.last
    assert info.backend == "opencl" and info.schedule == "hybrid"
    assert info.config["lanes_per_group"] * 32 <= info.config["workgroup_size"]
    np.testing.assert_allclose(y, loop_reference(**ops)[0], **TOL)


def test_device_arrays_in_and_out_without_copies(rng):
    import pyopencl.array as cla

    from scanweaver.runtime.base import ScanArrays

    be = get_backend("opencl")
    ops = make_operands(rng, (4, 150), np.float32)
    dev = {k: cla.to_device(be.queue, v) for k, v in ops.items()}
    stages = scanweaver.api.SELECTIVE.lower(backend="opencl", schedule="lookback", workgroup_size=32,
                                            items_per_thread=2)
    arrays = ScanArrays(inputs=dev, h0=None, reset=None, batch_shape=(4,), dtype=np.dtype(np.float32))
    y, hl = be.run(stages, arrays)
    assert isinstance(y, cla.Array) and isinstance(hl, cla.Array)
    assert be.to_device(dev["a"]) is dev["a"]
    assert be.last_ms > 0
    np.testing.assert_allclose(y.get(), loop_reference(**ops)[0], **TOL)
    h0 = rng.standard_normal(4).astype(np.float32)
    y, hl = scanweaver.selective_scan(**dev, h0=cla.to_device(be.queue, h0), return_state=True)
    assert scanweaver.api.SELECTIVE.last.backend == "opencl"
    assert isinstance(y, cla.Array) and y.shape == (4, 150) and hl.shape == (4,)
    ey, eh = loop_reference(**ops, h0=h0)
    np.testing.assert_allclose(y.get(), ey, **TOL)
    np.testing.assert_allclose(hl.get(), eh, **TOL)
    with pytest.raises(scanweaver.ScanInputError, match="use backend='opencl'"):
        scanweaver.selective_scan(**dev, backend="numpy")



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
def test_lookback_walks_many_windows(rng, dtype, reverse):
    """With ``SW_LOOKBACK_WALK`` every tile ignores published states but its lane's first and composes
    aggregates window by window (32 predecessors each) back to the lane's start: 70 tiles per lane."""
    import dataclasses

    from scanweaver.ir.stages import Features
    from scanweaver.runtime.base import ScanArrays

    be = get_backend("opencl")
    if dtype == np.float64 and not be.queue.device.double_fp_config:
        pytest.skip("the OpenCL device has no float64")
    lanes, L = 3, 70 * 64 - 5
    ops = make_operands(rng, (lanes, L), dtype)
    ops["a"] = rng.uniform(0.999, 1.0, (lanes, L)).astype(dtype)
    h0 = rng.standard_normal(lanes).astype(dtype)
    stages = scanweaver.api.SELECTIVE.lower(backend="opencl", schedule="lookback", workgroup_size=32,
                                            items_per_thread=2, dtype=np.dtype(dtype).name,
                                            features=Features(reverse=reverse, has_h0=True, return_state=True))
    walk = dataclasses.replace(stages, kernel="#define SW_LOOKBACK_WALK 1\n" + stages.kernel)
    arrays = ScanArrays(inputs=ops, h0=h0, reset=None, batch_shape=(lanes,), dtype=np.dtype(dtype))
    y, hl = be.run(walk, arrays)
    ey, eh = loop_reference(**ops, h0=h0, reverse=reverse)
    tol = TOL if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-10}
    np.testing.assert_allclose(y, ey, **tol)
    np.testing.assert_allclose(hl, eh, **tol)


@pytest.mark.parametrize("ipt", [1, 3, 8, 32])
def test_coalesced_tiles_every_items_per_thread(rng, ipt):
    """The striped load/store transpose for odd and large items_per_thread, several lanes per group."""
    ops = make_operands(rng, (5, 2 * 64 * ipt + 7), np.float32)
    h0 = rng.standard_normal(5).astype(np.float32)
    for schedule, cfg in (("hybrid", {"workgroup_size": 64, "lanes_per_group": 2}),
                          ("reduce_then_scan", {"workgroup_size": 32, "tiles_per_block": 2}),
                          ("lookback", {"workgroup_size": 32})):
        y = scanweaver.selective_scan(**ops, h0=h0, backend="opencl", schedule=schedule, items_per_thread=ipt,
                                      **cfg)
        np.testing.assert_allclose(y, loop_reference(**ops, h0=h0)[0], **TOL, err_msg=f"{schedule} ipt={ipt}")


def test_configuration_over_local_memory_is_refused_with_the_reason(rng):
    """A tile over the device's local memory is refused before anything is built (PoCL: 1 MiB)."""
    be = get_backend("opencl")
    if not be.queue.device.double_fp_config:
        pytest.skip("the OpenCL device has no float64")
    from scanweaver.targets.launch_limits import shared_bytes

    cfg = {"workgroup_size": 1024, "items_per_thread": 64, "lanes_per_group": 1}
    limit = be.queue.device.local_mem_size
    if shared_bytes("hybrid", cfg, "float64", "opencl") <= limit:
        pytest.skip(f"the device's {limit} bytes of local memory hold the largest tile")
    ops = make_operands(rng, (2, 100))
    with pytest.raises(scanweaver.ScanInputError, match="shared memory") as info:
        scanweaver.selective_scan(**ops, backend="opencl", schedule="hybrid", **cfg)
    assert str(limit) in str(info.value) and "items_per_thread=64" in str(info.value)
