"""The fused ``delta_rule`` forward's GPU text for every gate and form: run on OpenCL (PoCL here) against the float64
loops of the recurrences and the NumPy definition; compiled for sm_90 with nvcc, where ptxas reports no spills at
K = V = 128 with the default configuration (columns tiled over work-items, K split over ``key_split`` of them).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import GPU_TEST_BACKEND, gpu_backend
from delta_family import FAMILIES, inputs_of, loop, problem

import scanweaver
from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures, forward_reference
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for
from scanweaver.tools.ptxas import cubin_report

OP = FUSED.get("delta_rule")


#: (family, dtype, problem() keywords, config): K split over 1 to 4 work-items (rows past K on the last one),
#: V over several workgroups, tiles that do not divide the lengths, packed sequences with an empty one, T = 1;
#: DeltaNet with the L2 norm and K over 4 work-items (PoCL 3.1 staged wrong projections after the first tile there
#: before the staging's second barrier).
CASES = [("deltanet", "float64", {"T": 13, "K": 5, "V": 19}, {"workgroup_size": 8, "time_tile": 4, "key_split": 2}),
         ("gated", "float32", {"seqlens": [5, 0, 9, 1], "Hq": 1, "H": 2, "K": 16, "V": 12, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 3, "key_split": 4}),
         ("kda", "float64", {"T": 11, "Hq": 1, "H": 3, "K": 7, "V": 9, "l2norm": True},
          {"workgroup_size": 16, "time_tile": 16, "key_split": 1}),
         ("rwkv7", "float32", {"seqlens": [1, 12, 0], "K": 12, "V": 10, "lo": -20.0, "hi": -1e-4},
          {"workgroup_size": 8, "time_tile": 5, "key_split": 4}),
         ("rwkv7", "float64", {"T": 1, "K": 6, "V": 6}, {"workgroup_size": 8, "time_tile": 2, "key_split": 2}),
         ("deltanet", "float64", {"T": 13, "K": 8, "V": 8, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 3, "key_split": 4})]


@pytest.mark.parametrize("family,dtype,kw,config", CASES,
                         ids=[f"{c[0]}-{c[1]}{'-l2norm' * c[2].get('l2norm', False)}" for c in CASES])
def test_opencl_forward_matches_the_loop_and_the_definition(family, dtype, kw, config):
    be = gpu_backend()
    rng = np.random.default_rng(len(family) + len(kw))
    f, a, sizes = problem(rng, family, dtype=dtype, **kw)
    if "g" in a and a["g"].shape[1] > 3:
        a["g"][0, 3] = -np.inf  # an exact reset
    want_o, want_h = loop(family, a, 1.0, f.l2norm)
    ro, rh = forward_reference(a["q"], a["k"], a["v"], **inputs_of(a), l2norm=f.l2norm)
    out = {"o": np.full_like(ro, np.nan), "hlast": np.full_like(rh, np.nan)}
    be.run_fused(OP.call("forward", f, OP.resolve("gpu", config, {}, "test")), {**a, **out}, sizes)
    tol = {"float32": 2e-5, "float64": 1e-12}[dtype]
    np.testing.assert_allclose(out["o"], want_o, rtol=0, atol=tol * max(1.0, np.abs(want_o).max()))
    np.testing.assert_allclose(out["hlast"], want_h, rtol=0, atol=tol * max(1.0, np.abs(want_h).max()))
    np.testing.assert_allclose(out["o"], ro, rtol=0, atol=tol * max(1.0, np.abs(ro).max()))


def test_gpu_kernels_name_what_they_do_not_run():
    be = gpu_backend()
    rng = np.random.default_rng(0)
    f, a, sizes = problem(rng, "kda", T=5, K=4, V=4, dtype="float16")
    out = {"o": np.empty(a["v"].shape, np.float16), "hlast": np.empty(a["h0"].shape, np.float32)}
    with pytest.raises(ScanInputError, match="float32 or float64, got float16"):
        be.run_fused(OP.call("forward", f, OP.resolve("gpu", {}, be.fused_defaults(OP.name, f, sizes), "t")),
                     {**a, **out}, sizes)


def test_half_operands_on_the_gpu_kernels_are_refused_naming_them_and_the_way_out():
    gpu_backend()
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 1, 5, 2, 4)).astype(np.float16)
    v = rng.normal(size=(1, 5, 2, 3)).astype(np.float16)
    beta = rng.uniform(0, 1, (1, 5, 2)).astype(np.float16)
    with pytest.raises(ScanInputError, match=r"^delta_rule: .*float32 or float64; the operands \(q, k, v and the "
                                             r"gates\) are float16: convert them to float32, or use backend='cpu'"):
        scanweaver.delta_rule(q, k, v, beta, backend=GPU_TEST_BACKEND)
    o = scanweaver.delta_rule(q, k, v, beta)[0]  # auto passes over the GPU kernels
    assert o.dtype == np.float16 and np.isfinite(o.astype(np.float32)).all()


def test_one_key_with_the_l2_norm_runs_right_by_default():
    """K = 1 with the in-kernel L2 norm and V = 16 (a default of 16 columns a workgroup, which PoCL built wrong: o off
    by O(1)): the default configuration matches the NumPy definition, forward and final state, recurrent and
    chunked."""
    gpu_backend()
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(2, 1, 20, 1, 1))
    v, beta = rng.normal(size=(1, 20, 1, 16)), rng.uniform(0, 1, (1, 20, 1))
    want = scanweaver.delta_rule(q, k, v, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                 backend="numpy")
    for kw in ({}, {"algorithm": "chunked"}):
        got = scanweaver.delta_rule(q, k, v, beta, use_qk_l2norm_in_kernel=True, output_final_state=True,
                                    backend=GPU_TEST_BACKEND, **kw)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-12 * np.abs(w).max(), err_msg=str(kw))


def test_a_key_size_past_local_memory_names_the_ways_out():
    """K = 2048 (the default key_split held to the tunable's 64): the refusal names K and backend='cpu', not a
    tunable the call never gave."""
    gpu_backend()
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, 1, 3, 1, 2048)).astype(np.float32)
    v, beta = rng.normal(size=(1, 3, 1, 4)).astype(np.float32), rng.uniform(0, 1, (1, 3, 1)).astype(np.float32)
    with pytest.raises(ScanInputError, match="K is too large .* use backend='cpu'"):
        scanweaver.delta_rule(q, k, v, beta, backend=GPU_TEST_BACKEND)


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_forward_compiles_for_sm90_without_spills_at_k_v_128(family, dtype):
    gate, form = FAMILIES[family]
    f = DeltaRuleFeatures(dtype, 128, 128, True, True, False, gate, form, family != "rwkv7")
    sizes = {"batch": 1, "T": 4096, "H": 16, "Hq": 16, "nseq": 1}
    cfg = OP.resolve("gpu", {}, kernel_for("cuda", OP.name).defaults(f, sizes), "test")
    assert cfg["key_split"] == 8 and cfg["workgroup_size"] * cfg["key_split"] <= 1024
    proc, reports = cubin_report(kernel_for("cuda", OP.name).render(TARGETS.get("cuda")(), OP.call("forward", f, cfg)),
                                 nvcc=NVCC)
    assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
    report = reports["sw_delta_rule_forward"]
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and report["stack"] == 0, report
