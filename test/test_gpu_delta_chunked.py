"""The GPU kernels' chunked (WY) forward of the delta rule (DeltaNet, Gated DeltaNet, KDA, RWKV-7): run on OpenCL (PoCL
here; ``SCANWEAVER_TEST_GPU_BACKEND=cuda`` on a GPU) against the float64 loops of the recurrences, on plain chunks
(the product form) and on chunks the product form leaves to the recurrence (growth, a reset, a NaN, a decay past
its range) in one call; selection by ``algorithm=`` and ``chunk_size=``; compiled for sm_90 without spills.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import gpu_backend
from delta_family import loop, problem

import scanweaver
from scanweaver.calls import runner
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures
from scanweaver.targets import TARGETS
from scanweaver.targets.delta_gpu_chunked import layout
from scanweaver.targets.fused import kernel_for
from scanweaver.tools.ptxas import cubin_report

OP = FUSED.get("delta_rule")
NVCC = shutil.which("nvcc")
TOL = {"float32": 3e-5, "float64": 1e-12}


def run(be, f, a, sizes, **tunables):
    """The fused forward on ``be`` (NaN-filled outputs: every element must be written) and what ran."""
    out = {"o": np.full(a["v"].shape, np.nan, a["v"].dtype), "hlast": np.full(a["h0"].shape, np.nan, a["h0"].dtype)}
    cfg = OP.resolve("gpu", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    be.run_fused(OP.call("forward", f, cfg), {**a, **out}, sizes)
    return out["o"], out["hlast"]


def close(got, want, tol, what):
    """Equal non-finite entries, and the finite ones within ``tol`` of the largest."""
    bad = ~np.isfinite(want)
    assert np.array_equal(~np.isfinite(got), bad), f"{what}: non-finite at {np.argwhere(~np.isfinite(got))[:4]}, " \
                                                    f"the loop's at {np.argwhere(bad)[:4]}"
    scale = max(1.0, float(np.abs(want[~bad]).max(initial=0.0)))
    err = float(np.abs(np.where(bad, 0.0, got - want)).max(initial=0.0)) / scale
    assert err <= tol, f"{what}: error {err:.2e} relative to {scale:.3g}"


#: (family, dtype, problem() keywords, chunk): chunks shorter than, equal to and longer than the sequences, packed
#: sequences with an empty one, grouped value heads, the L2 norm, two key tiles (K = 20), two column tiles (V = 40).
CASES = [("deltanet", "float64", {"T": 13, "K": 5, "V": 19}, 4),
         ("gated", "float32", {"seqlens": [5, 0, 19, 1], "Hq": 1, "H": 2, "K": 16, "V": 40, "l2norm": True}, 8),
         ("kda", "float64", {"T": 40, "Hq": 1, "H": 3, "K": 20, "V": 40, "l2norm": True}, 16),
         ("kda", "float32", {"T": 70, "K": 64, "V": 64}, 32),
         ("gated", "float64", {"T": 1, "K": 6, "V": 6}, 16),
         ("deltanet", "float32", {"seqlens": [16, 17, 15], "K": 8, "V": 8, "l2norm": True}, 16),
         ("gated", "float64", {"T": 40, "K": 1, "V": 2}, 32),
         ("rwkv7", "float64", {"T": 13, "K": 5, "V": 19}, 4),
         ("rwkv7", "float32", {"seqlens": [5, 0, 19, 1], "H": 2, "K": 16, "V": 40}, 8),
         ("rwkv7", "float64", {"T": 40, "Hq": 1, "H": 3, "K": 20, "V": 40, "l2norm": True}, 16),
         ("rwkv7", "float32", {"T": 70, "K": 64, "V": 64}, 32),
         ("rwkv7", "float64", {"T": 1, "K": 6, "V": 6}, 16),
         ("rwkv7", "float64", {"T": 40, "K": 1, "V": 2}, 32)]


@pytest.mark.parametrize("family,dtype,kw,chunk", CASES,
                         ids=[f"{c[0]}-{c[1]}-C{c[3]}{'-l2norm' * c[2].get('l2norm', False)}" for c in CASES])
def test_chunked_forward_matches_the_loop(family, dtype, kw, chunk):
    be = gpu_backend()
    rng = np.random.default_rng(len(family) + chunk)
    f, a, sizes = problem(rng, family, dtype=dtype, **kw)
    want_o, want_h = loop(family, a, 1.0, f.l2norm)
    o, h = run(be, f, a, sizes, algorithm="chunked", chunk=chunk)
    close(o, want_o, TOL[dtype], "o")
    close(h, want_h, TOL[dtype], "final state")
    ro, rh = run(be, f, a, sizes)
    close(o, ro.astype(np.float64), TOL[dtype], "chunked against the GPU recurrence")


@pytest.mark.parametrize("family", ["gated", "kda", "rwkv7"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunks_the_product_form_leaves_to_the_recurrence(family, dtype):
    """Chunks of 8 over 56 steps: plain ones between a chunk that grows (log decays up to +0.05), one with a reset
    (-inf), one decaying past the product form's range in float32 (-9 a step) and one with a NaN log decay: the
    loop's outputs and final state, its NaNs exactly where the loop has them (from the NaN's step on)."""
    be = gpu_backend()
    rng = np.random.default_rng(3)
    f, a, sizes = problem(rng, family, dtype=dtype, batch=2, T=56, H=2, K=12, V=10, lo=-0.5, hi=-0.01)
    if family == "rwkv7":  # in-context rates that keep the growing chunk's state far inside float32
        a["b"] = (a["b"] * 0.5).astype(dtype)
    g = a["g"].astype(np.float64)
    g[:, 8:16] = rng.uniform(0.0, 0.05, g[:, 8:16].shape)
    g[:, 21] = -np.inf
    g[:, 32:40] = -9.0
    g[1, 45] = np.nan
    a["g"] = g.astype(dtype)
    want_o, want_h = loop(family, a, 1.0)
    assert np.isfinite(want_o[0]).all() and not np.isfinite(want_o[1, 45:]).any() and np.isfinite(want_o[1, :45]).all()
    o, h = run(be, f, a, sizes, algorithm="chunked", chunk=8)
    close(o, want_o, TOL[dtype], "o")
    close(h, want_h, TOL[dtype], "final state")


@pytest.mark.parametrize("family,name", [("gated", "k"), ("rwkv7", "k"), ("rwkv7", "a"), ("rwkv7", "b")])
def test_a_nan_in_one_key_reaches_only_its_step_and_later_ones(family, name):
    """A NaN in one element of k (RWKV-7: of k, a or b) in the middle of a plain chunk: the outputs before its step
    stay the loop's (the triangular products never read past the diagonal), those from it on are NaN, as in the
    recurrence."""
    be = gpu_backend()
    rng = np.random.default_rng(4)
    f, a, sizes = problem(rng, family, batch=1, T=24, K=8, V=6, hi=-0.01, lo=-0.3)
    a[name][0, 13, 1, 2] = np.nan
    want_o, want_h = loop(family, a, 1.0)
    assert np.isfinite(want_o[0, :13]).all() and not np.isfinite(want_o[0, 13:, 1]).all()
    o, h = run(be, f, a, sizes, algorithm="chunked", chunk=16)
    close(o, want_o, TOL["float64"], "o")
    close(h, want_h, TOL["float64"], "final state")


def test_public_calls_select_the_chunked_forward_and_report_it():
    """``algorithm="chunked"`` and ``chunk_size=`` run the chunked forward on the GPU kernels (``scanweaver.matrix``
    reports it), RWKV-7's forward too."""
    be = gpu_backend()
    rng = np.random.default_rng(5)
    q, k = (rng.normal(size=(1, 40, 2, 8)) for _ in range(2))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(1, 40, 2, 6))
    g, beta = -rng.uniform(0.01, 0.5, (1, 40, 2)), rng.uniform(0.1, 0.9, (1, 40, 2))
    want, _ = scanweaver.gated_delta_rule(q, k, v, g, beta, scale=1.0, backend="numpy")
    for kw in ({"algorithm": "chunked"}, {"chunk_size": 16}):
        o, _ = scanweaver.gated_delta_rule(q, k, v, g, beta, scale=1.0, backend=be.name, **kw)
        info = runner.last["delta_rule"]
        assert (info.backend, info.part, info.algorithm) == (be.name, "forward", "chunked"), info
        np.testing.assert_allclose(o, want, rtol=0, atol=1e-12 * np.abs(want).max())
    assert runner.last["delta_rule"].config["chunk"] == 16
    scanweaver.gated_delta_rule(q, k, v, g, beta, backend=be.name)
    assert runner.last["delta_rule"].algorithm == "recurrent", "the GPU default stays the recurrence"
    a_, b_ = -rng.uniform(0, 0.3, (1, 40, 2, 8)), rng.uniform(0, 0.3, (1, 40, 2, 8))
    w = -rng.uniform(0.01, 0.5, (1, 40, 2, 8))
    want, _ = scanweaver.rwkv7(q, w, k, v, a_, b_, backend="numpy")
    o, _ = scanweaver.rwkv7(q, w, k, v, a_, b_, backend=be.name, algorithm="chunked")
    assert runner.last["delta_rule"].algorithm == "chunked", runner.last["delta_rule"]
    np.testing.assert_allclose(o, want, rtol=0, atol=1e-12 * np.abs(want).max())
    f, _, _ = problem(rng, "rwkv7", batch=1, T=8, H=1, K=8, V=8)
    assert OP.chooses("gpu", "forward", f) and OP.chooses("gpu", "backward", f)
    assert OP.chooses("julia", "forward", f) and OP.chooses("julia", "backward", f)  # and ScanWeaver.jl's


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("gate,form", [("none", "delta"), ("scalar", "delta"), ("key", "delta"), ("key", "dplr")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_chunked_forward_compiles_for_sm90_without_spills(gate, form, dtype):
    """Both kernels at K = V = 128 (and 64) with the default chunk, the L2 norm, an initial state and packed
    sequences: no spills, within the static local memory of a workgroup."""
    for K in (128, 64):
        f = DeltaRuleFeatures(dtype, K, K, True, True, False, gate, form, True)
        sizes = {"batch": 1, "T": 4096, "H": 16, "Hq": 16, "nseq": 1}
        cfg = OP.resolve("gpu", {"algorithm": "chunked"}, kernel_for("cuda", OP.name).defaults(f, sizes), "test")
        assert layout(f, cfg).ct >= 16
        proc, reports = cubin_report(kernel_for("cuda", OP.name).render(TARGETS.get("cuda")(),
                                                                         OP.call("forward", f, cfg)), nvcc=NVCC)
        assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
        assert set(reports) == {"sw_delta_chunk_prep", "sw_delta_chunk_state"}
        for name, r in reports.items():
            assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, (K, name, r)
            assert r["shared"] <= 48 * 1024, (K, name, r)


def test_a_chunked_call_is_held_to_the_chunked_kernels_limits_only():
    """The recurrent kernels' tunables (time_tile, key_split, workgroup_size) do not refuse a chunked forward: a
    time_tile whose recurrent local memory is over a workgroup's 48 KiB plans the chunked kernels and runs right,
    while the same configuration is refused for the recurrent forward, naming time_tile."""
    from scanweaver.errors import ScanInputError
    from scanweaver.targets.fused_gpu_delta_rule import local_bytes, plan

    be = gpu_backend()
    rng = np.random.default_rng(6)
    f, a, sizes = problem(rng, "gated", dtype="float64", T=20, K=32, V=16)
    cfg = OP.resolve("gpu", {"algorithm": "chunked", "chunk": 8, "time_tile": 64},
                     be.fused_defaults(OP.name, f, sizes), "test")
    assert local_bytes("forward", f, cfg) > 48 * 1024
    launches = {x.kernel for x in plan(OP.call("forward", f, cfg), sizes).launches}
    assert launches == {"sw_delta_chunk_prep", "sw_delta_chunk_state"}, launches
    with pytest.raises(ScanInputError, match="time_tile=64"):
        plan(OP.call("forward", f, {**cfg, "algorithm": "recurrent"}), sizes)
    want_o, want_h = loop("gated", a, 1.0)
    o, h = run(be, f, a, sizes, algorithm="chunked", chunk=8, time_tile=64)
    close(o, want_o, TOL["float64"], "o")
    close(h, want_h, TOL["float64"], "final state")
