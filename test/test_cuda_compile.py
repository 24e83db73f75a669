"""CUDA C of every GPU schedule compiles with nvcc (PTX and sm_90 cubin); skipped where nvcc is absent.

Nothing runs here: this checks the emitted source, including tunables
injected the way Kernel Tuner does (``-D<name>=<value>`` before the guarded
defaults).  Correctness of the same kernel text is checked on OpenCL.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver.ir.stages import Features
from scanweaver.targets.gpu import emit_source
from scanweaver.targets.gpu import SCHEDULES
from scanweaver.tools.ptxas import matrix_configurations, matrix_report, nvcc_version

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")

ALL = Features(reverse=True, has_h0=True, has_reset=True, return_state=True)
GPU_SCHEDULES = sorted(SCHEDULES)


@scanweaver.recurrence
def gated(h, dt, x, w):
    h_new = np.exp(-scanweaver.softplus(dt)) * h + x
    return h_new, w * h_new + 0.5 * h


def nvcc(tmp_path, source: str, *flags: str) -> str:
    """Compiles ``source``; returns nvcc's diagnostics, failing the test with them on error."""
    path = tmp_path / "kernel.cu"
    path.write_text(source)
    out = tmp_path / "kernel.out"
    proc = subprocess.run([NVCC, *flags, "-o", str(out), str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"nvcc {' '.join(flags)} failed:\n{proc.stderr}\n{source}"
    assert out.stat().st_size > 0
    return proc.stderr


@pytest.mark.parametrize("schedule", GPU_SCHEDULES)
def test_selective_scan_compiles_to_ptx_and_sm90(tmp_path, schedule):
    stages = scanweaver.api.SELECTIVE.lower(backend="numpy", schedule=schedule, features=ALL)
    source = emit_source(stages, "cuda")
    assert "warning" not in nvcc(tmp_path, source, "-ptx")
    ptx = (tmp_path / "kernel.out").read_text()
    for launch in SCHEDULES[schedule].plan(stages.schedule.config, 3, 1000).launches:
        assert f".entry {launch.kernel}(" in ptx
    nvcc(tmp_path, source, "-cubin", "-arch=sm_90")


@pytest.mark.parametrize("schedule", GPU_SCHEDULES)
def test_float64_custom_recurrence_compiles(tmp_path, schedule):
    stages = gated.lower(backend="numpy", schedule=schedule, dtype="float64", features=Features(has_h0=True))
    source = emit_source(stages, "cuda")
    assert "double" in source
    nvcc(tmp_path, source, "-cubin", "-arch=sm_90")


@pytest.mark.parametrize("schedule", ["hybrid", "lookback"])
def test_injected_tunables_override_the_defaults(tmp_path, schedule):
    stages = scanweaver.api.SELECTIVE.lower(backend="numpy", schedule=schedule)
    source = emit_source(stages, "cuda")
    nvcc(tmp_path, source, "-ptx", "-Dworkgroup_size=64", "-Ditems_per_thread=3")
    injected = (tmp_path / "kernel.out").read_text()
    nvcc(tmp_path, source, "-ptx")
    default = (tmp_path / "kernel.out").read_text()
    assert ".shared" in injected and injected != default, "the -D values did not change the kernel"


@pytest.mark.parametrize("schedule", GPU_SCHEDULES)
def test_every_kernel_declares_its_launch_bounds(tmp_path, schedule):
    """``__launch_bounds__(workgroup_size)`` reaches the PTX as ``.maxntid``: ptxas budgets registers for it."""
    stages = scanweaver.api.SELECTIVE.lower(backend="numpy", schedule=schedule)
    nvcc(tmp_path, emit_source(stages, "cuda"), "-ptx", "-Dworkgroup_size=512")
    ptx = (tmp_path / "kernel.out").read_text()
    entries = ptx.count(".entry ")
    assert entries >= 1 and ptx.count(".maxntid 512, 1, 1") == entries


def test_lookback_votes_and_reduces_across_a_warp(tmp_path):
    """The look-back inspects its window with a warp ballot and shuffles, not one thread walking back."""
    stages = scanweaver.api.SELECTIVE.lower(backend="numpy", schedule="lookback")
    nvcc(tmp_path, emit_source(stages, "cuda"), "-ptx")
    ptx = (tmp_path / "kernel.out").read_text()
    assert "vote.sync.ballot" in ptx and "shfl.sync.down" in ptx
    assert "atom.global.exch.b64" in ptx, "float32 states are published packed with their status in one word"


@scanweaver.recurrence
def masked(h, g, x):
    return np.clip(g, 0.0, 0.99) * h + np.where(x > 0, x, 0.1 * x) * (x != 0.5)


def test_comparisons_and_where_compile(tmp_path):
    stages = masked.lower(backend="numpy", schedule="reduce_then_scan", dtype="float32")
    source = emit_source(stages, "cuda")
    assert "!= 0 ?" in source
    nvcc(tmp_path, source, "-cubin", "-arch=sm_90")


MATRIX = matrix_configurations()


@pytest.mark.parametrize("index", range(len(MATRIX)), ids=[f"{e['label']}-{e['dtype']}" for e in MATRIX])
def test_matrix_state_kernels_at_the_model_shapes_spill_nothing(index):
    """Every matrix-state kernel at the model shapes (the recurrent ones, the chunked forward's and backward's)
    compiles for sm_90 without spills or a stack frame; with
    the nvcc that made ``test/data/ptxas_matrix_state_sm90.json``, ptxas reports exactly what it records."""
    report = matrix_report(MATRIX[index], nvcc=NVCC)
    # 4 recurrent, 4 chunked forward, 5 more of the chunked backward
    assert len(report) == 13 and not any("error" in r for r in report.values()), report
    for name, r in report.items():
        assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0 and r["registers"] <= 255, (name, r)
    doc = json.loads((Path(__file__).parent / "data" / "ptxas_matrix_state_sm90.json").read_text())
    if nvcc_version(NVCC) == doc["nvcc"]:
        assert report == doc["entries"][index]["kernels"], "regenerate: python -m scanweaver.tools.ptxas --matrix-state"
