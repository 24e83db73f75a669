"""ScanWeaver.jl's fused operations from Python: Mamba-1 and the matrix-state family, forward and backward.

Without Julia: the golden files the Julia suite reads (``test/golden/matrix``, the Mamba files' gradients)
against the Python paths, the registry's claims, and the buffer checks that run before Julia starts.
With Julia (``PYTHON_JULIACALL_EXE``/``PROJECT`` naming an environment with ScanWeaver): every public
matrix-state operation and Mamba-1 with ``backend="julia"`` against ``backend="numpy"``, forward and
backward, and a few PyTorch training steps through the Julia backward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scanweaver.runtime import REGISTRY
from scanweaver.tools import golden_mamba, golden_matrix

ROOT = Path(__file__).resolve().parents[1]
MATRIX_FILES = sorted((ROOT / "test" / "golden" / "matrix").glob("*.toml"))
MAMBA_FILES = sorted((ROOT / "test" / "golden" / "mamba").glob("*.toml"))


def _backends() -> list[str]:
    return ["numpy"] + (["cpu"] if REGISTRY["cpu"].availability().ok else [])


def test_matrix_golden_files_cover_the_options():
    assert {f.stem for f in MATRIX_FILES} == {c.name for c in golden_matrix.MATRIX_CASES}
    assert all(f.stat().st_size < 50_000 for f in MATRIX_FILES)
    gs = [golden_matrix.load(f) for f in MATRIX_FILES]
    assert {g["decay"] for g in gs} == {"none", "scalar", "key"}
    assert {g["readout"] for g in gs} == {"after", "bonus"}
    assert {g["dtype"] for g in gs} == {"float32", "float64"}
    assert any(g["reverse"] for g in gs) and any("cu_seqlens" in g for g in gs)
    assert any(g["shape"][1] == 1 for g in gs) and any(g["shape"][2] > g["shape"][3] for g in gs)
    for g in gs:
        assert {"grad_dq", "grad_dk", "grad_dv"} <= set(g)
        assert ("grad_dg" in g) == (g["decay"] != "none") and ("grad_du" in g) == (g["readout"] == "bonus")
        assert ("grad_dh0" in g) == ("h0" in g)


def _matrix_ops(g: dict):
    from scanweaver.ops.matrix_state.operands import operands

    return operands("golden", g["q"], g["k"], g["v"], g.get("g"), decay=g["decay"], readout=g["readout"],
                    u=g.get("u"), h0=g.get("h0"), cu_seqlens=g.get("cu_seqlens"), reverse=g["reverse"])


@pytest.mark.parametrize("path", MATRIX_FILES, ids=[f.stem for f in MATRIX_FILES])
def test_matrix_golden_files_against_the_python_paths(path):
    from scanweaver.ops.matrix_state import kernels

    g = golden_matrix.load(path)
    rtol = {"float32": 2e-4, "float64": 1e-10}[g["dtype"]]
    ops = _matrix_ops(g)
    for backend in _backends():
        o, h = kernels.forward(ops, backend=backend)
        scale = max(1.0, float(np.abs(g["y"]).max()))
        np.testing.assert_allclose(o, g["y"], rtol=rtol, atol=rtol * scale, err_msg=backend)
        np.testing.assert_allclose(h, g["h_last"], rtol=rtol, atol=rtol * scale, err_msg=backend)
        grads = kernels.backward(ops, g["dout"], g["dh_last"], backend=backend)
        for name in golden_matrix.GRADIENTS:
            want = g.get(f"grad_{name}")
            if want is None:
                assert grads[name] is None or name == "dh0", (backend, name)
                continue
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(grads[name], want, rtol=4 * rtol, atol=4 * rtol * scale,
                                       err_msg=f"{backend} {name}")


@pytest.mark.parametrize("path", MAMBA_FILES, ids=[f.stem for f in MAMBA_FILES])
def test_mamba_golden_gradients_against_the_python_paths(path):
    from scanweaver.ops.mamba1 import kernels
    from scanweaver.ops.mamba1.operands import prepare

    g = golden_mamba.load(path)
    rtol = {"float32": 4e-4, "float64": 1e-9}[g["dtype"]]
    assert {f"grad_d{k}" for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0") if k in g} == \
        {k for k in g if k.startswith("grad_")}
    ops = prepare(g["u"], g["delta"], g["A"], g["B"], g["C"], D=g.get("D"), z=g.get("z"),
                  delta_bias=g.get("delta_bias"), delta_softplus=g["delta_softplus"], h0=g.get("h0"),
                  cu_seqlens=g.get("cu_seqlens"))
    for backend in _backends():
        grads = kernels.backward(ops, g["dout"], g["dh_last"], backend=backend)
        for key in (k for k in g if k.startswith("grad_")):
            want = g[key]
            got = np.asarray(grads[key.removeprefix("grad_")]).reshape(want.shape)
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=f"{backend} {key}")


def test_the_julia_backend_renders_the_matrix_state_operation():
    from scanweaver.fused import REGISTRY as FUSED
    from scanweaver.fused.matrix_state import JULIA_TUNABLES
    from scanweaver.julia.devices import DEVICES
    from scanweaver.ops.matrix_state.kernels import runs_matrix_state

    op = FUSED.get("matrix_state")
    assert op.runs_on("julia", "forward") and op.runs_on("julia", "backward")
    assert runs_matrix_state("julia", "forward") and runs_matrix_state("julia", "backward")
    device = next(t for t in JULIA_TUNABLES if t.name == "device")
    assert device.values == tuple(DEVICES)
    assert op.resolve("julia", {}, {}, "test") == {"workgroup_size": 64, "device": "cpu", "algorithm": "recurrent",
                                                   "chunk": 64}


def test_julia_run_fused_checks_matrix_buffers_before_starting_julia():
    from scanweaver.errors import ScanInputError
    from scanweaver.fused import REGISTRY as FUSED
    from scanweaver.fused.matrix_state import MatrixStateFeatures
    from scanweaver.julia.backend import JuliaBackend

    op = FUSED.get("matrix_state")
    q = np.ones((1, 5, 2, 3), np.float32)
    arrays = {"q": q, "k": q, "v": np.ones((1, 5, 2, 4), np.float32), "g": np.zeros((1, 5, 3), np.float32),
              "o": np.empty((1, 5, 2, 4), np.float32), "hlast": None}
    sizes = {"batch": 1, "T": 5, "H": 2, "Hq": 2, "nseq": 1}
    call = op.call("forward", MatrixStateFeatures("float32", 3, 4), op.resolve("julia", {}, {}, "test"))
    with pytest.raises(ScanInputError, match="g has shape"):
        JuliaBackend().run_fused(call, arrays, sizes)
    with pytest.raises(ScanInputError, match="device='tpu'"):
        op.resolve("julia", {"device": "tpu"}, {}, "test")


# --- with Julia ------------------------------------------------------------------------------------------

def _julia_environment() -> dict[str, str]:
    exe, project = os.environ.get("PYTHON_JULIACALL_EXE"), os.environ.get("PYTHON_JULIACALL_PROJECT")
    import importlib.util

    if importlib.util.find_spec("juliacall") is None or not exe or not project or not os.path.isdir(project):
        pytest.skip("needs juliacall and a Julia with an environment holding PythonCall and ScanWeaver, named by "
                    "PYTHON_JULIACALL_EXE/PROJECT (see docs/julia.md)")
    return {"PYTHON_JULIACALL_EXE": exe, "PYTHON_JULIACALL_PROJECT": project}


#: Runs every comparison in one process (Julia starts and compiles once) and prints one JSON object:
#: name -> the largest error relative to the largest reference value, or a list of the losses of a training run.
JULIA_CHECK = r'''
import json, numpy as np, scanweaver
from scanweaver.calls import runner
from scanweaver.ops.matrix_state import kernels as mk
from scanweaver.ops.matrix_state.operands import operands
from scanweaver.ops.mamba1 import kernels as bk
from scanweaver.ops.mamba1.operands import prepare
rng = np.random.default_rng(5)
out = {}

def rel(got, want):
    if got is None or want is None:
        return 0.0 if got is None and want is None else float("inf")
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))

def both(name, fn, last=None):
    got = fn("julia")
    if last is not None:
        out[f"{name}: ran on"] = last().backend
    want = fn("numpy")
    out[name] = max(rel(a, b) for a, b in zip(got, want))

for dtype in ("float32", "float64"):
    B, T, H, Hq, K, V = 2, 37, 4, 2, 8, 6
    q, k = (rng.standard_normal((B, T, Hq, K)).astype(dtype) for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(dtype)
    g = -rng.uniform(0.01, 1, (B, T, H, K)).astype(dtype)
    gh = -rng.uniform(0.01, 1, (B, T, H)).astype(dtype)
    h0 = rng.standard_normal((B, H, K, V)).astype(dtype)
    both(f"linear_attention g {dtype}", lambda be: scanweaver.linear_attention(
        q, k, v, g=g, initial_state=h0, output_final_state=True, backend=be))
    both(f"linear_attention g_head reverse {dtype}", lambda be: scanweaver.linear_attention(
        q, k, v, g_head=gh, reverse=True, output_final_state=True, backend=be))
    both(f"linear_attention decay {dtype}", lambda be: scanweaver.linear_attention(
        q, k, v, decay=np.log(1 - 2.0 ** (-5 - np.arange(H))), output_final_state=True, backend=be))
    cu = np.array([0, 5, 6, 20, T])
    both(f"linear_attention packed {dtype}", lambda be: scanweaver.linear_attention(
        q[:1], k[:1], v[:1], g=g[:1], cu_seqlens=cu, output_final_state=True, backend=be))
    r, kk, w = (rng.standard_normal((B, T, H, K)).astype(dtype) for _ in range(3))
    u = rng.standard_normal((H, K)).astype(dtype)
    both(f"rwkv6 {dtype}", lambda be: scanweaver.rwkv6(r, kk, v, -np.exp(w), u, initial_state=h0,
                                                        output_final_state=True, backend=be))
    x, z = (rng.standard_normal((B, T, H, V)).astype(dtype) for _ in range(2))
    dt, A = rng.standard_normal((B, T, H)).astype(dtype), -rng.uniform(0.5, 2, H).astype(dtype)
    Bm, Cm = (rng.standard_normal((B, T, 2, K)).astype(dtype) for _ in range(2))
    Dm2 = rng.standard_normal(H).astype(dtype)
    both(f"mamba2_scan {dtype}", lambda be: scanweaver.mamba2_scan(
        x, dt, A, Bm, Cm, D=Dm2, z=z, dt_bias=np.zeros(H, dtype),
        dt_softplus=True, return_final_states=True, backend=be))
    for decay, readout, rev, packed in (("scalar", "after", False, False), ("key", "after", True, True),
                                        ("none", "after", False, True), ("key", "bonus", False, False)):
        gg = {"scalar": gh, "key": g, "none": None}[decay]
        ops = operands("check", q[:1] if packed else q, k[:1] if packed else k, v[:1] if packed else v,
                       None if gg is None else (gg[:1] if packed else gg), decay=decay, readout=readout,
                       u=u if readout == "bonus" else None, h0=None if packed else h0,
                       cu_seqlens=cu if packed else None, reverse=rev)
        do = rng.standard_normal(ops.v.shape).astype(dtype)
        dh = rng.standard_normal(ops.state_shape).astype(dtype)
        names = ("dq", "dk", "dv", "dg", "du", "dh0")
        both(f"matrix backward {decay} {readout} reverse={rev} packed={packed} {dtype}",
             lambda be: [mk.backward(ops, do, dh, backend=be)[n] for n in names], lambda: runner.last["matrix_state"])
    L, Dm, N = 45, 5, 4
    ops = prepare(rng.standard_normal((2, Dm, L)).astype(dtype), rng.standard_normal((2, Dm, L)).astype(dtype),
                  -rng.uniform(0.5, 2, (Dm, N)).astype(dtype), rng.standard_normal((2, N, L)).astype(dtype),
                  rng.standard_normal((Dm, N)).astype(dtype), D=rng.standard_normal(Dm).astype(dtype),
                  z=rng.standard_normal((2, Dm, L)).astype(dtype), delta_bias=np.zeros(Dm, dtype),
                  delta_softplus=True, h0=rng.standard_normal((2, Dm, N)).astype(dtype))
    dout = rng.standard_normal((2, Dm, L)).astype(dtype)
    dh = rng.standard_normal((2, Dm, N)).astype(dtype)
    both(f"mamba1 forward {dtype}", lambda be: bk.forward(ops, backend=be, return_state=True),
         lambda: runner.last["mamba1"])
    names = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dh0")
    both(f"mamba1 backward {dtype}", lambda be: [bk.backward(ops, dout, dh, backend=be)[n] for n in names],
         lambda: runner.last["mamba1"])

try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    def train(backend):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, 33, 2, 8, dtype=torch.float64) for _ in range(3))
        gw = torch.zeros(2, 8, dtype=torch.float64, requires_grad=True)
        wv = torch.eye(8, dtype=torch.float64).requires_grad_(True)
        opt = torch.optim.Adam([gw, wv], lr=0.05)
        target = torch.randn(1, 33, 2, 8, dtype=torch.float64)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            g = torch.nn.functional.logsigmoid(gw).expand(1, 33, 2, 8)
            o, _ = scanweaver.linear_attention(q, k, v @ wv, g=g, backend=backend)
            loss = ((o - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses
    out["torch train julia"], out["torch train numpy"] = train("julia"), train("numpy")
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def julia_results() -> dict:
    env = {**os.environ, **_julia_environment(), "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run([sys.executable, "-c", JULIA_CHECK], capture_output=True, text=True, timeout=1800,
                          env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_julia_matrix_state_operations_match_numpy(julia_results):
    errors = {k: v for k, v in julia_results.items() if isinstance(v, float)}
    assert len(errors) == 2 * 12
    bad = {name: err for name, err in errors.items() if not err < (2e-4 if "float32" in name else 1e-10)}
    assert not bad, bad


def test_the_fused_parts_ran_in_julia(julia_results):
    ran = {k: v for k, v in julia_results.items() if k.endswith(": ran on")}
    assert len(ran) == 2 * 6 and set(ran.values()) == {"julia"}, ran


def test_pytorch_trains_through_the_julia_backward(julia_results):
    if "torch train julia" not in julia_results:
        pytest.skip("torch is not installed")
    julia, numpy = julia_results["torch train julia"], julia_results["torch train numpy"]
    np.testing.assert_allclose(julia, numpy, rtol=1e-9)
    assert julia[-1] < julia[0]
