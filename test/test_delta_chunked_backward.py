"""The chunked (WY / UT transform) backward of the fused ``delta_rule`` op on the cpu backend: every gradient (q, k,
v, g, beta, h0, and through the final state) of ``algorithm="chunked"`` against the recurrent backward and against
PyTorch float64 autograd through a float64 loop of the recurrence written here (one step at a time, the models'
formulas).

DeltaNet, Gated DeltaNet and KDA (the ``delta`` form); RWKV-7's (the ``dplr`` form) is tested in
test_delta_chunked_rwkv7_backward.py.
Cases: chunks of 16, 32 and 64 steps with T = 1, chunk - 1, chunk + 1 and 2 chunk + 3; log decays mixing tiny
(-1e-4), huge (-1e4) and exact resets (-inf); grouped value heads (Hq < H); the in-kernel L2 normalisation; h0 and
dhlast, and the final state's gradient alone; packed sequences with an empty one; a positive log decay (the lane
runs the recurrence); float32, float64, bfloat16 and float16 storage; chunk-boundary states past the
memory budget (checkpointed, recomputed per segment); beta through the public operations' sigmoid.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import no_wider
from delta_family import call_public, problem

import scanweaver
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.runtime import get_backend

torch = pytest.importorskip("torch")

OP = FUSED.get("delta_rule")
FAMILIES = ("deltanet", "gated", "kda")
#: Gradient name -> the differentiable input it belongs to.
INPUTS = {"dq": "q", "dk": "k", "dv": "v", "dg": "g", "dbeta": "beta", "dh0": "h0"}


def backward(be, f, a, sizes, do, **tunables):
    """The C backward's gradients (NaN-filled first, so an unwritten element shows)."""
    cfg = OP.resolve("c", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    out = {p.name: np.full(shape, np.nan, dtype) for p, enabled, shape, dtype in
           OP.layout("backward", f, tuple(sorted(sizes.items()))) if p.kind == "out" and enabled}
    be.run_fused(OP.call("backward", f, cfg), {**a, "do": do, **out}, sizes)
    return out


def loop(t, l2norm, cu=None):
    """``(o, hlast)`` of the delta rule in PyTorch, one step at a time over all heads (differentiable): S' = D S,
    u = beta (v - S'^T k), S = S' + k u^T, o = S^T q; D = exp(g) per head (g (B, T, H)) or per key (B, T, H, K)."""
    q, k, v, g = t["q"], t["k"], t["v"], t.get("g")
    B, T, Hq, K = q.shape
    H = v.shape[2]
    if l2norm:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q, k = q.repeat_interleave(H // Hq, 2), k.repeat_interleave(H // Hq, 2)  # value head h reads h // (H / Hq)
    segs = [(b, b, 0, T) for b in range(B)] if cu is None else \
        [(i, 0, int(cu[i]), int(cu[i + 1])) for i in range(len(cu) - 1)]
    rows: dict = {}
    finals = []
    for row, b, start, stop in segs:
        S = t["h0"][row] if "h0" in t else torch.zeros(H, K, v.shape[3], dtype=v.dtype)
        for i in range(start, stop):
            if g is not None:
                d = torch.exp(g[b, i])
                S = (d[:, None, None] if d.dim() == 1 else d[:, :, None]) * S
            u = t["beta"][b, i][:, None] * (v[b, i] - torch.einsum("hkv,hk->hv", S, k[b, i]))
            S = S + k[b, i][:, :, None] * u[:, None, :]
            rows[b, i] = torch.einsum("hkv,hk->hv", S, q[b, i])
        finals.append(S)
    o = torch.stack([torch.stack([rows[b, i] for i in range(T)]) for b in range(B)]) if T else v[:, :0]
    return o, torch.stack(finals)


def autograd(a, do, l2norm):
    """Float64 gradients of sum(o * do) + sum(hlast * dhlast) by autograd through :func:`loop`."""
    leaves = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()
              if n in INPUTS.values()}
    o, h = loop(leaves, l2norm, a.get("cu_seqlens"))
    loss = (o * torch.tensor(np.asarray(do, np.float64))).sum()
    if "dhlast" in a:
        loss = loss + (h * torch.tensor(np.asarray(a["dhlast"], np.float64))).sum()
    loss.backward()
    return {"d" + n: leaf.grad.numpy() for n, leaf in leaves.items()}


def mixed_gates(rng, a, T):
    """Log decays mixing tiny (-1e-4) and moderate ones, about a tenth huge (-1e4), and two exact resets."""
    if "g" not in a:
        return
    g = a["g"]
    g[...] = -np.exp(rng.uniform(np.log(1e-4), np.log(1.0), g.shape))
    g[rng.uniform(size=g.shape) < 0.1] = -1e4
    g[0, T // 2, 0] = -np.inf
    g[0, T - 1, -1] = -np.inf


def close(got, want, tol, what):
    for n, w in want.items():
        assert n in got, f"{what}: {n} missing"
        scale = max(float(np.abs(w).max()), 1e-30)
        np.testing.assert_allclose(np.asarray(got[n], np.float64), w, rtol=0, atol=tol * scale,
                                   err_msg=f"{what}: {n}")


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("family", FAMILIES)
def test_float64_gradients_match_autograd_and_the_recurrence(cpu, family, chunk):
    for i, T in enumerate((1, chunk - 1, chunk + 1, 2 * chunk + 3)):
        rng = np.random.default_rng(T + chunk)
        f, a, sizes = problem(rng, family, batch=1, T=T, H=2, Hq=1, K=16, V=24, l2norm=True, dhlast=True)
        mixed_gates(rng, a, T)
        do = rng.normal(size=a["v"].shape)
        dos = (do, np.zeros_like(do)) if i == 3 else (do,)  # then the final state's gradient alone
        for d in dos:
            want = autograd(a, d, True)
            rec = backward(cpu, f, a, sizes, d, algorithm="recurrent")
            got = backward(cpu, f, a, sizes, d, algorithm="chunked", chunk=chunk)
            close(got, want, 1e-10, f"T={T} vs autograd")
            close(got, {n: rec[n] for n in want}, 1e-11, f"T={T} vs recurrent")


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_gradients(cpu, family):
    rng = np.random.default_rng(len(family))
    T = 2 * 32 + 3
    f, a, sizes = problem(rng, family, batch=1, T=T, H=2, Hq=1, K=24, V=32, l2norm=True, dhlast=True,
                          dtype="float32")
    mixed_gates(rng, a, T)
    do = rng.normal(size=a["v"].shape).astype(np.float32)
    want = autograd(a, do, True)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=32)
    assert all(x.dtype == np.float32 and np.isfinite(x).all() for x in got.values())
    close(got, want, 2e-5, "vs float64 autograd")
    close(got, {n: rec[n].astype(np.float64) for n in want}, 2e-5, "vs recurrent float32")


@pytest.mark.parametrize("dtype,eps", [("bfloat16", 2.0 ** -8), ("float16", 2.0 ** -11)])
def test_half_storage_accumulates_in_float32(cpu, dtype, eps):
    rng = np.random.default_rng(14)
    f, a, sizes = problem(rng, "kda", batch=1, T=40, H=2, K=16, V=24, dtype=dtype, dhlast=True)
    do = rng.normal(size=a["v"].shape).astype(a["v"].dtype)
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    want = autograd(a, do, False)
    assert got["dq"].dtype.name == dtype and got["dh0"].dtype == np.float32
    close(got, want, 4 * eps, "vs float64 autograd")  # the gradients rounded to the storage type once


def test_chunk_states_past_the_memory_budget_are_checkpointed_and_recomputed(cpu):
    """520 chunks of 128 x 128 float64 states (65 MiB) pass the 64 MiB a thread keeps: the backward keeps every
    second chunk-boundary state and recomputes the others per segment, and its gradients equal the recurrent
    backward's."""
    rng = np.random.default_rng(21)
    T = 16 * 520
    f, a, sizes = problem(rng, "gated", batch=1, T=T, H=1, Hq=1, K=128, V=128, l2norm=True, dhlast=True,
                          lo=-0.5, hi=-1e-4)
    do = rng.normal(size=a["v"].shape)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, rec, 1e-10, "checkpointed chunks vs recurrent")


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_sequences_with_an_empty_one(cpu, family):
    rng = np.random.default_rng(11)
    f, a, sizes = problem(rng, family, seqlens=[17, 0, 35, 1], H=2, Hq=1, K=16, V=24, dhlast=True)
    mixed_gates(rng, a, 53)
    do = rng.normal(size=a["v"].shape)
    want = autograd(a, do, False)
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, want, 1e-10, "vs autograd")


@pytest.mark.parametrize("family", ["gated", "kda"])
def test_a_positive_log_decay_runs_the_recurrence(cpu, family):
    """A lane whose log decays are positive somewhere (the forward runs those chunks by the recurrence) takes the
    recurrent backward: the same numbers; the other lane the chunked one."""
    rng = np.random.default_rng(12)
    T = 2 * 16 + 3
    f, a, sizes = problem(rng, family, batch=1, T=T, H=2, Hq=1, K=16, V=24, l2norm=True, dhlast=True)
    a["g"][...] = rng.uniform(-0.05, -1e-4, a["g"].shape)
    a["g"][0, 20, 0] = 0.02  # head 0 grows at one step
    do = rng.normal(size=a["v"].shape)
    want = autograd(a, do, True)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, want, 1e-10, "vs autograd")
    for n in ("dv", "dg", "dbeta", "dh0"):  # head 0's own gradients: the recurrent backward's numbers exactly
        head0 = (slice(None), 0) if n == "dh0" else (slice(None), slice(None), 0)
        np.testing.assert_array_equal(got[n][head0], rec[n][head0], err_msg=n)


def test_the_public_operations_report_what_ran():
    """``algorithm="chunked"`` (or fla's ``chunk_size``) runs the chunked backward of the delta form (beta through
    the public operations' sigmoid) and reports it; so does RWKV-7's."""
    swt = pytest.importorskip("scanweaver.torch")
    if not get_backend("cpu").availability().ok:
        pytest.skip("cpu backend unavailable")
    rng = np.random.default_rng(13)
    _, a, _ = problem(rng, "kda", batch=1, T=21, H=2, Hq=1, K=8, V=8)
    a["beta"] = rng.normal(size=a["beta"].shape)  # logits
    t = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
    o, h = swt.kda(t["q"], t["k"], t["v"], t["g"], t["beta"], 0.5, t["h0"], True, True,
                   use_beta_sigmoid_in_kernel=True, backend="cpu", algorithm="chunked", chunk=8)
    (o.square().sum() + h.sum()).backward()
    ran = scanweaver.matrix.last
    assert (ran.backend, ran.part, ran.algorithm) == ("cpu", "backward", "chunked")
    w = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
    o, h = loop({**w, "beta": torch.sigmoid(w["beta"])}, True)  # use_qk_l2norm_in_kernel=True
    ((0.5 * o).square().sum() + h.sum()).backward()
    close({n: x.grad.numpy() for n, x in t.items()}, {n: x.grad.numpy() for n, x in w.items()}, 1e-10,
          "kda with beta logits")
    t = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
    o, h = swt.kda(t["q"], t["k"], t["v"], t["g"], t["beta"], 0.5, t["h0"], True, True,
                   use_beta_sigmoid_in_kernel=True, backend="cpu", chunk_size=8)  # fla's hint: the chunked form
    (o.square().sum() + h.sum()).backward()
    ran = scanweaver.matrix.last
    assert (ran.part, ran.algorithm, ran.source) == ("backward", "chunked", "hint")
    _, a, _ = problem(rng, "rwkv7", batch=1, T=9, H=2, K=8, V=8)
    t = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
    o, h = call_public(swt.rwkv7, "rwkv7", t, 0.5, backend="cpu", algorithm="chunked", chunk=4)
    assert scanweaver.matrix.last.algorithm == "chunked"  # the forward
    (o.sum() + h.sum()).backward()
    ran = scanweaver.matrix.last
    assert (ran.part, ran.algorithm) == ("backward", "chunked")  # test_delta_chunked_rwkv7_backward.py


def test_the_default_backward_follows_the_measured_rule():
    """With no ``algorithm`` given, the backward runs chunked from 1024 steps per sequence with K * V >= 4096 with a
    decay per head or none, from K * V >= 8192 with one per key (KDA, RWKV-7), and the forward of the delta form
    from K * V >= 16384 (where bench/delta_chunked.py measured them faster; RWKV-7's forward stays recurrent);
    below either bound the recurrent one runs (the GPU kernels' default is the recurrence, and the Julia kernels'
    chunked form is the forward's, never the default)."""
    swt = pytest.importorskip("scanweaver.torch")
    if not get_backend("cpu").availability().ok:
        pytest.skip("cpu backend unavailable")
    rng = np.random.default_rng(14)
    f, _, _ = problem(rng, "gated", batch=1, T=8, H=1, K=64, V=64)
    small, _, _ = problem(rng, "gated", batch=1, T=8, H=1, K=32, V=64)
    dplr, _, _ = problem(rng, "rwkv7", batch=1, T=8, H=1, K=64, V=128)
    key, _, _ = problem(rng, "kda", batch=1, T=8, H=1, K=64, V=64)
    one = {"batch": 1, "T": 1024, "H": 1, "Hq": 1, "nseq": 1}
    assert OP.algorithm("c", "backward", f, one) == "chunked"
    assert OP.algorithm("c", "forward", f, one) == "recurrent"
    assert OP.algorithm("c", "backward", f, {**one, "T": 1023}) == "recurrent"
    assert OP.algorithm("c", "backward", f, {**one, "batch": 1, "T": 4096, "nseq": 8}) == "recurrent"  # packed
    assert OP.algorithm("c", "backward", small, one) == "recurrent"
    assert OP.algorithm("c", "backward", dplr, one) == "chunked"
    assert OP.algorithm("c", "backward", key, one) == "recurrent"  # a decay per key: from K * V = 8192
    assert OP.algorithm("c", "backward", dataclasses.replace(key, V=128), one) == "chunked"
    assert OP.algorithm("c", "forward", dplr, one) == "recurrent"
    big, _, _ = problem(rng, "kda", batch=1, T=8, H=1, K=128, V=128)
    big_dplr, _, _ = problem(rng, "rwkv7", batch=1, T=8, H=1, K=128, V=128)
    assert OP.algorithm("c", "forward", big, one) == "chunked"
    assert OP.algorithm("c", "forward", big, {**one, "T": 1023}) == "recurrent"
    assert OP.algorithm("c", "forward", big_dplr, one) == "recurrent"
    assert OP.algorithm("c", "backward", dplr, {**one, "T": 1023}) == "recurrent"
    # the GPU kernels and ScanWeaver.jl have the chunked form of both parts but no measured rule: recurrent
    assert OP.algorithm("gpu", "backward", f, one) == OP.algorithm("gpu", "forward", f, one) == "recurrent"
    assert OP.algorithm("gpu", "forward", f, one, target="cuda") == "recurrent"
    assert OP.algorithm("julia", "backward", f, one) == OP.algorithm("julia", "forward", f, one) == "recurrent"
    # a real training step at the rule's bound: the chunked backward runs and matches the recurrent one
    _, a, _ = problem(rng, "gated", batch=1, T=1024, H=2, Hq=1, K=64, V=64)
    grads = {}
    for alg in (None, "recurrent"):
        t = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
        kw = {} if alg is None else {"algorithm": alg}
        o, h = swt.gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], 0.5, t["h0"], True, True,
                                    backend="cpu", **kw)
        (o.square().sum() + h.sum()).backward()
        ran = scanweaver.matrix.last
        assert (ran.part, ran.algorithm, ran.source) == ("backward", alg or "chunked", "explicit" if alg else "default")
        grads[alg] = {n: x.grad.numpy() for n, x in t.items()}
    close(grads[None], grads["recurrent"], 1e-9, "default chunked vs recurrent")
    # and RWKV-7's: the chunked backward by default, the same gradients as the recurrent one
    _, a, _ = problem(rng, "rwkv7", batch=1, T=1024, H=1, Hq=1, K=64, V=128)
    for alg in (None, "recurrent"):
        t = {n: torch.tensor(np.asarray(x, np.float64), requires_grad=True) for n, x in a.items()}
        kw = {} if alg is None else {"algorithm": alg}
        o, h = call_public(swt.rwkv7, "rwkv7", t, 1.0, backend="cpu", **kw)
        (o.square().sum() + h.sum()).backward()
        ran = scanweaver.matrix.last
        assert (ran.part, ran.algorithm, ran.source) == ("backward", alg or "chunked", "explicit" if alg else "default")
        grads[alg] = {n: x.grad.numpy() for n, x in t.items()}
    close(grads[None], grads["recurrent"], 1e-9, "RWKV-7 default chunked vs recurrent")


@pytest.mark.parametrize("name", ["q", "k"])
@pytest.mark.parametrize("family", ["gated", "kda"])
def test_a_non_finite_input_reaches_no_other_step_of_dq_dk(cpu, family, name):
    """A NaN in one step's q or k, inside a chunk and inside a register block of its rows: the chunked dq, dk, dv and
    dbeta are non-finite exactly where the recurrent ones are (a triangular product that read the rows of its block
    on the wrong side of the diagonal multiplied their NaN by a masked 0).  dg: see the test below."""
    rng = np.random.default_rng(14)
    f, a, sizes = problem(rng, family, batch=1, T=40, H=1, Hq=1, K=4, V=3, dhlast=True)
    do = rng.normal(size=a["v"].shape)
    for t in (3, 20):
        b = {n: x.copy() for n, x in a.items()}
        b[name][0, t, 0, 1] = np.nan
        rec = backward(cpu, f, b, sizes, do, algorithm="recurrent")
        got = backward(cpu, f, b, sizes, do, algorithm="chunked", chunk=16)
        for n in ("dq", "dk", "dv", "dbeta"):
            fin = np.isfinite(rec[n])
            np.testing.assert_array_equal(np.isfinite(got[n]), fin, err_msg=f"{n}, {name}[{t}] = NaN")
            np.testing.assert_allclose(got[n][fin], rec[n][fin], rtol=1e-10, atol=1e-10, err_msg=n)


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["h0", "q", "k", "v", "beta", "g"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_non_finite_input_leaves_every_gradient_no_wider_than_the_recurrence(cpu, family, name, value):
    """A NaN or inf in one element of h0, or of one step's q, k, v, beta or g (in the first, a middle and the last of
    five chunks of 16, two value heads on one q/k head): every chunked gradient is non-finite only where the
    recurrent one is, and equal to it elsewhere.  dg was one running sum from the lane's end, so a non-finite term
    of one step reached every earlier step (a NaN in one step's v: all 70 steps of Gated DeltaNet's dg against the
    recurrence's steps after it; in h0: KDA's dg at step 0 for the keys of the other rows); now each chunk's sum
    starts again from rows(S o dS) at its end, and a row before the term in its chunk reads the sum from the
    chunk's start."""
    rng = np.random.default_rng(70)
    f, a, sizes = problem(rng, family, batch=1, T=70, H=2, Hq=1, K=5, V=6, dhlast=True)
    if name not in a:
        pytest.skip(f"{family} has no {name}")
    do = rng.normal(size=a["v"].shape)
    for t in ((0,) if name == "h0" else (3, 37, 66)):
        b = {n: x.copy() for n, x in a.items()}
        x = b[name]
        x[(0, 1, 2, 3) if name == "h0" else (0, t, 0, 1)[:x.ndim]] = value
        rec = backward(cpu, f, b, sizes, do, algorithm="recurrent")
        got = backward(cpu, f, b, sizes, do, algorithm="chunked", chunk=16)
        no_wider(got, rec, f"{name}[{t}] = {value}")


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("family", ["gated", "kda"])
def test_a_non_finite_input_among_resets_leaves_every_gradient_no_wider_than_the_recurrence(cpu, family, chunk):
    """As above with resets inside the chunks (a tenth of the log decays -1e4, two -inf), the in-kernel L2
    normalisation and K = 8: a row after a reset in the chunk of the non-finite term takes the sum from the state and
    adjoint at the reset; and dq of the step before a NaN in the last step's k (a diagonal block of KDA's intra-chunk
    adjoint that is not plain was one product, which read the later row through a masked 0)."""
    rng = np.random.default_rng(chunk)
    T = 2 * chunk + 2
    f, a, sizes = problem(rng, family, batch=1, T=T, H=2, Hq=1, K=8, V=7, l2norm=True, dhlast=True)
    mixed_gates(rng, a, T)
    do = rng.normal(size=a["v"].shape)
    for name in ("h0", "q", "k", "v", "beta"):
        for t in ((0,) if name == "h0" else (*rng.integers(0, T, 4).tolist(), T - 1)):
            b = {n: x.copy() for n, x in a.items()}
            x = b[name]
            x[(0, 1, 2, 3) if name == "h0" else (0, t, 0, 1)[:x.ndim]] = np.nan
            rec = backward(cpu, f, b, sizes, do, algorithm="recurrent")
            got = backward(cpu, f, b, sizes, do, algorithm="chunked", chunk=chunk)
            no_wider(got, rec, f"{name}[{t}] = NaN")


@pytest.mark.parametrize("family,K,V", [("kda", 1, 130), ("gated", 17, 3)])
def test_odd_state_sizes_against_the_recurrent_form(cpu, family, K, V):
    """State sizes that fill no vector (K = 1, V = 130; K = 17, V = 3), packed sequences of 15, 0, 17 and 1 steps at
    chunks of 16 with tiny, huge and -inf log decays: the chunked gradients equal the recurrent ones."""
    rng = np.random.default_rng(K + V)
    f, a, sizes = problem(rng, family, seqlens=[15, 0, 17, 1], H=2, Hq=1, K=K, V=V, l2norm=True, dhlast=True)
    mixed_gates(rng, a, 33)
    do = rng.normal(size=a["v"].shape)
    rec = backward(cpu, f, a, sizes, do, algorithm="recurrent")
    got = backward(cpu, f, a, sizes, do, algorithm="chunked", chunk=16)
    close(got, rec, 1e-11, "vs recurrent")
