"""The fused Mamba-1 scan of ScanWeaver.jl, checked without Julia: its golden vectors and its Python facade.

The Julia kernel itself runs in ``test/runtests.jl`` (against the same golden files) wherever Julia exists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanInputError
from scanweaver.runtime import REGISTRY
from scanweaver.tools import golden_mamba

GOLDEN = Path(__file__).parent / "golden" / "mamba"
FILES = sorted(GOLDEN.glob("*.toml"))


def test_mamba_golden_files_cover_the_layouts_and_options():
    assert {f.stem for f in FILES} == {c.name for c in golden_mamba.MAMBA_CASES}
    assert all(f.stat().st_size < 80_000 for f in FILES)  # forward and backward vectors
    gs = [golden_mamba.load(f) for f in FILES]
    assert all(g["kind"] == "mamba" for g in gs)
    groups = {g["groups_b"] for g in gs} | {g["groups_c"] for g in gs}
    assert {0, 1} <= groups and max(groups) > 1
    assert {g["dtype"] for g in gs} == {"float32", "float64"}
    assert {g["state_size"] for g in gs} >= {1, 16}
    for key in ("D", "z", "delta_bias", "h0", "cu_seqlens"):
        assert any(key in g for g in gs) and not all(key in g for g in gs), key
    assert {g["delta_softplus"] for g in gs} == {False, True}
    assert any(g["shape"][2] == 1 for g in gs)


def _run(g: dict, backend: str) -> tuple[np.ndarray, np.ndarray]:
    return scanweaver.mamba_selective_scan(
        g["u"], g["delta"], g["A"], g["B"], g["C"], D=g.get("D"), z=g.get("z"), delta_bias=g.get("delta_bias"),
        delta_softplus=g["delta_softplus"], h0=g.get("h0"), return_state=True, cu_seqlens=g.get("cu_seqlens"),
        backend=backend)


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_mamba_golden_files_against_the_python_paths(path):
    g = golden_mamba.load(path)
    rtol = {"float32": 2e-4, "float64": 1e-10}[g["dtype"]]
    scale = max(1.0, float(np.abs(g["y"]).max()))
    backends = ["numpy"] + (["cpu"] if REGISTRY["cpu"].availability().ok else [])
    for backend in backends:
        y, h = _run(g, backend)
        np.testing.assert_allclose(y, g["y"], rtol=rtol, atol=rtol * scale, err_msg=backend)
        np.testing.assert_allclose(h, g["h_last"], rtol=rtol, atol=rtol * scale, err_msg=backend)


def test_the_julia_backend_renders_the_fused_forward_and_backward():
    from scanweaver.fused import REGISTRY as FUSED
    from scanweaver.fused.mamba1 import JULIA_TUNABLES
    from scanweaver.julia.backend import RUNNERS
    from scanweaver.julia.devices import DEVICES

    assert FUSED.get("mamba1").runs_on("julia", "forward") and FUSED.get("mamba1").runs_on("julia", "backward")
    assert {"mamba1", "matrix_state"} <= set(REGISTRY["julia"].fused)
    assert set(RUNNERS) == set(REGISTRY["julia"].fused)
    device = next(t for t in JULIA_TUNABLES if t.name == "device")
    assert device.values == tuple(DEVICES)


def test_julia_run_fused_checks_buffers_before_starting_julia():
    from scanweaver.fused import REGISTRY as FUSED
    from scanweaver.fused.mamba1 import Mamba1Features
    from scanweaver.julia.backend import JuliaBackend

    op = FUSED.get("mamba1")
    u = np.ones((1, 2, 3), np.float32)
    arrays = {"u": u, "delta": u, "A": -np.ones((2, 4), np.float32), "B": np.ones((1, 1, 4, 2), np.float32),
              "C": np.ones((2, 4), np.float32), "y": np.empty_like(u), "hlast": None}
    sizes = {"batch": 1, "dim": 2, "L": 3, "groups_b": 1, "groups_c": 0}
    call = op.call("forward", Mamba1Features("float32", 4, c_fixed=True),
                   op.resolve("julia", {}, {}, "test"))
    with pytest.raises(ScanInputError, match="B"):
        JuliaBackend().run_fused(call, arrays, sizes)
    with pytest.raises(ScanInputError, match="device='tpu'"):
        op.resolve("julia", {"device": "tpu"}, {}, "test")


def test_julia_mamba_without_julia_fails_fast_and_clearly():
    code = ("import time, numpy as np, scanweaver\n"
            "u = np.ones((1, 2, 3)); t = time.perf_counter()\n"
            "try:\n"
            "    scanweaver.mamba_selective_scan(u, u, -np.ones((2, 4)), np.ones((1, 4, 3)), np.ones((1, 4, 3)),\n"
            "                                    backend='julia', device='cpu')\n"
            "except scanweaver.BackendUnavailable as exc:\n"
            "    print(f'{time.perf_counter() - t:.3f}'); print(exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_JULIACALL_")}  # no Julia named
    env = {**env, "PATH": "/usr/bin:/bin", "PYTHON_JULIAPKG_EXE": "",
           "PYTHON_JULIAPKG_PROJECT": "/nonexistent/env"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    seconds, message = proc.stdout.strip().split("\n", 1)
    assert float(seconds) < 5 and "julia" in message.lower()
