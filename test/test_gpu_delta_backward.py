"""The fused ``delta_rule`` backward's GPU text for DeltaNet, Gated DeltaNet, KDA and RWKV-7: run on OpenCL (PoCL here)
against the float64 NumPy definition and PyTorch autograd through the recurrences' loops, with q/k heads shared
by value heads, the in-kernel L2 norm, packed sequences with an empty one, exact resets (g = -inf) and decays
that underflow (g = -1e4); compiled for sm_90 with nvcc, where ptxas reports no spills at K = V = 128 with the
default configuration.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import GPU_TEST_BACKEND, gpu_backend, no_wider

import scanweaver
from delta_family import FAMILIES, PUBLIC, call_public, inputs_of, problem, torch_loop

from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures, backward_reference
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for
from scanweaver.tools.ptxas import cubin_report

OP = FUSED.get("delta_rule")
#: Gradient name -> the differentiable input it belongs to.
INPUTS = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "da": "a", "db": "b", "dh0": "h0"}


def gpu_backward(be, f, a, sizes, do, config):
    """The GPU backward's gradients (NaN-filled first, so an unwritten element shows)."""
    out = {p.name: np.full(shape, np.nan, dtype) for p, enabled, shape, dtype in
           OP.layout("backward", f, tuple(sorted(sizes.items()))) if p.kind == "out" and enabled}
    be.run_fused(OP.call("backward", f, OP.resolve("gpu", config, be.fused_defaults(OP.name, f, sizes), "test")),
                 {**a, "do": do, **out}, sizes)
    return out


def autograd(family, a, do, l2norm):
    """Float64 gradients of sum(o * do) + sum(hlast * dhlast) by PyTorch autograd through the family's loop."""
    torch = pytest.importorskip("torch")
    leaves = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()
              if n in INPUTS.values()}
    o, h = torch_loop(family, leaves, 1.0, l2norm, a.get("cu_seqlens"))
    loss = (o * torch.tensor(np.asarray(do, np.float64))).sum()
    if "dhlast" in a:
        loss = loss + (h * torch.tensor(np.asarray(a["dhlast"], np.float64))).sum()
    loss.backward()
    return {"d" + n: leaf.grad.numpy() for n, leaf in leaves.items()}


def extreme_gates(a):
    """An exact reset (g = -inf) and a decay that underflows to 0 (g = -1e4) in the first sequence."""
    if "g" in a:
        a["g"][0, 2] = -np.inf
        a["g"][0, 3, -1] = -1e4


def poisoned(a, value, steps=(3, 20, 38)):
    """``(name, step, arrays less do, do)`` for each copy of ``a`` (its cotangent ``do`` among them) with one element
    set to ``value``: element (1, 2, 3) of head 0 of h0 and dhlast, element 1 of row 0 at each of ``steps`` of the
    others."""
    for name in ("h0", "dhlast", "q", "k", "v", "beta", "g", "a", "b", "do"):
        if name not in a:
            continue
        for t in ((0,) if name in ("h0", "dhlast") else steps):
            b = {n: x.copy() for n, x in a.items()}
            b[name][(0, 1, 2, 3) if name in ("h0", "dhlast") else (0, t, 0, 1)[:b[name].ndim]] = value
            do = b.pop("do")
            yield name, t, b, do


def close(got, want, tol, what):
    for n, w in want.items():
        assert n in got, f"{what}: {n} missing"
        scale = max(float(np.abs(w).max()), 1.0)
        np.testing.assert_allclose(np.asarray(got[n], np.float64), w, rtol=0, atol=tol * scale,
                                   err_msg=f"{what}: {n}")


#: (family, problem() keywords, config): K split over 1 to 4 work-items in the values kernel and the columns over
#: 1 to 4 in the keys kernel (rows and columns past K and V on the last one), V over several workgroups, tiles
#: that do not divide the lengths, packed sequences with an empty one, q/k heads shared by 2 or 3 value heads; K x
#: key_split over 512 (the keys kernel's columns over 16 work-items, slices past V idle, one row per work-item in
#: the values kernel).
CASES = [("deltanet", {"seqlens": [5, 0, 9, 1], "Hq": 1, "H": 2, "K": 5, "V": 19, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 4, "key_split": 2}),
         ("gated", {"seqlens": [5, 0, 9, 1], "Hq": 1, "H": 2, "K": 16, "V": 12, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 3, "key_split": 4}),
         ("gated", {"T": 13, "Hq": 2, "H": 2, "K": 7, "V": 9}, {"workgroup_size": 16, "time_tile": 16, "key_split": 1}),
         ("kda", {"T": 11, "batch": 2, "Hq": 1, "H": 3, "K": 7, "V": 9, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 4, "key_split": 4}),
         ("kda", {"seqlens": [6, 0, 13], "Hq": 1, "H": 2, "K": 12, "V": 10, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 5, "key_split": 2}),
         ("gated", {"T": 9, "batch": 1, "Hq": 1, "H": 2, "K": 24, "V": 24, "l2norm": True},
          {"workgroup_size": 8, "time_tile": 4, "key_split": 32}),
         ("rwkv7", {"T": 13, "batch": 2, "Hq": 2, "H": 2, "K": 7, "V": 9},
          {"workgroup_size": 8, "time_tile": 4, "key_split": 2}),
         ("rwkv7", {"seqlens": [5, 0, 9, 1], "Hq": 2, "H": 2, "K": 12, "V": 19},
          {"workgroup_size": 8, "time_tile": 3, "key_split": 4}),
         ("rwkv7", {"T": 9, "batch": 1, "Hq": 1, "H": 2, "K": 24, "V": 24},
          {"workgroup_size": 8, "time_tile": 16, "key_split": 32})]


@pytest.mark.parametrize("family,kw,config", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_opencl_float64_gradients_match_the_definition_and_autograd(family, kw, config):
    be = gpu_backend()
    rng = np.random.default_rng(len(family) + len(kw))
    f, a, sizes = problem(rng, family, dhlast=True, **kw)
    extreme_gates(a)
    do = rng.normal(size=a["v"].shape)
    got = gpu_backward(be, f, a, sizes, do, config)
    want = backward_reference(a["q"], a["k"], a["v"], **inputs_of(a), l2norm=f.l2norm, do=do, dhlast=a["dhlast"])
    want = {n: w for n, w in want.items() if w is not None and OP.enabled(n, f)}
    assert set(want) >= {"dq", "dk", "dv", "dh0", *(("da", "db") if family == "rwkv7" else ("dbeta",))}
    assert ("dg" in want) == (family != "deltanet")
    close(got, want, 1e-11, "vs the definition")
    close(got, autograd(family, a, do, f.l2norm), 1e-10, "vs autograd")
    if "g" in a:
        assert got["dg"][0, 2].tolist() == np.zeros_like(got["dg"][0, 2]).tolist()  # a reset's dg is 0, no NaN


@pytest.mark.parametrize("family", ["gated", "kda", "rwkv7"])
def test_opencl_float32_gradients(family):
    be = gpu_backend()
    rng = np.random.default_rng(7)
    f, a, sizes = problem(rng, family, T=23, batch=1, Hq=1, H=2, K=16, V=24, l2norm=family != "rwkv7",
                          dhlast=True, dtype="float32")
    extreme_gates(a)
    do = rng.normal(size=a["v"].shape).astype(np.float32)
    got = gpu_backward(be, f, a, sizes, do, {"workgroup_size": 8, "time_tile": 6, "key_split": 2})
    assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in got.values())
    want = backward_reference(*(np.asarray(a[n], np.float64) for n in ("q", "k", "v")),
                              **{n: np.asarray(x, np.float64) for n, x in inputs_of(a).items()}, l2norm=f.l2norm,
                              do=np.asarray(do, np.float64), dhlast=np.asarray(a["dhlast"], np.float64))
    close(got, {n: w for n, w in want.items() if w is not None and OP.enabled(n, f)}, 2e-5, "vs float64")


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("family", ["deltanet", "gated", "kda", "rwkv7"])
def test_a_non_finite_input_leaves_every_gradient_no_wider_than_the_definition(family, value):
    """A NaN or inf in one element of h0 or dhlast, or of one step's q, k, v, beta, g or do: each gradient is
    non-finite only where the float64 definition's is, and equal to it elsewhere.  dg_t was one sum from the
    lane's end, so a non-finite term of one step reached every earlier step (a NaN in one step's v: all earlier
    steps of Gated DeltaNet's and KDA's dg; in h0: KDA's dg at step 0 for the other keys).  One case is still
    wider, and only near that step: a non-finite g_t of one key of KDA leaves rows(G'_t o S'_t) finite for the other
    keys at step t alone, where both sums (from the end through the NaN state S_t, from the start through the NaN
    adjoint before t) are not; RWKV-7's rank-one term couples the rows, so a non-finite g_t, a_t or b_t of one key
    does that at steps t - 1 to t + 1."""
    be = gpu_backend()
    rng = np.random.default_rng(70)
    f, a, sizes = problem(rng, family, batch=1, T=40, H=2, Hq=1, K=5, V=6, dhlast=True)
    a["do"] = rng.normal(size=a["v"].shape)
    for name, t, b, do in poisoned(a, value):
        with np.errstate(all="ignore"):
            got = gpu_backward(be, f, b, sizes, do, {"workgroup_size": 8, "time_tile": 4, "key_split": 2})
            want = backward_reference(b["q"], b["k"], b["v"], **inputs_of(b), l2norm=f.l2norm, do=do,
                                      dhlast=b["dhlast"])
        want = {n: w for n, w in want.items() if w is not None and OP.enabled(n, f)}
        if (family, name) in (("kda", "g"), ("rwkv7", "g"), ("rwkv7", "a"), ("rwkv7", "b")):  # named above
            steps = [t] if family == "kda" else [s for s in (t - 1, t, t + 1) if s < sizes["T"]]
            got, want = ({n: np.delete(x, steps, axis=1) if n == "dg" else x for n, x in d.items()}
                         for d in (got, want))
        no_wider(got, want, f"{name}[{t}] = {value}")


@pytest.mark.parametrize("op", ["gated_delta_rule", "kda", "rwkv7"])
def test_public_gradients_run_the_opencl_backward(op):
    """The PyTorch entry points with ``backend="opencl"`` run both parts there (no fallback): every gradient equals
    autograd of the loop, with a scale, the L2 norm (not RWKV-7's) and q/k heads shared by two value heads."""
    gpu_backend()
    torch = pytest.importorskip("torch")
    swt = pytest.importorskip("scanweaver.torch")
    rng = np.random.default_rng(5)
    l2norm = op != "rwkv7"
    _, a, _ = problem(rng, PUBLIC[op], batch=2, T=7, H=4, Hq=2 if l2norm else 4, K=6, V=5, l2norm=l2norm)
    w_o, w_h = rng.normal(size=(2, 7, 4, 5)), rng.normal(size=(2, 4, 6, 5))
    leaves = {n: {m: torch.tensor(x, requires_grad=True) for m, x in a.items()} for n in ("want", "got")}
    o, h = torch_loop(PUBLIC[op], leaves["want"], 0.8, l2norm)
    ((o * torch.tensor(w_o)).sum() + (h * torch.tensor(w_h)).sum()).backward()
    o, h = call_public(swt.__dict__[op], op, leaves["got"], 0.8, l2norm, backend=GPU_TEST_BACKEND)
    ((o * torch.tensor(w_o)).sum() + (h * torch.tensor(w_h)).sum()).backward()
    ran = scanweaver.matrix.last
    assert (ran.part, ran.backend, ran.fallback) == ("backward", GPU_TEST_BACKEND, ""), ran
    for n, leaf in leaves["got"].items():
        np.testing.assert_allclose(leaf.grad.numpy(), leaves["want"][n].grad.numpy(), rtol=0, atol=1e-11, err_msg=n)


def test_the_gpu_backward_is_chosen_for_every_family():
    kernel = kernel_for("opencl", OP.name)
    for family, (gate, form) in FAMILIES.items():
        assert kernel.fits("backward", DeltaRuleFeatures("float32", 8, 8, gate=gate, form=form)) is None, family
    why = kernel.fits("backward", DeltaRuleFeatures("float16", 8, 8, gate="key", form="dplr"))
    assert "float32 or float64" in why and "float16" in why


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("family", ["deltanet", "gated", "kda", "rwkv7"])
def test_cuda_backward_compiles_for_sm90_without_spills_at_k_v_128(family):
    """ptxas (CUDA 13) reported: values 47 to 80 registers, keys 108 to 128 (512 work-items: 8 x 16 columns
    per row, 1024 spilled), qk 56 to 64, deltas as the forward; float64 (not compiled here, 256 work-items in
    keys) 254 to 255 registers in keys, no spills."""
    gate, form = FAMILIES[family]
    f = DeltaRuleFeatures("float32", 128, 128, True, True, True, gate, form, family in ("gated", "kda"))
    sizes = {"batch": 1, "T": 4096, "H": 16, "Hq": 16 if family == "rwkv7" else 4, "nseq": 1}
    cfg = OP.resolve("gpu", {}, kernel_for("cuda", OP.name).defaults(f, sizes), "test")
    proc, reports = cubin_report(kernel_for("cuda", OP.name).render(TARGETS.get("cuda")(), OP.call("backward", f, cfg)),
                                 nvcc=NVCC)
    assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
    for kernel in ("deltas", "values", "keys", "qk"):
        report = reports[f"sw_delta_rule_bwd_{kernel}"]
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and report["stack"] == 0, (kernel, report)
