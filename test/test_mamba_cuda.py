"""Mamba-1 on CUDA tensors stays on the device: operands checked and converted there, the fused CUDA kernels,
results handed back through DLPack on PyTorch's stream.

The device checks of the fused operation and the array-module path of the
operands run everywhere (NumPy as the array module, stand-in device arrays);
the CUDA run needs a GPU (``bench/gpu_session.sh`` runs it) and skips with the
reason elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.benchmarks import model_refs
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.ops.mamba1.operands import prepare
from scanweaver.runtime import REGISTRY

from mamba_oracle import extras, operands


class DeviceStandIn:
    """A device array as the fused operation's checks see it: protocol, dtype, shape and C order."""

    def __init__(self, arr: np.ndarray):
        self.dtype, self.shape, self.flags = arr.dtype, arr.shape, arr.flags
        self.__cuda_array_interface__ = {"data": (arr.ctypes.data, False), "shape": arr.shape, "typestr": arr.dtype.str,
                                         "strides": None, "version": 3}


def _raw(rng, bshape="step", dtype=np.float64) -> dict:
    return {**operands(rng, 2, 6, 3, 17, bshape, "step", dtype=dtype), **extras(rng, 2, 6, 3, 17, dtype)}


def _forward_args(rng, dtype=np.float32):
    ops = prepare(**_raw(rng, dtype=dtype))
    call = FUSED.get("mamba1").call("forward", ops.features(), {"workgroup_size": 32, "items_per_thread": 8})
    return ops, call


def test_fused_arguments_take_device_arrays_in_place_and_check_them(rng):
    ops, call = _forward_args(rng)
    op = FUSED.get("mamba1")
    arrays = {k: (DeviceStandIn(v) if v is not None else None) for k, v in ops.arrays().items()}
    y = DeviceStandIn(np.empty(ops.u.shape, np.float32))
    args = op.arguments("forward", call.features, {**arrays, "y": y}, ops.sizes, "test")
    assert args[0] is arrays["u"] and any(a is y for a in args), "device arrays are passed as they are"
    bad = DeviceStandIn(ops.u.astype(np.float64))
    with pytest.raises(scanweaver.ScanInputError, match="u has dtype float64; the kernel was built for float32"):
        op.arguments("forward", call.features, {**arrays, "u": bad, "y": y}, ops.sizes, "test")
    with pytest.raises(scanweaver.ScanInputError, match=r"delta has shape \(2, 6, 16\)"):
        short = DeviceStandIn(np.ascontiguousarray(ops.delta[..., :16]))
        op.arguments("forward", call.features, {**arrays, "delta": short, "y": y}, ops.sizes, "test")
    with pytest.raises(scanweaver.ScanInputError, match="B must be a C-contiguous device array"):
        strided = DeviceStandIn(np.asfortranarray(ops.B))
        op.arguments("forward", call.features, {**arrays, "B": strided, "y": y}, ops.sizes, "test")


def test_operands_through_an_array_module_stay_in_it(rng, monkeypatch):
    from device_standin import DeviceArray, device, install, xp

    install(monkeypatch)
    raw = _raw(rng, "group")
    dev = {k: device(v) if isinstance(v, np.ndarray) else v for k, v in raw.items()}
    ops = prepare(**dev, xp=xp)
    host = prepare(**raw)
    for k, v in ops.arrays().items():
        assert (v is None) == (host.arrays()[k] is None)
        if v is not None:
            assert isinstance(v, DeviceArray), k
            np.testing.assert_array_equal(v._a, host.arrays()[k])
    with pytest.raises(scanweaver.ScanInputError, match="A is a list; with device operands every array"):
        prepare(**{**dev, "A": raw["A"].tolist()}, xp=xp)


def _cuda_torch():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    avail = REGISTRY["cuda"].availability()
    if not avail.ok or not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device with CuPy: {avail.reason or 'PyTorch sees no CUDA device'}")
    return torch


def test_cuda_tensors_stay_on_the_device_with_gradients(monkeypatch):
    torch = _cuda_torch()
    import cupy

    import scanweaver.torch as swt

    def no_host(*a, **k):
        raise AssertionError("a CUDA tensor's data went through host memory")

    monkeypatch.setattr(cupy, "asnumpy", no_host)
    shape = (2, 48, 8, 333)
    ins = {k: v.requires_grad_(True) for k, v in model_refs.inputs("mamba1", shape, torch.float32, "cuda").items()}
    w = torch.randn(shape[0], shape[1], shape[3], dtype=torch.float64)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = swt.mamba_selective_scan(ins["u"], ins["delta"], ins["A"], ins["B"], ins["C"], ins["D"],
                                     delta_bias=ins["delta_bias"], delta_softplus=True)
        (y * w.to("cuda", torch.float32)).sum().backward()
    stream.synchronize()
    assert y.is_cuda and scanweaver.mamba.last is not None and scanweaver.mamba.last.backend == "cuda"
    ref_y, ref_g = model_refs.reference("mamba1", ins, w)
    scale = float(ref_y.abs().max())
    assert float((y.detach().cpu().double() - ref_y).abs().max()) <= 2e-4 * scale
    for k, v in ins.items():
        g = ref_g[k]
        assert v.grad is not None and v.grad.is_cuda, k
        assert float((v.grad.cpu().double() - g).abs().max()) <= 2e-3 * float(g.abs().max()), k
