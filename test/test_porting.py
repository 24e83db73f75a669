"""Calls that port from flash-linear-attention and mamba-ssm by renaming (the table of docs/porting.md).

Each ScanWeaver call is made with exactly the positional arguments of the peer's public call
(``chunk_gla(q, k, v, g, scale, initial_state, output_final_state)`` becomes
``scanweaver.linear_attention(q, k, v, g, scale, initial_state, output_final_state)``, tensors and all)
and compared with the peer's own reference run on the same tensors on the CPU: fla's naive
recurrences (loaded by path, without Triton) and mamba-ssm's pure-PyTorch references (extracted
into ``.deps/mamba_ssm_ref`` by ``.ci/run``).  The positional order itself is read from the peers'
sources.  Each test skips, saying why, where its peer is absent.
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError

import matrix_peers as peers

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(36)
TOL = {"rtol": 1e-4, "atol": 1e-4}  # the peers' references compute in float32

#: (peer, the file of its public call, the call, the ScanWeaver call): fla's files under fla/ops, mamba-ssm's
#: in peers.MAMBA_REF.
CALLS = [
    ("fla", "gla/chunk", "chunk_gla", "linear_attention"),
    ("fla", "simple_gla/chunk", "chunk_simple_gla", "simple_gla"),
    ("fla", "retention/chunk", "chunk_retention", "retention"),
    ("fla", "rwkv6/chunk", "chunk_rwkv6", "rwkv6"),
    ("mamba", "ssd_combined.py", "mamba_chunk_scan_combined", "mamba2_scan"),
    ("mamba", "selective_state_update.py", "selective_state_update", "mamba2_state_update"),
    ("mamba", "selective_scan_interface.py", "selective_scan_fn", "mamba_selective_scan"),
]


def _t(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))


def _np(t):
    return t.detach().numpy()


def _fla(module: str):
    mod = peers.fla(module)
    if mod is None:
        pytest.skip(peers.FLA_WHY)
    return mod


def _mamba(name: str):
    fn = peers.mamba_fn(name) if name in peers._MAMBA_MORE else (peers.mamba_ref() or {}).get(name)
    if fn is None:
        pytest.skip(peers.MAMBA_WHY)
    return fn


def _logsig(shape):
    return torch.nn.functional.logsigmoid(_t(RNG.normal(size=shape)) + 2.0)


@pytest.mark.parametrize("peer, file, call, ours", CALLS, ids=[c[2] for c in CALLS])
def test_positional_order_is_the_peers(peer, file, call, ours):
    path = peers.fla_file(file) if peer == "fla" else peers.MAMBA_REF / file
    theirs = peers.parameters(path, call)
    if theirs is None:
        pytest.skip(peers.FLA_WHY if peer == "fla" else peers.MAMBA_WHY)
    sig = inspect.signature(getattr(scanweaver, ours))
    positional = [(n, p.default) for n, p in sig.parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [n for n, _ in positional] == [n for n, _ in theirs], ours
    for (name, default), (_, mine) in zip(theirs, positional, strict=True):
        if default is not ...:
            assert mine == default, f"{ours}: {name} defaults to {mine!r}, {call}'s to {default!r}"


@pytest.mark.parametrize("ours", ["linear_attention", "simple_gla", "retention", "rwkv6"])
def test_head_first_is_refused_with_fla_message(ours):
    q = np.ones((1, 3, 2, 4))
    args = (q, q, q, q, np.ones((2, 4))) if ours == "rwkv6" else (q, q, q)
    with pytest.raises(ScanInputError) as exc:
        getattr(scanweaver, ours)(*args, head_first=False)
    message = str(exc.value).splitlines()[0]
    fla_says = "head_first has been removed. Inputs must be in `[B, T, H, ...]` format."
    assert message == f"{ours}: {fla_says}"
    source = peers.fla_file("simple_gla/chunk")
    if source is not None:
        assert fla_says in source.read_text()


# --- flash-linear-attention ---------------------------------------------------------------------------------------

def test_chunk_gla():
    gla = _fla("gla/naive")
    B, T, H, K, V = 2, 37, 3, 8, 6
    q, k, v = _t(RNG.normal(size=(B, T, H, K))), _t(RNG.normal(size=(B, T, H, K))), _t(RNG.normal(size=(B, T, H, V)))
    g, h0 = _logsig((B, T, H, K)), _t(RNG.normal(size=(B, H, K, V)))
    want_o, want_h = gla.naive_recurrent_gla(q, k, v, g, h0, True)
    o, h = scanweaver.linear_attention(q, k, v, g, None, h0, True)        # chunk_gla(q, k, v, g, None, h0, True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32
    np.testing.assert_allclose(_np(o), _np(want_o), **TOL)
    np.testing.assert_allclose(_np(h), _np(want_h), **TOL)
    # state_v_first: states (N, H, V, K) in and out
    o, h = scanweaver.linear_attention(q, k, v, g, None, h0.transpose(-1, -2).contiguous(), True, True)
    np.testing.assert_allclose(_np(o), _np(want_o), **TOL)
    np.testing.assert_allclose(_np(h), _np(want_h.transpose(-1, -2)), **TOL)


def test_chunk_gla_varlen_against_fla_per_sequence():
    gla = _fla("gla/naive")
    T, H, K, V = 41, 2, 4, 5
    cu = torch.tensor([0, 9, 9, 30, 41])                     # an empty sequence too
    q, k, v = _t(RNG.normal(size=(1, T, H, K))), _t(RNG.normal(size=(1, T, H, K))), _t(RNG.normal(size=(1, T, H, V)))
    g, h0 = _logsig((1, T, H, K)), _t(RNG.normal(size=(4, H, K, V)))
    # chunk_gla(q, k, v, g, None, h0, True, False, cu_seqlens, cu_seqlens_cpu)
    o, h = scanweaver.linear_attention(q, k, v, g, None, h0, True, False, cu, cu.cpu())
    for i in range(4):
        s, e = int(cu[i]), int(cu[i + 1])
        want_o, want_h = gla.naive_recurrent_gla(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], h0[i:i + 1], True)
        np.testing.assert_allclose(_np(o[:, s:e]), _np(want_o), **TOL)
        np.testing.assert_allclose(_np(h[i:i + 1]), _np(want_h), **TOL)


def test_chunk_simple_gla_and_retention():
    sgla, ret = _fla("simple_gla/naive"), _fla("retention/naive")
    B, T, H, K, V = 2, 29, 4, 8, 5
    q, k, v = _t(RNG.normal(size=(B, T, H, K))), _t(RNG.normal(size=(B, T, H, K))), _t(RNG.normal(size=(B, T, H, V)))
    g, h0 = _logsig((B, T, H)), _t(RNG.normal(size=(B, H, K, V)))
    want_o, want_h = sgla.naive_recurrent_simple_gla(q, k, v, g, 0.3, h0, True)
    o, h = scanweaver.simple_gla(q, k, v, g, None, 0.3, h0, True)  # chunk_simple_gla(q, k, v, g, None, 0.3, h0, True)
    np.testing.assert_allclose(_np(o), _np(want_o), **TOL)
    np.testing.assert_allclose(_np(h), _np(want_h), **TOL)
    g_gamma = _logsig((H,))
    want_o, want_h = sgla.naive_recurrent_simple_gla(q, k, v, g_gamma.expand(B, T, H), None, h0, True)
    o, h = scanweaver.simple_gla(q, k, v, None, g_gamma, None, h0, True)   # chunk_simple_gla(q, k, v, g_gamma=...)
    np.testing.assert_allclose(_np(o), _np(want_o), **TOL)
    np.testing.assert_allclose(_np(h), _np(want_h), **TOL)
    # chunk_retention(q, k, v): RetNet's decays derived as fla derives them
    want = ret.naive_retention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    o, h = scanweaver.retention(q, k, v)
    assert h is None
    np.testing.assert_allclose(_np(o), _np(want), **TOL)
    gamma = (1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float))).log()   # chunk_retention's own line
    _, want_h = sgla.naive_recurrent_simple_gla(q, k, v, gamma.expand(B, T, H), None, h0, True)
    _, h = scanweaver.retention(q, k, v, None, h0, True)
    np.testing.assert_allclose(_np(h), _np(want_h), **TOL)


def test_chunk_rwkv6():
    mod = _fla("rwkv6/recurrent_naive")
    B, T, H, K, V = 2, 23, 2, 8, 4
    r, k, v = _t(RNG.normal(size=(B, T, H, K))), _t(RNG.normal(size=(B, T, H, K))), _t(RNG.normal(size=(B, T, H, V)))
    w, u, h0 = _logsig((B, T, H, K)), _t(RNG.normal(size=(H, K))), _t(RNG.normal(size=(B, H, K, V)))
    first = [a.transpose(1, 2) for a in (r, k, v, w)]                 # naive_recurrent_rwkv6 is head-first
    want_o, want_h = mod.naive_recurrent_rwkv6(*first, u, 0.5, h0, True)
    o, h = scanweaver.rwkv6(r, k, v, w, u, 0.5, h0, True)             # chunk_rwkv6(r, k, v, w, u, 0.5, h0, True)
    np.testing.assert_allclose(_np(o), _np(want_o.transpose(1, 2)), **TOL)
    np.testing.assert_allclose(_np(h), _np(want_h), **TOL)


# --- mamba-ssm ----------------------------------------------------------------------------------------------------

def _ssd_inputs(b, L, H, P, G, N):
    x, z = _t(RNG.normal(size=(b, L, H, P))), _t(RNG.normal(size=(b, L, H, P)))
    dt, A = _t(RNG.normal(size=(b, L, H)) - 1), _t(-np.exp(RNG.uniform(-1, 1.5, H)))
    B, C = _t(RNG.normal(size=(b, L, G, N))), _t(RNG.normal(size=(b, L, G, N)))
    return x, dt, A, B, C, _t(RNG.normal(size=(H, P))), z, _t(RNG.normal(size=H))


def test_mamba_chunk_scan_combined():
    ref = _mamba("ssd_chunk_scan_combined_ref")
    x, dt, A, B, C, D, z, dt_bias = _ssd_inputs(2, 48, 4, 8, 2, 6)
    want = ref(x, dt, A, B, C, 16, D, z, dt_bias, True)
    # mamba_chunk_scan_combined(x, dt, A, B, C, 16, D, z, dt_bias, None, None, None, True)
    out = scanweaver.mamba2_scan(x, dt, A, B, C, 16, D, z, dt_bias, None, None, None, True)
    np.testing.assert_allclose(_np(out), _np(want), rtol=2e-4, atol=2e-4)


def test_mamba_chunk_scan_combined_seq_idx_and_varlen_states():
    ref, minimal = _mamba("ssd_chunk_scan_combined_ref"), _mamba("ssd_minimal_discrete")
    H, P, G, N, chunk = 2, 4, 1, 3, 8
    lengths = [16, 8, 24]
    cu = torch.tensor(np.cumsum([0, *lengths]))
    seq_idx = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))[None]   # (1, L), as mamba-ssm's callers
    x, dt, A, B, C, _, _, dt_bias = _ssd_inputs(1, sum(lengths), H, P, G, N)
    # mamba_chunk_scan_combined(x, dt, A, B, C, 8, None, None, dt_bias, None, seq_idx, cu, True, (0.0, inf),
    #                           True, True)
    out, final, varlen = scanweaver.mamba2_scan(x, dt, A, B, C, chunk, None, None, dt_bias, None, seq_idx, cu, True,
                                                (0.0, float("inf")), True, True)
    assert final.shape == (1, H, P, N) and varlen.shape == (3, H, P, N)
    dts = torch.nn.functional.softplus(dt + dt_bias)
    for i in range(3):
        s, e = int(cu[i]), int(cu[i + 1])
        want = ref(x[:, s:e], dt[:, s:e], A, B[:, s:e], C[:, s:e], chunk, None, None, dt_bias, True)
        np.testing.assert_allclose(_np(out[:, s:e]), _np(want), rtol=2e-4, atol=2e-4)
        _, state = minimal(x[:, s:e] * dts[:, s:e, :, None], A * dts[:, s:e], B[:, s:e].expand(-1, -1, H, -1),
                           C[:, s:e].expand(-1, -1, H, -1), chunk)
        np.testing.assert_allclose(_np(varlen[i]), _np(state[0]), rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(_np(final), _np(varlen[-1:]), rtol=0, atol=0)
    out2, varlen2 = scanweaver.mamba2_scan(x, dt, A, B, C, chunk, None, None, dt_bias, None, seq_idx, cu, True,
                                           (0.0, float("inf")), False, True)
    np.testing.assert_allclose(_np(out2), _np(out), rtol=0, atol=0)
    np.testing.assert_allclose(_np(varlen2), _np(varlen), rtol=0, atol=0)


def test_selective_state_update():
    ref = _mamba("selective_state_update_ref")
    b, H, P, N, G = 3, 4, 5, 6, 2
    A_h, D_h, bias_h = _t(-np.exp(RNG.normal(size=H))), _t(RNG.normal(size=H)), _t(RNG.normal(size=H))
    # as Mamba-2's step passes them: A, dt, D, dt_bias tiled over the head dim (stride 0)
    A = A_h[:, None, None].expand(H, P, N)
    dt_h = _t(RNG.normal(size=(b, H)))
    dt, D, dt_bias = dt_h[..., None].expand(b, H, P), D_h[:, None].expand(H, P), bias_h[:, None].expand(H, P)
    x, z = _t(RNG.normal(size=(b, H, P))), _t(RNG.normal(size=(b, H, P)))
    B, C = _t(RNG.normal(size=(b, G, N))), _t(RNG.normal(size=(b, G, N)))
    state = _t(RNG.normal(size=(b, H, P, N)))
    want_state = state.clone()
    want = ref(want_state, x, dt, A, B, C, D, z, dt_bias, True)
    mine = state.clone()
    out = scanweaver.mamba2_state_update(mine, x, dt, A, B, C, D, z, dt_bias, True)   # selective_state_update(...)
    np.testing.assert_allclose(_np(out), _np(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(mine), _np(want_state), rtol=1e-5, atol=1e-5)
    # the untiled forms (A (H,), dt (batch, H), D and dt_bias (H,)) give the same
    untiled = state.clone()
    out = scanweaver.mamba2_state_update(untiled, x, dt_h, A_h, B, C, D_h, z, bias_h, True)
    np.testing.assert_allclose(_np(out), _np(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(untiled), _np(want_state), rtol=1e-5, atol=1e-5)
    # continuous batching: batch element i reads and writes cache row idx[i]; the other rows stay
    cache = _t(RNG.normal(size=(5, H, P, N)))
    idx = torch.tensor([4, 0, 2])
    want_cache = cache.clone()
    rows = want_cache[idx].clone()
    want = ref(rows, x, dt, A, B, C, D, z, dt_bias, True)
    want_cache[idx] = rows
    out = scanweaver.mamba2_state_update(cache, x, dt, A, B, C, D, z, dt_bias, True, idx)
    np.testing.assert_allclose(_np(out), _np(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(cache), _np(want_cache), rtol=1e-5, atol=1e-5)


def test_selective_state_update_without_heads():
    ref = _mamba("selective_state_update_ref")
    b, dim, N = 2, 6, 4                                                # Mamba-1's step: state (batch, dim, dstate)
    state = _t(RNG.normal(size=(b, dim, N)))
    x, dt, z = (_t(RNG.normal(size=(b, dim))) for _ in range(3))
    A, B, C = _t(-np.exp(RNG.normal(size=(dim, N)))), _t(RNG.normal(size=(b, N))), _t(RNG.normal(size=(b, N)))
    D, dt_bias = _t(RNG.normal(size=dim)), _t(RNG.normal(size=dim))
    want_state = state.clone()
    want = ref(want_state, x, dt, A, B, C, D, z, dt_bias, True)
    out = scanweaver.mamba2_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)
    assert out.shape == (b, dim)
    np.testing.assert_allclose(_np(out), _np(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_np(state), _np(want_state), rtol=1e-5, atol=1e-5)


def test_selective_scan_fn_return_last_state():
    ref = _mamba("selective_scan_ref")
    b, dim, N, L = 2, 4, 3, 19
    u, delta, z = (_t(RNG.normal(size=(b, dim, L))) for _ in range(3))
    A, B, C = _t(-np.exp(RNG.normal(size=(dim, N)))), _t(RNG.normal(size=(b, N, L))), _t(RNG.normal(size=(b, N, L)))
    D, delta_bias = _t(RNG.normal(size=dim)), _t(RNG.normal(size=dim))
    want_y, want_h = ref(u, delta, A, B, C, D, z, delta_bias, True, True)
    y, h = scanweaver.mamba_selective_scan(u, delta, A, B, C, D, z, delta_bias, True, True)  # selective_scan_fn(...)
    np.testing.assert_allclose(_np(y), _np(want_y), rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(_np(h), _np(want_h), rtol=2e-4, atol=2e-4)


def test_tensors_as_offsets_and_sequence_indices_are_taken_as_their_values():
    x, dt, A, B, C, _, _, _ = _ssd_inputs(1, 12, 2, 3, 1, 4)
    seq_idx = torch.tensor([[0] * 5 + [1] * 7])
    a = scanweaver.mamba2_scan(x, dt, A, B, C, 64, seq_idx=seq_idx)
    b = scanweaver.mamba2_scan(x, dt, A, B, C, 64, cu_seqlens=[0, 5, 12])
    np.testing.assert_allclose(_np(a), _np(b), rtol=1e-6, atol=1e-6)
    for bad, name in ((dict(seq_idx=seq_idx.float()), "seq_idx"), (dict(seq_idx=seq_idx[0]), "seq_idx"),
                      (dict(cu_seqlens=torch.tensor([0.0, 12.0])), "cu_seqlens"),
                      (dict(cu_seqlens=torch.tensor([[0, 5], [5, 12]])), "cu_seqlens")):
        with pytest.raises(ScanInputError, match=rf"mamba2_scan: {name} must be"):
            scanweaver.mamba2_scan(x, dt, A, B, C, **bad)
    q = _t(RNG.normal(size=(1, 12, 2, 3)))
    for bad in (torch.tensor([0.0, 12.0]), torch.tensor([[0, 5], [5, 12]])):
        with pytest.raises(ScanInputError, match=r"linear_attention: cu_seqlens_cpu must be 1-D integers"):
            scanweaver.linear_attention(q, q, q, cu_seqlens_cpu=bad)
    with pytest.raises(ScanInputError, match="cu_seqlens_cpu must hold the offsets of cu_seqlens"):
        scanweaver.linear_attention(q, q, q, cu_seqlens=torch.tensor([0, 5, 12]),
                                    cu_seqlens_cpu=torch.tensor([0, 6, 12]))
    assert math.isfinite(float(scanweaver.linear_attention(q, q, q, None, torch.tensor(0.5))[0].sum()))


def test_state_update_on_tensors_that_need_gradients():
    H, P, N = 2, 3, 4
    x, dt, A = _t(RNG.normal(size=(1, H, P))), _t(RNG.normal(size=(1, H))), _t(-np.ones(H))
    B = C = _t(RNG.normal(size=(1, 1, N)))
    with pytest.raises(ScanInputError, match="state is a leaf tensor that requires grad"):
        scanweaver.mamba2_state_update(torch.zeros(1, H, P, N, requires_grad=True), x, dt, A, B, C)
    x.requires_grad_()
    state = torch.ones(1, H, P, N)
    out = scanweaver.mamba2_state_update(state, x, dt, A, B, C)            # a cache: gradients reach x
    out.sum().backward()
    assert x.grad is not None and torch.count_nonzero(x.grad) == x.numel()
