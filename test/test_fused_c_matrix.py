"""The cpu backend's C kernels of the fused ``matrix_state`` op against its NumPy definition.

Every feature combination (decay none/scalar/key, readout after/bonus, reverse, h0, dhlast, packed
sequences, groups) forward in both algorithms and backward, at odd T and T not a multiple of the chunk,
with non-uniform data; float64 to near rounding, float32 at realistic K and V with strong and weak decays
(log decays from -20 to -1e-4 per step); the recurrent and chunked forms agree at every chunk length
the tuner may pick.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures, backward_reference, forward_reference

OP = FUSED.get("matrix_state")


def problem(rng, f: MatrixStateFeatures, B, T, H, Hq, lo=-2.0, hi=-0.01, seqlens=None):
    """Inputs of one call (packed sequences: batch 1, ``seqlens`` lengths summing to T)."""
    K, V, dt = f.K, f.V, f.dtype
    nseq = B if seqlens is None else len(seqlens)
    a = {"q": rng.normal(size=(B, T, Hq, K)), "k": rng.normal(size=(B, T, Hq, K)) / np.sqrt(K),
         "v": rng.normal(size=(B, T, H, V))}
    if f.decay != "none":
        a["g"] = -np.exp(rng.uniform(np.log(-hi), np.log(-lo), (B, T, H, K) if f.decay == "key" else (B, T, H)))
    if f.readout == "bonus":
        a["u"] = rng.normal(size=(H, K))
    if f.has_h0:
        a["h0"] = rng.normal(size=(nseq, H, K, V))
    a = {n: np.ascontiguousarray(x, dt) for n, x in a.items()}
    if seqlens is not None:
        a["cu_seqlens"] = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int64)
    return a, {"batch": B, "T": T, "H": H, "Hq": Hq, "nseq": nseq}


def forward(be, f, a, sizes, **tunables):
    cfg = OP.resolve("c", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    B, T, H, nseq = sizes["batch"], sizes["T"], sizes["H"], sizes["nseq"]
    out = {"o": np.full((B, T, H, f.V), np.nan, f.dtype), "hlast": np.full((nseq, H, f.K, f.V), np.nan, f.dtype)}
    be.run_fused(OP.call("forward", f, cfg), {**a, **out}, sizes)
    return out["o"], out["hlast"]


def reference_forward(f, a):
    kw = {n: a[n].astype(np.float64) for n in ("g", "u", "h0") if n in a}
    return forward_reference(*(a[n].astype(np.float64) for n in "qkv"), decay=f.decay, readout=f.readout,
                             reverse=f.reverse, cu_seqlens=a.get("cu_seqlens"), **kw)


CASES = list(itertools.product(("none", "scalar", "key"), ("after", "bonus"), (False, True)))


@pytest.mark.parametrize("decay,readout,reverse", CASES)
def test_forward_and_backward_match_the_definition_in_float64(cpu, decay, readout, reverse):
    rng = np.random.default_rng(hash((decay, readout, reverse)) % 2**32)
    seq = reverse  # packed sequences on half the cases (one of length 0)
    f = MatrixStateFeatures("float64", 12, 20, decay, readout, reverse, has_h0=True, has_seqlens=seq,
                            has_dhlast=True)
    a, sizes = problem(rng, f, 1 if seq else 2, 53, 4, 2, seqlens=[20, 0, 33] if seq else None)
    ro, rh = reference_forward(f, a)
    for alg, chunk in (("recurrent", 64), ("chunked", 16)):
        o, h = forward(cpu, f, a, sizes, algorithm=alg, chunk=chunk, block_v=16)
        np.testing.assert_allclose(o, ro, rtol=1e-10, atol=1e-10, err_msg=alg)
        np.testing.assert_allclose(h, rh, rtol=1e-10, atol=1e-10, err_msg=alg)
    do = rng.normal(size=ro.shape)
    dhlast = rng.normal(size=rh.shape)
    ref = backward_reference(*(a[n] for n in "qkv"), a.get("g"), decay=decay, readout=readout, u=a.get("u"),
                             h0=a["h0"], cu_seqlens=a.get("cu_seqlens"), reverse=reverse, do=do, dhlast=dhlast)
    for threads in (1, 2):
        got = {n: (None if r is None else np.full_like(r, np.nan)) for n, r in ref.items()}
        cfg = OP.resolve("c", {"threads": threads}, {}, "test")
        cpu.run_fused(OP.call("backward", f, cfg), {**a, "do": do, "dhlast": dhlast, **got}, sizes)
        for n, r in ref.items():
            if r is not None:
                np.testing.assert_allclose(got[n], r, rtol=1e-9, atol=1e-9, err_msg=f"{n}, threads={threads}")


@pytest.mark.parametrize("K,V,decay,readout,lo,hi,every_chunk", [
    (16, 16, "scalar", "after", -20.0, -1e-4, False), (64, 64, "key", "after", -20.0, -1e-4, True),
    (128, 64, "scalar", "after", -1.0, -1e-4, False), (64, 128, "key", "bonus", -8.0, -1e-4, False),
    (128, 128, "key", "after", -0.5, -1e-4, False)])
def test_float32_at_realistic_sizes_and_strong_and_weak_decays(cpu, K, V, decay, readout, lo, hi, every_chunk):
    rng = np.random.default_rng(K + V)
    f = MatrixStateFeatures("float32", K, V, decay, readout, has_h0=True)
    a, sizes = problem(rng, f, 1, 77, 2, 1, lo, hi)
    ro, rh = reference_forward(f, a)
    scale = np.abs(ro).max()
    results = {}
    chunks = [t for t in OP.tunables_for("c") if t.name == "chunk"][0].values if every_chunk else (32,)
    for alg, chunk in [("recurrent", 64)] + [("chunked", c) for c in chunks]:
        o, h = forward(cpu, f, a, sizes, algorithm=alg, chunk=chunk)
        results[(alg, chunk)] = o
        np.testing.assert_allclose(o, ro, atol=2e-5 * scale, rtol=0, err_msg=f"{alg} chunk {chunk}")
        np.testing.assert_allclose(h, rh, atol=2e-5 * np.abs(rh).max(), rtol=0, err_msg=f"{alg} chunk {chunk}")
    first = results[("recurrent", 64)]
    for key, o in results.items():  # the two algorithms agree with each other as closely as with the definition
        np.testing.assert_allclose(o, first, atol=4e-5 * scale, rtol=0, err_msg=str(key))
    do = rng.normal(size=ro.shape).astype(np.float32)
    ref = backward_reference(*(a[n].astype(np.float64) for n in "qkv"), a.get("g"), decay=decay, readout=readout,
                             u=a.get("u"), h0=a["h0"], do=do.astype(np.float64))
    got = {n: (None if r is None else np.empty(r.shape, np.float32)) for n, r in ref.items()}
    cpu.run_fused(OP.call("backward", f, OP.resolve("c", {}, {}, "test")), {**a, "do": do, **got}, sizes)
    for n, r in ref.items():
        if r is not None:
            np.testing.assert_allclose(got[n], r, atol=1e-4 * max(1.0, np.abs(r).max()), rtol=0, err_msg=n)


def test_long_sequence_split_over_threads_and_column_blocks(cpu):
    """One (sequence, head) item and two threads: parts of T through the affine carry; and blocks of V."""
    rng = np.random.default_rng(5)
    for decay, readout, reverse in (("scalar", "after", False), ("key", "bonus", True)):
        f = MatrixStateFeatures("float64", 8, 40, decay, readout, reverse, has_h0=True)
        a, sizes = problem(rng, f, 1, 1001, 1, 1, -0.3, -1e-3)
        ro, rh = reference_forward(f, a)
        for cols in (8, 16, 64):
            o, h = forward(cpu, f, a, sizes, algorithm="recurrent", block_v=cols, threads=2)
            np.testing.assert_allclose(o, ro, rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(h, rh, rtol=1e-10, atol=1e-10)


def test_the_default_algorithm_comes_from_the_op_and_the_tuner_sees_both(cpu):
    big = MatrixStateFeatures("float32", 64, 64)
    sizes = {"batch": 2, "T": 2048, "H": 8, "Hq": 8, "nseq": 2}
    assert OP.resolve("c", {}, cpu.fused_defaults(OP.name, big, sizes), "test")["algorithm"] == "recurrent"
    assert [t for t in OP.tunables_for("c") if t.name == "algorithm"][0].values == ("recurrent", "chunked")


def test_a_short_call_runs_on_one_thread_only_while_its_state_is_small(cpu):
    """Decode (T = 1): GLA's 16 x 64 x 64 state at batch 1 stays on one thread (no parallel region); Mamba-2's
    24 x 128 x 64 at batch 1 and GLA's at batch 16, streamed from memory, take every thread; a long call always."""
    from scanweaver.targets.fused_c_matrix import ONE_THREAD_STATE

    def threads(K, V, b, T, H, decay="key"):
        f = MatrixStateFeatures("float32", K, V, decay)
        sizes = {"batch": b, "T": T, "H": H, "Hq": H, "nseq": b}
        return OP.resolve("c", {}, cpu.fused_defaults(OP.name, f, sizes), "test")["threads"]

    assert 16 * 64 * 64 < ONE_THREAD_STATE <= 24 * 128 * 64
    assert threads(64, 64, 1, 1, 16) == 1
    assert threads(128, 64, 1, 1, 24, "scalar") == 0
    assert threads(64, 64, 16, 1, 16) == 0
    assert threads(64, 64, 1, 4096, 16) == 0


def test_bad_offsets_and_tunables_are_clear_errors(cpu):
    rng = np.random.default_rng(1)
    f = MatrixStateFeatures("float32", 8, 8, has_seqlens=True)
    a, sizes = problem(rng, f, 1, 10, 2, 2, seqlens=[4, 6])
    a["cu_seqlens"] = np.array([0, 7, 5], np.int64)
    with pytest.raises(ScanInputError, match="cu_seqlens"):
        forward(cpu, f, a, sizes)
    for bad in ({"chunk": 0}, {"chunk": 1025}, {"block_v": 3}, {"algorithm": "fast"}, {"threads": 5000}, {"width": 32}):
        with pytest.raises(ScanInputError, match=next(iter(bad))):
            OP.resolve("c", bad, {}, "test")
