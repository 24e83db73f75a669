"""The GPU kernels' chunked backward of the delta rule (DeltaNet, Gated DeltaNet, KDA, RWKV-7): run on OpenCL
(PoCL here; ``SCANWEAVER_TEST_GPU_BACKEND=cuda`` on a GPU) against the float64 definition, PyTorch autograd through the
recurrences' loops and the GPU recurrent backward, on plain chunks (the adjoints carried by the chunk products) and
on chunks the product form leaves to the recurrence (growth, a reset, a NaN, a decay past its range) in one call;
selection by ``algorithm=`` and ``chunk_size=`` through the public operations; compiled for sm_90 without spills.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import GPU_TEST_BACKEND, gpu_backend, no_wider
from delta_family import call_public, dplr_gated, inputs_of, problem, torch_loop
from test_gpu_delta_backward import autograd, close, extreme_gates, gpu_backward, poisoned

import scanweaver
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures, backward_reference
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for
from scanweaver.tools.ptxas import cubin_report

OP = FUSED.get("delta_rule")
NVCC = shutil.which("nvcc")
#: The recurrent kernels' layout inside the chunks: K over 2 work-items, tiles of 4 steps (shorter than some chunks).
SMALL = {"workgroup_size": 8, "time_tile": 4, "key_split": 2}


def definition(f, a, do):
    """The float64 definition's gradients of the inputs ``f`` uses."""
    want = backward_reference(*(np.asarray(a[n], np.float64) for n in ("q", "k", "v")),
                              **{n: np.asarray(x, np.float64) for n, x in inputs_of(a).items()}, l2norm=f.l2norm,
                              do=np.asarray(do, np.float64), dhlast=np.asarray(a["dhlast"], np.float64))
    return {n: w for n, w in want.items() if w is not None and OP.enabled(n, f)}


#: (family, problem() keywords, chunk): chunks shorter than, equal to and longer than the sequences, T = 1, packed
#: sequences with an empty one and one shorter than a chunk, q/k heads shared by 2 or 3 value heads, the L2 norm, two
#: key tiles of the products (K = 20) and two column tiles (V = 40), with an exact reset and an underflowing decay.
CASES = [("deltanet", {"T": 13, "K": 5, "V": 19}, 4),
         ("gated", {"seqlens": [5, 0, 19, 1], "Hq": 1, "H": 2, "K": 16, "V": 40, "l2norm": True}, 8),
         ("kda", {"T": 40, "Hq": 1, "H": 3, "K": 20, "V": 9, "l2norm": True}, 16),
         ("kda", {"seqlens": [6, 0, 13], "Hq": 1, "H": 2, "K": 12, "V": 10}, 4),
         ("gated", {"T": 1, "K": 6, "V": 6}, 16),
         ("deltanet", {"seqlens": [16, 17, 15], "K": 8, "V": 8, "l2norm": True}, 16),
         ("deltanet", {"T": 70, "K": 1, "V": 2}, 64),
         # chunks shorter than the adjoints' row groups with two rows a work-item (columns of 16 and 32)
         ("deltanet", {"T": 5, "K": 4, "V": 16}, 32),
         ("gated", {"T": 40, "K": 3, "V": 32}, 17),
         ("rwkv7", {"T": 13, "K": 5, "V": 19}, 4),
         ("rwkv7", {"seqlens": [5, 0, 19, 1], "Hq": 1, "H": 2, "K": 16, "V": 40, "l2norm": True}, 8),
         ("rwkv7", {"T": 40, "Hq": 1, "H": 3, "K": 20, "V": 9}, 16),
         ("rwkv7", {"T": 1, "K": 6, "V": 6}, 16),
         ("rwkv7", {"T": 5, "K": 4, "V": 16}, 32)]


@pytest.mark.parametrize("family,kw,chunk", CASES, ids=[f"{c[0]}-C{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_float64_gradients_match_the_definition_and_autograd(family, kw, chunk):
    be = gpu_backend()
    rng = np.random.default_rng(len(family) + chunk)
    f, a, sizes = problem(rng, family, dhlast=True, **kw)
    resets = sizes["T"] > 3
    if resets:
        extreme_gates(a)
    do = rng.normal(size=a["v"].shape)
    got = gpu_backward(be, f, a, sizes, do, {**SMALL, "algorithm": "chunked", "chunk": chunk})
    want = definition(f, a, do)
    assert set(want) >= {"dq", "dk", "dv", "dh0", "da" if family == "rwkv7" else "dbeta"}
    assert ("dg" in want) == (family != "deltanet")
    close(got, want, 1e-11, "vs the definition")
    close(got, autograd(family, a, do, f.l2norm), 1e-10, "vs autograd")
    if "g" in a and resets:
        assert got["dg"][0, 2].tolist() == np.zeros_like(got["dg"][0, 2]).tolist()  # a reset's dg is 0, no NaN


@pytest.mark.parametrize("family", ["gated", "kda", "rwkv7"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunks_the_product_form_leaves_to_the_recurrence(family, dtype):
    """Chunks of 8 over 56 steps: plain ones between a chunk that grows (log decays up to +0.05), one with a reset
    (-inf) and one decaying past the product form's range in float32 (-9 a step): every gradient the definition's."""
    be = gpu_backend()
    rng = np.random.default_rng(3)
    f, a, sizes = problem(rng, family, dtype=dtype, batch=2, T=56, H=2, K=12, V=10, lo=-0.5, hi=-0.01, dhlast=True)
    if family == "rwkv7":  # in-context rates that keep the growing chunk's state far inside float32
        a["b"] = (a["b"] * 0.5).astype(dtype)
    g = a["g"].astype(np.float64)
    g[:, 8:16] = rng.uniform(0.0, 0.05, g[:, 8:16].shape)
    g[:, 21] = -np.inf
    g[:, 32:40] = -9.0
    a["g"] = g.astype(dtype)
    do = rng.normal(size=a["v"].shape).astype(dtype)
    got = gpu_backward(be, f, a, sizes, do, {**SMALL, "algorithm": "chunked", "chunk": 8})
    close(got, definition(f, a, do), 1e-11 if dtype == "float64" else 3e-5, "vs the definition")


@pytest.mark.parametrize("family,chunk", [("deltanet", 32), ("gated", 64), ("kda", 64), ("rwkv7", 32)])
def test_float32_at_length_512_against_the_definition(family, chunk):
    """Float32, 512 steps in chunks of 32 or 64, K = V = 32, the default recurrent layout: the chunked gradients
    within 3e-5 (relative to the largest) of the float64 definition, as the recurrent GPU backward's are
    (test_gpu_delta_backward.py)."""
    be = gpu_backend()
    rng = np.random.default_rng(8)
    f, a, sizes = problem(rng, family, dtype="float32", batch=1, T=512, H=2, Hq=1, K=32, V=32, l2norm=True,
                          dhlast=True, lo=-0.2, hi=-0.001)
    do = rng.normal(size=a["v"].shape).astype(np.float32)
    got = gpu_backward(be, f, a, sizes, do, {"algorithm": "chunked", "chunk": chunk})
    assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in got.values())
    close(got, definition(f, a, do), 3e-5, f"chunked, chunk {chunk}")


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("family", ["deltanet", "gated", "kda", "rwkv7"])
def test_a_non_finite_input_leaves_every_gradient_no_wider_than_the_recurrent_backward(family, value):
    """A NaN or inf in one element of h0 or dhlast, or of one step's q, k, v, beta, g, a, b or do (in the first, a
    middle and the last of five chunks of 8): every chunked gradient is non-finite only where the GPU recurrent
    backward's is, and equal to it elsewhere (a NaN log decay makes its chunk run by the recurrence in both
    directions)."""
    be = gpu_backend()
    rng = np.random.default_rng(70)
    f, a, sizes = problem(rng, family, batch=1, T=40, H=2, Hq=1, K=5, V=6, dhlast=True)
    a["do"] = rng.normal(size=a["v"].shape)
    for name, t, b, do in poisoned(a, value):
        with np.errstate(all="ignore"):
            rec = gpu_backward(be, f, b, sizes, do, SMALL)
            got = gpu_backward(be, f, b, sizes, do, {**SMALL, "algorithm": "chunked", "chunk": 8})
        no_wider(got, rec, f"{name}[{t}] = {value}")


def test_public_gradients_select_the_chunked_backward_and_report_it():
    """``algorithm="chunked"`` and fla's ``chunk_size`` run both parts chunked on the GPU kernels through the
    PyTorch entry points (``scanweaver.matrix.last`` says so for the backward), with gradients equal to autograd of
    the loop, RWKV-7's too."""
    gpu_backend()
    torch = pytest.importorskip("torch")
    swt = pytest.importorskip("scanweaver.torch")
    rng = np.random.default_rng(5)
    _, a, _ = problem(rng, "gated", batch=2, T=21, H=4, Hq=2, K=6, V=5, l2norm=True)
    w_o, w_h = rng.normal(size=(2, 21, 4, 5)), rng.normal(size=(2, 4, 6, 5))
    want = {m: torch.tensor(x, requires_grad=True) for m, x in a.items()}
    o, h = torch_loop("gated", want, 0.8, True)
    ((o * torch.tensor(w_o)).sum() + (h * torch.tensor(w_h)).sum()).backward()
    for kw, source in (({"algorithm": "chunked", "chunk": 8}, "explicit"), ({"chunk_size": 16}, "hint")):
        got = {m: torch.tensor(x, requires_grad=True) for m, x in a.items()}
        o, h = call_public(swt.gated_delta_rule, "gated_delta_rule", got, 0.8, True, backend=GPU_TEST_BACKEND, **kw)
        ((o * torch.tensor(w_o)).sum() + (h * torch.tensor(w_h)).sum()).backward()
        ran = scanweaver.matrix.last
        assert (ran.part, ran.backend, ran.algorithm, ran.source, ran.fallback) == \
            ("backward", GPU_TEST_BACKEND, "chunked", source, ""), ran
        for n, leaf in got.items():
            np.testing.assert_allclose(leaf.grad.numpy(), want[n].grad.numpy(), rtol=0, atol=1e-11, err_msg=n)
    _, a, _ = problem(rng, "rwkv7", batch=1, T=9, H=2, K=8, V=8)
    want = {n: torch.tensor(x, requires_grad=True) for n, x in a.items()}
    o, h = torch_loop("rwkv7", want, 0.5)
    (o.sum() + h.sum()).backward()
    t = {n: torch.tensor(x, requires_grad=True) for n, x in a.items()}
    o, h = call_public(swt.rwkv7, "rwkv7", t, 0.5, backend=GPU_TEST_BACKEND, algorithm="chunked", chunk=4)
    (o.sum() + h.sum()).backward()
    ran = scanweaver.matrix.last
    assert (ran.part, ran.algorithm) == ("backward", "chunked"), ran
    for n, leaf in t.items():
        np.testing.assert_allclose(leaf.grad.numpy(), want[n].grad.numpy(), rtol=0, atol=1e-11, err_msg=n)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("gate,form", [("none", "delta"), ("scalar", "delta"), ("key", "delta"), ("key", "dplr")])
def test_cuda_chunked_backward_compiles_for_sm90_without_spills(gate, form):
    """The seven kernels at K = V = 128 and 64 in float32 with the default configuration, the L2 norm, an initial
    state, dhlast and packed sequences: no spills, within a workgroup's static local memory."""
    for K in (128, 64):
        f = DeltaRuleFeatures("float32", K, K, True, True, True, gate, form, True)
        sizes = {"batch": 1, "T": 4096, "H": 16, "Hq": 4, "nseq": 1}
        kernel = kernel_for("cuda", OP.name)
        cfg = OP.resolve("gpu", {"algorithm": "chunked"}, kernel.defaults(f, sizes), "test")
        proc, reports = cubin_report(kernel.render(TARGETS.get("cuda")(), OP.call("backward", f, cfg)), nvcc=NVCC)
        assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
        assert set(reports) == {"sw_delta_chunk_prep", "sw_delta_chunk_state", "sw_delta_chunk_adjoint",
                                "sw_delta_rule_bwd_deltas", "sw_delta_rule_bwd_values", "sw_delta_rule_bwd_keys",
                                "sw_delta_rule_bwd_qk"}, set(reports)
        for name, r in reports.items():
            assert r["spill_stores"] == r["spill_loads"] == r["stack"] == 0, (K, name, r)
            assert r["shared"] <= 48 * 1024, (K, name, r)


@pytest.mark.parametrize("gate", ["none", "scalar"])
def test_the_dplr_form_with_a_decay_per_head_or_none(gate):
    """The ``dplr`` form with one log decay per head (a reset and an underflowing decay among them) or none: the
    chunked forward and every chunked gradient equal the recurrent GPU kernels' (float64)."""
    from test_gpu_delta_chunked import run

    be = gpu_backend()
    rng = np.random.default_rng(3)
    f, a, sizes = dplr_gated(rng, gate)
    for got, want in zip(run(be, f, a, sizes, algorithm="chunked", chunk=16), run(be, f, a, sizes), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())
    do = rng.normal(size=a["v"].shape)
    rec = gpu_backward(be, f, a, sizes, do, SMALL)
    got = gpu_backward(be, f, a, sizes, do, {**SMALL, "algorithm": "chunked", "chunk": 16})
    close(got, rec, 1e-11, "vs the recurrent GPU backward")
