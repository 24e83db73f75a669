"""The ``cpu`` backend against the float64 oracle (NumPy, sequential, float64).

Compiled kernels are shared across the module through one cache directory.
Chunk sizes are odd on purpose: 1003 leaves a longer last sub-range in a
tile, 4100 a shorter one (skewed sub-ranges), and lengths sit just past a
chunk.  ``threads=2`` keeps the split layout (one lane's tiles over threads)
in play even on one core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import scanweaver
from scanweaver.arrays import prepare
from scanweaver.errors import ScanInputError
from scanweaver.runtime import get_backend
from scanweaver.runtime.cpu_backend import CpuBackend

pytestmark = pytest.mark.skipif(not CpuBackend.availability().ok,
                                reason=f"cpu backend unavailable: {CpuBackend.availability().reason}")

CONFIGS = [
    ("sequential", {}),
    ("chunked", {"chunk": 1003, "threads": 2}),
    ("chunked", {"chunk": 4100, "threads": 2, "interleave": 8}),
]
SHAPES = [(1, 1), (1, 1004), (2, 8201), (5, 3), (37, 1005), (9, 2)]
FEATURES = [
    {},
    {"h0": True, "return_state": True},
    {"reverse": True, "h0": True, "return_state": True},
    {"reset": True, "return_state": True},
    {"reset": True, "reverse": True},
]


@pytest.fixture(scope="module", autouse=True)
def kernel_cache(tmp_path_factory):
    old = os.environ.get("SCANWEAVER_CACHE_DIR")
    os.environ["SCANWEAVER_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernels"))
    yield
    if old is None:
        os.environ.pop("SCANWEAVER_CACHE_DIR", None)
    else:
        os.environ["SCANWEAVER_CACHE_DIR"] = old


def operands(lanes, L, seed=0, with_c=True):
    rng = np.random.default_rng(seed)
    ops = {
        "a": rng.uniform(0.6, 1.0, (lanes, L)),
        "b": rng.uniform(-2.0, 2.0, (lanes, L)),
        "x": rng.standard_normal((lanes, L)) * rng.uniform(0.1, 3.0, (lanes, 1)),
    }
    if with_c:
        ops["c"] = rng.standard_normal((lanes, L))
    return ops


def call_kwargs(feats, lanes, L, seed=1):
    rng = np.random.default_rng(seed)
    kw = {"reverse": feats.get("reverse", False), "return_state": feats.get("return_state", False)}
    if feats.get("h0"):
        kw["h0"] = rng.standard_normal(lanes)
    if feats.get("reset"):
        kw["reset"] = rng.random((lanes, L)) < 0.002
        kw["reset"][:, min(L - 1, 1003)] = True
    return kw


def check(got, want, rtol=2e-4):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def cast(kw, dtype):
    return {k: (v.astype(dtype) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v) for k, v in kw.items()}


@pytest.mark.parametrize("feats", FEATURES, ids=lambda f: "+".join(f) or "plain")
@pytest.mark.parametrize("schedule,config", CONFIGS, ids=lambda v: str(v))
def test_selective_scan_matches_oracle(schedule, config, feats):
    for lanes, L in SHAPES:
        ops = operands(lanes, L, seed=lanes * 7 + L)
        kw = call_kwargs(feats, lanes, L)
        want = scanweaver.selective_scan(**ops, backend="numpy", **kw)
        got = scanweaver.selective_scan(**{k: v.astype(np.float32) for k, v in ops.items()}, backend="cpu",
                                        schedule=schedule, **config, **cast(kw, np.float32))
        if feats.get("return_state"):
            check(got[0], want[0])
            check(got[1], want[1])
        else:
            check(got, want)


@pytest.mark.parametrize("schedule,config", CONFIGS, ids=lambda v: str(v))
def test_float64_without_c_is_h(schedule, config):
    for lanes, L in SHAPES:
        ops = operands(lanes, L, seed=L, with_c=False)
        want = scanweaver.selective_scan(**ops, backend="numpy", h0=np.ones(lanes))
        got = scanweaver.selective_scan(**ops, backend="cpu", schedule=schedule, h0=np.ones(lanes), **config)
        assert got.dtype == np.float64
        check(got, want, rtol=1e-10)


@scanweaver.recurrence
def gated(h, dt, x, z):
    decay = np.exp(-scanweaver.softplus(dt))
    h_new = decay * h + (1 - decay) * x
    return h_new, z * h_new - 0.5 * h + 0.25 * z


@pytest.mark.parametrize("schedule,config", CONFIGS, ids=lambda v: str(v))
def test_custom_recurrence_with_gates_and_old_state(schedule, config):
    rng = np.random.default_rng(3)
    for lanes, L in [(1, 2300), (20, 515), (3, 1)]:
        dt, x, z = (rng.standard_normal((lanes, L)) for _ in range(3))
        h0 = rng.standard_normal(lanes)
        want, wlast = gated(dt, x, z, h0=h0, reverse=True, return_state=True, backend="numpy")
        got, glast = gated(*(v.astype(np.float32) for v in (dt, x, z)), h0=h0.astype(np.float32), reverse=True,
                           return_state=True, backend="cpu", schedule=schedule, **config)
        check(got, want)
        check(glast, wlast)


def test_views_with_strides_and_negative_steps():
    rng = np.random.default_rng(4)
    base = {k: rng.uniform(0.5, 1.0, (6, 2 * 1301)).astype(np.float32) for k in "abxc"}
    views = {k: v[::2, ::-2] if k in "ac" else v[1::2, 1::2] for k, v in base.items()}
    assert not views["a"].flags.c_contiguous and views["a"].strides[1] < 0
    want = scanweaver.selective_scan(**{k: v.astype(np.float64) for k, v in views.items()}, backend="numpy")
    for schedule, config in CONFIGS:
        got = scanweaver.selective_scan(**views, backend="cpu", schedule=schedule, **config)
        check(got, want)


@pytest.mark.parametrize("schedule,config", CONFIGS, ids=lambda v: str(v))
def test_nan_and_inf_propagate_like_the_sequential_recurrence(schedule, config):
    lanes, L = 3, 2100
    ops = {k: v.astype(np.float32) for k, v in operands(lanes, L, seed=5).items()}
    # a = 0.99: products over a chunk stay normal floats; when they underflow to 0, a chunked
    # scan turns an infinite carry into 0*inf = NaN, as the NumPy chunked interpreter does.
    ops["a"][:] = np.float32(0.99)
    ops["x"][0, 1500] = np.nan
    ops["x"][1, 40] = np.inf
    ops["b"][1, 40] = 1.0
    ops["c"][:] = 1.0
    got = scanweaver.selective_scan(**ops, backend="cpu", schedule=schedule, **config)
    want = scanweaver.selective_scan(**{k: v.astype(np.float64) for k, v in ops.items()}, backend="numpy")
    assert np.isnan(got[0, 1500:]).all() and np.isfinite(got[0, :1500]).all()
    assert np.isposinf(got[1, 40:]).all() and np.isfinite(got[1, :40]).all()
    check(got[2], want[2])


def test_default_schedule_and_config_are_recorded():
    ops = {k: v.astype(np.float32) for k, v in operands(64, 300).items()}
    scanweaver.selective_scan(**ops, backend="cpu")
    info = scanweaver.api.SELECTIVE.last
    assert info.backend == "cpu" and info.schedule == "chunked" and info.source in ("default", "tuned")
    assert {"chunk", "threads", "interleave"} <= set(info.config)
    assert "int sw_scan(" in info.stages.kernel and info.stages.target == "c"


def test_bad_tunables_and_schedules_are_clear_errors():
    ops = {k: v.astype(np.float32) for k, v in operands(2, 10).items()}
    with pytest.raises(ScanInputError, match="interleave"):
        scanweaver.selective_scan(**ops, backend="cpu", interleave=0)
    with pytest.raises(ScanInputError, match="threads"):
        scanweaver.selective_scan(**ops, backend="cpu", threads=-1)
    with pytest.raises(ScanInputError, match="blelloch"):
        scanweaver.selective_scan(**ops, backend="cpu", schedule="blelloch")


def test_run_validates_arrays_before_calling_c():
    be = get_backend("cpu")
    ops = {k: v.astype(np.float32) for k, v in operands(4, 33).items()}
    stages = scanweaver.api.SELECTIVE.lower(backend="cpu", schedule="chunked", dtype="float32")
    arrays = prepare("t", ops)
    y, _ = be.run(stages, arrays)
    check(y, scanweaver.selective_scan(**ops, backend="numpy"))
    bad = prepare("t", ops)
    bad.inputs["a"] = np.asfortranarray(bad.inputs["a"])
    with pytest.raises(ScanInputError, match="C-contiguous"):
        be.run(stages, bad)
    bad = prepare("t", ops)
    bad.inputs["b"] = bad.inputs["b"][:, :-1]
    with pytest.raises(ScanInputError, match="shape"):
        be.run(stages, bad)
    bad = prepare("t", {k: v.astype(np.float64) for k, v in ops.items()})
    with pytest.raises(ScanInputError, match="float32"):
        be.run(stages, bad)
    bad = prepare("t", ops)
    del bad.inputs["c"]
    bad.inputs["w"] = ops["c"]
    with pytest.raises(ScanInputError, match="do not match"):
        be.run(stages, bad)
    h0_stages = scanweaver.api.SELECTIVE.lower(backend="cpu", schedule="chunked", dtype="float32",
                                               features=scanweaver.ir.stages.Features(has_h0=True))
    with pytest.raises(ScanInputError, match="h0"):
        be.run(h0_stages, prepare("t", ops))


def _run_isolated(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_missing_compiler_is_a_clear_error_and_auto_falls_back_once(tmp_path):
    # No OpenCL platforms either: PoCL needs `ld` from PATH and would abort the process without it.
    env = {**os.environ, "CC": "/nonexistent/cc", "PATH": str(tmp_path), "SCANWEAVER_CACHE_DIR": str(tmp_path),
           "OCL_ICD_VENDORS": str(tmp_path)}
    proc = _run_isolated("""
        import warnings, numpy as np, scanweaver
        a = np.full((2, 5), 0.5, np.float32)
        try:
            scanweaver.selective_scan(a, a, a, backend="cpu")
        except scanweaver.BackendUnavailable as exc:
            print("CPU-ERROR:", exc)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y1 = scanweaver.selective_scan(a, a, a)
            y2 = scanweaver.selective_scan(a, a, a)
        print("WARNINGS:", len(caught), caught[0].message if caught else "")
        print("BACKEND:", scanweaver.api.SELECTIVE_NO_C.last.backend, float(y2[0, -1]))
    """, env)
    assert proc.returncode == 0, proc.stderr
    assert "CPU-ERROR: backend 'cpu' is unavailable: no C compiler found" in proc.stdout
    assert "set CC" in proc.stdout
    assert "WARNINGS: 1 " in proc.stdout and "falling back to the numpy backend" in proc.stdout
    assert "BACKEND: numpy" in proc.stdout


def test_broken_compiler_makes_the_backend_unavailable_with_the_log(tmp_path):
    """A compiler that cannot build the probe kernel is found out when the backend is probed:
    ``scanweaver devices`` says why, and an explicit ``backend="cpu"`` raises with the compiler's words."""
    script = tmp_path / "badcc"
    script.write_text("#!/bin/sh\necho 'badcc: simulated internal error' >&2\nexit 1\n")
    script.chmod(0o755)
    env = {**os.environ, "CC": str(script), "SCANWEAVER_CACHE_DIR": str(tmp_path)}
    proc = _run_isolated("""
        import numpy as np, scanweaver
        from scanweaver.cli.devices import backend_rows
        print("DEVICES:", [r["reason"] for r in backend_rows() if r["backend"] == "cpu"][0])
        a = np.full((2, 5), 0.5, np.float32)
        try:
            scanweaver.selective_scan(a, a, a, backend="cpu")
        except scanweaver.BackendUnavailable as exc:
            print("UNAVAILABLE:", exc)
    """, env)
    assert proc.returncode == 0, proc.stderr
    assert "UNAVAILABLE: backend 'cpu' is unavailable: the C compiler" in proc.stdout
    assert proc.stdout.count("badcc: simulated internal error") == 2
    assert "DEVICES: the C compiler" in proc.stdout
