"""Kernel Tuner on the fused Mamba-1 kernel: real tunes (C on this CPU, OpenCL on PoCL), the store, the calls."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver import mamba
from scanweaver.errors import BackendUnavailable, ScanInputError
from scanweaver.runtime import REGISTRY
from scanweaver.tuning import store

pytest.importorskip("kernel_tuner", reason="Kernel Tuner is not installed (pip install scanweaver[tune])")
from scanweaver.tuning.fused import build_fused_space, tune_fused  # noqa: E402
from scanweaver.tuning.space import Limits  # noqa: E402


@pytest.fixture
def isolated_store(tmp_path, monkeypatch):
    """A fresh cache directory (store and Kernel Tuner files) for one test."""
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    store._cache_dir.cache_clear()
    yield tmp_path
    store._cache_dir.cache_clear()


def layer(rng, batch, dim, N, L):
    f = np.float32
    return dict(u=rng.standard_normal((batch, dim, L)).astype(f), delta=rng.standard_normal((batch, dim, L)).astype(f),
                A=-rng.uniform(1, 8, (dim, N)).astype(f), B=rng.standard_normal((batch, N, L)).astype(f),
                C=rng.standard_normal((batch, N, L)).astype(f), D=rng.standard_normal(dim).astype(f),
                z=rng.standard_normal((batch, dim, L)).astype(f), delta_bias=rng.uniform(-1, 0, dim).astype(f),
                delta_softplus=True)


def test_space_comes_from_the_declared_tunables():
    sp = build_fused_space("mamba1", "cpu", "c", Limits(lanes=64, L=100, cpu_count=2))
    assert sp.params["chunk"] == (16, 32, 64, 128) and sp.params["width"] == (4, 8, 16)
    assert sp.params["threads"] == (1, 2)
    gpu = build_fused_space("mamba1", "opencl", "gpu", Limits(lanes=8, L=100, max_workgroup=64))
    assert gpu.params["workgroup_size"] == (32, 64)
    with pytest.raises(ScanInputError, match="no valid value of width"):
        build_fused_space("mamba1", "cpu", "c", Limits(lanes=8, L=100), {"width": (3,)})


@pytest.mark.parametrize("backend, values", [
    ("cpu", {"chunk": (16, 32), "width": (8,), "threads": (1,)}),
    ("opencl", {"workgroup_size": (32,), "items_per_thread": (2, 4)}),
    ("julia", {"workgroup_size": (32, 64), "chunk": (35,)}),
])
def test_a_real_tune_is_stored_and_used_by_the_next_call(isolated_store, rng, backend, values):
    if not REGISTRY[backend].availability().ok:
        pytest.skip(f"backend {backend!r} unavailable: {REGISTRY[backend].availability().reason}")
    batch, dim, N, L = 1, 24, 4, 70
    device = "cpu" if backend == "julia" else None  # the julia backend tunes the device it is told to
    report = tune_fused("mamba1", backend=backend, shape=(batch, dim, N, L), values=values, progress=False,
                        iterations=3, device=device)
    assert len(report.evaluations) == 2 and all(e.reason is None for e in report.evaluations)
    assert report.best is not None and report.best.schedule == "fused:mamba1"
    ops = layer(rng, batch, dim, N, L)
    y = scanweaver.mamba_selective_scan(**ops, backend=backend)
    assert mamba.last.source == "tuned" and mamba.last.config == {**mamba.last.config, **report.best.config}
    ref = scanweaver.mamba_selective_scan(**ops, backend="numpy")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    other = dict(ops, D=None)  # other features: another signature, the defaults
    scanweaver.mamba_selective_scan(**other, backend=backend)
    assert mamba.last.source == "default"


def test_tune_errors_name_the_problem(isolated_store):
    with pytest.raises(ScanInputError, match=r"needs shape \(batch, D, N, L\)"):
        tune_fused("mamba1", shape=(8, 512, 4096))
    with pytest.raises(ScanInputError, match="unknown fused operation 'mamba2'"):
        tune_fused("mamba2", shape=(1, 2, 3, 4))
    # without Julia it cannot be tuned; with Julia and no GPU, the default device (cuda) is named before the tune
    with pytest.raises(BackendUnavailable, match="has no tunable fused mamba1 kernel|cannot be tuned"):
        tune_fused("mamba1", backend="julia", shape=(1, 2, 3, 4))


def test_the_cli_tunes_the_fused_kernel_and_the_next_call_uses_it(isolated_store, rng, capsys):
    """``scanweaver tune --op mamba1``: a real tune from the command line, stored, then used."""
    from scanweaver.cli import main

    assert main(["tune", "--op", "mamba1", "--backend", "cpu", "--shape", "1,24,4,70", "--values", "chunk=16,32",
                 "--values", "width=8", "--values", "threads=1", "--json"]) == 0
    out = capsys.readouterr().out
    assert "fused:mamba1" in out
    ops = layer(rng, 1, 24, 4, 70)
    scanweaver.mamba_selective_scan(**ops, backend="cpu")
    assert mamba.last.source == "tuned" and mamba.last.config["chunk"] in (16, 32)


def test_a_real_tune_of_the_matrix_state_kernel_covers_both_algorithms(isolated_store):
    if not REGISTRY["cpu"].availability().ok:
        pytest.skip(f"cpu backend unavailable: {REGISTRY['cpu'].availability().reason}")
    values = {"algorithm": ("recurrent", "chunked"), "chunk": (16, 32), "block_v": (16,), "width": (8,),
              "threads": (1,)}
    report = tune_fused("matrix_state", backend="cpu", shape=(1, 70, 2, 16, 24), values=values, progress=False,
                        iterations=3)
    assert len(report.evaluations) == 4 and all(e.reason is None for e in report.evaluations)
    assert {e.config["algorithm"] for e in report.evaluations} == {"recurrent", "chunked"}
    assert report.best is not None and report.best.schedule == "fused:matrix_state"
    with pytest.raises(ScanInputError, match=r"\(batch, T, H, K, V\)"):
        tune_fused("matrix_state", shape=(1, 70, 2, 16))
