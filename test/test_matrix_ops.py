"""The matrix-state operations against float64 loops of their defining recurrences and the peers' references.

linear_attention (GLA, simple GLA, RetNet), rwkv6 and mamba2_scan: initial and final
states, packed sequences, reverse, odd lengths, groups, D of both shapes, z,
dt_softplus with dt_limit, strong and weak decays; the decode steps; the errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError

import matrix_peers as peers
from matrix_loops import la_loop, mamba2_loop

RNG = np.random.default_rng(22)


def _close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def _logdecay(shape, lo=-20.0, hi=-1e-4):
    """Log decays spread log-uniformly over [lo, hi] (strong and weak)."""
    return -np.exp(RNG.uniform(np.log(-hi), np.log(-lo), shape))


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("kind", ["g", "g_head", "decay", "none"])
def test_linear_attention_against_loop(T, kind):
    batch, H, K, V = 2, 3, 4, 5
    q, k = RNG.normal(size=(2, batch, T, H, K))
    v = RNG.normal(size=(batch, T, H, V))
    h0 = RNG.normal(size=(batch, H, K, V))
    args = {"g": _logdecay((batch, T, H, K)), "g_head": _logdecay((batch, T, H)), "decay": _logdecay((H,), -2, -1e-3)}
    gk = {"g": lambda a: a, "g_head": lambda a: np.repeat(a[..., None], K, -1),
          "decay": lambda a: np.broadcast_to(a[None, None, :, None], (batch, T, H, K)),
          "none": lambda a: np.zeros((batch, T, H, K))}[kind](args.get(kind))
    kw = {} if kind == "none" else {kind: args[kind]}
    o, h = scanweaver.linear_attention(q, k, v, initial_state=h0, output_final_state=True, scale=0.7, **kw)
    want_o, want_h = la_loop(q, k, v, gk, 0.7, h0)
    _close(o, want_o)
    _close(h, want_h)
    assert scanweaver.matrix.last.backend == "numpy" or scanweaver.matrix.runs_matrix_state(
        scanweaver.matrix.last.backend)


def test_linear_attention_packed_reverse_groups_float32():
    H, Hq, K, V, cu = 4, 2, 3, 6, [0, 5, 6, 13]
    T = cu[-1]
    q, k = RNG.normal(size=(2, 1, T, Hq, K)).astype(np.float32)
    v = RNG.normal(size=(1, T, H, V)).astype(np.float32)
    g = _logdecay((1, T, H, K)).astype(np.float32)
    h0 = RNG.normal(size=(3, H, K, V)).astype(np.float32)
    for reverse in (False, True):
        o, h = scanweaver.linear_attention(q, k, v, g=g, initial_state=h0, output_final_state=True,
                                           cu_seqlens=np.array(cu), reverse=reverse)
        want_o, want_h = la_loop(q, k, v, g, K ** -0.5, h0, cu, reverse)
        assert o.dtype == np.float32 and h.shape == (3, H, K, V)
        _close(o, want_o, 2e-5)
        _close(h, want_h, 2e-5)
    o, h = scanweaver.linear_attention(q, k, v, g=g)
    assert h is None


def test_rwkv6_against_loop():
    batch, T, H, K, V = 2, 9, 2, 4, 3
    r, k, w = RNG.normal(size=(3, batch, T, H, K))
    w = _logdecay((batch, T, H, K))
    v, u = RNG.normal(size=(batch, T, H, V)), RNG.normal(size=(H, K))
    h0 = RNG.normal(size=(batch, H, K, V))
    o, h = scanweaver.rwkv6(r, k, v, w, u, initial_state=h0, output_final_state=True)
    want_o, want_h = la_loop(r, k, v, w, K ** -0.5, h0, bonus=u)
    _close(o, want_o)
    _close(h, want_h)


MAMBA_CASES = [dict(), dict(D="H", z=True), dict(D="HP", dt_bias=True, softplus=True),
               dict(softplus=True, limit=(0.05, 0.3), dt_bias=True, h0=True), dict(h0=True, cu=[0, 4, 11])]


@pytest.mark.parametrize("case", range(len(MAMBA_CASES)))
def test_mamba2_against_loop(case):
    c = MAMBA_CASES[case]
    cu = c.get("cu")
    batch, L, H, P, G, N = (1, cu[-1], 4, 3, 2, 5) if cu else (2, 13, 4, 3, 2, 5)
    x, z = RNG.normal(size=(2, batch, L, H, P))
    dt = RNG.uniform(-1, 1, (batch, L, H)) if c.get("softplus") else RNG.uniform(0.01, 1, (batch, L, H))
    A = -np.exp(RNG.uniform(-2, 1, H))
    B, C = RNG.normal(size=(2, batch, L, G, N))
    D = {"H": RNG.normal(size=H), "HP": RNG.normal(size=(H, P))}.get(c.get("D"))
    kw = dict(D=D, z=z if c.get("z") else None, dt_bias=RNG.normal(size=H) if c.get("dt_bias") else None,
              dt_softplus=c.get("softplus", False), dt_limit=c.get("limit", (0.0, math.inf)),
              initial_states=RNG.normal(size=(len(cu) - 1 if cu else batch, H, P, N)) if c.get("h0") else None)
    out, h = scanweaver.mamba2_scan(x, dt, A, B, C, return_final_states=True, cu_seqlens=cu, **kw)
    want, want_h = mamba2_loop(x, dt, A, B, C, kw["D"], kw["z"], kw["dt_bias"], kw["dt_softplus"], kw["dt_limit"],
                               kw["initial_states"], cu)
    _close(out, want)
    _close(h, want_h)


def test_decode_steps_match_the_scans():
    batch, H, K, V = 2, 2, 3, 4
    q, k = RNG.normal(size=(2, batch, 1, H, K))
    v, g = RNG.normal(size=(batch, 1, H, V)), _logdecay((batch, 1, H, K))
    S0 = RNG.normal(size=(batch, H, K, V))
    o, S = scanweaver.linear_attention_step(S0, q[:, 0], k[:, 0], v[:, 0], g=g[:, 0])
    o2, S2 = scanweaver.linear_attention(q, k, v, g=g, initial_state=S0, output_final_state=True)
    _close(o, o2[:, 0])
    _close(S, S2)
    u = RNG.normal(size=(H, K))
    o, S = scanweaver.rwkv6_step(S0, q[:, 0], k[:, 0], v[:, 0], g[:, 0], u)
    o2, S2 = scanweaver.rwkv6(q, k, v, g, u, initial_state=S0, output_final_state=True)
    _close(o, o2[:, 0])
    _close(S, S2)
    P, N, G = 3, 4, 1
    x, z = RNG.normal(size=(2, batch, 1, H, P))
    dt, A = RNG.normal(size=(batch, 1, H)), -RNG.uniform(0.5, 2, H)
    B, C = RNG.normal(size=(2, batch, 1, G, N))
    h0, D, bias = RNG.normal(size=(batch, H, P, N)), RNG.normal(size=(H, P)), RNG.normal(size=H)
    kw = dict(D=D, z=z[:, 0], dt_bias=bias, dt_softplus=True, dt_limit=(0.1, 0.9))
    y, S = scanweaver.mamba2_step(h0, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], **kw)
    y2, S2 = scanweaver.mamba2_scan(x, dt, A, B, C, initial_states=h0, return_final_states=True,
                                    **{**kw, "z": z})
    _close(y, y2[:, 0])
    _close(S, S2)


def test_float16_storage():
    q, k, v = RNG.normal(size=(3, 1, 6, 2, 4)).astype(np.float16)
    g = _logdecay((1, 6, 2, 4), -3, -0.01).astype(np.float16)
    o, h = scanweaver.linear_attention(q, k, v, g=g, output_final_state=True)
    assert o.dtype == np.float16 and h.dtype == np.float32
    want, _ = la_loop(*(a.astype(np.float64) for a in (q, k, v, g)), 0.5)
    np.testing.assert_allclose(o.astype(np.float64), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("call, match", [
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 2)), np.ones((1, 4, 2, 5))),
     r"linear_attention: k has shape \(1, 4, 2, 2\)"),
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 3, 5))),
     "heads of q/k must divide those of v"),
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 5)),
                                         g=np.ones((1, 4, 2)), decay=np.ones(2)), "at most one of g"),
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 5)),
                                         g=np.ones((1, 4, 2))), r"g has shape \(1, 4, 2\); it needs"),
    (lambda: scanweaver.linear_attention(np.ones((2, 4, 2, 3)), np.ones((2, 4, 2, 3)), np.ones((2, 4, 2, 5)),
                                         cu_seqlens=[0, 4]), "needs batch 1"),
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 5)),
                                         cu_seqlens=[0, 3]), "ending at T; got cu_seqlens\\[-1\\] = 3"),
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 5)),
                                         initial_state=np.ones((1, 2, 5, 3))), r"initial_state has shape"),
    (lambda: scanweaver.linear_attention(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 5)),
                                         backend="nosuch"), "nosuch"),
    (lambda: scanweaver.rwkv6(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 3)), np.ones((1, 4, 2, 5)),
                              np.ones((1, 4, 2, 3)), np.ones((3, 2))), r"rwkv6: u has shape \(3, 2\)"),
    (lambda: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), np.ones(3), np.ones((1, 4, 1, 5)),
                                    np.ones((1, 4, 1, 5))), r"mamba2_scan: A has shape \(3,\)"),
    (lambda: scanweaver.mamba2_scan(np.ones((1, 4, 4, 3)), np.ones((1, 4, 4)), np.ones(4), np.ones((1, 4, 3, 5)),
                                    np.ones((1, 4, 3, 5))), "G dividing H = 4"),
    (lambda: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), np.ones(2), np.ones((1, 4, 1, 5)),
                                    np.ones((1, 4, 1, 5)), D=np.ones(3)), r"D has shape \(3,\)"),
    (lambda: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), np.ones(2), np.ones((1, 4, 1, 5)),
                                    np.ones((1, 4, 1, 5)), dt_limit=(1.0, 0.5)), "min <= max"),
    (lambda: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), np.ones(2), np.ones((1, 4, 1, 5)),
                                    np.ones((1, 4, 1, 5)), initial_states=np.ones((1, 2, 5, 3))),
     r"initial_states has shape \(1, 2, 5, 3\)"),
    (lambda: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), np.ones(2), np.ones((1, 4, 1, 5)),
                                    np.ones((1, 4, 1, 5)), chunk_size=0), "chunk_size must be a positive"),
    (lambda: scanweaver.linear_attention_step(np.ones((1, 2, 3, 4)), np.ones((1, 2, 3)), np.ones((1, 2, 3)),
                                              np.ones((1, 2, 5))), r"linear_attention_step: v has shape"),
    (lambda: scanweaver.mamba2_step(np.ones((1, 2, 3, 4)), np.ones((1, 2, 3)), np.ones((1, 2)), np.ones(2),
                                    np.ones((1, 1, 5)), np.ones((1, 1, 4))), r"mamba2_step: B has shape"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises((ScanInputError, scanweaver.BackendUnavailable), match=match):
        call()


# --- the peers' references (float32) ---------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("strength", ["strong", "weak"])
def test_gla_and_simple_gla_against_fla(strength):
    torch = _torch()
    gla, sgla = peers.fla("gla/naive"), peers.fla("simple_gla/naive")
    if gla is None or sgla is None:
        pytest.skip(peers.FLA_WHY)
    B, T, H, K, V = 2, 37, 3, 8, 6
    lo, hi = (-20.0, -1.0) if strength == "strong" else (-0.1, -1e-4)
    q, k = RNG.normal(size=(2, B, T, H, K)).astype(np.float32)
    v = RNG.normal(size=(B, T, H, V)).astype(np.float32)
    g, gh = _logdecay((B, T, H, K), lo, hi).astype(np.float32), _logdecay((B, T, H), lo, hi).astype(np.float32)
    h0 = RNG.normal(size=(B, H, K, V)).astype(np.float32)
    t = [torch.from_numpy(a) for a in (q, k, v, g, gh, h0)]
    ref_o, ref_h = gla.naive_recurrent_gla(t[0], t[1], t[2], t[3], initial_state=t[5], output_final_state=True)
    o, h = scanweaver.linear_attention(q, k, v, g=g, initial_state=h0, output_final_state=True)
    np.testing.assert_allclose(o, ref_o.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(h, ref_h.numpy(), rtol=1e-4, atol=1e-4)
    ref_o, ref_h = sgla.naive_recurrent_simple_gla(t[0], t[1], t[2], t[4], scale=0.3, initial_state=t[5],
                                                   output_final_state=True)
    o, h = scanweaver.linear_attention(q, k, v, g_head=gh, scale=0.3, initial_state=h0, output_final_state=True)
    np.testing.assert_allclose(o, ref_o.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(h, ref_h.numpy(), rtol=1e-4, atol=1e-4)


def test_rwkv6_against_fla():
    torch = _torch()
    mod = peers.fla("rwkv6/recurrent_naive")
    if mod is None:
        pytest.skip(peers.FLA_WHY)
    B, T, H, K, V = 2, 29, 2, 8, 4
    r, k = RNG.normal(size=(2, B, T, H, K)).astype(np.float32)
    v = RNG.normal(size=(B, T, H, V)).astype(np.float32)
    w = _logdecay((B, T, H, K)).astype(np.float32)
    u, h0 = RNG.normal(size=(H, K)).astype(np.float32), RNG.normal(size=(B, H, K, V)).astype(np.float32)
    head_first = [torch.from_numpy(a).transpose(1, 2) for a in (r, k, v, w)]  # naive_recurrent_rwkv6: (B, H, T, .)
    ref_o, ref_h = mod.naive_recurrent_rwkv6(*head_first, torch.from_numpy(u), initial_state=torch.from_numpy(h0),
                                             output_final_state=True)
    o, h = scanweaver.rwkv6(r, k, v, w, u, initial_state=h0, output_final_state=True)
    np.testing.assert_allclose(o, ref_o.transpose(1, 2).numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(h, ref_h.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("D_shape", ["H", "HP"])
def test_mamba2_against_mamba_ssm(D_shape):
    torch = _torch()
    ref = peers.mamba_ref()
    if ref is None:
        pytest.skip(peers.MAMBA_WHY)
    b, L, H, P, G, N = 2, 48, 4, 8, 2, 6  # the combined reference needs L a multiple of its chunk
    x, z = RNG.normal(size=(2, b, L, H, P)).astype(np.float32)
    dt = RNG.normal(size=(b, L, H)).astype(np.float32) - 1
    A = -np.exp(RNG.uniform(-1, 1.5, H)).astype(np.float32)
    B, C = RNG.normal(size=(2, b, L, G, N)).astype(np.float32)
    D = (RNG.normal(size=H) if D_shape == "H" else RNG.normal(size=(H, P))).astype(np.float32)
    bias = RNG.normal(size=H).astype(np.float32)
    T = {n: torch.from_numpy(a) for n, a in dict(x=x, z=z, dt=dt, A=A, B=B, C=C, D=D, bias=bias).items()}
    want = ref["ssd_chunk_scan_combined_ref"](T["x"], T["dt"], T["A"], T["B"], T["C"], 16, D=T["D"], z=T["z"],
                                              dt_bias=T["bias"], dt_softplus=True)
    got = scanweaver.mamba2_scan(x, dt, A, B, C, D=D, z=z, dt_bias=bias, dt_softplus=True, chunk_size=16)
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-4, atol=2e-4)
    # ssd_minimal_discrete: X = x*dt, A = A*dt, one group per head; L a multiple of its block
    L2 = 32
    dts = np.log1p(np.exp(dt[:, :L2] + bias))
    Bh, Ch = (np.repeat(M[:, :L2], H // G, axis=2) for M in (B, C))
    h0 = RNG.normal(size=(b, H, P, N)).astype(np.float32)
    Y, final = ref["ssd_minimal_discrete"](torch.from_numpy(x[:, :L2] * dts[..., None]),
                                           torch.from_numpy(A * dts), torch.from_numpy(Bh), torch.from_numpy(Ch),
                                           8, initial_states=torch.from_numpy(h0)[:, None])
    got, h = scanweaver.mamba2_scan(x[:, :L2], dt[:, :L2], A, B[:, :L2], C[:, :L2], dt_bias=bias, dt_softplus=True,
                                    initial_states=h0, return_final_states=True)
    np.testing.assert_allclose(got, Y.numpy(), rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(h, final.numpy(), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("bad", ["0.5", [1.0], True, float("nan")])
def test_every_decode_step_checks_its_scale_like_the_whole_sequence_call(bad):
    """``scale`` of a decode step is held to the rule of the operations: a finite real number or None."""
    rng = np.random.default_rng(3)
    S, q, v = rng.normal(size=(1, 2, 4, 3)), rng.normal(size=(1, 2, 4)), rng.normal(size=(1, 2, 3))
    g, beta = -rng.uniform(0.1, 1, (1, 2)), rng.uniform(0, 1, (1, 2))
    calls = {"linear_attention_step": lambda sc: scanweaver.linear_attention_step(S, q, q, v, scale=sc),
             "rwkv6_step": lambda sc: scanweaver.rwkv6_step(S, q, q, v, -np.abs(q), q[0], scale=sc),
             "gated_delta_rule_step": lambda sc: scanweaver.gated_delta_rule_step(S, q, q / 3, v, g, beta, scale=sc),
             "rwkv7_step": lambda sc: scanweaver.rwkv7_step(S, q, -np.abs(q), q / 3, v, q / 3, q / 3, scale=sc)}
    for name, call in calls.items():
        with pytest.raises(ScanInputError, match=rf"^{name}: scale must be (a real number or None|finite)"):
            call(bad)
        assert np.isfinite(np.asarray(call(0.5)[0], np.float64)).all(), name


def test_a_decode_step_with_a_wrong_state_says_where_the_sizes_come_from():
    """A state of the wrong V (or N) shows as the next operand's mismatch: the message names the state as the source."""
    rng = np.random.default_rng(4)
    q, v, S = rng.normal(size=(1, 2, 3)), rng.normal(size=(1, 2, 2)), np.zeros((1, 2, 3, 1))
    need = r"\(batch, H, V\) = \(1, 2, 1\) \(batch, H, K, V from the state, Hq from q\)"
    with pytest.raises(ScanInputError, match=r"^linear_attention_step: v has shape \(1, 2, 2\); it needs " + need):
        scanweaver.linear_attention_step(S, q, q, v)
    with pytest.raises(ScanInputError, match=r"^rwkv6_step: v .* \(batch, H, K, V from the state\)"):
        scanweaver.rwkv6_step(S, q, q, v, -np.abs(q), q[0])
    with pytest.raises(ScanInputError, match=r"^mamba2_step: x has shape \(1, 2, 2\); it needs \(batch, H, P\) = "
                                             r"\(1, 2, 3\) \(batch, H, P, N from the state, G from B\)"):
        scanweaver.mamba2_step(S, v, np.ones((1, 2)), -np.ones(2), np.ones((1, 1, 4)), np.ones((1, 1, 4)))


def test_mamba2_step_holds_dt_limit_to_the_scans_rule():
    """The decode step read dt_limit unchecked: (2, 1) ran (the scan refuses it), a triple raised an unpacking error."""
    S, x, dt = np.zeros((1, 2, 2, 3)), np.ones((1, 2, 2)), np.ones((1, 2))
    A, B = -np.ones(2), np.ones((1, 1, 3))
    for bad, message in (((2.0, 1.0), r"dt_limit = \(2\.0, 1\.0\) needs min <= max"),
                         ((0.0, 1.0, 2.0), r"dt_limit must be a pair \(min, max\) of numbers"),
                         ((math.nan, 1.0), r"dt_limit = \(nan, 1\.0\) needs numbers, not NaN")):
        with pytest.raises(ScanInputError, match=r"^mamba2_step: " + message):
            scanweaver.mamba2_step(S, x, dt, A, B, B, dt_limit=bad)
        with pytest.raises(ScanInputError, match=r"^mamba2_scan: " + message):
            scanweaver.mamba2_scan(x[:, None], dt[:, None], A, B[:, None], B[:, None], dt_limit=bad)
    y, _ = scanweaver.mamba2_step(S, x, dt, A, B, B, dt_limit=(0.0, 0.5))
    want, _ = scanweaver.mamba2_scan(x[:, None], dt[:, None], A, B[:, None], B[:, None], dt_limit=(0.0, 0.5),
                                     return_final_states=True)
    np.testing.assert_allclose(y, want[:, 0], rtol=1e-12)


def test_decode_steps_take_integer_operands_in_float64_and_refuse_complex_ones():
    """mamba2_state_update returned its output in x's dtype even for an integer x (int64 output: the step's values
    truncated); the steps computed complex operands silently, which every scan refuses."""
    rng = np.random.default_rng(5)
    state, x = rng.normal(size=(2, 2, 3, 4)), rng.integers(-3, 4, (2, 2, 3))
    dt, A, B = rng.uniform(0.1, 1, (2, 2)), -np.ones(2), rng.normal(size=(2, 1, 4))
    y, new = scanweaver.mamba2_step(state, x, dt, A, B, B)
    s = state.copy()
    out = scanweaver.mamba2_state_update(s, x, dt, A, B, B)
    assert out.dtype == np.float64 and y.dtype == np.float64
    np.testing.assert_allclose(out, y, rtol=1e-12)
    np.testing.assert_allclose(s, new, rtol=1e-12)
    z = x + 1j
    with pytest.raises(ScanInputError, match=r"^mamba2_state_update: x has dtype complex128"):
        scanweaver.mamba2_state_update(state.copy(), z, dt, A, B, B)
    with pytest.raises(ScanInputError, match=r"^mamba2_step: x has dtype complex128"):
        scanweaver.mamba2_step(state, z, dt, A, B, B)
    q = rng.normal(size=(2, 2, 3)) + 0j
    with pytest.raises(ScanInputError, match=r"^linear_attention_step: q has dtype complex128"):
        scanweaver.linear_attention_step(state, q, q.real, rng.normal(size=(2, 2, 4)))
    with pytest.raises(ScanInputError, match=r"^rwkv6_step: r has dtype complex128"):
        scanweaver.rwkv6_step(state, q, q.real, rng.normal(size=(2, 2, 4)), -np.abs(q.real), q.real[0])


def test_state_update_refuses_dt_and_z_of_another_batch():
    """dt and z of batch 1 broadcast against x's batch; one of batch 3 raised NumPy's error: both now name the
    argument and x's batch."""
    state, x = np.zeros((2, 2, 3, 4)), np.ones((2, 2, 3))
    A, B = -np.ones(2), np.ones((2, 1, 4))
    for dt in (np.ones((1, 2)), np.ones((3, 2))):
        with pytest.raises(ScanInputError, match=r"dt has shape \(\d, 2\); it needs \(batch, H, P\) = \(2, 2, 3\) or "
                                                 r"\(batch, H\) = \(2, 2\)"):
            scanweaver.mamba2_state_update(state, x, dt, A, B, B)
    with pytest.raises(ScanInputError, match=r"z has shape \(1, 2, 3\); it needs \(batch, H, P\) = \(2, 2, 3\)"):
        scanweaver.mamba2_state_update(state, x, np.ones((2, 2)), A, B, B, z=np.ones((1, 2, 3)))
    assert not state.any()


def test_state_update_takes_row_indices_of_every_integer_dtype_as_indices():
    """A uint8 index tensor is a mask to PyTorch, an int16 one no index at all: the rows are the indices' values."""
    torch = pytest.importorskip("torch")
    x, dt, A, B = torch.ones(2, 2, 3), torch.ones(2, 2), -torch.ones(2), torch.ones(2, 1, 4)
    for dtype in (torch.uint8, torch.int16, torch.int32, torch.int64):
        for grad in (False, True):  # the NumPy views, and PyTorch's expressions
            state = torch.zeros(3, 2, 3, 4)
            xs = x.clone().requires_grad_(grad)
            rows = torch.tensor([2, 0], dtype=dtype)
            scanweaver.mamba2_state_update(state, xs, dt, A, B, B, state_batch_indices=rows)
            assert state[0].any() and not state[1].any() and state[2].any(), (dtype, grad)
