"""The ``iree`` backend on ``llvm-cpu`` against the float64 oracle, and every module compiled for the GPU targets.

Needs ``scanweaver[iree]`` (iree-base-compiler, iree-base-runtime); every test skips with the
reason without it.  Modules are compiled once per configuration (the backend keeps them in
memory and in the cache directory), so the problems below share a few configurations.
The GPU targets are compiled, not run: no GPU is attached here (``bench/gpu_session.sh`` runs
the cuda module on the H200).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanInputError
from scanweaver.ir.stages import Features
from scanweaver.passes import lower
from scanweaver.targets.mlir_target import MLIRRenderer
from conftest import loop_reference

pytestmark = pytest.mark.skipif(importlib.util.find_spec("iree") is None
                                or importlib.util.find_spec("iree.runtime") is None,
                                reason="IREE is not installed (pip install scanweaver[iree])")

#: The golden suite's configurations (smallest candidates), so modules compiled there serve here too.
CONFIGS = {"sequential": {}, "chunked": {"chunk": 256}, "blelloch": {"workgroup_size": 32}}
#: Lengths at and around the block and chunk boundaries, and the shortest.
LENGTHS = (1, 63, 64, 65, 300, 513)


def _problem(rng, lanes: int, L: int, dtype):
    a = rng.uniform(0.3, 1.0, (lanes, L))
    b, x, c = (rng.standard_normal((lanes, L)) for _ in range(3))
    return [v.astype(dtype) for v in (a, b, x, c)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("schedule", sorted(CONFIGS))
def test_every_schedule_and_feature_matches_the_float64_loop(rng, schedule, dtype):
    tol = 3e-4 if dtype == np.float32 else 1e-10
    for L in LENGTHS:
        for reverse, with_state in ((False, False), (True, True)):
            a, b, x, c = _problem(rng, 3, L, dtype)
            h0 = rng.standard_normal(3).astype(dtype) if with_state else None
            reset = rng.random((3, L)) < 0.1 if with_state else None
            kept = [v.copy() for v in (a, b, x, c)] + ([h0.copy()] if with_state else [])
            y, h_last = scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=reverse, return_state=True,
                                                  backend="iree", schedule=schedule, **CONFIGS[schedule])
            want, want_h = loop_reference(a, b, x, c, h0=h0, reset=reset, reverse=reverse)
            assert y.dtype == dtype and h_last.shape == (3,)
            np.testing.assert_allclose(y, want, rtol=tol, atol=tol * 10, err_msg=f"L={L} reverse={reverse}")
            np.testing.assert_allclose(h_last, want_h, rtol=tol, atol=tol * 10)
            for before, after in zip(kept, [a, b, x, c, h0], strict=False):
                np.testing.assert_array_equal(before, after)  # the module never writes its operands


def test_packed_sequences_scalar_operands_and_batch_shapes(rng):
    a, b, x, c = _problem(rng, 4, 65, np.float64)
    cu = np.array([0, 7, 30, 65])
    got = scanweaver.selective_scan(a, b, x, c, cu_seqlens=cu, backend="iree", schedule="chunked", chunk=256)
    want = scanweaver.selective_scan(a, b, x, c, cu_seqlens=cu, backend="numpy")
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)

    @scanweaver.recurrence
    def ema(h, alpha, x):
        return alpha * h + (1 - alpha) * x

    xs = rng.standard_normal((2, 3, 63))
    np.testing.assert_allclose(ema(0.8, xs, backend="iree"), ema(0.8, xs, backend="numpy"), rtol=1e-12)
    y = scanweaver.selective_scan(*(v.reshape(2, 2, 65) for v in (a, b, x, c)), backend="iree")
    assert y.shape == (2, 2, 65) and scanweaver.api.SELECTIVE.last.backend == "iree"


def test_what_the_backend_cannot_run_is_refused_with_its_name(rng):
    @scanweaver.recurrence(state_size=2)
    def osc(h, p, x):
        return (p * h[0] - 0.5 * h[1] + x, h[0])

    p = rng.uniform(0.1, 0.5, (2, 9))
    with pytest.raises(ScanInputError, match="backend 'iree' does not run dense transitions"):
        osc(p, p, backend="iree")
    a, b, x, c = _problem(rng, 2, 9, np.float64)
    with pytest.raises(ScanInputError, match="device='tpu' is invalid: it must be one of llvm-cpu, cuda"):
        scanweaver.selective_scan(a, b, x, c, backend="iree", device="tpu")
    with pytest.raises(ScanInputError, match="iree"):
        scanweaver.selective_scan(*(v.astype(np.complex128) for v in (a, b, x, c)), backend="iree")
    with pytest.raises(ScanInputError, match="iree"):
        scanweaver.selective_scan(a, b, x, c, backend="iree", schedule="lookback")


def test_compiled_modules_are_cached_by_content(tmp_path):
    from scanweaver.runtime.iree_backend import compile_module

    stages = lower(scanweaver.api.SELECTIVE.scan_ir("float32", Features()), "sequential", {}, ())
    text = MLIRRenderer().render(stages)
    first = compile_module(text, "llvm-cpu", tmp_path)
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".vmfb"
    mtime = files[0].stat().st_mtime_ns
    assert compile_module(text, "llvm-cpu", tmp_path) == first and files[0].stat().st_mtime_ns == mtime


def test_devices_lists_the_iree_drivers():
    from scanweaver.cli.devices import backend_rows

    row = next(r for r in backend_rows() if r["backend"] == "iree")
    assert row["available"] and set(row["schedules"]) == set(CONFIGS)
    assert row["details"]["driver local-task"] and "device=cuda" in row["details"]


#: GPU targets compiled here (not run): the compile options are :func:`~scanweaver.runtime.iree_devices.compile_flags`.
GPU_DEVICES = ("cuda", "rocm", "vulkan", "metal")
#: Schedules whose modules IREE 3.13 compiles for every GPU target.  ``blelloch`` compiles and runs on
#: llvm-cpu only: its tree levels (strided slices of one block) fail in IREE's GPU pipelines
#: (cuda: "LLVM Translation failed for operation: builtin.unrealized_conversion_cast"; vulkan-spirv and
#: metal-spirv: "failed to legalize operation 'hal.interface.binding.subspan'").
GPU_SCHEDULES = ("sequential", "chunked")


@pytest.mark.skipif(not os.environ.get("SCANWEAVER_IREE_GPU_COMPILE"),
                    reason="GPU compiles take 10-60 s each; CI runs them (.ci/run sets SCANWEAVER_IREE_GPU_COMPILE=1)")
@pytest.mark.parametrize("device", GPU_DEVICES)
def test_the_gpu_schedules_compile_for_every_gpu_target(device):
    from scanweaver.runtime.iree_backend import compile_module
    from scanweaver.runtime.iree_devices import compile_flags

    feats = Features(reverse=True, has_h0=True, has_reset=True, return_state=True)  # every feature on
    for schedule in GPU_SCHEDULES:
        stages = lower(scanweaver.api.SELECTIVE.scan_ir("float32", feats), schedule, CONFIGS[schedule], ())
        vmfb = compile_module(MLIRRenderer().render(stages), device)  # cached: a rerun compiles nothing
        assert len(vmfb) > 1000, (device, schedule, compile_flags(device))


@pytest.mark.skipif(importlib.util.find_spec("kernel_tuner") is None, reason="Kernel Tuner is not installed")
def test_kernel_tuner_times_real_iree_modules(tmp_path, monkeypatch):
    from scanweaver.tuning import tune

    monkeypatch.chdir(tmp_path)
    report = tune("selective_scan", backend="iree", shape=(2, 70), schedule=("chunked", "sequential"),
                  values={"chunk": [256]}, record=False, progress=False)
    assert report.best is not None and report.backend == "iree"
    assert {e.schedule for e in report.ok} == {"chunked", "sequential"}  # both ran and verified
    assert all(e.time_ms > 0 for e in report.ok)
