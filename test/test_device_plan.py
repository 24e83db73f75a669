"""Call plans for CUDA device arrays, checked without a GPU.

Stand-in device arrays expose host memory through ``__cuda_array_interface__``
(their own library, registered as a :class:`~scanweaver.runtime.device_plan.Family`
with a stand-in current stream).  The ``cuda`` backend's planned launch is
recorded and replayed with the same arguments on the ``opencl`` backend (PoCL),
which renders the same GPU kernels with the same argument order from the same
stages, so the numbers a planned call would produce are checked against the
float64 loop.  The CUDA launch itself runs only on a GPU
(``test_cuda_device_arrays.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from conftest import loop_reference, make_operands
from scanweaver.core import fastpath
from scanweaver.api import SELECTIVE, CallInfo
from scanweaver.ir.stages import Features
from scanweaver.runtime import REGISTRY, ScanArrays, get_backend
from scanweaver.runtime.cuda_backend import CUDABackend
from scanweaver.runtime.device_plan import FAMILIES, Family, PlanMismatch, call_key, interface
from scanweaver.targets.gpu import Launch, Plan

OCL = REGISTRY["opencl"].availability()
MEMORY: dict[int, np.ndarray] = {}
CURRENT = {"stream": 7}


class StandIn:
    """Host memory behind ``__cuda_array_interface__``, on stand-in device ``device_id``."""

    def __init__(self, arr: np.ndarray, device_id: int = 0, readonly: bool = False):
        self.host, self.device_id = arr, device_id
        MEMORY[arr.ctypes.data] = arr
        self.__cuda_array_interface__ = {"data": (arr.ctypes.data, readonly), "shape": arr.shape,
                                         "strides": None if arr.flags.c_contiguous else arr.strides,
                                         "typestr": arr.dtype.str, "version": 3}

    @property
    def shape(self):
        return self.host.shape

    @property
    def dtype(self):
        return self.host.dtype


class Replay(CUDABackend):
    """The ``cuda`` backend with its device primitives recorded and replayed on OpenCL."""

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[tuple] = []

    def planned_kernel(self, source, step, stages=None):
        return (step, stages)

    def plan_scratch(self, sizes, stream):
        # garbage, not zeros: a kernel that relies on zeroed scratch must get it from the plan
        return {k: StandIn(np.full(n, -7, dtype) if dtype.kind == "i" else np.full(n, 3, dtype))
                for k, (n, dtype) in sizes.items()}

    def launch_planned(self, kernels, args, stream, zeros=()):
        self.launched.append((tuple(k[0][0].kernel for k in kernels), args, stream, zeros))
        for ptr, nbytes in zeros:
            MEMORY[ptr].reshape(-1).view(np.uint8)[:nbytes] = 0
        ocl = get_backend("opencl")
        stages = ocl.emit(kernels[0][0][1])
        dev = [ocl.to_device(MEMORY[int(a)].reshape(-1)) if isinstance(a, np.uint64) else a for a in args]
        ocl.launch(stages.kernel, Plan(launches=tuple(Launch(k[0].kernel, g, b) for k, g, b in kernels)), dev,
                   stages)
        for a, d in zip(args, dev, strict=True):
            if isinstance(a, np.uint64):
                MEMORY[int(a)].reshape(-1)[...] = ocl.to_host(d)


@pytest.fixture(autouse=True)
def family(monkeypatch):
    fam = Family(device=lambda v: v.device_id, stream=lambda v, d: CURRENT["stream"],
                 launch_stream=lambda v, d: ("stream", CURRENT["stream"]),
                 empty=lambda shape, dtype, device, stream: StandIn(np.full(shape, np.nan, dtype), device))
    monkeypatch.setitem(FAMILIES, __name__.split(".")[-1], fam)
    CURRENT["stream"] = 7
    yield fam
    MEMORY.clear()


def _plan(be, ops: dict, h0=None, reset=None, out=None, *, schedule="hybrid", reverse=False, return_state=False,
          **cfg):
    """A device plan built the way the full path builds one after a call."""
    first = next(iter(ops.values()))
    shape, dtype = first.shape, first.dtype
    feats = Features(reverse=reverse, has_h0=h0 is not None, has_reset=reset is not None, return_state=return_state)
    stages = SELECTIVE.lower(backend="cuda", schedule=schedule, dtype=dtype.name, features=feats,
                             lanes=int(np.prod(shape[:-1])), L=shape[-1], **cfg)
    lanes, L = int(np.prod(shape[:-1])), shape[-1]
    arrays = ScanArrays(inputs={n: v.host.reshape(lanes, L) for n, v in ops.items()}, h0=None, reset=None,
                        batch_shape=shape[:-1], dtype=dtype)
    info = CallInfo("cuda", schedule, stages.schedule.config, "explicit", stages)
    values = (*ops.values(), h0, reset, out)
    return fastpath.build_device(SELECTIVE, be, stages, arrays, info, values, return_state, from_store=False)


def _views(ops, h0=None, reset=None, out=None, flags=("f",)):
    return call_key((*ops.values(), h0, reset, out), flags)


@pytest.mark.skipif(not OCL.ok, reason=f"opencl backend unavailable for the replay: {OCL.reason}")
@pytest.mark.parametrize("schedule, cfg", [
    ("hybrid", {"workgroup_size": 64, "items_per_thread": 2, "lanes_per_group": 2}),
    ("reduce_then_scan", {"workgroup_size": 32, "items_per_thread": 2, "tiles_per_block": 2}),
    ("lookback", {"workgroup_size": 32, "items_per_thread": 2}),
])
def test_planned_launch_computes_the_scan(rng, schedule, cfg):
    be = Replay()
    host = make_operands(rng, (2, 3, 301), np.float32)
    h0h, rh = rng.standard_normal((2, 3)).astype(np.float32), rng.random((2, 3, 301)) < 0.05
    for reverse in (False, True):
        ops = {k: StandIn(v) for k, v in host.items()}
        h0, reset = StandIn(h0h), StandIn(rh)
        plan = _plan(be, ops, h0, reset, schedule=schedule, reverse=reverse, return_state=True, **cfg)
        assert plan is not None
        for _ in range(2):  # a repeated call reuses the plan's scratch (zeroed where the schedule needs it)
            key, views = _views(ops, h0, reset)
            y, h = plan.run(views, None)
            ey, eh = loop_reference(**host, h0=h0h, reset=rh, reverse=reverse)
            np.testing.assert_allclose(y.host, ey, rtol=2e-4, atol=2e-4, err_msg=f"{schedule} reverse={reverse}")
            np.testing.assert_allclose(h.host, eh, rtol=2e-4, atol=2e-4)
    names, args, stream, zeros = be.launched[-1]
    assert stream == ("stream", 7), "launched on the caller's stream"
    assert [int(a) for a in args[:4]] == [v.host.ctypes.data for v in ops.values()]
    assert (len(zeros) == 1) == plan.zero_wsi


def test_key_holds_library_device_stream_and_layout(rng):
    ops = {k: StandIn(v) for k, v in make_operands(rng, (4, 64), np.float32).items()}
    key, views = _views(ops)
    assert key is not None and key[1] == "cuda" and key[-1] == 7 and len(views) == 7
    assert [v[0] for v in views[:4]] == [o.host.ctypes.data for o in ops.values()]
    CURRENT["stream"] = 9
    assert _views(ops)[0] != key, "another stream is another plan"
    other = {k: StandIn(v.host.copy(), device_id=1) for k, v in ops.items()}
    assert _views(other)[0] != key, "another device is another plan"
    CURRENT["stream"] = 7
    fresh = {k: StandIn(v.host.copy()) for k, v in ops.items()}
    assert _views(fresh)[0] == key, "new pointers of the same layout use the same plan"
    ops64 = {k: StandIn(v.host.astype(np.float64)) for k, v in ops.items()}
    assert _views(ops64)[0] != key


def test_mixed_or_foreign_values_have_no_key(rng):
    ops = {k: StandIn(v) for k, v in make_operands(rng, (4, 64), np.float32).items()}
    assert _views({**ops, "c": ops["c"].host})[0] is None, "a host array among device arrays"
    split = {**ops, "c": StandIn(ops["c"].host.copy(), device_id=1)}
    assert _views(split)[0] is None, "operands on two devices"
    assert _views(ops, flags=None)[0] is None, "unhashable arguments"

    class Refuses:  # e.g. a PyTorch tensor that needs a gradient refuses the protocol
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("needs grad")

    assert interface(Refuses()) is None
    assert _views({**ops, "a": Refuses()})[0] is None


@pytest.mark.skipif(not OCL.ok, reason=f"opencl backend unavailable for the replay: {OCL.reason}")
def test_checks_of_a_repeated_call(rng):
    be = Replay()
    host = make_operands(rng, (2, 256), np.float32)
    ops = {k: StandIn(v) for k, v in host.items()}
    out = StandIn(np.empty((2, 256), np.float32))
    plan = _plan(be, ops, out=out)
    assert plan is not None
    assert plan.run(_views(ops, out=out)[1], out) is out, "out= is returned as it is"
    with pytest.raises(scanweaver.ScanInputError, match="out is read-only"):
        ro = StandIn(np.empty((2, 256), np.float32), readonly=True)
        plan.run(_views(ops, out=ro)[1], ro)
    with pytest.raises(scanweaver.ScanInputError, match="out overlaps x"):
        alias = StandIn(host["x"])
        plan.run(_views(ops, out=alias)[1], alias)
    raw = np.zeros(2 * 256 * 4 + 4, np.uint8)
    odd = StandIn(raw[1:1 + 2 * 256 * 4].view(np.float32).reshape(2, 256))
    with pytest.raises(PlanMismatch, match="not aligned to 4 bytes"):
        plan.run(_views({**ops, "a": odd})[1], None)
    be.timing = True
    with pytest.raises(PlanMismatch, match="timing"):
        plan.run(_views(ops)[1], None)


def test_calls_that_need_copies_are_not_planned(rng):
    be = Replay()
    host = make_operands(rng, (4, 128), np.float32)
    ops = {k: StandIn(v) for k, v in host.items()}
    strided = {**ops, "a": StandIn(np.repeat(host["a"], 2, axis=1)[:, ::2])}
    assert _plan(be, strided) is None, "a non-contiguous operand is copied by the full path"
    assert _plan(be, ops, reset=StandIn(np.zeros((4, 128), np.float32))) is None, "a float reset mask"
    assert _plan(get_backend("numpy"), ops) is None, "a backend without planned launches"
    assert _plan(be, ops) is not None


def test_repeated_call_through_the_public_api_uses_the_plan(rng, monkeypatch):
    be = Replay()
    monkeypatch.setattr(be, "launch_planned", lambda *a: be.launched.append(a))
    host = make_operands(rng, (3, 128), np.float32)
    ops = {k: StandIn(v) for k, v in host.items()}
    plan = _plan(be, ops)
    key, _ = fastpath.device_call_key(tuple(ops.values()), None, None, None,
                                      fastpath.flags(False, False, "auto", "auto", "auto", {}))
    monkeypatch.setitem(SELECTIVE._plans, key, plan)
    y = scanweaver.selective_scan(*ops.values())
    assert isinstance(y, StandIn) and y.shape == (3, 128) and len(be.launched) == 1
    assert SELECTIVE.last is plan.info
    kernels, args, stream, _ = be.launched[0]
    assert int(args[4]) == y.host.ctypes.data and int(args[8]) == 3 and int(args[9]) == 128
