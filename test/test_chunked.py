"""The chunked (matmul) form of the matrix-state scans against float64 loops of their defining recurrences.

Every decay the recurrence admits: decays (log decays from -1e-4 to -12), growth (positive log decays), mixed
signs, hard resets (-inf), tiny and huge log decays mixed (-1e-4 with -1e4), per head and per key; through the
public calls (``linear_attention``, ``rwkv6``, ``mamba2_scan`` with ``algorithm="chunked"``) and at the fused
operation's level; lengths that straddle every chunk length; packed sequences (one empty); reverse; initial and
final states; groups; float16 and bfloat16 storage; the split over threads; overflow exactly where the recurrence
overflows; gradients by finite differences of the loop in float64 and against the recurrent backward in float32.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures

OP = FUSED.get("matrix_state")
KINDS = ("decay", "growth", "mixed", "reset", "tiny_huge")


def log_decays(rng, kind: str, shape) -> np.ndarray:
    """Log decays of one kind (non-uniform, with every sign the kind allows)."""
    if kind == "decay":
        return -np.exp(rng.uniform(np.log(1e-4), np.log(12.0), shape))
    if kind == "growth":
        return rng.uniform(0.0, 0.02, shape)
    if kind == "mixed":
        return rng.uniform(-0.05, 0.05, shape)
    if kind == "reset":
        return np.where(rng.random(shape) < 0.06, -np.inf, -rng.uniform(0.0, 0.5, shape))
    return np.where(rng.random(shape) < 0.1, -1e4, -1e-4)


def loop(q, k, v, g, decay, readout="after", u=None, h0=None, cu=None, reverse=False):
    """``(o, hlast)``: S_t = exp(g_t) S_{t-1} + k_t v_t^T per head in float64, read after the update (o = S^T q) or
    RWKV-6's way (o = S_{t-1}^T q + (q . (u k)) v)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, V = v.shape
    Hq, K = q.shape[2:]
    segs = [(b, b, 0, T) for b in range(B)] if cu is None else [(i, 0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o, hl = np.zeros((B, T, H, V)), np.zeros((len(segs), H, K, V))
    for row, b, s, e in segs:
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else np.array(h0[row, h], np.float64)
            for t in (range(e - 1, s - 1, -1) if reverse else range(s, e)):
                qt, kt, vt = q[b, t, h * Hq // H], k[b, t, h * Hq // H], v[b, t, h]
                d = 1.0 if decay == "none" else np.exp(np.float64(g[b, t, h]))
                d = d[:, None] if decay == "key" else d
                prev, S = S, d * S + np.outer(kt, vt)
                o[b, t, h] = S.T @ qt if readout == "after" else prev.T @ qt + (qt @ (u[h] * kt)) * vt
            hl[row, h] = S
    return o, hl


def close(got, want, tol, what=""):
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) / scale
    assert err <= tol, f"{what}: max error {err:.2e} relative to max |want| {scale:.3g} (tolerance {tol:.0e})"


def qkv(rng, B, T, H, Hq, K, V, dtype=np.float64):
    return (rng.normal(size=(B, T, Hq, K)).astype(dtype), (rng.normal(size=(B, T, Hq, K)) / np.sqrt(K)).astype(dtype),
            rng.normal(size=(B, T, H, V)).astype(dtype))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("per", ["key", "head"])
def test_linear_attention_chunked_matches_the_loop(cpu, kind, per):
    rng = np.random.default_rng(hash((kind, per)) % 2**32)
    B, T, H, Hq, K, V = 2, 45, 4, 2, 8, 12
    q, k, v = qkv(rng, B, T, H, Hq, K, V)
    g = log_decays(rng, kind, (B, T, H, K) if per == "key" else (B, T, H))
    h0 = rng.normal(size=(B, H, K, V))
    want, want_h = loop(q, k, v, g, "key" if per == "key" else "scalar", h0=h0)
    decay = {"g": g} if per == "key" else {"g_head": g}
    for alg in ("chunked", "recurrent"):
        o, h = scanweaver.linear_attention(q, k, v, **decay, scale=1.0, initial_state=h0, output_final_state=True,
                                           backend="cpu", algorithm=alg, chunk=16)
        close(o, want, 1e-12, f"{alg} o")
        close(h, want_h, 1e-12, f"{alg} final state")


@pytest.mark.parametrize("kind", KINDS)
def test_rwkv6_chunked_matches_the_loop_with_packed_sequences(cpu, kind):
    rng = np.random.default_rng(7 + KINDS.index(kind))
    T, H, K, V = 50, 3, 8, 8
    r, k, v = qkv(rng, 1, T, H, H, K, V)
    w, u = log_decays(rng, kind, (1, T, H, K)), rng.normal(size=(H, K))
    cu = np.array([0, 17, 17, 50])
    h0 = rng.normal(size=(3, H, K, V))
    want, want_h = loop(r, k, v, w, "key", "bonus", u=u, h0=h0, cu=cu)
    o, h = scanweaver.rwkv6(r, k, v, w, u, scale=1.0, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                            backend="cpu", algorithm="chunked", chunk=7)
    close(o, want, 1e-12, "o")
    close(h, want_h, 1e-12, "final state")


@pytest.mark.parametrize("A_sign", [-1.0, 1.0])
def test_mamba2_chunked_matches_the_loop(cpu, A_sign):
    """dt * A below zero (decays, some strong) and above zero (growth), groups of B and C."""
    rng = np.random.default_rng(3)
    b, L, H, P, G, N = 2, 70, 4, 6, 2, 10
    x = rng.normal(size=(b, L, H, P))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.5), (b, L, H)))
    A = A_sign * np.exp(rng.uniform(np.log(0.01), np.log(8.0 if A_sign < 0 else 0.03), H))
    B, C = rng.normal(size=(2, b, L, G, N))
    D = rng.normal(size=H)
    h0 = rng.normal(size=(b, H, P, N))
    # the op's form: q = C, k = B, v = dt x, g = dt A, state (N, P) transposed to mamba-ssm's (P, N)
    want, want_h = loop(C, B, dt[..., None] * x, dt * A, "scalar", h0=h0.transpose(0, 1, 3, 2))
    want = want + D[:, None] * x
    out, h = scanweaver.mamba2_scan(x, dt, A, B, C, D=D, initial_states=h0, return_final_states=True, backend="cpu",
                                    algorithm="chunked", chunk=16)
    close(out, want, 1e-12, "y")
    close(h, want_h.transpose(0, 1, 3, 2), 1e-12, "final state")


def fused(be, f, a, sizes, part="forward", **tunables):
    """Runs one part of the fused op on ``a`` (NaN-filled outputs: every element must be written)."""
    cfg = OP.resolve("c", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    B, T, H, nseq = sizes["batch"], sizes["T"], sizes["H"], sizes["nseq"]
    if part == "forward":
        out = {"o": np.full((B, T, H, f.V), np.nan, f.dtype), "hlast": np.full((nseq, H, f.K, f.V), np.nan, f.dtype)}
    else:
        out = {n: np.full(a[s].shape, np.nan, f.dtype) for n, s in (("dq", "q"), ("dk", "k"), ("dv", "v"),
                                                                     ("dg", "g"), ("du", "u"), ("dh0", "h0")) if s in a}
    be.run_fused(OP.call(part, f, cfg), {**a, **out}, sizes)
    return out


def operands(rng, f: MatrixStateFeatures, B, T, H, Hq, kinds=KINDS, seqlens=None, dtype=None):
    """Inputs of the fused op: log decays of every kind in ``kinds``, each on a slice of the heads."""
    dtype = dtype or f.dtype
    q, k, v = qkv(rng, B, T, H, Hq, f.K, f.V)
    a = {"q": q, "k": k, "v": v}
    nseq = B if seqlens is None else len(seqlens)
    if f.decay != "none":
        shape = (B, T, H, f.K) if f.decay == "key" else (B, T, H)
        a["g"] = np.concatenate([log_decays(rng, kinds[h % len(kinds)], shape[:2] + (1,) + shape[3:])
                                 for h in range(H)], axis=2)
    if f.readout == "bonus":
        a["u"] = rng.normal(size=(H, f.K))
    if f.has_h0:
        a["h0"] = rng.normal(size=(nseq, H, f.K, f.V))
    a = {n: np.ascontiguousarray(x, dtype) for n, x in a.items()}
    if seqlens is not None:
        a["cu_seqlens"] = np.concatenate([[0], np.cumsum(seqlens)]).astype(np.int64)
    return a, {"batch": B, "T": T, "H": H, "Hq": Hq, "nseq": nseq}


def loop_of(f, a):
    return loop(a["q"], a["k"], a["v"], a.get("g"), f.decay, f.readout, u=a.get("u"), h0=a.get("h0"),
                cu=a.get("cu_seqlens"), reverse=f.reverse)


FEATURES = {"key-after": MatrixStateFeatures("float64", 6, 10, "key", "after", has_h0=True),
            "head-bonus-packed-reverse": MatrixStateFeatures("float64", 5, 9, "scalar", "bonus", True, has_h0=True,
                                                             has_seqlens=True)}


@pytest.mark.parametrize("chunk", [1, 7, 16, 64])
@pytest.mark.parametrize("name", sorted(FEATURES))
def test_lengths_that_straddle_every_chunk_length(cpu, chunk, name):
    f = FEATURES[name]
    rng = np.random.default_rng(chunk)
    for T in sorted({1, max(1, chunk - 1), chunk, chunk + 1, 2 * chunk + 3}):
        seqlens = [T // 2, 0, T - T // 2] if f.has_seqlens else None
        a, sizes = operands(rng, f, 1 if seqlens else 2, T, 5, 5, seqlens=seqlens)
        want, want_h = loop_of(f, a)
        got = fused(cpu, f, a, sizes, algorithm="chunked", chunk=chunk, threads=1)
        close(got["o"], want, 1e-12, f"o, T={T}")
        close(got["hlast"], want_h, 1e-12, f"hlast, T={T}")


@pytest.mark.parametrize("decay", ["scalar", "key"])
def test_a_few_long_lanes_split_over_threads(cpu, decay):
    """Fewer lanes than threads: parts of whole chunks through the affine carry of the chunk engine."""
    rng = np.random.default_rng(11)
    f = MatrixStateFeatures("float64", 6, 10, decay, "after", has_h0=True)
    a, sizes = operands(rng, f, 1, 301, 1, 1, kinds=("decay",))
    want, want_h = loop_of(f, a)
    got = fused(cpu, f, a, sizes, algorithm="chunked", chunk=16, threads=2)
    close(got["o"], want, 1e-12, "o")
    close(got["hlast"], want_h, 1e-12, "hlast")
    a["g"][0, 150:170] = -np.inf  # a reset in the second part
    a["g"][0, :40] = 0.03  # growth in the first
    want, want_h = loop_of(f, a)
    got = fused(cpu, f, a, sizes, algorithm="chunked", chunk=16, threads=2)
    close(got["o"], want, 1e-12, "o with a reset and growth")
    close(got["hlast"], want_h, 1e-12, "hlast with a reset and growth")


@pytest.mark.parametrize("algorithm", ["recurrent", "chunked"])
@pytest.mark.parametrize("per", ["key", "head"])
def test_growth_after_a_zero_prefix_split_over_threads(cpu, algorithm, per):
    """T = 8192, one head, log decay 0.05 and zero inputs but for the last 200 steps, two threads: the carry of a
    part whose decays overflow float32 never multiplies inf by its zero state."""
    rng = np.random.default_rng(6)
    T, K, V = 8192, 8, 8
    q, k, v = qkv(rng, 1, T, 1, 1, K, V, np.float32)
    k[:, : T - 200] = 0
    v[:, : T - 200] = 0
    g = np.full((1, T, 1, K) if per == "key" else (1, T, 1), 0.05, np.float32)
    decay = {"g": g} if per == "key" else {"g_head": g}
    o, h = scanweaver.linear_attention(q, k, v, **decay, scale=1.0, output_final_state=True, backend="cpu",
                                       threads=2, algorithm=algorithm)
    want, want_h = loop(q[:, -400:], k[:, -400:], v[:, -400:], g[:, -400:], "key" if per == "key" else "scalar")
    assert np.isfinite(o).all() and np.isfinite(h).all()
    close(o[:, -400:], want, 2e-5, "o")  # float32: 200 steps of growth compound each step's rounding
    close(h, want_h, 2e-5, "final state")


def test_overflow_only_where_the_recurrence_overflows(cpu):
    """Strong growth in float32: the chunked form is inf (or NaN) exactly where the recurrent form is, and agrees
    with it everywhere else."""
    rng = np.random.default_rng(8)
    q, k, v = qkv(rng, 1, 300, 2, 2, 8, 8, np.float32)
    g = rng.uniform(0.2, 0.6, (1, 300, 2)).astype(np.float32)
    rec, _ = scanweaver.linear_attention(q, k, v, g_head=g, scale=1.0, backend="cpu", algorithm="recurrent")
    chk, _ = scanweaver.linear_attention(q, k, v, g_head=g, scale=1.0, backend="cpu", algorithm="chunked")
    finite = np.isfinite(rec)
    assert 0 < finite.sum() < finite.size, "the case must overflow part of the way"
    np.testing.assert_array_equal(np.isfinite(chk), finite)
    np.testing.assert_allclose(chk[finite], rec[finite], rtol=1e-5, atol=0)


def test_float16_storage(cpu):
    rng = np.random.default_rng(9)
    q, k, v = qkv(rng, 2, 70, 4, 4, 16, 16, np.float16)
    g = log_decays(rng, "reset", (2, 70, 4, 16)).astype(np.float16)
    want, _ = loop(q, k, v, g, "key")
    o, _ = scanweaver.linear_attention(q, k, v, g=g, scale=1.0, backend="cpu", algorithm="chunked")
    assert o.dtype == np.float16
    close(o, want, 2e-3, "o")


def test_bfloat16_storage_through_torch(cpu):
    torch = pytest.importorskip("torch", reason="bfloat16 storage is exercised through the PyTorch front end")
    rng = np.random.default_rng(10)
    q, k, v = (torch.tensor(x, dtype=torch.bfloat16) for x in qkv(rng, 1, 70, 4, 4, 16, 16))
    g = torch.tensor(log_decays(rng, "tiny_huge", (1, 70, 4, 16)), dtype=torch.bfloat16)
    o, _ = scanweaver.linear_attention(q, k, v, g=g, scale=1.0, backend="cpu", algorithm="chunked")
    assert o.dtype == torch.bfloat16
    want, _ = loop(*(x.float().numpy() for x in (q, k, v, g)), "key")
    close(o.float().numpy(), want, 2e-2, "o")


@pytest.mark.parametrize("bad", [0, -3, 1025, 2.5, True, "64"])
def test_the_chunk_rule_names_the_lengths_allowed(bad):
    with pytest.raises(ScanInputError, match="chunk"):
        OP.resolve("c", {"algorithm": "chunked", "chunk": bad}, {}, "test")


@pytest.mark.parametrize("chunk", [1, 13, 100, 1024])
def test_any_chunk_length_up_to_the_limit_is_accepted(chunk):
    assert OP.resolve("c", {"algorithm": "chunked", "chunk": chunk}, {}, "test")["chunk"] == chunk


def same_non_finite(got, want, what):
    """Non-finite exactly where ``want`` is, and equal to it elsewhere."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), fin, err_msg=f"{what}: non-finite elsewhere than the recurrence")
    assert fin.any(), what
    close(got[fin], want[fin], 1e-12, what)


@pytest.mark.parametrize("value", [np.nan, np.inf])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_a_non_finite_input_reaches_no_earlier_step(cpu, name, value):
    """A NaN or inf in one step's q, k or v, inside a chunk and inside a register block of its rows: the chunked
    outputs and gradients are non-finite exactly where the recurrent ones are, so the steps before it stay finite
    (a triangular product that read the later rows of its block multiplied their NaN or inf by a masked 0)."""
    rng = np.random.default_rng(12)
    f = MatrixStateFeatures("float64", 4, 3, "key", "after", has_h0=True, has_dhlast=True)
    a, sizes = operands(rng, f, 1, 40, 1, 1, kinds=("decay",))
    for t in (3, 20):  # inside the first chunk of 16, and inside the second
        b = {n: x.copy() for n, x in a.items()}
        b[name][0, t, 0, 1] = value
        rec = fused(cpu, f, b, sizes, algorithm="recurrent")
        got = fused(cpu, f, b, sizes, algorithm="chunked", chunk=16)
        for n in ("o", "hlast"):
            same_non_finite(got[n], rec[n], f"{n}, {name}[{t}] = {value}")
        args = {**b, "do": rng.normal(size=b["v"].shape), "dhlast": rng.normal(size=b["h0"].shape)}
        rec = fused(cpu, f, args, sizes, "backward", algorithm="recurrent")
        got = fused(cpu, f, args, sizes, "backward", algorithm="chunked", chunk=16)
        for n in ("dq", "dk", "dv"):
            same_non_finite(got[n], rec[n], f"{n}, {name}[{t}] = {value}")
