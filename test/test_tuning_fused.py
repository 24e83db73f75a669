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
    with pytest.raises(ScanInputError, match="no valid value of chunk"):  # a TypeError ('<=' of int and str) before
        build_fused_space("matrix_state", "cpu", "c", Limits(lanes=8, L=100), {"chunk": ("abc",)})


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


def test_the_cli_tunes_the_matrix_state_algorithm_and_later_calls_use_it(isolated_store, capsys):
    """``scanweaver tune --op matrix_state``: a real tune of both algorithms, stored, then used by a later call of
    the tuned features (GLA's decay per key): the forward runs the stored algorithm and chunk, the backward the
    stored chunk with the rule's algorithm (the tune measured the forward); results as the float64 loop."""
    import json

    from scanweaver import matrix
    from scanweaver.cli import main
    from scanweaver.fused import REGISTRY as FUSED

    if not REGISTRY["cpu"].availability().ok:
        pytest.skip(f"cpu backend unavailable: {REGISTRY['cpu'].availability().reason}")
    batch, T, H, K, V = 1, 70, 2, 16, 24
    assert main(["tune", "--op", "matrix_state", "--backend", "cpu", "--shape", f"{batch},{T},{H},{K},{V}",
                 "--values", "algorithm=recurrent,chunked", "--values", "chunk=16,32", "--values", "block_v=16",
                 "--values", "width=8", "--values", "threads=1", "--max-fevals", "3", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    best = report["best_config"]
    assert report["best_schedule"] == "fused:matrix_state" and best["algorithm"] in ("recurrent", "chunked")
    assert report["evaluated"] == 3
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, batch, T, H, K)).astype(np.float32)
    v = rng.standard_normal((batch, T, H, V)).astype(np.float32)
    g = np.log(rng.uniform(0.9, 0.999, (batch, T, H, K))).astype(np.float32)
    o, _ = scanweaver.linear_attention(q, k, v, g, scale=1.0, backend="cpu", chunk_size=64)
    info = matrix.last
    assert (info.part, info.source, info.algorithm, info.config["chunk"]) == ("forward", "tuned", best["algorithm"],
                                                                              best["chunk"])
    S, want = np.zeros((H, K, V)), np.zeros((batch, T, H, V))
    for t in range(T):  # S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, in float64
        S = np.exp(g[0, t].astype(np.float64))[:, :, None] * S + k[0, t, :, :, None] * v[0, t, :, None, :]
        want[0, t] = np.einsum("hk,hkv->hv", q[0, t].astype(np.float64), S)
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ops = matrix.operands("test", q, k, v, g, decay="key")
    matrix.backward(ops, np.ones_like(v), backend="cpu")
    rule = FUSED.get("matrix_state").algorithm("c", "backward", ops.features(), ops.sizes)
    assert (matrix.last.part, matrix.last.source, matrix.last.algorithm) == ("backward", "tuned", rule)
    matrix.forward(ops, backend="cpu", algorithm="chunked" if best["algorithm"] == "recurrent" else "recurrent")
    assert matrix.last.source == "explicit" and matrix.last.algorithm != best["algorithm"]


def test_the_cli_tunes_the_delta_rule_algorithm_and_later_calls_use_it(isolated_store, capsys):
    """``scanweaver tune --op delta_rule``: a real tune of both algorithms on Gated DeltaNet's features, stored,
    then used by a later ``gated_delta_rule`` call (the forward runs the stored algorithm and chunk, the backward
    the rule's algorithm: the tune measured the forward); results as the float64 definition."""
    import json

    from scanweaver import matrix
    from scanweaver.cli import main
    from scanweaver.fused import REGISTRY as FUSED
    from scanweaver.fused.delta_rule import forward_reference
    from scanweaver.ops.delta_rule import kernels as delta_kernels
    from scanweaver.ops.delta_rule.operands import operands

    if not REGISTRY["cpu"].availability().ok:
        pytest.skip(f"cpu backend unavailable: {REGISTRY['cpu'].availability().reason}")
    batch, T, H, K, V = 1, 70, 2, 16, 24
    assert main(["tune", "--op", "delta_rule", "--backend", "cpu", "--shape", f"{batch},{T},{H},{K},{V}",
                 "--values", "algorithm=recurrent,chunked", "--values", "chunk=16,32", "--values", "block_v=16",
                 "--values", "width=8", "--values", "threads=1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    best = report["best_config"]
    assert report["best_schedule"] == "fused:delta_rule" and report["evaluated"] == 4
    assert "checkpoint" not in best  # read by the backward only: the tune leaves it at its default
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((2, batch, T, H, K)).astype(np.float32)
    v = rng.standard_normal((batch, T, H, V)).astype(np.float32)
    g = np.log(rng.uniform(0.9, 0.999, (batch, T, H))).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (batch, T, H)).astype(np.float32)
    o, _ = scanweaver.gated_delta_rule(q, k, v, g, beta, scale=1.0, use_qk_l2norm_in_kernel=True, backend="cpu",
                                       chunk_size=64)
    info = matrix.last
    assert (info.op, info.part, info.source, info.algorithm, info.config["chunk"]) == (
        "delta_rule", "forward", "tuned", best["algorithm"], best["chunk"])
    want = forward_reference(*(x.astype(np.float64) for x in (q, k, v, beta)), g=g.astype(np.float64),
                             l2norm=True)[0]
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    ops = operands("test", "gated_delta_rule", q, k, v, g=g, beta=beta, l2norm=True)
    delta_kernels.backward(ops, np.ones_like(v), backend="cpu")
    rule = FUSED.get("delta_rule").algorithm("c", "backward", ops.features(), ops.sizes)
    assert (matrix.last.part, matrix.last.source, matrix.last.algorithm) == ("backward", "tuned", rule)
    with pytest.raises(ScanInputError, match="checkpoint of the fused delta_rule kernel is read by its backward"):
        tune_fused("delta_rule", shape=(batch, T, H, K, V), values={"checkpoint": (8,)})
