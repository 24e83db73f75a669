"""The ``cuda`` backend on device arrays: CuPy, PyTorch (DLPack), ``__cuda_array_interface__``, streams, out=.

These run where CuPy sees a CUDA device (``bench/gpu_session.sh`` runs them
on a GPU machine) and skip with the reason elsewhere.  Every result is
checked against the float64 loop.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from conftest import loop_reference, make_operands
from scanweaver.runtime import REGISTRY, get_backend

AVAIL = REGISTRY["cuda"].availability()
pytestmark = pytest.mark.skipif(not AVAIL.ok, reason=f"cuda backend unavailable: {AVAIL.reason}")
TOL = {"rtol": 2e-4, "atol": 2e-4}


@pytest.fixture
def cp():
    import cupy

    return cupy


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return torch


def test_cupy_in_cupy_out_asynchronously(rng, cp):
    ops = make_operands(rng, (3, 5, 700), np.float32)
    dev = {k: cp.asarray(v) for k, v in ops.items()}
    be = get_backend("cuda")
    be.timing = False
    y = scanweaver.selective_scan(**dev)
    assert isinstance(y, cp.ndarray) and y.shape == (3, 5, 700)
    assert np.isnan(be.last_ms), "no events are recorded unless timing is asked for"
    np.testing.assert_allclose(y.get(), loop_reference(**ops)[0], **TOL)


def test_timing_records_device_time(rng, cp):
    ops = {k: cp.asarray(v) for k, v in make_operands(rng, (4, 3000), np.float32).items()}
    be = get_backend("cuda")
    be.timing = True
    try:
        scanweaver.selective_scan(**ops)
        assert be.last_ms > 0
    finally:
        be.timing = False


def test_launches_on_the_current_cupy_stream(rng, cp):
    ops = make_operands(rng, (8, 4099), np.float32)
    with cp.cuda.Stream(non_blocking=True) as stream:
        dev = {k: cp.asarray(v) for k, v in ops.items()}
        y = scanweaver.selective_scan(**dev, schedule="reduce_then_scan")
        stream.synchronize()
        np.testing.assert_allclose(y.get(), loop_reference(**ops)[0], **TOL)


def test_non_contiguous_operands_are_copied_once(rng, cp):
    ops = make_operands(rng, (6, 400), np.float32)
    wide = {k: cp.asarray(np.concatenate([v, v], axis=1))[:, ::2] for k, v in ops.items()}
    assert not wide["a"].flags.c_contiguous
    y = scanweaver.selective_scan(**wide)
    ref = {k: v[:, ::2] for k, v in ((k, np.concatenate([v, v], axis=1)) for k, v in ops.items())}
    np.testing.assert_allclose(y.get(), loop_reference(**ref)[0], **TOL)


def test_device_out_is_written_in_place(rng, cp):
    ops = make_operands(rng, (4, 999), np.float32)
    dev = {k: cp.asarray(v) for k, v in ops.items()}
    out = cp.full((4, 999), np.nan, cp.float32)
    y = scanweaver.selective_scan(**dev, out=out)
    assert y is out
    np.testing.assert_allclose(out.get(), loop_reference(**ops)[0], **TOL)
    with pytest.raises(scanweaver.ScanInputError, match="out"):
        scanweaver.selective_scan(**dev, out=np.empty((4, 999), np.float32))


def test_empty_inputs_come_back_as_device_arrays(cp):
    z = cp.zeros((2, 3, 0), cp.float32)
    h0 = cp.ones((2, 3), cp.float32)
    y, h = scanweaver.selective_scan(z, z, z, z, h0=h0, return_state=True)
    assert isinstance(y, cp.ndarray) and y.shape == (2, 3, 0)
    assert isinstance(h, cp.ndarray) and bool((h == 1).all()) and h.data.ptr != h0.data.ptr


def test_cuda_array_interface_producers(rng, cp):
    class Foreign:
        def __init__(self, arr):
            self._arr = arr
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    ops = make_operands(rng, (2, 300), np.float32)
    y = scanweaver.selective_scan(**{k: Foreign(cp.asarray(v)) for k, v in ops.items()})
    assert isinstance(y, cp.ndarray)
    np.testing.assert_allclose(y.get(), loop_reference(**ops)[0], **TOL)


def test_torch_tensors_through_dlpack_on_torch_stream(rng):
    torch = _torch_cuda()
    ops = make_operands(rng, (2, 64, 1000), np.float32)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dev = {k: torch.from_numpy(v).cuda() for k, v in ops.items()}
        h0 = torch.randn(2, 64, device="cuda")
        y, h = scanweaver.selective_scan(**dev, h0=h0, return_state=True)
        assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == (2, 64, 1000)
        out = torch.empty_like(dev["a"])
        assert scanweaver.selective_scan(**dev, out=out) is out
    stream.synchronize()
    ey, eh = loop_reference(**ops, h0=h0.cpu().numpy())
    np.testing.assert_allclose(y.cpu().numpy(), ey, **TOL)
    np.testing.assert_allclose(h.cpu().numpy(), eh, **TOL)
    np.testing.assert_allclose(out.cpu().numpy(), loop_reference(**ops)[0], **TOL)


def test_empty_torch_inputs_come_back_as_tensors():
    torch = _torch_cuda()
    z = torch.zeros(3, 0, device="cuda")
    assert isinstance(scanweaver.selective_scan(z, z, z, z), torch.Tensor)


def test_module_cache_is_keyed_by_device(rng, cp):
    be = get_backend("cuda")
    scanweaver.selective_scan(*(cp.asarray(v) for v in make_operands(rng, (2, 50), np.float32).values()))
    assert all(key[0] == cp.cuda.Device().id for key in be._functions)


@pytest.mark.parametrize("schedule", ["hybrid", "reduce_then_scan", "lookback", "blelloch", "sequential"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_schedule_on_device(rng, cp, schedule, dtype):
    ops = make_operands(rng, (3, 20001), dtype)
    h0 = rng.standard_normal(3).astype(dtype)
    y, h = scanweaver.selective_scan(**{k: cp.asarray(v) for k, v in ops.items()}, h0=cp.asarray(h0),
                                     reverse=True, return_state=True, schedule=schedule)
    ey, eh = loop_reference(**ops, h0=h0, reverse=True)
    tol = TOL if dtype == np.float32 else {"rtol": 1e-9, "atol": 1e-9}
    np.testing.assert_allclose(y.get(), ey, **tol)
    np.testing.assert_allclose(h.get(), eh, **tol)


def test_repeated_calls_launch_the_plan_on_the_callers_stream(rng, cp):
    from scanweaver.api import SELECTIVE
    from scanweaver.runtime.device_plan import DevicePlan

    be = get_backend("cuda")
    be.timing = False
    SELECTIVE._plans.clear()
    with cp.cuda.Stream(non_blocking=True) as stream:
        for schedule in ("hybrid", "reduce_then_scan", "lookback"):
            for _ in range(3):  # the first call plans, the later ones launch the plan
                ops = make_operands(rng, (4, 3001), np.float32)
                dev = [cp.asarray(v) for v in ops.values()]
                out = cp.empty((4, 3001), cp.float32)
                y, h = scanweaver.selective_scan(*dev, schedule=schedule, return_state=True)
                assert scanweaver.selective_scan(*dev, schedule=schedule, out=out) is out
                stream.synchronize()
                ey, eh = loop_reference(**ops)
                np.testing.assert_allclose(y.get(), ey, **TOL)
                np.testing.assert_allclose(h.get(), eh, **TOL)
                np.testing.assert_allclose(out.get(), ey, **TOL)
    plans = [p for p in SELECTIVE._plans.values() if isinstance(p, DevicePlan)]
    assert len(plans) == 6 and all(p.stream is None for p in plans)
    with pytest.raises(scanweaver.ScanInputError, match="out overlaps operand a"):
        scanweaver.selective_scan(*dev, schedule="hybrid", out=dev[0])


def test_repeated_torch_calls_use_the_plan_on_torchs_stream(rng):
    torch = _torch_cuda()
    from scanweaver.api import SELECTIVE
    from scanweaver.runtime.device_plan import DevicePlan

    SELECTIVE._plans.clear()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            ops = make_operands(rng, (2, 32, 700), np.float32)
            y = scanweaver.selective_scan(*(torch.from_numpy(v).cuda() for v in ops.values()))
            assert isinstance(y, torch.Tensor) and y.is_cuda
            stream.synchronize()
            np.testing.assert_allclose(y.cpu().numpy(), loop_reference(**ops)[0], **TOL)
    plans = [(k, p) for k, p in SELECTIVE._plans.items() if isinstance(p, DevicePlan)]
    # the tensors reach the plan as CuPy views with PyTorch's stream made CuPy's current one: the plan is keyed
    # by that stream and launches on CuPy's current stream (no stream of its own)
    assert len(plans) == 1 and plans[0][1].stream is None
    assert int(stream.cuda_stream) in plans[0][0], "the plan is keyed by PyTorch's current stream"
