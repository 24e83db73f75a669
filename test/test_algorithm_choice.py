"""Which algorithm a fused kernel runs: the measured rule, ``chunk_size``, the tuned store, the call's ``algorithm=``.

The matrix-state C kernels have a recurrent and a chunked form, forward and backward.  The runner picks one per
part (``scanweaver.matrix.last.algorithm`` says which ran): the call's ``algorithm=`` over the tuned store over
``chunk_size`` over the rule ``MatrixState.chunked_from``.  Whatever runs, the results are those of the float64
loops written here (the recurrence and its adjoint, GLA's decay per key), at a short odd T and at a T past the
rule's threshold that straddles chunks.
"""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver import matrix
from scanweaver.calls import runner
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.runtime import REGISTRY as BACKENDS
from scanweaver.tuning import store

OP = FUSED.get("matrix_state")
K = V = 64
#: The fewest steps per sequence from which the rule runs the backward chunked at this K * V.
STEPS = min(s for s, n in OP.chunked_from["c"]["backward"] if n <= K * V)
SHORT, LONG = 7, STEPS + 37  # below the rule's steps; past them, not a multiple of any chunk

pytestmark = pytest.mark.skipif(not BACKENDS["cpu"].availability().ok,
                                reason=f"cpu backend unavailable: {BACKENDS['cpu'].availability().reason}")


@pytest.fixture
def isolated_store(tmp_path, monkeypatch):
    """A fresh, empty tuned store for one test."""
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(store.SHARED_ENV, raising=False)
    store._cache_dir.cache_clear()
    yield tmp_path
    store._cache_dir.cache_clear()


def data(T: int, H: int = 2, seed: int = 0) -> dict:
    """GLA's operands (batch 1): a log decay per key in (log 0.9, log 0.999), keys scaled by K**-0.5."""
    rng = np.random.default_rng(seed + T)
    return {"q": rng.normal(size=(1, T, H, K)), "k": rng.normal(size=(1, T, H, K)) / 8,
            "v": rng.normal(size=(1, T, H, V)), "g": np.log(rng.uniform(0.9, 0.999, (1, T, H, K))),
            "do": rng.normal(size=(1, T, H, V))}


def loop(a: dict) -> tuple[np.ndarray, dict]:
    """o and the gradients of sum(o * do) by the recurrence and its adjoint, step by step in float64:
    S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T, o_t = S_t^T q_t."""
    q, k, v, g, do = (a[n][0] for n in ("q", "k", "v", "g", "do"))
    T, H = v.shape[:2]
    S = np.zeros((T + 1, H, K, V))
    o = np.zeros((T, H, V))
    for t in range(T):
        for h in range(H):
            S[t + 1, h] = np.exp(g[t, h])[:, None] * S[t, h] + np.outer(k[t, h], v[t, h])
            o[t, h] = S[t + 1, h].T @ q[t, h]
    dq, dk, dv, dg = (np.zeros_like(x) for x in (q, k, v, g))
    G = np.zeros((H, K, V))  # dL/dS_t
    for t in reversed(range(T)):
        for h in range(H):
            G[h] += np.outer(q[t, h], do[t, h])
            dq[t, h] = S[t + 1, h] @ do[t, h]
            dk[t, h] = G[h] @ v[t, h]
            dv[t, h] = G[h].T @ k[t, h]
            dg[t, h] = np.exp(g[t, h]) * (G[h] * S[t, h]).sum(-1)
            G[h] = np.exp(g[t, h])[:, None] * G[h]
    return o[None], {"dq": dq[None], "dk": dk[None], "dv": dv[None], "dg": dg[None]}


def run(a: dict, forward: dict | None = None, backward: dict | None = None) -> tuple:
    """The fused forward and backward on the cpu backend; what each ran."""
    ops = matrix.operands("test", a["q"], a["k"], a["v"], a["g"], decay="key")
    o, _ = matrix.forward(ops, backend="cpu", **(forward or {}))
    fwd = runner.last["matrix_state"]
    grads = matrix.backward(ops, a["do"], backend="cpu", **(backward or {}))
    return o, grads, fwd, runner.last["matrix_state"]


def check(o, grads, want_o, want):
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-10)
    for name, w in want.items():
        np.testing.assert_allclose(grads[name], w, rtol=1e-9, atol=1e-9, err_msg=name)


@pytest.fixture(scope="module")
def answers():
    """The loops' answers at the short and the long T (computed once)."""
    return {T: (data(T), *loop(data(T))) for T in (SHORT, LONG)}


def test_the_default_follows_the_rule_at_a_short_and_a_long_T(isolated_store, answers):
    assert SHORT < STEPS < LONG
    seen = {}
    for T in (SHORT, LONG):
        a, want_o, want = answers[T]
        o, grads, fwd, bwd = run(a)
        check(o, grads, want_o, want)
        assert (fwd.part, bwd.part, fwd.source, bwd.source) == ("forward", "backward", "default", "default")
        sizes = {"batch": 1, "T": T, "H": 2, "Hq": 2, "nseq": 1}
        feats = matrix.operands("test", a["q"], a["k"], a["v"], a["g"], decay="key").features()
        assert fwd.algorithm == OP.algorithm("c", "forward", feats, sizes)
        seen[T] = (fwd.algorithm, bwd.algorithm)
    # the rule measured: the forward recurrent at both; the backward chunked from STEPS steps on
    assert seen == {SHORT: ("recurrent", "recurrent"), LONG: ("recurrent", "chunked")}


def test_the_rule_needs_the_state_size_and_counts_steps_per_packed_sequence():
    from scanweaver.fused.matrix_state import MatrixStateFeatures

    big, small = MatrixStateFeatures("float32", K, V), MatrixStateFeatures("float32", 32, 32)
    one = {"batch": 1, "T": 4 * STEPS, "H": 4, "Hq": 4, "nseq": 1}
    assert OP.algorithm("c", "backward", big, one) == "chunked"
    assert OP.algorithm("c", "forward", big, one) == "recurrent"
    assert OP.algorithm("c", "backward", small, one) == "recurrent"  # K * V below every pair's size
    assert OP.algorithm("c", "backward", big, {**one, "nseq": 8}) == "recurrent"  # eight packed sequences of T/8
    # the GPU kernels keep their default but where CUDA was measured: the backward chunked from 8192 steps there
    assert OP.algorithm("gpu", "backward", big, one) == "recurrent"
    assert OP.algorithm("gpu", "backward", big, one, target="opencl") == "recurrent"
    assert OP.algorithm("gpu", "forward", big, {**one, "T": 1 << 20}) == "recurrent"
    gpu_steps = min(s for s, n in OP.chunked_from["cuda"]["backward"] if n <= K * V)
    assert OP.algorithm("gpu", "backward", big, {**one, "T": gpu_steps}, target="cuda") == "chunked"
    assert OP.algorithm("gpu", "backward", big, {**one, "T": gpu_steps - 1}, target="cuda") == "recurrent"
    assert OP.algorithm("gpu", "backward", small, {**one, "T": gpu_steps}, target="cuda") == "recurrent"
    assert OP.algorithm("gpu", "forward", big, {**one, "T": 1 << 20}, target="cuda") == "recurrent"
    # ScanWeaver.jl has both algorithms, forward and backward; its default stays recurrent (the rule was measured on C)
    assert OP.algorithm("julia", "backward", big, one) == "recurrent"
    assert OP.algorithm("julia", "forward", big, {**one, "T": 1 << 20}) == "recurrent"


def test_an_explicit_algorithm_wins_over_the_rule(isolated_store, answers):
    a, want_o, want = answers[SHORT]
    o, grads, fwd, bwd = run(a, {"algorithm": "chunked", "chunk": 4}, {"algorithm": "chunked", "chunk": 4})
    check(o, grads, want_o, want)
    assert (fwd.algorithm, bwd.algorithm, fwd.source, bwd.source) == ("chunked", "chunked", "explicit", "explicit")
    a, want_o, want = answers[LONG]
    o, grads, fwd, bwd = run(a, backward={"algorithm": "recurrent"})
    check(o, grads, want_o, want)
    assert (bwd.algorithm, bwd.source) == ("recurrent", "explicit")


def test_chunk_size_selects_the_chunked_form_unless_the_store_or_the_call_say_otherwise(isolated_store, answers):
    a, want_o, want = answers[SHORT]
    o, grads, fwd, bwd = run(a, {"chunk_size": 3}, {"chunk_size": 3})
    check(o, grads, want_o, want)
    for info in (fwd, bwd):
        assert (info.algorithm, info.config["chunk"], info.source) == ("chunked", 3, "hint")
    # a length the kernel refuses is dropped (the result never depends on it)
    o, grads, fwd, bwd = run(a, {"chunk_size": 5000}, {"chunk_size": 5000})
    check(o, grads, want_o, want)
    assert (fwd.algorithm, fwd.source, bwd.algorithm, bwd.source) == ("recurrent", "default", "recurrent", "default")
    # the call's algorithm= wins over the hint
    _, _, fwd, _ = run(a, {"chunk_size": 3, "algorithm": "recurrent"})
    assert (fwd.algorithm, fwd.source) == ("recurrent", "explicit")
    # a tuned entry for this shape wins over the hint: its algorithm for the forward it was tuned on
    be = BACKENDS["cpu"]
    feats = matrix.operands("test", a["q"], a["k"], a["v"], a["g"], decay="key").features()
    store.record(store.Entry(backend="cpu", device=be.availability().device, signature=OP.signature(feats),
                             dtype="float64", lanes=2, L=SHORT, schedule=store.FUSED_PREFIX + OP.name,
                             config={"algorithm": "recurrent", "chunk": 16}, time_ms=1.0))
    o, grads, fwd, bwd = run(a, {"chunk_size": 3}, {"chunk_size": 3})
    check(o, grads, want_o, want)
    assert (fwd.algorithm, fwd.config["chunk"], fwd.source) == ("recurrent", 16, "tuned")
    assert (bwd.algorithm, bwd.config["chunk"], bwd.source) == ("chunked", 16, "tuned")


def test_the_forward_runs_chunked_by_default_in_mamba2s_form_only(isolated_store):
    """A decay per head and one q/k group for four heads (Mamba-2), past the forward's steps: chunked by default,
    with the float64 loop's answer; the same shape with a q/k per head, or with a decay per key, stays recurrent."""
    from scanweaver.fused.matrix_state import MatrixStateFeatures

    steps, size = next((e[0], e[1]) for e in OP.chunked_from["c"]["forward"] if e[2:] == ("one_qk_group_head_decay",))
    Kb, Vb, H, T = 128, 64, 4, steps + 19
    assert Kb * Vb >= size
    head, key = MatrixStateFeatures("float64", Kb, Vb, "scalar"), MatrixStateFeatures("float64", Kb, Vb, "key")
    grouped = {"batch": 1, "T": T, "H": H, "Hq": 1, "nseq": 1}
    assert OP.algorithm("c", "forward", head, grouped) == "chunked"
    assert OP.algorithm("c", "forward", head, {**grouped, "T": steps - 1}) == "recurrent"
    assert OP.algorithm("c", "forward", head, {**grouped, "Hq": H}) == "recurrent"
    assert OP.algorithm("c", "forward", head, {**grouped, "H": 2}) == "recurrent"
    assert OP.algorithm("c", "forward", key, grouped) == "recurrent"
    rng = np.random.default_rng(7)
    q, k = rng.normal(size=(1, T, 1, Kb)), rng.normal(size=(1, T, 1, Kb)) / 11
    v, g = rng.normal(size=(1, T, H, Vb)), -rng.uniform(1e-3, 0.2, (1, T, H))
    o, _ = matrix.forward(matrix.operands("test", q, k, v, g, decay="scalar"), backend="cpu")
    info = runner.last["matrix_state"]
    assert (info.algorithm, info.source) == ("chunked", "default")
    S, want = np.zeros((H, Kb, Vb)), np.zeros((T, H, Vb))
    for t in range(T):
        S = np.exp(g[0, t])[:, None, None] * S + k[0, t, 0][None, :, None] * v[0, t][:, None, :]
        want[t] = np.einsum("k,hkv->hv", q[0, t, 0], S)
    np.testing.assert_allclose(o[0], want, rtol=1e-9, atol=1e-9)
