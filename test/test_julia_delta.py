"""The delta-rule family (DeltaNet, Gated DeltaNet, KDA, RWKV-7) on ScanWeaver.jl from Python.

Without Julia: the registry's claims (``julia`` renders the forward and the backward; half storage does not
fit, nor a backward on a GPU device; ``algorithm="chunked"`` reaches the ``delta`` form's forward only), the
entry points' argument order in ``src/matrix/host.jl`` against the buffers Python passes, the tunables each
part passes, and the buffer checks that run before Julia starts.  With Julia (``PYTHON_JULIACALL_EXE``/
``PROJECT`` naming an environment with ScanWeaver): the four public operations with ``backend="julia"``
against the float64 loops of ``delta_family`` (plain with h0, grouped heads with l2norm, packed sequences
with an empty one, T = 1, strong and weak decays, float32 and float64), their gradients through
``scanweaver.torch`` against autograd of the float64 PyTorch loops (lengths on both sides of the
checkpoints, packed, grouped), what ran, half storage refused with the reason, and the chunked (WY) forward
(``algorithm="chunked"``, ``chunk_size=``) against the same loops.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures

ROOT = Path(__file__).resolve().parents[1]
OP = FUSED.get("delta_rule")


def test_the_julia_backend_renders_the_delta_rule_forward():
    from scanweaver.targets.fused import kernel_for

    assert OP.runs_on("julia", "forward") and OP.runs_on("julia", "backward")
    assert OP.resolve("julia", {}, {}, "test") == {"workgroup_size": 64, "device": "cpu", "algorithm": "recurrent",
                                                   "chunk": 32}
    kernel = kernel_for("julia", "delta_rule")
    assert kernel.entry("forward") == "ScanWeaver.host_delta_rule!"
    assert kernel.misfit("forward", DeltaRuleFeatures("float32", 4, 4)) is None
    assert "bfloat16" in kernel.misfit("forward", DeltaRuleFeatures("bfloat16", 4, 4))
    assert kernel.misfit("backward", DeltaRuleFeatures("float32", 4, 4), {"device": "cpu"}) is None
    assert "'cuda'" in kernel.misfit("backward", DeltaRuleFeatures("float32", 4, 4), {"device": "cuda"})
    assert kernel.misfit("forward", DeltaRuleFeatures("float32", 4, 4), {"device": "cuda"}) is None


def test_the_julia_chunked_form_is_both_parts_of_both_forms():
    delta, dplr = DeltaRuleFeatures("float32", 64, 64, gate="scalar"), DeltaRuleFeatures("float32", 64, 64,
                                                                                         gate="key", form="dplr")
    for f in (delta, dplr):
        assert OP.chooses("julia", "forward", f) and OP.chooses("julia", "backward", f)
    cfg = OP.resolve("julia", {"algorithm": "chunked", "chunk": 5}, {}, "test")
    assert (cfg["algorithm"], cfg["chunk"]) == ("chunked", 5)
    assert OP.settle("julia", "backward", cfg, delta) == cfg
    assert OP.settle("julia", "backward", cfg, dplr) == cfg
    assert OP.settle("julia", "forward", cfg, dplr) == cfg
    assert OP.settle("julia", "forward", cfg, delta) == cfg
    sizes = {"batch": 1, "T": 8192, "H": 4, "Hq": 4, "nseq": 1}
    assert OP.algorithm("julia", "forward", delta, sizes) == "recurrent"
    assert OP.defaults("julia", "forward", delta, sizes, {}, {"chunk": 16}) == (
        {"algorithm": "chunked", "chunk": 16}, True)
    with pytest.raises(ScanInputError, match="algorithm"):
        OP.resolve("julia", {"algorithm": "blocked"}, {}, "test")
    with pytest.raises(ScanInputError, match="chunk"):
        OP.resolve("julia", {"chunk": 0}, {}, "test")


@pytest.mark.parametrize("part", ["forward", "backward"])
def test_the_julia_route_passes_the_algorithm_to_both_parts(monkeypatch, part):
    from scanweaver.julia import delta, fusedcall

    seen = {}
    monkeypatch.setattr(fusedcall, "entry", lambda call, dtype: lambda *args, **kw: seen.update(kw))
    f = DeltaRuleFeatures("float32", 3, 4, gate="scalar")
    call = OP.call(part, f, OP.resolve("julia", {"algorithm": "chunked", "chunk": 8}, {}, "test"))
    delta.run(call, {}, {"batch": 1, "T": 5, "H": 2, "Hq": 2, "nseq": 1})
    assert seen == {"l2norm": False, "workgroupsize": 64, "algorithm": "chunked", "chunk": 8}


@pytest.mark.parametrize("part,entry", [("forward", "host_delta_rule!"), ("backward", "host_delta_backward!")])
def test_the_entry_points_take_the_buffers_in_the_order_python_passes_them(part, entry):
    from scanweaver.julia.delta import BUFFERS

    src = (ROOT / "src" / "matrix" / "host.jl").read_text()
    m = re.search(rf"function {re.escape(entry)}\((.*?);", src, re.S)
    assert m, f"{entry} not found in src/matrix/host.jl"
    names = [a.split("::")[0].strip() for a in m.group(1).split(",") if a.strip()]
    assert names[:10] == ["device", "dtype", "batch", "T", "H", "Hq", "nseq", "K", "V", "gate"]
    julia_names = {"do": "dout"}  # `do` is a Julia keyword
    assert tuple(names[10:]) == tuple(julia_names.get(n, n) for n in BUFFERS[part])
    abi = [p.name for p in OP.params(part) if p.kind != "int"]
    assert sorted(abi) == sorted(BUFFERS[part])


def test_julia_run_fused_checks_delta_buffers_before_starting_julia():
    from scanweaver.julia.backend import JuliaBackend

    q = np.ones((1, 5, 2, 3), np.float32)
    arrays = {"q": q, "k": q, "v": np.ones((1, 5, 2, 4), np.float32), "beta": np.ones((1, 4, 2), np.float32),
              "o": np.zeros((1, 5, 2, 4), np.float32), "hlast": None}
    sizes = {"batch": 1, "T": 5, "H": 2, "Hq": 2, "nseq": 1}
    call = OP.call("forward", DeltaRuleFeatures("float32", 3, 4), OP.resolve("julia", {}, {}, "test"))
    with pytest.raises(ScanInputError, match="beta has shape"):
        JuliaBackend().run_fused(call, arrays, sizes)
    half = OP.call("forward", DeltaRuleFeatures("float16", 3, 4), OP.resolve("julia", {}, {}, "test"))
    arrays16 = {n: None if x is None else x.astype(np.float16) for n, x in arrays.items()}
    arrays16["beta"] = np.ones((1, 5, 2), np.float16)
    with pytest.raises(ScanInputError, match="float32 or float64, not float16"):
        JuliaBackend().run_fused(half, arrays16, sizes)


# --- with Julia ------------------------------------------------------------------------------------------

def _julia_environment() -> dict[str, str]:
    exe, project = os.environ.get("PYTHON_JULIACALL_EXE"), os.environ.get("PYTHON_JULIACALL_PROJECT")
    import importlib.util

    if importlib.util.find_spec("juliacall") is None or not exe or not project or not os.path.isdir(project):
        pytest.skip("needs juliacall and a Julia with an environment holding PythonCall and ScanWeaver, named by "
                    "PYTHON_JULIACALL_EXE/PROJECT (see docs/julia.md)")
    return {"PYTHON_JULIACALL_EXE": exe, "PYTHON_JULIACALL_PROJECT": project}


#: One process (Julia starts and compiles once); prints one JSON object: name -> the largest error relative to
#: the largest loop value, or what ran.
JULIA_CHECK = r'''
import json, numpy as np, scanweaver
from scanweaver.calls import runner
from delta_family import FAMILIES, PUBLIC, call_public, loop, problem
CASES = {"plain": {}, "groups_l2norm": {"Hq": 1, "H": 3, "l2norm": True},
         "packed": {"seqlens": [4, 0, 7, 1], "Hq": 1}, "one_step": {"T": 1},
         "decays": {"T": 23, "lo": -20.0, "hi": -1e-4, "K": 6, "V": 3}}
out = {}

def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))

rng = np.random.default_rng(11)
for op, family in PUBLIC.items():
    fn = getattr(scanweaver, op)
    for case, kw in CASES.items():
        if family == "rwkv7" and kw.get("l2norm"):
            kw = {k: v for k, v in kw.items() if k != "l2norm"}
        for dtype in ("float32", "float64"):
            f, a, sizes = problem(rng, family, dtype=dtype, **kw)
            o, h = call_public(fn, op, a, scale=0.5, l2norm=f.l2norm, backend="julia")
            want_o, want_h = loop(family, a, 0.5, f.l2norm)
            out[f"{op} {case} {dtype}"] = max(rel(o, want_o), rel(h, want_h))
            out[f"{op} {case} {dtype}: ran on"] = runner.last["delta_rule"].backend
try:
    import torch
    import scanweaver.torch as swt
except ImportError:
    torch = None
if torch is not None:
    from delta_family import torch_loop
    for op, family in PUBLIC.items():
        for T, kw in ((1, {}), (9, {}), (17, {"Hq": 1, "H": 4}), (None, {"seqlens": [5, 0, 11, 1]})):
            l2norm = op != "rwkv7"
            f, a, sizes = problem(rng, family, T=T or 1, K=5, V=3, l2norm=l2norm, lo=-4.0, hi=-1e-3, **kw)
            shape_o, shape_h = a["v"].shape, a["h0"].shape
            w_o, w_h = torch.tensor(rng.normal(size=shape_o)), torch.tensor(rng.normal(size=shape_h))
            leaves = lambda: {n: torch.tensor(x, requires_grad=True) for n, x in a.items()
                              if n not in ("cu_seqlens", "dhlast")}
            want = leaves()
            o, h = torch_loop(family, want, 0.8, l2norm, a.get("cu_seqlens"))
            ((o * w_o).sum() + (h * w_h).sum()).backward()
            for extra in ({}, {"algorithm": "chunked", "chunk_size": 4}):
                got = leaves()
                o, h = call_public(getattr(swt, op), op, {**got, "cu_seqlens": a.get("cu_seqlens")}, 0.8, l2norm,
                                   backend="julia", **extra)
                ((o * w_o).sum() + (h * w_h).sum()).backward()
                name = f"{op} backward T={T} {kw}" + (" chunked" if extra else "")
                out[name + " float64"] = max(rel(got[n].grad, want[n].grad) for n in got)
                out[name + ": ran on"] = runner.last["delta_rule"].backend
                out[name + ": algorithm"] = runner.last["delta_rule"].algorithm
f, a, sizes = problem(rng, "deltanet", dtype="float16")
try:
    call_public(scanweaver.delta_rule, "delta_rule", a, backend="julia")
    out["float16"] = "ran"
except scanweaver.ScanInputError as exc:
    out["float16"] = str(exc)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def julia_results() -> dict:
    env = {**os.environ, **_julia_environment(), "PYTHONPATH": os.pathsep.join((str(ROOT / "python"),
                                                                               str(ROOT / "test")))}
    proc = subprocess.run([sys.executable, "-c", JULIA_CHECK], capture_output=True, text=True, timeout=1800,
                          env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_julia_delta_rule_operations_match_the_float64_loops(julia_results):
    errors = {k: v for k, v in julia_results.items() if isinstance(v, float) and " backward " not in k}
    assert len(errors) == 4 * 5 * 2
    bad = {name: err for name, err in errors.items() if not err < (2e-5 if "float32" in name else 1e-12)}
    assert not bad, bad


def test_the_delta_rule_ran_in_julia(julia_results):
    ran = {k: v for k, v in julia_results.items() if k.endswith(": ran on")}
    backward = {k for k in ran if " backward " in k}
    assert len(ran) - len(backward) == 4 * 5 * 2 and set(ran.values()) == {"julia"}, ran


def test_julia_delta_rule_gradients_match_autograd_of_the_float64_loops(julia_results):
    errors = {k: v for k, v in julia_results.items() if isinstance(v, float) and " backward " in k}
    if not errors:
        pytest.skip("torch is not installed")
    assert len(errors) == 4 * 4 * 2  # the recurrent and the chunked backward
    bad = {name: err for name, err in errors.items() if not err < 1e-10}
    assert not bad, bad
    ran = {k: v for k, v in julia_results.items() if k.endswith(": algorithm")}
    assert len(ran) == 4 * 4 * 2
    assert all(v == ("chunked" if " chunked:" in k else "recurrent") for k, v in ran.items()), ran


def test_half_storage_is_refused_with_the_reason(julia_results):
    assert "float32 or float64, not float16" in julia_results["float16"]


#: One process: the chunked forward of both forms (``algorithm="chunked"``, ``chunk_size=``) on ``julia`` against the
#: float64 loops over the families, resets, growth, packing and groups, with what ran.  Prints one JSON list of
#: cases.
CHUNKED_CHECK = r'''
import json, numpy as np, scanweaver
from scanweaver.calls import runner
from delta_family import PUBLIC, call_public, loop, problem

def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))

rng = np.random.default_rng(5)
cases = []
for op, family in PUBLIC.items():
    for dtype in ("float32", "float64"):
        for name, kw in (("plain", {"T": 45}), ("packed", {"seqlens": [4, 0, 33, 1], "Hq": 1, "H": 2}),
                         ("l2norm", {"T": 40, "Hq": 1, "H": 2, "l2norm": True}),
                         ("growth", {"T": 37, "lo": -0.05, "hi": -1e-3}), ("resets", {"T": 37, "lo": -1e4})):
            if family == "rwkv7" and kw.get("l2norm"):
                continue
            f, a, sizes = problem(rng, family, dtype=dtype, K=6, V=5, **kw)
            if name == "resets" and a.get("g") is not None:
                a["g"][rng.random(a["g"].shape) < 0.1] = -np.inf
            if name == "growth" and a.get("g") is not None:
                a["g"] = np.abs(a["g"]) * np.where(rng.random(a["g"].shape) < 0.5, 1.0, -1.0)
            want_o, want_h = loop(family, a, 0.5, f.l2norm)
            for chunk in (1, 16, 64):
                o, h = call_public(getattr(scanweaver, op), op, a, 0.5, f.l2norm, backend="julia",
                                   algorithm="chunked", chunk_size=chunk)
                last = runner.last["delta_rule"]
                cases.append({"name": f"{op} {name} {dtype} {chunk}", "dtype": dtype, "family": family,
                              "err": max(rel(o, want_o), rel(h, want_h)), "backend": last.backend,
                              "algorithm": last.algorithm, "chunk": last.config.get("chunk")})
print(json.dumps(cases))
'''


@pytest.fixture(scope="module")
def chunked_results() -> list:
    env = {**os.environ, **_julia_environment(), "PYTHONPATH": os.pathsep.join((str(ROOT / "python"),
                                                                               str(ROOT / "test")))}
    proc = subprocess.run([sys.executable, "-c", CHUNKED_CHECK], capture_output=True, text=True, timeout=1800,
                          env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_julia_chunked_delta_forward_matches_the_float64_loops(chunked_results):
    bad = [c for c in chunked_results if not c["err"] < (2e-4 if c["dtype"] == "float32" else 1e-10)]
    assert not bad, bad
    ran = {(c["family"] == "rwkv7", c["backend"], c["algorithm"]) for c in chunked_results}
    assert ran == {(False, "julia", "chunked"), (True, "julia", "chunked")}, ran
    assert {c["chunk"] for c in chunked_results} == {1, 16, 64}
