"""The chunked (matmul) form of the matrix-state forward on the ``julia`` backend (``src/matrix/chunked.jl``).

Without Julia: the ``julia`` tunables (``algorithm``, ``chunk``) are declared and validated, and the measured
rule of the C kernels does not choose the chunked form for ScanWeaver.jl.  With Julia
(``PYTHON_JULIACALL_EXE``/``PROJECT`` naming an environment with ScanWeaver): ``algorithm="chunked"`` and
``chunk_size=`` on ``backend="julia"`` against a float64 loop of the recurrence written here and against the
``cpu`` backend's chunked form, over the decays (with resets and growth), readouts, reverse, packing and groups;
the chunked backward against central differences of that loop; ``scanweaver.matrix.last`` says what ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures

ROOT = Path(__file__).resolve().parents[1]
OP = FUSED.get("matrix_state")


def test_the_julia_tunables_have_the_chunked_form():
    cfg = OP.resolve("julia", {}, {}, "test")
    assert cfg == {"workgroup_size": 64, "device": "cpu", "algorithm": "recurrent", "chunk": 64}
    assert OP.chooses("julia") and FUSED.get("delta_rule").chooses("julia", "forward")
    assert FUSED.get("delta_rule").chooses("julia", "backward")
    assert OP.resolve("julia", {"algorithm": "chunked", "chunk": 5}, {}, "test")["chunk"] == 5
    with pytest.raises(ScanInputError, match="algorithm"):
        OP.resolve("julia", {"algorithm": "blocked"}, {}, "test")
    with pytest.raises(ScanInputError, match="chunk"):
        OP.resolve("julia", {"chunk": 0}, {}, "test")


def test_the_c_rule_does_not_pick_the_julia_algorithm():
    big, one = MatrixStateFeatures("float32", 128, 128), {"batch": 1, "T": 4096, "H": 1, "Hq": 1, "nseq": 1}
    assert OP.algorithm("c", "backward", big, one) == "chunked"
    assert OP.algorithm("julia", "backward", big, one) == "recurrent"
    assert OP.defaults("julia", "forward", big, one, {}, {"chunk": 32}) == (
        {"algorithm": "chunked", "chunk": 32}, True)


def _julia_environment() -> dict[str, str]:
    exe, project = os.environ.get("PYTHON_JULIACALL_EXE"), os.environ.get("PYTHON_JULIACALL_PROJECT")
    import importlib.util

    if importlib.util.find_spec("juliacall") is None or not exe or not project or not os.path.isdir(project):
        pytest.skip("needs juliacall and a Julia with an environment holding PythonCall and ScanWeaver, named by "
                    "PYTHON_JULIACALL_EXE/PROJECT (see docs/julia.md)")
    return {"PYTHON_JULIACALL_EXE": exe, "PYTHON_JULIACALL_PROJECT": project}


#: One process (Julia starts once); prints one JSON list of cases: name, the errors of julia against the loop
#: and against cpu (relative to the largest loop value), and what scanweaver.matrix.last reported.
CHECK = r'''
import json, numpy as np, scanweaver
from scanweaver import matrix
from scanweaver.calls import runner

def loop(q, k, v, g, decay, u, h0, cu, reverse):
    """o and hlast of S_t = exp(g_t) o S_{t-1} + k_t v_t^T read by q_t (after), or the bonus readout, in float64."""
    B, T, H, V = v.shape
    Hq, K = q.shape[2], q.shape[3]
    segs = [(b, b, 0, T) for b in range(B)] if cu is None else \
        [(n, 0, int(cu[n]), int(cu[n + 1] - cu[n])) for n in range(len(cu) - 1)]
    o, hl = np.zeros((B, T, H, V)), np.zeros((len(segs), H, K, V))
    for n, b, start, ln in segs:
        for h in range(H):
            hq = h // (H // Hq)
            S = np.zeros((K, V)) if h0 is None else h0[n, h].astype(np.float64)
            steps = range(start + ln - 1, start - 1, -1) if reverse else range(start, start + ln)
            for t in steps:
                d = np.ones(K) if decay == "none" else np.exp(np.float64(g[b, t, h])) * np.ones(K)
                qt, kt, vt = (x[b, t, hq if x is not v else h].astype(np.float64) for x in (q, k, v))
                prev = S
                S = d[:, None] * S + np.outer(kt, vt)
                o[b, t, h] = S.T @ qt if u is None else prev.T @ qt + (qt * u[h] * kt).sum() * vt
            hl[n, h] = S
    return o, hl

def rel(got, want):
    got = np.asarray(got, np.float64)
    return float(np.abs(got - want).max(initial=0.0) / max(1.0, np.abs(want).max(initial=0.0)))

rng = np.random.default_rng(3)
cases = []
B, T, H, Hq, K, V = 2, 45, 4, 2, 8, 6
for dtype in ("float32", "float64"):
    for decay, readout, reverse, packed, kind in (
            ("scalar", "after", False, False, "mixed"), ("key", "after", True, True, "reset"),
            ("key", "bonus", False, False, "tiny"), ("scalar", "bonus", True, True, "huge"),
            ("none", "after", False, True, "none"), ("key", "after", False, False, "positive")):
        b = 1 if packed else B
        q, k = (rng.standard_normal((b, T, Hq, K)).astype(dtype) for _ in range(2))
        v = rng.standard_normal((b, T, H, V)).astype(dtype)
        gshape = (b, T, H, K) if decay == "key" else (b, T, H)
        g = {"mixed": 0.4 - 2 * rng.random(gshape), "reset": np.where(rng.random(gshape) < 0.1, -np.inf,
             -2 * rng.random(gshape)), "tiny": np.full(gshape, -1e-4), "huge": -1e4 * (1 + rng.random(gshape)),
             "positive": 0.1 * rng.random(gshape), "none": None}[kind]
        g = None if g is None else g.astype(dtype)
        u = rng.standard_normal((H, K)).astype(dtype) if readout == "bonus" else None
        cu = np.array([0, 1, 20, 20, T]) if packed else None
        h0 = rng.standard_normal((len(cu) - 1 if packed else b, H, K, V)).astype(dtype)
        ops = matrix.operands("test", q, k, v, g, decay=decay, readout=readout, u=u, h0=h0, cu_seqlens=cu,
                              reverse=reverse)
        want_o, want_h = loop(q, k, v, g, decay, u, h0, cu, reverse)
        for chunk in (1, 16, 64):
            o, h = matrix.forward(ops, backend="julia", algorithm="chunked", chunk=chunk)
            last = runner.last["matrix_state"]
            co, ch = matrix.forward(ops, backend="cpu", algorithm="chunked", chunk=chunk)
            cpu = runner.last["matrix_state"]
            cases.append({"name": f"{dtype} {decay} {readout} reverse={reverse} packed={packed} {kind} {chunk}",
                          "dtype": dtype, "loop": max(rel(o, want_o), rel(h, want_h)),
                          "cpu": max(rel(o, co), rel(h, ch)), "backend": last.backend,
                          "algorithm": last.algorithm, "chunk": last.config["chunk"], "source": last.source,
                          "cpu_ran": [cpu.backend, cpu.algorithm]})
        do, dh = rng.standard_normal(v.shape), rng.standard_normal(want_h.shape)
        grads = matrix.backward(ops, do.astype(dtype), dh.astype(dtype), backend="julia", algorithm="chunked",
                                chunk=16)
        last = runner.last["matrix_state"]
        named = {"q": q, "k": k, "v": v, "g": g, "u": u, "h0": h0}
        worst = 0.0
        for name, x in named.items():
            if x is None or grads["d" + name] is None:
                continue
            step = rng.standard_normal(x.shape)
            def loss(s):
                moved = {**named, name: x.astype(np.float64) + s * step}
                o, h = loop(moved["q"], moved["k"], moved["v"], moved["g"], decay, moved["u"], moved["h0"], cu,
                            reverse)
                return float((o * do).sum() + (h * dh).sum())
            fd = (loss(1e-6) - loss(-1e-6)) / 2e-6
            got = float((np.asarray(grads["d" + name], np.float64) * step).sum())
            worst = max(worst, abs(got - fd) / max(1.0, abs(fd)))
        cases.append({"name": f"backward {dtype} {decay} {readout} reverse={reverse} packed={packed} {kind}",
                      "dtype": dtype, "fd": worst, "backend": last.backend, "algorithm": last.algorithm,
                      "part": last.part, "chunk": last.config["chunk"]})
q, k = (rng.standard_normal((1, 33, 2, 8)) for _ in range(2))
v, g = rng.standard_normal((1, 33, 2, 8)), -rng.random((1, 33, 2, 8))
o, _ = scanweaver.linear_attention(q, k, v, g=g, backend="julia", chunk_size=8)
last = scanweaver.matrix.last
cases.append({"name": "linear_attention chunk_size=8", "backend": last.backend, "algorithm": last.algorithm,
              "chunk": last.config["chunk"], "source": last.source,
              "numpy": rel(o, scanweaver.linear_attention(q, k, v, g=g, backend="numpy")[0])})
print(json.dumps(cases))
'''


@pytest.fixture(scope="module")
def results() -> list:
    env = {**os.environ, **_julia_environment(), "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=1800, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_julia_chunked_matches_the_loop_and_cpu(results):
    forms = [c for c in results if "loop" in c]
    assert len(forms) == 2 * 6 * 3
    bad = [c for c in forms if not (c["loop"] < (2e-4 if c["dtype"] == "float32" else 1e-10)
                                   and c["cpu"] < (2e-4 if c["dtype"] == "float32" else 1e-10))]
    assert not bad, bad


def test_julia_chunked_backward_matches_central_differences_of_the_loop(results):
    grads = [c for c in results if "fd" in c]
    assert len(grads) == 2 * 6 and {c["part"] for c in grads} == {"backward"}
    bad = [c for c in grads if not c["fd"] < (1e-2 if c["dtype"] == "float32" else 1e-6)]
    assert not bad, bad


def test_matrix_last_reports_the_julia_chunked_form(results):
    for c in results:
        assert (c["backend"], c["algorithm"]) == ("julia", "chunked"), c
    assert {tuple(c["cpu_ran"]) for c in results if "cpu_ran" in c} == {("cpu", "chunked")}
    assert {c["chunk"] for c in results if "loop" in c} == {1, 16, 64}
    assert {c["chunk"] for c in results if "fd" in c} == {16}
    hint = next(c for c in results if c["name"].startswith("linear_attention"))
    assert (hint["chunk"], hint["source"]) == (8, "hint") and hint["numpy"] < 1e-10
