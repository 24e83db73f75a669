"""The chunked (WY / UT transform) forward of the fused ``delta_rule`` op on the cpu backend against the float64 loops
of the recurrences (``delta_family.loop``: one matrix product per step, written from the models' formulas).

DeltaNet, Gated DeltaNet, KDA (the ``delta`` form) and RWKV-7 (the ``dplr`` form).  Cases: odd lengths, T = 1,
lengths that straddle the chunks and equal them, packed sequences with an empty one, h0, grouped value heads, L2
normalisation, beta in [0, 2] (negative eigenvalues), log decays near 0 of both signs (a chunk that grows runs the
recurrence itself), strong decays (chunks beyond the product form's range), exact resets (-inf), float32 at
realistic K and V, half storage, and the public operations with ``algorithm="chunked"``.
"""

from __future__ import annotations

import numpy as np
import pytest
from delta_family import FAMILIES, PUBLIC, call_public, loop, problem

import scanweaver
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import backward_reference

OP = FUSED.get("delta_rule")


def run(be, f, a, sizes, **tunables):
    """The chunked C forward's ``(o, hlast)`` (NaN-filled first, so an unwritten element shows)."""
    cfg = OP.resolve("c", {"algorithm": "chunked", **tunables}, be.fused_defaults(OP.name, f, sizes), "test")
    out = {}
    for p, enabled, shape, dtype in OP.layout("forward", f, tuple(sorted(sizes.items()))):
        if p.kind == "out" and enabled:
            out[p.name] = np.full(shape, np.nan, dtype)
    be.run_fused(OP.call("forward", f, cfg), {**a, **out}, sizes)
    return out["o"], out["hlast"]


def wide_beta(rng, a):
    """beta in [0, 2] (fla's allow_neg_eigval: the transition's eigenvalue 1 - beta down to -1)."""
    if "beta" in a:
        a["beta"] = rng.uniform(0.0, 2.0, a["beta"].shape).astype(a["beta"].dtype)


#: name -> (problem() keywords, chunk): lengths odd, 1, equal to and straddling the chunk, packed with an empty one.
CASES = {"odd": ({"T": 21}, 4), "one_step": ({"T": 1}, 4), "equal": ({"T": 16}, 16), "straddle": ({"T": 17}, 8),
         "packed_groups": ({"seqlens": [5, 0, 13, 1], "Hq": 1, "H": 2}, 4),
         "groups_l2norm": ({"T": 19, "Hq": 1, "H": 3, "l2norm": True}, 8), "no_h0": ({"T": 9, "h0": False}, 3)}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_float64_matches_the_loop(cpu, family, case):
    rng = np.random.default_rng(len(family) * 7 + len(case))
    kw, chunk = CASES[case]
    f, a, sizes = problem(rng, family, K=6, V=21, **kw)
    wide_beta(rng, a)
    want_o, want_h = loop(family, a, 1.0, f.l2norm)
    o, h = run(cpu, f, a, sizes, chunk=chunk, threads=2)
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["gated", "kda", "rwkv7"])
def test_log_decays_near_zero_of_both_signs(cpu, family):
    """Chunks with a positive log decay grow: they run the recurrence; the others the product form."""
    rng = np.random.default_rng(3)
    f, a, sizes = problem(rng, family, batch=2, T=37, K=8, V=16)
    a["g"] = rng.uniform(-0.03, 0.01, a["g"].shape)
    a["g"][0, :20] = -np.abs(a["g"][0, :20])  # the first chunks of batch 0 decay only
    wide_beta(rng, a)
    want_o, want_h = loop(family, a)
    o, h = run(cpu, f, a, sizes, chunk=8)
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family", ["gated", "kda", "rwkv7"])
def test_strong_decays_and_resets(cpu, family):
    """Log decays down to -30 per step (a chunk's sums far beyond the product form's range: sub-blocks and
    entries) and exact resets (-inf), one of them at a chunk's first step."""
    rng = np.random.default_rng(4)
    f, a, sizes = problem(rng, family, batch=1, T=70, H=2, K=8, V=16, lo=-30.0, hi=-1e-3)
    a["g"][0, 5, 0] = -np.inf
    a["g"][0, 32, 1] = -np.inf
    want_o, want_h = loop(family, a)
    o, h = run(cpu, f, a, sizes, chunk=32)
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("family,K,V,lo,hi,chunk", [
    ("deltanet", 64, 64, -1.0, -0.1, 64), ("gated", 128, 128, -20.0, -1e-4, 64), ("gated", 64, 48, -0.05, -1e-6, 32),
    ("kda", 64, 128, -20.0, -1e-4, 64), ("kda", 128, 64, -0.5, -1e-4, 16), ("rwkv7", 64, 64, -8.0, -1e-3, 64),
    ("rwkv7", 128, 32, -20.0, -1e-4, 32)])
def test_float32_at_realistic_sizes(cpu, family, K, V, lo, hi, chunk):
    rng = np.random.default_rng(K + V + chunk)
    f, a, sizes = problem(rng, family, batch=1, T=157, H=2, Hq=1, K=K, V=V, lo=lo, hi=hi, dtype="float32",
                          l2norm=family != "rwkv7")
    wide_beta(rng, a)
    if "g" in a:
        a["g"][0, 70, 0] = -np.inf  # an exact reset on one head
    want_o, want_h = loop(family, a, 1.0, f.l2norm)
    o, h = run(cpu, f, a, sizes, chunk=chunk)
    assert o.dtype == np.float32 and np.isfinite(o).all()
    np.testing.assert_allclose(o, want_o, atol=5e-5 * np.abs(want_o).max(), rtol=0)
    np.testing.assert_allclose(h, want_h, atol=5e-5 * np.abs(want_h).max(), rtol=0)


@pytest.mark.parametrize("dtype,family", [("float16", "gated"), ("bfloat16", "gated"), ("bfloat16", "rwkv7")])
def test_half_storage_accumulates_in_float32(cpu, dtype, family):
    rng = np.random.default_rng(5)
    f, a, sizes = problem(rng, family, batch=1, T=40, H=2, K=32, V=48, dtype=dtype)
    want_o, want_h = loop(family, a)
    o, h = run(cpu, f, a, sizes, chunk=16)
    assert o.dtype.name == dtype and h.dtype == np.float32
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    np.testing.assert_allclose(o.astype(np.float64), want_o, atol=2 * ulp * np.abs(want_o).max(), rtol=0)
    np.testing.assert_allclose(h, want_h, atol=5e-5 * np.abs(want_h).max(), rtol=0)


@pytest.mark.parametrize("family", ["kda", "rwkv7"])
def test_results_do_not_depend_on_the_chunk(cpu, family):
    rng = np.random.default_rng(6)
    f, a, sizes = problem(rng, family, batch=1, T=45, K=16, V=24)
    outs = [run(cpu, f, a, sizes, chunk=c) for c in (1, 7, 16, 45, 64)]
    for o, h in outs[1:]:
        np.testing.assert_allclose(o, outs[0][0], rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(h, outs[0][1], rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("op", PUBLIC)
def test_public_operations_take_the_chunked_form(op):
    rng = np.random.default_rng(7)
    family = PUBLIC[op]
    f, a, sizes = problem(rng, family, batch=1, seqlens=[7, 12], H=2, K=8, V=8)
    want_o, want_h = loop(family, a, 0.5)
    o, h = call_public(getattr(scanweaver, op), op, a, 0.5, backend="cpu", algorithm="chunked", chunk=4)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-10, atol=1e-10)


def test_the_backward_under_the_chunked_algorithm_is_the_chunked_one(cpu):
    """``algorithm="chunked"`` runs the chunked backward of the delta form (test_delta_chunked_backward.py), exact,
    and the runner reports it."""
    rng = np.random.default_rng(8)
    f, a, sizes = problem(rng, "gated", batch=1, T=13, K=6, V=7, dhlast=True)
    wide = {n: (x if n == "cu_seqlens" else np.asarray(x, np.float64)) for n, x in a.items()}
    do = rng.normal(size=a["v"].shape)
    want = backward_reference(wide["q"], wide["k"], wide["v"], wide["beta"], g=wide["g"], h0=wide["h0"], do=do,
                              dhlast=wide["dhlast"])
    cfg = OP.resolve("c", {"algorithm": "chunked", "chunk": 4}, cpu.fused_defaults(OP.name, f, sizes), "test")
    out = {p.name: np.full(shape, np.nan, dtype) for p, enabled, shape, dtype in
           OP.layout("backward", f, tuple(sorted(sizes.items()))) if p.kind == "out" and enabled}
    cpu.run_fused(OP.call("backward", f, cfg), {**a, "do": do, **out}, sizes)
    for n, g in out.items():
        np.testing.assert_allclose(g, want[n], rtol=1e-10, atol=1e-10, err_msg=n)
    # through the runner, the algorithm it reports is the one that ran
    from scanweaver.calls import runner
    from scanweaver.ops.delta_rule import kernels
    from scanweaver.ops.delta_rule.operands import operands

    ops = operands("test", "gated_delta_rule", wide["q"], wide["k"], wide["v"], g=wide["g"], beta=wide["beta"],
                   h0=wide["h0"])
    grads = kernels.backward(ops, do, wide["dhlast"], backend="cpu", algorithm="chunked", chunk=4)
    ran = runner.last["delta_rule"]
    assert (ran.part, ran.algorithm) == ("backward", "chunked")
    np.testing.assert_allclose(grads["dv"], want["dv"], rtol=1e-10, atol=1e-10)
    kernels.forward(ops, backend="cpu", algorithm="chunked", chunk=4)
    assert runner.last["delta_rule"].algorithm == "chunked"


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["k", "v", "beta"])
@pytest.mark.parametrize("family", ["gated", "kda"])
def test_a_non_finite_input_reaches_no_earlier_step(cpu, family, name, value):
    """A NaN or inf in one step's k, v or beta, inside a chunk and inside a register block of its rows: the chunked
    output is non-finite exactly where the recurrent one is (a triangular product that read the later rows of its
    block multiplied their NaN or inf by a masked 0, so the steps before it turned NaN too)."""
    rng = np.random.default_rng(13)
    f, a, sizes = problem(rng, family, batch=1, T=40, H=1, Hq=1, K=4, V=3)
    for t in (3, 20):  # inside the first chunk of 16, and inside the second
        b = {n: x.copy() for n, x in a.items()}
        b[name][(0, t, 0, 1)[:b[name].ndim]] = value
        rec = run(cpu, f, b, sizes, algorithm="recurrent")
        got = run(cpu, f, b, sizes, chunk=16)
        for x, want, what in zip(got, rec, ("o", "hlast"), strict=True):
            fin = np.isfinite(want)
            np.testing.assert_array_equal(np.isfinite(x), fin, err_msg=f"{what}, {name}[{t}] = {value}")
            assert fin.any() or what == "hlast"
            np.testing.assert_allclose(x[fin], want[fin], rtol=1e-10, atol=1e-10)
