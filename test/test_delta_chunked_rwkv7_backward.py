"""The chunked (WY / UT transform) backward of RWKV-7 (the ``dplr`` form of the fused ``delta_rule`` op) on the cpu
backend: every gradient (r as q, w as g, k, v, a, b, h0, and through the final state) of ``algorithm="chunked"``
against the recurrent backward and against PyTorch float64 autograd through the float64 loop of
:func:`delta_family.torch_loop` (one step at a time, the model's formula).

Cases: chunks of 1, 4, 16, 32 and 64 steps with T = 1, chunk - 1, chunk + 1 and 2 chunk + 3; log decays mixing
tiny (-1e-4), huge (-1e4) and exact resets (-inf); grouped value heads (Hq < H) and the in-kernel L2
normalisation; h0 and dhlast, and the final state's gradient alone; packed sequences with an empty one; a positive
log decay (the lane runs the recurrence); K = 1; a decay per head and none; float32 at T = 1024; bfloat16
storage; chunk-boundary states past the memory budget; a non-finite input (every gradient non-finite
only where the recurrent one is); what ``scanweaver.matrix.last`` reports.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import no_wider
from delta_family import call_public, dplr_gated, problem, torch_loop
from test_delta_chunked_backward import backward, close, mixed_gates

import scanweaver
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.runtime import get_backend

torch = pytest.importorskip("torch")

OP = FUSED.get("delta_rule")
#: Gradient name -> the differentiable input it belongs to.
INPUTS = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "da": "a", "db": "b", "dh0": "h0"}


def autograd(a, do, l2norm):
    """Float64 gradients of sum(o * do) + sum(hlast * dhlast) by autograd through the RWKV-7 loop."""
    leaves = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()
              if n in INPUTS.values()}
    o, h = torch_loop("rwkv7", leaves, 1.0, l2norm, a.get("cu_seqlens"))
    loss = (o * torch.tensor(np.asarray(do, np.float64))).sum()
    if "dhlast" in a:
        loss = loss + (h * torch.tensor(np.asarray(a["dhlast"], np.float64))).sum()
    loss.backward()
    return {"d" + n: leaf.grad.numpy() for n, leaf in leaves.items()}


@pytest.mark.parametrize("chunk", [1, 4, 16, 32, 64])
def test_float64_gradients_match_autograd_and_the_recurrence(cpu, chunk):
    last = 2 * chunk + 3
    for T in sorted({1, max(1, chunk - 1), chunk + 1, last}):
        rng = np.random.default_rng(T + chunk)
        f, a, sizes = problem(rng, "rwkv7", batch=1, T=T, H=2, Hq=1, K=16, V=24, l2norm=True, dhlast=True)
        mixed_gates(rng, a, T)
        do = rng.normal(size=a["v"].shape)
        dos = (do, np.zeros_like(do)) if last == T else (do,)  # then the final state's gradient alone
        for d in dos:
            want = autograd(a, d, True)
            rec = backward(cpu, f, a, sizes, d, algorithm="recurrent")
            got = backward(cpu, f, a, sizes, d, algorithm="chunked", chunk=chunk)
            close(got, want, 1e-10, f"T={T} vs autograd")
            close(got, {n: rec[n] for n in want}, 1e-11, f"T={T} vs recurrent")


def test_packed_sequences_with_an_empty_one(cpu):
    rng = np.random.default_rng(11)
    f, a, sizes = problem(rng, "rwkv7", seqlens=[17, 0, 35, 1], H=2, Hq=1, K=16, V=24, dhlast=True)
    mixed_gates(rng, a, 53)
    do = rng.normal(size=a["v"].shape)
    want = autograd(a, do, False)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, want, 1e-10, "vs autograd")
    close(got, rec, 1e-11, "vs recurrent")


def test_a_positive_log_decay_runs_the_recurrence(cpu):
    """A lane whose log decays are positive somewhere (the forward runs those chunks by the recurrence) takes the
    recurrent backward: the same numbers; the other lane the chunked one."""
    rng = np.random.default_rng(12)
    T = 2 * 16 + 3
    f, a, sizes = problem(rng, "rwkv7", batch=1, T=T, H=2, Hq=1, K=16, V=24, l2norm=True, dhlast=True)
    a["g"][...] = rng.uniform(-0.05, -1e-4, a["g"].shape)
    a["g"][0, 20, 0, 3] = 0.02  # head 0 grows at one step
    do = rng.normal(size=a["v"].shape)
    want = autograd(a, do, True)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, want, 1e-10, "vs autograd")
    close(got, rec, 1e-11, "vs recurrent")
    for n in ("dv", "dg", "da", "db", "dh0"):  # head 0's own gradients: the recurrent backward's numbers exactly
        head0 = (slice(None), 0) if n == "dh0" else (slice(None), slice(None), 0)
        np.testing.assert_array_equal(got[n][head0], rec[n][head0], err_msg=n)


@pytest.mark.parametrize("K,V,seqlens", [(1, 130, [15, 0, 17, 1]), (17, 3, [1]), (5, 9, [1, 4, 33])])
def test_odd_state_sizes_against_the_recurrent_form(cpu, K, V, seqlens):
    """State sizes that fill no vector (K = 1, V = 130; K = 17, V = 3; K = 5, V = 9), packed sequences (a single step
    among them, and T = 1) at chunks of 16 with tiny, huge and -inf log decays."""
    rng = np.random.default_rng(K + V)
    f, a, sizes = problem(rng, "rwkv7", seqlens=seqlens, H=2, Hq=1, K=K, V=V, l2norm=True, dhlast=True)
    mixed_gates(rng, a, sum(seqlens))
    do = rng.normal(size=a["v"].shape)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, rec, 1e-11, "vs recurrent")
    if K == 1:
        close(got, autograd(a, do, True), 1e-10, "vs autograd")


@pytest.mark.parametrize("gate", ["none", "scalar"])
def test_the_dplr_form_with_a_decay_per_head_or_none(cpu, gate):
    """The ``dplr`` form with one log decay per head (a reset among them) or none: the chunked gradients equal the
    recurrent ones (the engine's weights of a decay per head in place of its key adjoints)."""
    rng = np.random.default_rng(3)
    f, a, sizes = dplr_gated(rng, gate)
    do = rng.normal(size=a["v"].shape)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, rec, 1e-11, "vs recurrent")


def test_float32_at_1024_steps_against_the_recurrence(cpu):
    rng = np.random.default_rng(5)
    T = 1024
    f, a, sizes = problem(rng, "rwkv7", batch=1, T=T, H=2, Hq=1, K=32, V=32, dhlast=True, dtype="float32",
                          lo=-1.0, hi=-1e-3)
    a["g"][0, 500, 0] = -np.inf
    do = rng.normal(size=a["v"].shape).astype(np.float32)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=32)
    assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in got.values())
    close(got, {n: x.astype(np.float64) for n, x in rec.items()}, 2e-5, "vs recurrent float32")


@pytest.mark.parametrize("name,value", [(n, np.nan) for n in ("h0", "q", "k", "v", "a", "b", "g")] +
                         [(n, np.inf) for n in ("h0", "a", "b", "g")])
def test_a_non_finite_input_leaves_every_gradient_no_wider_than_the_recurrence(cpu, name, value):
    """A NaN (or inf) in one element of h0, or of one step's q, k, v, a, b or w (in the first, a middle and the last of
    five chunks of 16, two value heads on one q/k head): every chunked gradient is non-finite only where the
    recurrent one is, and equal to it elsewhere.  A non-finite a_t or b_t reaches every key of the state after t and
    of the adjoint before t, so dg_{t-1} (or dg_t) is finite in the recurrence while both sums of the chunked
    backward are not: that row takes the recurrence's value (``sw_dplrb_direct``)."""
    rng = np.random.default_rng(70)
    f, a, sizes = problem(rng, "rwkv7", batch=1, T=70, H=2, Hq=1, K=5, V=6, dhlast=True)
    do = rng.normal(size=a["v"].shape)
    for t in ((0,) if name == "h0" else (3, 37, 66)):
        b = {n: x.copy() for n, x in a.items()}
        x = b[name]
        x[(0, 1, 2, 3) if name == "h0" else (0, t, 0, 1)[:x.ndim]] = value
        rec = backward(cpu, f, b, sizes, do, algorithm="recurrent")
        got = backward(cpu, f, b, sizes, do, algorithm="chunked", chunk=16)
        no_wider(got, rec, f"{name}[{t}] = {value}")


def test_a_non_finite_input_among_resets_leaves_every_gradient_no_wider_than_the_recurrence(cpu):
    rng = np.random.default_rng(16)
    T = 2 * 16 + 2
    f, a, sizes = problem(rng, "rwkv7", batch=1, T=T, H=2, Hq=1, K=8, V=7, l2norm=True, dhlast=True)
    mixed_gates(rng, a, T)
    do = rng.normal(size=a["v"].shape)
    for name in ("h0", "q", "k", "v", "a", "b"):
        for t in ((0,) if name == "h0" else (*rng.integers(0, T, 3).tolist(), T - 1)):
            b = {n: x.copy() for n, x in a.items()}
            x = b[name]
            x[(0, 1, 2, 3) if name == "h0" else (0, t, 0, 1)[:x.ndim]] = np.nan
            rec = backward(cpu, f, b, sizes, do, algorithm="recurrent")
            got = backward(cpu, f, b, sizes, do, algorithm="chunked", chunk=16)
            no_wider(got, rec, f"{name}[{t}] = NaN")


def test_the_public_operation_reports_the_chunked_backward():
    """``algorithm="chunked"`` (or fla's ``chunk_size``) runs RWKV-7's backward chunked and reports it, with the
    gradients of autograd through the loop (with no ``algorithm``, the default rule decides:
    test_delta_chunked_backward.py)."""
    swt = pytest.importorskip("scanweaver.torch")
    if not get_backend("cpu").availability().ok:
        pytest.skip("cpu backend unavailable")
    rng = np.random.default_rng(13)
    f, a, _ = problem(rng, "rwkv7", batch=1, T=21, H=2, K=8, V=8)
    want = None
    for kw, source in (({"algorithm": "chunked", "chunk": 4}, "explicit"), ({"chunk_size": 8}, "hint")):
        t = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
        o, h = call_public(swt.rwkv7, "rwkv7", t, 0.5, backend="cpu", **kw)
        (o.square().sum() + h.sum()).backward()
        ran = scanweaver.matrix.last
        assert (ran.backend, ran.part, ran.algorithm, ran.source) == ("cpu", "backward", "chunked", source)
        if want is None:
            w = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
            o, h = torch_loop("rwkv7", w, 0.5)
            (o.square().sum() + h.sum()).backward()
            want = {n: x.grad.numpy() for n, x in w.items()}
        close({n: x.grad.numpy() for n, x in t.items()}, want, 1e-10, f"rwkv7 {kw}")
    one = {"batch": 1, "T": 4096, "H": 1, "Hq": 1, "nseq": 1}
    big, _, _ = problem(rng, "rwkv7", batch=1, T=8, H=1, K=128, V=128)
    assert OP.algorithm("c", "backward", big, one) == "chunked"
    assert OP.algorithm("gpu", "backward", big, one) == "recurrent"  # no rule measured on the GPU kernels
    assert OP.chooses("c", "backward", f)


@pytest.mark.parametrize("dtype,eps", [("bfloat16", 2.0 ** -8)])
def test_half_storage_accumulates_in_float32(cpu, dtype, eps):
    rng = np.random.default_rng(14)
    f, a, sizes = problem(rng, "rwkv7", batch=1, T=40, H=2, K=16, V=24, dtype=dtype, dhlast=True)
    do = rng.normal(size=a["v"].shape).astype(a["v"].dtype)
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    want = autograd(a, do, False)
    assert got["da"].dtype.name == dtype and got["dh0"].dtype == np.float32
    close(got, want, 4 * eps, "vs float64 autograd")  # the gradients rounded to the storage type once


def test_chunk_states_past_the_memory_budget_are_checkpointed_and_recomputed(cpu):
    """520 chunks of 128 x 128 float64 states pass the 64 MiB a thread keeps: every second chunk-boundary state
    is kept and the others recomputed per segment (``sw_dplr_chunk`` without its outputs)."""
    rng = np.random.default_rng(21)
    f, a, sizes = problem(rng, "rwkv7", batch=1, T=16 * 520, H=1, Hq=1, K=128, V=128, dhlast=True, lo=-0.5,
                          hi=-1e-4)
    do = rng.normal(size=a["v"].shape)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, rec, 1e-10, "checkpointed chunks vs recurrent")
