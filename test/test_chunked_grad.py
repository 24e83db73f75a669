"""Gradients of the chunked (matmul) matrix-state backward.

float64: every gradient (q, k, v, the log decays, RWKV-6's u, the initial state, and through the final state) against
central differences of the float64 loop of :mod:`test_chunked` along random directions, on log decays of every kind
(decays, growth, mixed signs, hard resets, tiny with huge), per head and per key, packed sequences, reverse, groups,
odd chunks and two threads.  float32 at T = 4096: against the recurrent backward.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import no_wider

from scanweaver.fused.matrix_state import MatrixStateFeatures
from test_chunked import close, fused, loop_of, operands

CASES = {
    "key-after-groups": (MatrixStateFeatures("float64", 5, 7, "key", "after", has_h0=True, has_dhlast=True), None, 4,
                         2),
    "key-bonus-packed-reverse": (MatrixStateFeatures("float64", 6, 5, "key", "bonus", True, has_h0=True,
                                                     has_seqlens=True, has_dhlast=True), [9, 0, 14], 3, 3),
    "head-after-reverse": (MatrixStateFeatures("float64", 6, 6, "scalar", "after", True, has_h0=True,
                                               has_dhlast=True), None, 5, 5),
    "head-bonus-packed-groups": (MatrixStateFeatures("float64", 4, 6, "scalar", "bonus", has_h0=True,
                                                     has_seqlens=True, has_dhlast=True), [11, 12], 4, 2),
    "none-after": (MatrixStateFeatures("float64", 5, 6, "none", "after", has_h0=True, has_dhlast=True), None, 2, 2),
}


def objective(f, a, do, dh) -> float:
    o, h = loop_of(f, a)
    return float((o * do).sum() + (h * dh).sum())


def assert_finite_differences(rng, f, a, grads, do, dh) -> None:
    """Every gradient along a random direction against central differences of the loop's objective."""
    eps = 1e-6
    for name_in, grad in (("q", "dq"), ("k", "dk"), ("v", "dv"), ("g", "dg"), ("u", "du"), ("h0", "dh0")):
        if name_in not in a:
            continue
        x = a[name_in]
        direction = rng.normal(size=x.shape) * np.isfinite(x)
        plus, minus = dict(a), dict(a)
        with np.errstate(invalid="ignore"):
            plus[name_in], minus[name_in] = x + eps * direction, x - eps * direction
        numeric = (objective(f, plus, do, dh) - objective(f, minus, do, dh)) / (2 * eps)
        analytic = float((np.where(np.isfinite(x), grads[grad], 0) * direction).sum())
        assert np.isfinite(grads[grad]).all(), f"{grad} has non-finite entries"
        assert abs(analytic - numeric) <= 1e-6 * max(1.0, abs(numeric)), \
            f"{grad}: analytic {analytic:.10g}, finite differences {numeric:.10g}"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_gradient_against_finite_differences_of_the_loop(cpu, name, threads):
    f, seqlens, H, Hq = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)) + threads)
    a, sizes = operands(rng, f, 1 if seqlens else 2, 23, H, Hq, seqlens=seqlens)
    o, h = loop_of(f, a)
    do, dh = rng.normal(size=o.shape), rng.normal(size=h.shape)
    grads = fused(cpu, f, {**a, "do": do, "dhlast": dh}, sizes, "backward", algorithm="chunked", chunk=7,
                  threads=threads)
    assert_finite_differences(rng, f, a, grads, do, dh)


@pytest.mark.parametrize("decay,readout,Hq", [("key", "after", 4), ("scalar", "after", 1), ("key", "bonus", 4)])
def test_float32_at_4096_steps_against_the_recurrent_backward(cpu, decay, readout, Hq):
    rng = np.random.default_rng(4096)
    f = MatrixStateFeatures("float32", 32, 32, decay, readout, has_h0=True, has_dhlast=True)
    a, sizes = operands(rng, f, 1, 4096, 4, Hq, kinds=("decay", "reset", "tiny_huge", "decay"))
    do = rng.normal(size=a["v"].shape).astype(np.float32)
    dh = rng.normal(size=a["h0"].shape).astype(np.float32)
    args = {**a, "do": do, "dhlast": dh}
    ref = fused(cpu, f, args, sizes, "backward", algorithm="recurrent")
    got = fused(cpu, f, args, sizes, "backward", algorithm="chunked")
    for n, r in ref.items():
        scale = max(1.0, float(np.abs(r).max()))
        err = float(np.abs(got[n] - r).max()) / scale
        assert err < 2e-4, f"{n}: chunked and recurrent differ by {err:.2e} of max |{n}|"


@pytest.mark.parametrize("decay,readout", [("key", "after"), ("scalar", "bonus")])
def test_one_long_lane_on_two_threads_against_finite_differences(cpu, decay, readout):
    """One lane and two threads: the backward runs parts of the lane from chunk-parallel carries (states forward,
    adjoints in reverse), its decay gradient offset part by part; growth, resets and decays along the lane."""
    rng = np.random.default_rng(31)
    f = MatrixStateFeatures("float64", 5, 6, decay, readout, has_h0=True, has_dhlast=True)
    a, sizes = operands(rng, f, 1, 60, 1, 1, kinds=("decay",))
    shape = a["g"].shape
    a["g"][0, :20] = rng.uniform(0.0, 0.02, shape[2:] if len(shape) > 3 else shape[2])
    a["g"][0, 30:33] = -np.inf
    o, h = loop_of(f, a)
    do, dh = rng.normal(size=o.shape), rng.normal(size=h.shape)
    grads = fused(cpu, f, {**a, "do": do, "dhlast": dh}, sizes, "backward", algorithm="chunked", chunk=7, threads=2)
    assert_finite_differences(rng, f, a, grads, do, dh)


@pytest.mark.parametrize("name,K,V", [("key-bonus-packed-reverse", 1, 130), ("head-after-reverse", 17, 3)])
def test_odd_state_sizes_against_the_recurrent_form(cpu, name, K, V):
    """State sizes that fill no vector (K = 1, V = 130; K = 17, V = 3): the chunked forward and every gradient equal
    the recurrent ones, on log decays of every kind, with lengths around the chunk of 16 (packed with an empty one)."""
    base, seqlens, H, Hq = CASES[name]
    f = dataclasses.replace(base, K=K, V=V)
    rng = np.random.default_rng(K * V)
    a, sizes = operands(rng, f, 1 if seqlens else 2, 33, H, Hq, seqlens=seqlens and [15, 0, 17, 1])
    ref = fused(cpu, f, a, sizes, algorithm="recurrent")
    got = fused(cpu, f, a, sizes, algorithm="chunked", chunk=16)
    args = {**a, "do": rng.normal(size=ref["o"].shape), "dhlast": rng.normal(size=ref["hlast"].shape)}
    ref.update(fused(cpu, f, args, sizes, "backward", algorithm="recurrent"))
    got.update(fused(cpu, f, args, sizes, "backward", algorithm="chunked", chunk=16))
    for n, r in ref.items():
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(got[n] - r).max() <= 1e-11 * scale, f"{n}: chunked and recurrent differ"


#: (decay, readout, reverse, Hq, sequence lengths, threads): every case has fewer (sequence, q/k group) units than
#: threads, so the backward cuts each group's chunks into parts, a part running the group's 4 heads in turn.
GROUP_SPLITS = {
    "key-after-one-group": ("key", "after", False, 1, None, 2),
    "head-after-one-group-reverse-three-parts": ("scalar", "after", True, 1, None, 3),
    "none-after-one-group": ("none", "after", False, 1, None, 2),
    "key-bonus-one-group-packed-reverse": ("key", "bonus", True, 1, [23, 0, 40], 6),
    "head-bonus-two-groups": ("scalar", "bonus", False, 2, None, 4),
    "head-after-two-groups-packed": ("scalar", "after", False, 2, [61], 4),
}


@pytest.mark.parametrize("name", sorted(GROUP_SPLITS))
def test_groups_of_heads_split_over_threads(cpu, name):
    """Fewer q/k groups than threads (Mamba-2's 4 heads of one group of B and C): the backward runs parts of each
    group's chunks from chunk-parallel carries, every part's heads in turn on its own rows of dq and dk.  Against
    finite differences of the loop, and against one thread (no parts) to float64 rounding."""
    decay, readout, reverse, Hq, seqlens, threads = GROUP_SPLITS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    f = MatrixStateFeatures("float64", 5, 6, decay, readout, reverse, has_h0=True, has_seqlens=seqlens is not None,
                            has_dhlast=True)
    a, sizes = operands(rng, f, 1, sum(seqlens) if seqlens else 61, 4, Hq,
                        kinds=("decay", "growth", "reset", "decay"), seqlens=seqlens)
    o, h = loop_of(f, a)
    do, dh = rng.normal(size=o.shape), rng.normal(size=h.shape)
    args = {**a, "do": do, "dhlast": dh}
    grads = fused(cpu, f, args, sizes, "backward", algorithm="chunked", chunk=7, threads=threads)
    assert_finite_differences(rng, f, a, grads, do, dh)
    one = fused(cpu, f, args, sizes, "backward", algorithm="chunked", chunk=7, threads=1)
    again = fused(cpu, f, args, sizes, "backward", algorithm="chunked", chunk=7, threads=threads)
    for n, want in one.items():
        close(grads[n], want, 1e-11, f"{n} on {threads} threads against one")
        assert np.array_equal(grads[n], again[n]), f"{n} differs between two calls on {threads} threads"


#: (decay, readout): RWKV-6 (a decay per key, the bonus readout), its per-head form, and a decay per key read after.
NON_FINITE = {"rwkv6": ("key", "bonus"), "head-bonus": ("scalar", "bonus"), "key-after": ("key", "after")}


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["q", "k", "v", "h0", "u"])
@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_a_non_finite_input_leaves_every_gradient_no_wider_than_the_recurrence(cpu, case, name, value):
    """A NaN or inf in one element of h0 or u, or of one step's q (RWKV-6's r), k or v, in the first, a middle and
    the last of five chunks of 16: every chunked gradient is non-finite only where the recurrent one is, and equal
    to it elsewhere.  With the bonus readout a non-finite q_t made the chunked dg_t so too, where the recurrence's
    has no a_t = q_t o dq_t: dg_t was formed as (r + a_t - b_t) - a_t, and the state part of dk_t read q_t through
    the masked diagonal of dA (0 times it)."""
    decay, readout = NON_FINITE[case]
    f = MatrixStateFeatures("float64", 5, 4, decay, readout, has_h0=True, has_dhlast=True)
    rng = np.random.default_rng(77)
    a, sizes = operands(rng, f, 1, 70, 2, 1, kinds=("decay",))
    if name not in a:
        pytest.skip(f"{case} has no {name}")
    args = {**a, "do": rng.normal(size=a["v"].shape), "dhlast": rng.normal(size=a["h0"].shape)}
    for t in ((0,) if name in ("h0", "u") else (3, 37, 66)):
        b = {n: x.copy() for n, x in args.items()}
        b[name][{"h0": (0, 1, 2, 3), "u": (1, 2)}.get(name, (0, t, 0, 1))] = value
        rec = fused(cpu, f, b, sizes, "backward", algorithm="recurrent")
        got = fused(cpu, f, b, sizes, "backward", algorithm="chunked", chunk=16, threads=1)
        no_wider(got, rec, f"{name}[{t}] = {value}")
