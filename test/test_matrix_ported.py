"""The calls ported from flash-linear-attention and mamba-ssm against float64 loops of their definitions, and
the argument rules every matrix-state call shares.

``simple_gla`` and ``retention`` (fla's decays), ``state_v_first``, ``cu_seqlens_cpu``, mamba-ssm's
``seq_idx`` and ``return_varlen_states``, ``mamba2_state_update`` (in place, tiled and untiled, without
heads, continuous batching); one ``chunk_size`` rule on every backend, one ``cu_seqlens`` checker for
every operation, ``scale`` named when it is no number.  The peers' own references are run beside these
calls in ``test_porting.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.calls import runner
from scanweaver.runtime import REGISTRY as BACKENDS

from matrix_loops import la_loop, mamba2_loop, state_update_loop

RNG = np.random.default_rng(37)


def _close(a, b, tol=1e-10):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def _logdecay(shape, lo=-20.0, hi=-1e-4):
    return -np.exp(RNG.uniform(np.log(-hi), np.log(-lo), shape))


@pytest.mark.parametrize("T", [1, 8, 33])
def test_simple_gla_retention_and_state_v_first_against_loop(T):
    batch, H, K, V = 2, 3, 4, 5
    q, k = RNG.normal(size=(2, batch, T, H, K))
    v, h0 = RNG.normal(size=(batch, T, H, V)), RNG.normal(size=(batch, H, K, V))
    g, g_gamma = _logdecay((batch, T, H)), _logdecay((H,), -3, -1e-3)
    o, h = scanweaver.simple_gla(q, k, v, g, None, 0.6, h0, True)
    want_o, want_h = la_loop(q, k, v, np.repeat(g[..., None], K, -1), 0.6, h0)
    _close(o, want_o)
    _close(h, want_h)
    o, h = scanweaver.simple_gla(q, k, v, None, g_gamma, None, h0.swapaxes(2, 3), True, True)  # V-first states
    want_o, want_h = la_loop(q, k, v, np.broadcast_to(g_gamma[:, None], (batch, T, H, K)), K ** -0.5, h0)
    _close(o, want_o)
    _close(h, want_h.swapaxes(2, 3))
    o, h = scanweaver.retention(q, k, v, 0.9, h0, True)
    retnet = np.log(1 - 2.0 ** (-5.0 - np.arange(H)))  # Sun et al. 2023, 2.2: gamma = 1 - 2^(-5 - h)
    want_o, want_h = la_loop(q, k, v, np.broadcast_to(retnet[:, None], (batch, T, H, K)), 0.9, h0)
    _close(o, want_o)
    _close(h, want_h)
    gk = _logdecay((batch, T, H, K))
    o, h = scanweaver.linear_attention(q, k, v, gk, None, h0.swapaxes(2, 3), True, True)
    want_o, want_h = la_loop(q, k, v, gk, K ** -0.5, h0)
    _close(o, want_o)
    _close(h, want_h.swapaxes(2, 3))


def test_cu_seqlens_cpu_means_cu_seqlens():
    H, K, V, cu = 2, 3, 4, [0, 5, 5, 12]
    q, k = RNG.normal(size=(2, 1, 12, H, K))
    v, g, h0 = RNG.normal(size=(1, 12, H, V)), _logdecay((1, 12, H, K)), RNG.normal(size=(3, H, K, V))
    want_o, want_h = la_loop(q, k, v, g, K ** -0.5, h0, cu)
    for kw in (dict(cu_seqlens=cu), dict(cu_seqlens_cpu=np.array(cu)), dict(cu_seqlens=cu, cu_seqlens_cpu=cu)):
        o, h = scanweaver.linear_attention(q, k, v, g, None, h0, True, **kw)
        _close(o, want_o)
        _close(h, want_h)
    for call in (lambda: scanweaver.linear_attention(q, k, v, g, cu_seqlens_cpu=[0, 5, 11]),
                 lambda: scanweaver.rwkv6(q, k, v, g, RNG.normal(size=(H, K)), cu_seqlens_cpu=[0, 5, 11])):
        with pytest.raises(ScanInputError, match=r"cu_seqlens_cpu must be 1-D .* got cu_seqlens_cpu\[-1\] = 11"):
            call()
    with pytest.raises(ScanInputError, match="cu_seqlens_cpu packs sequences along T of one batch row"):
        scanweaver.linear_attention(*(np.repeat(x, 2, 0) for x in (q, k, v)), cu_seqlens_cpu=cu)
    w, u = _logdecay((1, 12, H, K)), RNG.normal(size=(H, K))
    o, h = scanweaver.rwkv6(q, k, v, w, u, None, h0, True, None, cu)
    want_o, want_h = la_loop(q, k, v, w, K ** -0.5, h0, cu, bonus=u)
    _close(o, want_o)
    _close(h, want_h)


SEQ_CASES = {
    "rows": dict(batch=2, L=11, seq=[[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3], [5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]]),
    "first index not 0": dict(batch=2, L=7, seq=[[3, 3, 1, 1, 1, 1, 1], [2, 0, 0, 0, 0, 0, 0]]),
    "every step": dict(batch=1, L=6, seq=[[0, 1, 2, 3, 4, 5]]),
    "T = 1": dict(batch=3, L=1, seq=[[0], [1], [0]]),
    "with cu_seqlens": dict(batch=1, L=13, seq=[[0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2]], cu=[0, 2, 2, 7, 13]),
}


@pytest.mark.parametrize("case", SEQ_CASES)
def test_mamba2_seq_idx_against_loop(case):
    c = SEQ_CASES[case]
    batch, L, cu = c["batch"], c["L"], c.get("cu")
    seq = np.array(c["seq"])
    H, P, G, N = 4, 3, 2, 5
    x, z = RNG.normal(size=(2, batch, L, H, P))
    dt, A = RNG.uniform(-1, 1, (batch, L, H)), -np.exp(RNG.uniform(-2, 1, H))
    B, C = RNG.normal(size=(2, batch, L, G, N))
    D, bias = RNG.normal(size=(H, P)), RNG.normal(size=H)
    h0 = RNG.normal(size=(batch if cu is None else len(cu) - 1, H, P, N))
    out, h = scanweaver.mamba2_scan(x, dt, A, B, C, 64, D, z, bias, h0, seq, cu, True, (0.0, math.inf), True)
    want, want_h = mamba2_loop(x, dt, A, B, C, D, z, bias, True, h0=h0, cu=cu, seq_idx=seq)
    _close(out, want)
    _close(h, want_h)
    for be in ("numpy", "cpu"):
        _close(scanweaver.mamba2_scan(x, dt, A, B, C, 64, D, z, bias, h0, seq, cu, True, backend=be), want)


def test_mamba2_varlen_states():
    cu, H, P, G, N = [0, 3, 3, 9, 10], 2, 3, 1, 4
    L = cu[-1]
    x = RNG.normal(size=(1, L, H, P))
    dt, A = RNG.uniform(0.05, 1, (1, L, H)), -np.exp(RNG.uniform(-1, 1, H))
    B, C = RNG.normal(size=(2, 1, L, G, N))
    h0 = RNG.normal(size=(4, H, P, N))
    want, want_h = mamba2_loop(x, dt, A, B, C, h0=h0, cu=cu)
    out, varlen = scanweaver.mamba2_scan(x, dt, A, B, C, None, initial_states=h0, cu_seqlens=cu,
                                         return_varlen_states=True)
    _close(out, want)
    _close(varlen, want_h)
    out, final, varlen = scanweaver.mamba2_scan(x, dt, A, B, C, None, initial_states=h0, cu_seqlens=cu,
                                                return_final_states=True, return_varlen_states=True)
    _close(final, want_h[-1:])
    _close(varlen, want_h)
    with pytest.raises(ScanInputError, match="return_varlen_states=True .* pass cu_seqlens"):
        scanweaver.mamba2_scan(x, dt, A, B, C, return_varlen_states=True)


def _tiled(H, P, N, batch):
    A, D, bias = -np.exp(RNG.normal(size=H)), RNG.normal(size=H), RNG.normal(size=H)
    dt = RNG.normal(size=(batch, H))
    return (A, D, bias, dt), (np.broadcast_to(A[:, None, None], (H, P, N)), np.broadcast_to(D[:, None], (H, P)),
                              np.broadcast_to(bias[:, None], (H, P)), np.broadcast_to(dt[..., None], (batch, H, P)))


def test_state_update_against_loop():
    batch, H, P, N, G = 3, 4, 2, 3, 2
    (A, D, bias, dt), (At, Dt, biast, dtt) = _tiled(H, P, N, batch)
    x, z = RNG.normal(size=(2, batch, H, P))
    B, C = RNG.normal(size=(2, batch, G, N))
    state = RNG.normal(size=(batch, H, P, N))
    want, want_state = state_update_loop(state, x, dtt, At, B, C, Dt, z, biast, True)
    for args in ((dtt, At, Dt, biast), (dt, A, D, bias)):                      # tiled, untiled
        s = state.copy()
        out = scanweaver.mamba2_state_update(s, x, args[0], args[1], B, C, args[2], z, args[3], True)
        _close(out, want)
        _close(s, want_state)
    cache = RNG.normal(size=(6, H, P, N))                                      # continuous batching
    idx = np.array([5, 1, 3])
    s = cache.copy()
    out = scanweaver.mamba2_state_update(s, x, dt, A, B, C, D, z, bias, True, idx)
    want, want_rows = state_update_loop(cache[idx], x, dtt, At, B, C, Dt, z, biast, True)
    _close(out, want)
    _close(s[idx], want_rows)
    _close(np.delete(s, idx, 0), np.delete(cache, idx, 0), 0)
    s32 = state.astype(np.float32)                                             # the state keeps its dtype
    out = scanweaver.mamba2_state_update(s32, x.astype(np.float32), dt, A, B, C)
    assert out.dtype == np.float32 and s32.dtype == np.float32
    y, S = scanweaver.mamba2_step(state.astype(np.float32), x.astype(np.float32), dt, A, B, C)
    _close(out, y, 1e-5)
    _close(s32, S, 1e-5)


def test_state_update_without_heads_is_mamba1_step():
    batch, dim, N, L = 2, 5, 3, 4
    u, delta = RNG.normal(size=(batch, dim, L)), RNG.uniform(0.1, 1, (batch, dim, L))
    A, Bs, Cs = -np.exp(RNG.normal(size=(dim, N))), RNG.normal(size=(batch, N, L)), RNG.normal(size=(batch, N, L))
    D = RNG.normal(size=dim)
    state = np.zeros((batch, dim, N))
    ys = [scanweaver.mamba2_state_update(state, u[..., t], delta[..., t], A, Bs[..., t], Cs[..., t], D)
          for t in range(L)]
    y, h = scanweaver.mamba_selective_scan(u, delta, A, Bs, Cs, D, None, None, False, True, backend="numpy")
    _close(np.stack(ys, -1), y)
    _close(state, h)


# --- the argument rules -------------------------------------------------------------------------------------------

def _matrix_backends():
    return [n for n in runner.renders("matrix_state", "forward") if BACKENDS.get(n).availability().ok]


def test_chunk_size_one_rule_on_every_backend():
    x, dt = RNG.normal(size=(1, 9, 2, 3)), RNG.uniform(0.1, 1, (1, 9, 2))
    A, (B, C) = -np.ones(2), RNG.normal(size=(2, 1, 9, 1, 4))
    want, _ = mamba2_loop(x, dt, A, B, C)
    q = RNG.normal(size=(1, 9, 2, 3))
    for be in _matrix_backends():
        for size in (1, 100, 512, 16, np.int64(64)):
            _close(scanweaver.mamba2_scan(x, dt, A, B, C, size, backend=be), want, 1e-5)
            _close(scanweaver.linear_attention(q, q, q, chunk_size=size, backend=be)[0],
                   scanweaver.linear_attention(q, q, q, backend="numpy")[0], 1e-5)
        for bad in (0, -64, 2.5, True, "64"):
            with pytest.raises(ScanInputError, match=rf"mamba2_scan: chunk_size must be a positive int or None, "
                                                     rf"got {bad!r}"):
                scanweaver.mamba2_scan(x, dt, A, B, C, bad, backend=be)


def _cu_calls(cu):
    """Every operation that takes cu_seqlens, called with ``cu`` (T = 8)."""
    rng = np.random.default_rng(0)
    a, q = rng.uniform(0.1, 0.9, (1, 8)), rng.normal(size=(1, 8, 2, 3))
    u, d = rng.normal(size=(1, 2, 8)), rng.uniform(0.1, 1, (1, 2, 8))
    x, dt, B = rng.normal(size=(1, 8, 2, 3)), rng.uniform(0.1, 1, (1, 8, 2)), rng.normal(size=(1, 8, 1, 4))

    @scanweaver.recurrence
    def ema(h, alpha, x):
        return alpha * h + (1 - alpha) * x

    return {"selective_scan": lambda: scanweaver.selective_scan(a, a, a, cu_seqlens=cu),
            "ema": lambda: ema(a, a, cu_seqlens=cu),
            "mamba_selective_scan": lambda: scanweaver.mamba_selective_scan(u, d, -np.ones((2, 4)),
                                                                            rng.normal(size=(1, 4, 8)),
                                                                            rng.normal(size=(1, 4, 8)), cu_seqlens=cu),
            "linear_attention": lambda: scanweaver.linear_attention(q, q, q, cu_seqlens=cu),
            "simple_gla": lambda: scanweaver.simple_gla(q, q, q, cu_seqlens_cpu=cu),
            "retention": lambda: scanweaver.retention(q, q, q, cu_seqlens=cu),
            "rwkv6": lambda: scanweaver.rwkv6(q, q, q, -np.ones((1, 8, 2, 3)), np.ones((2, 3)), cu_seqlens=cu),
            "mamba2_scan": lambda: scanweaver.mamba2_scan(x, dt, -np.ones(2), B, B, cu_seqlens=cu)}


@pytest.mark.parametrize("cu", [[0, 3.5, 8], [[0, 4], [4, 8]], [0, 5, 3, 8], [0, 4, 9], [1, 8], [True, False]],
                         ids=["float", "2-D", "decreasing", "past T", "not from 0", "bool"])
def test_one_cu_seqlens_checker_for_every_operation(cu):
    for api, call in _cu_calls(cu).items():
        with pytest.raises(ScanInputError) as exc:
            call()
        message = str(exc.value)
        assert "1-D integers [0, ..., T]" in message and "cu_seqlens" in message and api in message, message


@pytest.mark.parametrize("api", ["linear_attention", "simple_gla", "retention", "rwkv6"])
@pytest.mark.parametrize("scale", ["a", b"1", True, [1.0], float("nan")])
def test_scale_is_named(api, scale):
    q = np.ones((1, 3, 2, 4))
    args = (q, q, q, -np.ones((1, 3, 2, 4)), np.ones((2, 4))) if api == "rwkv6" else (q, q, q)
    with pytest.raises(ScanInputError, match=rf"^{api}: scale must be"):
        getattr(scanweaver, api)(*args, scale=scale)


@pytest.mark.parametrize("call, match", [
    (lambda s, x: scanweaver.mamba2_state_update(s, x, np.ones((2, 2)), -np.ones(2), np.ones((2, 1, 4)),
                                                 np.ones((2, 1, 4)), state_batch_indices=np.array([1, 1])),
     "state_batch_indices repeats a row"),
    (lambda s, x: scanweaver.mamba2_state_update(s, x, np.ones((2, 2)), -np.ones(2), np.ones((2, 1, 4)),
                                                 np.ones((2, 1, 4)), state_batch_indices=np.array([0, 3])),
     r"state_batch_indices must lie in \[0, 3\)"),
    (lambda s, x: scanweaver.mamba2_state_update(s, x, np.ones((2, 2)), -np.ones(2), np.ones((2, 1, 4)),
                                                 np.ones((2, 1, 4))), "state has 3 rows and x a batch of 2"),
    (lambda s, x: scanweaver.mamba2_state_update(s[:2], x, np.ones((2, 3)), -np.ones(2), np.ones((2, 1, 4)),
                                                 np.ones((2, 1, 4))), r"dt has shape \(2, 3\); it needs"),
    (lambda s, x: scanweaver.mamba2_state_update(s[:2], x, np.ones((2, 2)), -np.ones((2, 3)), np.ones((2, 1, 4)),
                                                 np.ones((2, 1, 4))), r"A has shape \(2, 3\); it needs \(H, P, N\)"),
    (lambda s, x: scanweaver.mamba2_state_update(s[:2], x, np.ones((2, 2)), -np.ones(2), np.ones((2, 3, 4)),
                                                 np.ones((2, 3, 4))), "G dividing H = 2"),
    (lambda s, x: scanweaver.mamba2_state_update(np.ones((2, 2, 3, 4), np.int64), x, np.ones((2, 2)), -np.ones(2),
                                                 np.ones((2, 1, 4)), np.ones((2, 1, 4))), "writeable floating-point"),
    (lambda s, x: scanweaver.mamba2_state_update(np.broadcast_to(s[:1], (2, 2, 3, 4)), x, np.ones((2, 2)),
                                                 -np.ones(2), np.ones((2, 1, 4)), np.ones((2, 1, 4))),
     "got a read-only ndarray"),
    # a 3-D state (Mamba-1's form) with Mamba-2's x: state is named, with both layouts and their sizes
    (lambda s, x: scanweaver.mamba2_state_update(s[:2, 0], x, np.ones((2, 2)), -np.ones(2), np.ones((2, 1, 4)),
                                                 np.ones((2, 1, 4))),
     r"^mamba2_state_update: state has shape \(2, 3, 4\); it needs \(nb, H, P, N\) = \(2, 2, 3, 4\) \(Mamba-2's, "
     r"with heads; sizes from x \(2, 2, 3\) and B \(2, 1, 4\)\), or \(nb, P, N\) without heads \(Mamba-1's step, "
     r"which takes x as \(batch, P\), not \(2, 2, 3\)\)"),
    (lambda s, x: scanweaver.mamba2_state_update(np.zeros((2, 2, 3)), x, np.ones((2, 2)), -np.ones((2, 3, 4)), None,
                                                 None), r"^mamba2_state_update: state has shape \(2, 2, 3\); it needs "
                                                        r"\(nb, H, P, N\) = \(2, 2, 3, 4\) .*sizes from x \(2, 2, 3\) "
                                                        r"and A \(2, 3, 4\)"),
    (lambda s, x: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), -np.ones(2), np.ones((1, 4, 1, 5)),
                                         np.ones((1, 4, 1, 5)), seq_idx=np.zeros((2, 4), int)),
     r"seq_idx has shape \(2, 4\); it needs \(batch, L\) = \(1, 4\)"),
    (lambda s, x: scanweaver.mamba2_scan(np.ones((1, 4, 2, 3)), np.ones((1, 4, 2)), -np.ones(2), np.ones((1, 4, 1, 5)),
                                         np.ones((1, 4, 1, 5)), seq_idx=np.zeros((1, 4))),
     r"seq_idx must be \(batch, L\) integers"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises(ScanInputError, match=match):
        call(np.zeros((3, 2, 3, 4)), np.ones((2, 2, 3)))
