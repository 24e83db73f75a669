"""The GPU renderings of the fused matrix_state scan: run on OpenCL (PoCL here) against the NumPy definition,
and the CUDA text compiled for sm_90 with nvcc (nothing CUDA runs here).

Every decay x readout runs forward and backward; the booleans (reverse, h0,
cu_seqlens, dhlast), the dtypes, groups (Hq < H), V split over several
workgroups and time tiles that do not divide T are spread over those cases so
that each value of each appears.  Data are non-uniform; lengths are odd and
packed sequences include an empty one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from scanweaver import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures, backward_reference, forward_reference
from scanweaver.runtime import REGISTRY
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for
from scanweaver.targets.fused_gpu_matrix_state import layout, local_bytes
from scanweaver.tools.ptxas import matrix_configurations, matrix_table, parse

OP = FUSED.get("matrix_state")
NVCC = shutil.which("nvcc")
ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "test" / "data" / "ptxas_matrix_state_sm90.json"

#: (decay, readout, reverse, has_h0, has_seqlens, has_dhlast, dtype, H, Hq, K, V, config)
CASES = [
    ("none", "after", False, True, False, True, "float64", 4, 2, 4, 6, {"workgroup_size": 8, "time_tile": 4}),
    ("none", "bonus", True, False, True, False, "float32", 2, 2, 5, 20,
     {"workgroup_size": 8, "time_tile": 3, "state_per_item": 2}),
    ("scalar", "after", True, True, True, True, "float32", 4, 2, 8, 12,
     {"workgroup_size": 16, "time_tile": 5, "state_per_item": 4}),
    ("scalar", "bonus", False, True, False, False, "float64", 3, 1, 3, 9, {"workgroup_size": 16, "time_tile": 16}),
    ("key", "after", False, False, True, True, "float64", 2, 1, 6, 5,
     {"workgroup_size": 8, "time_tile": 2, "state_per_item": 2}),
    ("key", "bonus", True, True, False, True, "float32", 4, 2, 7, 17,
     {"workgroup_size": 8, "time_tile": 4, "state_per_item": 4}),
]
IDS = [f"{c[0]}-{c[1]}-{c[6]}" for c in CASES]


def opencl():
    """The ``opencl`` backend, or a skip saying why it cannot run here."""
    cls = REGISTRY.get("opencl")
    if not cls.availability().ok:
        pytest.skip(f"backend 'opencl' unavailable: {cls.availability().reason}")
    from scanweaver.runtime import get_backend

    return get_backend("opencl")


def problem(rng, decay, readout, reverse, has_h0, seqlens, dhlast, dtype, H, Hq, K, V):
    """Features, sizes and random operands of one case (T = 13, batch 2, or 4 packed sequences, one empty)."""
    T = 13
    batch = 1 if seqlens else 2
    cu = np.array([0, 4, 4, 9, T], np.int64) if seqlens else None
    nseq = len(cu) - 1 if seqlens else batch
    q, k = (rng.normal(size=(batch, T, Hq, K)).astype(dtype) for _ in range(2))
    v, do = (rng.normal(size=(batch, T, H, V)).astype(dtype) for _ in range(2))
    gshape = (batch, T, H, K) if decay == "key" else (batch, T, H)
    arrays = {
        "q": q, "k": k, "v": v, "cu_seqlens": cu, "do": do,
        "g": -rng.uniform(1e-4, 2.0, gshape).astype(dtype) if decay != "none" else None,
        "u": rng.normal(size=(H, K)).astype(dtype) if readout == "bonus" else None,
        "h0": rng.normal(size=(nseq, H, K, V)).astype(dtype) if has_h0 else None,
        "dhlast": rng.normal(size=(nseq, H, K, V)).astype(dtype) if dhlast else None,
    }
    features = MatrixStateFeatures(dtype, K, V, decay, readout, reverse, has_h0, seqlens, dhlast)
    return features, {"batch": batch, "T": T, "H": H, "Hq": Hq, "nseq": nseq}, arrays


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_opencl_forward_and_backward_match_the_definition(rng, case):
    be = opencl()
    *spec, config = case
    features, sizes, a = problem(rng, *spec)
    opts = dict(decay=features.decay, readout=features.readout, u=a["u"], h0=a["h0"], cu_seqlens=a["cu_seqlens"],
                reverse=features.reverse)
    o, hlast = forward_reference(a["q"], a["k"], a["v"], a["g"], **opts)
    out = {"o": np.full_like(o, np.nan), "hlast": np.full_like(hlast, np.nan)}
    be.run_fused(OP.call("forward", features, OP.resolve("gpu", config, {}, "test")), {**a, **out}, sizes)
    tol = {"float32": 2e-5, "float64": 1e-12}[features.dtype]
    np.testing.assert_allclose(out["o"], o, rtol=tol, atol=tol)
    np.testing.assert_allclose(out["hlast"], hlast, rtol=tol, atol=tol)

    want = backward_reference(a["q"], a["k"], a["v"], a["g"], **opts, do=a["do"], dhlast=a["dhlast"])
    grads = {n: np.full_like(w, np.nan) for n, w in want.items() if w is not None and OP.enabled(n, features)}
    be.run_fused(OP.call("backward", features, OP.resolve("gpu", config, {}, "test")), {**a, **grads}, sizes)
    assert set(grads) >= {"dq", "dk", "dv"}
    for name, got in grads.items():
        scale = max(1.0, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(got, want[name], rtol=tol, atol=tol * scale, err_msg=name)


def test_opencl_defaults_run_and_an_empty_sequence_writes_nothing(rng):
    """The shape defaults resolve and run; one empty packed sequence launches nothing and leaves zero outputs."""
    be = opencl()
    features, sizes, a = problem(rng, "scalar", "after", False, False, False, False, "float32", 2, 2, 4, 8)
    cfg = OP.resolve("gpu", {}, be.fused_defaults("matrix_state", features, sizes), "test")
    assert cfg == {"algorithm": "recurrent", "chunk": 64, "workgroup_size": 32, "time_tile": 16, "state_per_item": 8}
    o = np.zeros_like(a["v"])
    be.run_fused(OP.call("forward", features, cfg), {**a, "o": o}, sizes)
    np.testing.assert_allclose(o, forward_reference(a["q"], a["k"], a["v"], a["g"])[0], rtol=2e-5, atol=2e-5)
    f0 = MatrixStateFeatures("float32", 4, 8, "scalar", has_seqlens=True)
    hlast = np.ones((1, 2, 4, 8), "f4")
    empty = {"q": a["q"][:1, :0], "k": a["k"][:1, :0], "v": a["v"][:1, :0], "g": a["g"][:1, :0],
             "cu_seqlens": np.zeros(2, np.int64), "o": a["v"][:1, :0].copy(), "hlast": hlast}
    be.run_fused(OP.call("forward", f0, cfg), empty, {"batch": 1, "T": 0, "H": 2, "Hq": 2, "nseq": 1})
    assert not hlast.any(), "the empty sequence's final state is its (zero) initial state"


@pytest.mark.parametrize("decay", ["key", "scalar"])
def test_decay_gradients_of_a_long_float32_sequence_keep_their_precision(rng, decay):
    """At T = 8192 the decay gradients' suffix sums over time are accumulated in double: float32 results
    within a few float32 roundings of the float64 definition (a float32 running sum was about 10x off)."""
    be = opencl()
    T, H, K, V = 8192, 2, 8, 8
    gshape = (1, T, H, K) if decay == "key" else (1, T, H)
    a = {"q": rng.normal(size=(1, T, H, K)), "k": rng.normal(size=(1, T, H, K)) / np.sqrt(K),
         "v": rng.normal(size=(1, T, H, V)), "g": np.log(rng.uniform(0.9, 0.999, gshape)),
         "do": rng.normal(size=(1, T, H, V))}
    want = backward_reference(a["q"], a["k"], a["v"], a["g"], decay=decay, do=a["do"])["dg"]
    features, sizes = MatrixStateFeatures("float32", K, V, decay), {"batch": 1, "T": T, "H": H, "Hq": H, "nseq": 1}
    a32 = {n: x.astype(np.float32) for n, x in a.items()}
    grads = {n: np.zeros_like(a32[m]) for n, m in (("dq", "q"), ("dk", "k"), ("dv", "v"), ("dg", "g"))}
    cfg = OP.resolve("gpu", {}, be.fused_defaults("matrix_state", features, sizes), "test")
    be.run_fused(OP.call("backward", features, cfg), {**a32, **grads}, sizes)
    err = float(np.abs(grads["dg"] - want).max() / np.abs(want).max())
    assert err < 4e-6, f"dg relative error {err:.1e}"


def test_k_1024_builds_and_runs_on_opencl(rng):
    """A wide state is tiled over work-items (no K-long unrolled loop): K = 1024 builds in seconds and is right."""
    be = opencl()
    features, sizes, a = problem(rng, "key", "after", False, False, False, False, "float32", 1, 1, 1024, 16)
    cfg = OP.resolve("gpu", {}, be.fused_defaults("matrix_state", features, sizes), "test")
    o = np.full_like(a["v"], np.nan)
    be.run_fused(OP.call("forward", features, cfg), {**a, "o": o}, sizes)
    np.testing.assert_allclose(o, forward_reference(a["q"], a["k"], a["v"], a["g"], decay="key")[0], rtol=1e-4,
                               atol=1e-4 * np.abs(o).max())


def test_offsets_outside_the_sequence_are_refused_before_any_kernel(rng):
    be = opencl()
    features, sizes, a = problem(rng, "scalar", "after", False, False, True, False, "float32", 2, 2, 4, 8)
    a["cu_seqlens"] = np.array([0, 4, 40, 9, 13], np.int64)
    with pytest.raises(ScanInputError, match=r"cu_seqlens must be .*T = 13.*40 followed by cu_seqlens\[3\] = 9"):
        be.run_fused(OP.call("forward", features, {"workgroup_size": 8, "time_tile": 4}),
                     {**a, "o": np.zeros_like(a["v"])}, sizes)


def test_bad_tunables_and_oversized_tiles_are_refused():
    with pytest.raises(ScanInputError, match="workgroup_size"):
        OP.resolve("gpu", {"workgroup_size": 48}, {}, "test")
    with pytest.raises(ScanInputError, match="time_tile"):
        OP.resolve("gpu", {"time_tile": 65}, {}, "test")
    with pytest.raises(ScanInputError, match="state_per_item"):
        OP.resolve("gpu", {"state_per_item": 3}, {}, "test")
    big = MatrixStateFeatures("float64", 256, 256)
    call = OP.call("backward", big, {"workgroup_size": 64, "time_tile": 64, "state_per_item": 32})
    with pytest.raises(ScanInputError, match="lower time_tile"):
        kernel_for("opencl", "matrix_state").plan(call, {"batch": 1, "T": 1, "H": 1, "Hq": 1, "nseq": 1})


def test_layout_keeps_every_work_item_within_its_state_budget():
    for K, V, per, wg in ((128, 128, 32, 256), (256, 512, 32, 256), (1024, 64, 8, 256), (5, 20, 2, 8)):
        lay = layout(MatrixStateFeatures("float32", K, V), {"workgroup_size": wg, "state_per_item": per})
        assert lay.ks * lay.ct == wg and lay.vs * lay.rt == wg
        assert lay.ks * lay.kp >= K and lay.vs * lay.vp >= V
        assert lay.kp <= max(per, -(-K // wg)) and lay.vp <= max(per, -(-V // wg))


def nvcc(tmp_path, source: str, name: str) -> str:
    """``nvcc -ptx`` of ``source``, then ``nvcc -cubin -arch=sm_90 -Xptxas -v`` of that PTX; ptxas's report."""
    cu, ptx = tmp_path / f"{name}.cu", tmp_path / f"{name}.ptx"
    cu.write_text(source)
    for args in (["-ptx", "-o", str(ptx), str(cu)],
                 ["-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(tmp_path / f"{name}.cubin"), str(ptx)]):
        proc = subprocess.run([NVCC, *args], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"nvcc {' '.join(args[:2])} failed:\n{proc.stderr}"
        assert "warning" not in proc.stderr.lower(), proc.stderr
    return proc.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_cuda_kernels_compile_to_ptx_and_sm90(tmp_path, rng, case):
    """Nothing CUDA runs here: the same kernels that ran on OpenCL compile for sm_90 without spills."""
    *spec, config = case
    features, _, _ = problem(rng, *spec)
    for part in ("forward", "backward"):
        call = OP.call(part, features, OP.resolve("gpu", config, {}, "test"))
        report = parse(nvcc(tmp_path, kernel_for("cuda", "matrix_state").render(TARGETS.get("cuda")(), call), part))
        want = {"forward"} if part == "forward" else {"bwd_keys", "bwd_values"} | (
            {"bwd_decay"} if features.decay != "none" else set())
        assert set(report) >= {f"sw_matrix_state_{w}" for w in want}
        for name, res in report.items():
            assert res["spill_stores"] == 0 and res["stack"] == 0, (name, res)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
def test_cuda_kernels_at_a_model_shape_fit_their_launch_limits(tmp_path):
    """K = V = 64 float32 with the defaults: no spills, and ptxas's shared memory is :func:`local_bytes`."""
    features = MatrixStateFeatures("float32", 64, 64, "key", "after", has_h0=True, has_dhlast=True)
    sizes = {"batch": 4, "T": 2048, "H": 16, "Hq": 16, "nseq": 4}
    cfg = OP.resolve("gpu", {}, kernel_for("cuda", "matrix_state").defaults(features, sizes), "test")
    call = OP.call("backward", features, cfg)
    report = parse(nvcc(tmp_path, kernel_for("cuda", "matrix_state").render(TARGETS.get("cuda")(), call), "b"))
    assert max(r["shared"] for r in report.values()) == local_bytes("backward", features, cfg)
    assert all(r["spill_stores"] == 0 and r["registers"] <= 255 for r in report.values()), report


def test_the_ptxas_record_of_the_model_shapes_is_current_and_spills_nothing():
    """``test/data/ptxas_matrix_state_sm90.json`` holds every model shape with today's defaults, no kernel of it
    spills or keeps a stack frame, and ``docs/gpu.md`` shows its table (``python -m scanweaver.tools.ptxas
    --matrix-state`` regenerates both)."""
    doc = json.loads(RECORD.read_text())
    assert [(e["label"], e["dtype"], e["config"]) for e in doc["entries"]] == \
        [(c["label"], c["dtype"], c["config"]) for c in matrix_configurations()], "the record is stale"
    for e, c in zip(doc["entries"], matrix_configurations(), strict=True):
        assert set(e["kernels"]) == {f"sw_matrix_state_{k}" for k in ("forward", "bwd_keys", "bwd_values", "bwd_decay",
                                                                        "chunk_prefix", "chunk_local", "chunk_carry",
                                                                        "chunk_output", "chunk_adjoint_local",
                                                                        "chunk_adjoint_carry", "chunk_bwd_keys",
                                                                        "chunk_bwd_values", "chunk_bwd_decay")}
        for name, r in e["kernels"].items():
            assert "error" not in r and r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, (e["label"], name)
            assert r["registers"] <= 255 and r["shared"] <= max(local_bytes("backward", c["features"], c["config"]),
                                                                local_bytes("forward", c["features"],
                                                                            {**c["config"], "algorithm": "chunked"}))
    assert matrix_table(doc) in (ROOT / "docs" / "gpu.md").read_text(), "docs/gpu.md shows another table"


LARGE_K = r"""
import json, sys
import numpy as np
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures, backward_reference, forward_reference
from scanweaver.runtime import get_backend

K, V, T = int(sys.argv[1]), 8, 5
rng = np.random.default_rng(K)
OP, be = FUSED.get("matrix_state"), get_backend("opencl")
a = {"q": rng.normal(size=(1, T, 1, K)).astype("f4"), "k": rng.normal(size=(1, T, 1, K)).astype("f4"),
     "v": rng.normal(size=(1, T, 1, V)).astype("f4"), "g": -rng.uniform(0.01, 1, (1, T, 1, K)).astype("f4"),
     "u": None, "h0": None, "cu_seqlens": None}
do = rng.normal(size=(1, T, 1, V)).astype("f4")
f = MatrixStateFeatures("float32", K, V, "key")
sizes = {"batch": 1, "T": T, "H": 1, "Hq": 1, "nseq": 1}
cfg = OP.resolve("gpu", {"workgroup_size": 8, "time_tile": 2}, {}, "test")
o, _ = forward_reference(a["q"], a["k"], a["v"], a["g"], decay="key")
out = {"o": np.full_like(a["v"], np.nan), "hlast": np.zeros((1, 1, K, V), "f4")}
be.run_fused(OP.call("forward", f, cfg), {**a, **out}, sizes)
want = backward_reference(a["q"], a["k"], a["v"], a["g"], decay="key", do=do)
grads = {n: np.full_like(want[n], np.nan) for n in ("dq", "dk", "dv", "dg")}
be.run_fused(OP.call("backward", f, cfg), {**a, "do": do, **grads}, sizes)
err = {n: float(np.abs(g - want[n]).max() / max(1.0, np.abs(want[n]).max())) for n, g in grads.items()}
err["o"] = float(np.abs(out["o"] - o).max() / np.abs(o).max())
print(json.dumps(err))
"""


def test_opencl_builds_and_runs_large_k_as_loops():
    """K = 1024 rows: loops over K are not unrolled past UNROLL_MAX, so PoCL builds the forward and backward in
    seconds (fully unrolled, K = 512 took minutes and K = 1024 did not build in 120 s); both match the
    definition.  A subprocess with a timeout, so a build that runs away fails the test instead of the run."""
    import sys

    opencl()
    try:
        proc = subprocess.run([sys.executable, "-c", LARGE_K, "1024"], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("building the K = 1024 matrix_state kernels on OpenCL did not finish in 240 s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    err = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(err.values()) < 1e-4, err


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
def test_cuda_kernels_at_large_k_compile(tmp_path):
    """K = 1024 (loops over K, the state column in local memory) compiles for sm_90, forward and backward."""
    features = MatrixStateFeatures("float32", 1024, 8, "key")
    for part in ("forward", "backward"):
        call = OP.call(part, features, OP.resolve("gpu", {"workgroup_size": 8, "time_tile": 2}, {}, "test"))
        report = parse(nvcc(tmp_path, kernel_for("cuda", "matrix_state").render(TARGETS.get("cuda")(), call), part))
        assert report, part
