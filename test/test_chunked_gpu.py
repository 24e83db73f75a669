"""The chunked (matmul) forward of the matrix-state scans on the GPU backends, against a float64 loop of the recurrence.

Runs on OpenCL (PoCL here): decays, growth (positive log decays), mixed signs, hard resets (-inf), tiny and huge
log decays mixed (-1e-4 with -1e4), per head and per key, both readouts; lengths that straddle the chunk (T = 1,
sequences shorter than a chunk, 63 / 64 / 65 / 130 steps at chunk 64); packed sequences (one empty); reverse;
initial and final states; groups (H > Hq); float32 and float64; the public calls with ``algorithm="chunked"`` and
``chunk_size=``, and what :data:`scanweaver.matrix.last` reports.  The CUDA text of the same kernels compiles for
sm_90 with nvcc and spills nothing at K = V = 128 and at K = 256, V = 512 (nothing CUDA runs here).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for
from scanweaver.targets.fused_gpu_matrix_state import local_bytes
from scanweaver.targets.matrix_gpu_chunked import chunk_layout
from scanweaver.tools.ptxas import cubin_report

OP = FUSED.get("matrix_state")
NVCC = shutil.which("nvcc")
KINDS = ("decay", "growth", "mixed", "reset", "tiny_huge")


def log_decays(rng, kind: str, shape) -> np.ndarray:
    """Log decays of one kind, non-uniform."""
    if kind == "decay":
        return -np.exp(rng.uniform(np.log(1e-4), np.log(12.0), shape))
    if kind == "growth":
        return rng.uniform(0.0, 0.3, shape)
    if kind == "mixed":
        return rng.uniform(-0.5, 0.5, shape)
    if kind == "reset":
        return np.where(rng.random(shape) < 0.08, -np.inf, -rng.uniform(0.0, 0.5, shape))
    return np.where(rng.random(shape) < 0.1, -1e4, -1e-4)


def loop(q, k, v, g, decay, readout="after", u=None, h0=None, cu=None, reverse=False):
    """``(o, hlast)`` in float64: S_t = exp(g_t) S_{t-1} + k_t v_t^T per head, read after the update
    (o_t = S_t^T q_t) or RWKV-6's way (o_t = S_{t-1}^T q_t + (q_t . (u k_t)) v_t); head h reads q/k head
    h // (H // Hq)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, H, V = v.shape
    Hq, K = q.shape[2:]
    segs = [(b, b, 0, T) for b in range(B)] if cu is None else [(i, 0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o, hl = np.zeros((B, T, H, V)), np.zeros((len(segs), H, K, V))
    with np.errstate(over="ignore", invalid="ignore"):
        for row, b, s, e in segs:
            for h in range(H):
                S = np.zeros((K, V)) if h0 is None else np.array(h0[row, h], np.float64)
                for t in (range(e - 1, s - 1, -1) if reverse else range(s, e)):
                    qt, kt, vt = q[b, t, h // (H // Hq)], k[b, t, h // (H // Hq)], v[b, t, h]
                    d = 1.0 if decay == "none" else np.exp(np.asarray(g[b, t, h], np.float64))
                    prev, S = S, (d[:, None] if decay == "key" else d) * S + np.outer(kt, vt)
                    o[b, t, h] = S.T @ qt if readout == "after" else prev.T @ qt + (qt @ (u[h] * kt)) * vt
                hl[row, h] = S
    return o, hl


def close(got, want, tol, what=""):
    assert np.isfinite(want).all(), f"{what}: the loop is not finite here (a test of finite cases)"
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(np.asarray(got, np.float64) - want).max()) / scale
    assert err <= tol, f"{what}: max error {err:.2e} relative to max |want| {scale:.3g} (tolerance {tol:.0e})"


def case(rng, decay, readout, dtype, *, T=13, H=2, Hq=1, K=5, V=7, kind="decay", reverse=False, seqlens=None,
         h0=True):
    """Features, sizes and operands (in ``dtype``) of one problem; batch 2, or 1 with packed ``seqlens``."""
    batch = 1 if seqlens is not None else 2
    nseq = len(seqlens) - 1 if seqlens is not None else batch
    q, k = (rng.normal(size=(batch, T, Hq, K)).astype(dtype) for _ in range(2))
    v = rng.normal(size=(batch, T, H, V)).astype(dtype)
    shape = (batch, T, H, K) if decay == "key" else (batch, T, H)
    a = {"q": q, "k": k / np.sqrt(K).astype(dtype), "v": v, "cu_seqlens": seqlens,
         "g": log_decays(rng, kind, shape).astype(dtype) if decay != "none" else None,
         "u": rng.normal(size=(H, K)).astype(dtype) if readout == "bonus" else None,
         "h0": rng.normal(size=(nseq, H, K, V)).astype(dtype) if h0 else None}
    f = MatrixStateFeatures(dtype, K, V, decay, readout, reverse, h0, seqlens is not None)
    return f, {"batch": batch, "T": T, "H": H, "Hq": Hq, "nseq": nseq}, a


def run(be, f, sizes, a, **tunables):
    """The fused forward on ``be`` with ``tunables`` over the backend's defaults; NaN-filled outputs (every
    element must be written)."""
    cfg = OP.resolve("gpu", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    out = {"o": np.full(a["v"].shape, np.nan, f.dtype),
           "hlast": np.full((sizes["nseq"], sizes["H"], f.K, f.V), np.nan, f.dtype)}
    be.run_fused(OP.call("forward", f, cfg), {**a, **out}, sizes)
    return out["o"], out["hlast"]


def check(be, f, sizes, a, tol, **tunables):
    want, want_h = loop(a["q"], a["k"], a["v"], a["g"], f.decay, f.readout, a["u"], a["h0"], a["cu_seqlens"],
                        f.reverse)
    o, h = run(be, f, sizes, a, algorithm="chunked", **tunables)
    close(o, want, tol, "o")
    close(h, want_h, tol, "final state")
    return o, h


#: (decay, readout, kind, dtype, reverse, packed, Hq): every kind per key and per head, both readouts, both dtypes.
CASES = [
    ("key", "after", "decay", "float64", False, False, 1),
    ("key", "bonus", "growth", "float64", True, True, 2),
    ("key", "after", "mixed", "float32", True, False, 2),
    ("key", "bonus", "reset", "float32", False, True, 1),
    ("key", "after", "tiny_huge", "float64", False, True, 1),
    ("scalar", "bonus", "decay", "float32", True, False, 1),
    ("scalar", "after", "growth", "float32", False, True, 2),
    ("scalar", "bonus", "mixed", "float64", False, True, 1),
    ("scalar", "after", "reset", "float64", True, True, 2),
    ("scalar", "bonus", "tiny_huge", "float32", True, False, 2),
    ("none", "after", "decay", "float32", False, True, 2),
    ("none", "bonus", "decay", "float64", True, False, 1),
]


@pytest.mark.parametrize("decay, readout, kind, dtype, reverse, packed, Hq", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_chunked_forward_matches_the_loop(gpu, decay, readout, kind, dtype, reverse, packed, Hq):
    """Chunks of 4 over 13 steps (and over packed sequences of 4, 0, 5 and 4 steps: shorter than, equal to and
    longer than a chunk), several value tiles, odd K and V."""
    rng = np.random.default_rng(CASES.index((decay, readout, kind, dtype, reverse, packed, Hq)))
    cu = np.array([0, 4, 4, 9, 13], np.int64) if packed else None
    f, sizes, a = case(rng, decay, readout, dtype, kind=kind, reverse=reverse, seqlens=cu, Hq=Hq)
    check(gpu, f, sizes, a, {"float32": 3e-5, "float64": 1e-12}[dtype], chunk=4, workgroup_size=8, time_tile=3)


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
def test_lengths_around_the_default_chunk(gpu, T):
    """The default chunk (64) and workgroups: T = 1, one step short of, at and past one chunk, and two chunks and
    a bit; float32 against the loop and against the GPU recurrence on the same data."""
    rng = np.random.default_rng(T)
    f, sizes, a = case(rng, "key", "after", "float32", T=T, K=16, V=24, Hq=2, kind="mixed")
    o, h = check(gpu, f, sizes, a, 3e-5)
    ro, rh = run(gpu, f, sizes, a, algorithm="recurrent")
    close(o, ro.astype(np.float64), 3e-5, "chunked vs recurrent o")
    close(h, rh.astype(np.float64), 3e-5, "chunked vs recurrent final state")


@pytest.mark.parametrize("dtype, readout", [("float32", "after"), ("float64", "bonus")])
def test_plain_and_other_key_tiles_in_one_chunk(gpu, dtype, readout):
    """A decay per key over three key tiles of the output kernel (K = 40: 16, 16, 8), chunks of 16: GLA's
    decays on the first tile (plain: its scores are products of q o e^{Gq} and k o e^{-Gk}), a reset in the
    middle of a chunk on the second, growth on the third; then every key plain but one whose total decay in a
    chunk passes the product form's range in float32 (not in float64); against the loop."""
    rng = np.random.default_rng(17)
    f, sizes, a = case(rng, "key", readout, dtype, T=50, H=2, K=40, V=24)
    g = np.log(rng.uniform(0.9, 0.999, a["g"].shape))
    g[..., 16:32][:, 21] = -np.inf
    g[..., 32:] = rng.uniform(0.0, 0.05, g[..., 32:].shape)
    for gates in (g, np.where(np.arange(40) == 3, -6.0, np.log(rng.uniform(0.9, 0.999, g.shape)))):
        a["g"] = gates.astype(dtype)
        check(gpu, f, sizes, a, {"float32": 3e-5, "float64": 1e-12}[dtype], chunk=16)


@pytest.mark.parametrize("dtype, readout", [("float32", "after"), ("float64", "bonus")])
def test_plain_and_other_chunks_of_a_decay_per_head(gpu, dtype, readout):
    """A decay per head, chunks of 16: plain chunks (their scores q . k times e^{Gq_i} e^{-Gk_j}), a chunk with a
    reset, one that grows, and one whose total decay passes the product form's range in float32 (not in
    float64); against the loop."""
    rng = np.random.default_rng(19)
    f, sizes, a = case(rng, "scalar", readout, dtype, T=70, H=2, K=24, V=12)
    g = np.log(rng.uniform(0.9, 0.999, a["g"].shape))
    g[:, 21, 1] = -np.inf
    g[:, 32:48, 0] = rng.uniform(0.0, 0.05, g[:, 32:48, 0].shape)
    g[:, 48:64, 1] = -6.0
    a["g"] = g.astype(dtype)
    check(gpu, f, sizes, a, {"float32": 3e-5, "float64": 1e-12}[dtype], chunk=16)


@pytest.mark.parametrize("decay, readout, kind, dtype", [("key", "after", "mixed", "float32"),
                                                         ("key", "bonus", "reset", "float64"),
                                                         ("scalar", "after", "decay", "float32"),
                                                         ("none", "bonus", "decay", "float32")])
def test_the_scores_serve_every_tile_of_value_columns(gpu, decay, readout, kind, dtype):
    """The output kernel forms a chunk's scores once and then walks the tiles of value columns (V = 70: three
    tiles of 32, the last partial), each over the key tiles of the start state's part (K = 40: 16, 16, 8), in
    alternate directions: every tile's outputs against the loop, with an initial state, packed sequences and
    chunks of 16."""
    rng = np.random.default_rng(23)
    cu = np.array([0, 17, 17, 50], np.int64)
    f, sizes, a = case(rng, decay, readout, dtype, T=50, H=2, K=40, V=70, kind=kind, seqlens=cu)
    assert chunk_layout(f, {"chunk": 16}).ct3 == 32 and chunk_layout(f, {"chunk": 16}).kt == 16
    check(gpu, f, sizes, a, {"float32": 3e-5, "float64": 1e-12}[dtype], chunk=16)


def test_growth_overflows_only_where_the_recurrence_does(gpu):
    """Log decays of +50 per step in float32 (e^50 = 5e21, finite) over 3 steps, the first key 1e-25 small: its
    weight to the chunk's end, e^100 = 3e43, overflows float32, but the recurrence multiplies its tiny term by
    e^50 twice and stays finite (about 1e21), and so does the chunked form, which forms k_j e^{G_last - G_j}
    (and q_i e^{G_i}, and the scores) in double before rounding."""
    rng = np.random.default_rng(5)
    for decay, readout in (("scalar", "after"), ("key", "bonus")):
        f, sizes, a = case(rng, decay, readout, "float32", T=3, H=1, K=4, V=4, h0=False)
        a["g"] = np.full(a["g"].shape, 50.0, np.float32)
        a["k"][:, 0] *= np.float32(1e-25)
        want, want_h = loop(a["q"], a["k"], a["v"], a["g"], decay, readout, a["u"])
        assert 1e18 < np.abs(want_h).max() < 1e30
        assert np.exp(100.0) > np.finfo(np.float32).max, "the first key's factor alone overflows float32"
        o, h = run(gpu, f, sizes, a, algorithm="chunked", chunk=64)
        assert np.isfinite(o).all() and np.isfinite(h).all()
        for got, w, what in ((o, want, "o"), (h, want_h, "final state")):
            m = np.abs(w).max()
            close(got / m, w / m, 3e-5, f"{decay} {readout} {what} / its max")


def test_public_calls_select_the_chunked_form_and_report_it(gpu):
    """``algorithm="chunked"`` and ``chunk_size=`` select the chunked forward on opencl as on cpu, and
    :data:`scanweaver.matrix.last` says which algorithm ran."""
    rng = np.random.default_rng(11)
    B, T, H, K, V = 1, 37, 2, 8, 8
    q, k = rng.normal(size=(2, B, T, H, K)).astype(np.float32)
    v = rng.normal(size=(B, T, H, V)).astype(np.float32)
    g = log_decays(rng, "reset", (B, T, H, K)).astype(np.float32)
    want = loop(q, k, v, g, "key")[0]
    o, _ = scanweaver.linear_attention(q, k, v, g=g, scale=1.0, backend=gpu.name, algorithm="chunked", chunk=16)
    close(o, want, 3e-5, "algorithm=chunked")
    info = scanweaver.matrix.last
    assert (info.backend, info.algorithm, info.config["chunk"], info.source) == (gpu.name, "chunked", 16, "explicit")
    o, _ = scanweaver.linear_attention(q, k, v, g=g, scale=1.0, backend=gpu.name, chunk_size=32)
    close(o, want, 3e-5, "chunk_size=32")
    info = scanweaver.matrix.last
    assert (info.algorithm, info.config["chunk"], info.source) == ("chunked", 32, "hint")
    scanweaver.linear_attention(q, k, v, g=g, scale=1.0, backend=gpu.name)
    assert scanweaver.matrix.last.algorithm == "recurrent", "the GPU default stays the recurrence"
    scanweaver.linear_attention(q, k, v, g=g, scale=1.0, backend=gpu.name, chunk_size=256)
    assert scanweaver.matrix.last.algorithm == "recurrent", "a chunk over 64 is a hint the GPU kernels drop"


def test_both_gpu_parts_take_the_chunked_form_and_keep_the_recurrent_default():
    """Both GPU parts have the chunked form (explicitly or by the hint); the rule measured on CUDA (an H200,
    ``bench/results/gpu_chunked_h200_train.json``) runs the backward chunked from 8192 steps there and keeps the
    forward recurrent; OpenCL, not measured, keeps the recurrence."""
    f = MatrixStateFeatures("float32", 64, 64, "key")
    sizes = {"batch": 1, "T": 8192, "H": 1, "Hq": 1, "nseq": 1}
    assert OP.algorithm("c", "backward", f, sizes) == "chunked"
    assert OP.algorithm("gpu", "backward", f, sizes, target="opencl") == "recurrent"
    assert OP.algorithm("gpu", "backward", f, sizes, target="cuda") == "chunked"
    assert OP.algorithm("gpu", "backward", f, {**sizes, "T": 4096}, target="cuda") == "recurrent"
    for part in ("forward", "backward"):
        assert OP.defaults("gpu", part, f, sizes, {}, {"chunk": 32}) == ({"algorithm": "chunked", "chunk": 32}, True)
        assert OP.settle("gpu", part, {"algorithm": "chunked"}) == {"algorithm": "chunked"}


def test_bad_algorithm_and_chunk_are_refused():
    with pytest.raises(ScanInputError, match="algorithm.*recurrent, chunked"):
        OP.resolve("gpu", {"algorithm": "wy"}, {}, "test")
    for bad in (0, 65):
        with pytest.raises(ScanInputError, match="chunk.*between 1 and 64"):
            OP.resolve("gpu", {"algorithm": "chunked", "chunk": bad}, {}, "test")
    big = MatrixStateFeatures("float64", 1024, 64, "key")
    call = OP.call("forward", big, OP.resolve("gpu", {"algorithm": "chunked", "time_tile": 32,
                                                      "workgroup_size": 64}, {}, "test"))
    with pytest.raises(ScanInputError, match="chunk=64, time_tile=32 .* lower chunk or time_tile"):
        kernel_for("opencl", "matrix_state").plan(call, {"batch": 1, "T": 1, "H": 1, "Hq": 1, "nseq": 1})


def nvcc(source: str) -> dict:
    """ptxas's report of ``source`` compiled for sm_90 (``nvcc -cubin -Xptxas -v``), which compiles without a
    warning."""
    proc, report = cubin_report(source, nvcc=NVCC)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr
    return report


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("K, V, decay, readout, dtype, reverse", [(128, 128, "key", "after", "float32", False),
                                                                  (256, 512, "key", "bonus", "float32", True),
                                                                  (256, 512, "scalar", "after", "float64", False),
                                                                  (64, 64, "none", "bonus", "float32", False)])
def test_cuda_chunked_kernels_compile_for_sm90_without_spills(K, V, decay, readout, dtype, reverse):
    """The defaults at a model's batch (8 sequences of 2048 steps, 16 heads) with the chunked forward: every
    kernel compiles without a warning, spills nothing, keeps no stack frame, and its shared memory is within
    :func:`local_bytes`."""
    f = MatrixStateFeatures(dtype, K, V, decay, readout, reverse, has_h0=True, has_seqlens=True)
    sizes = {"batch": 1, "T": 8 * 2048, "H": 16, "Hq": 16, "nseq": 8}
    kernel = kernel_for("cuda", "matrix_state")
    cfg = OP.resolve("gpu", {"algorithm": "chunked"}, kernel.defaults(f, sizes), "test")
    call = OP.call("forward", f, cfg)
    report = nvcc(kernel.render(TARGETS.get("cuda")(), call))
    want = ("chunk_prefix", "chunk_local", "chunk_carry", "chunk_output")[decay == "none":]
    assert set(report) == {f"sw_matrix_state_{w}" for w in want}
    assert [x.kernel for x in kernel.plan(call, sizes).launches] == [f"sw_matrix_state_{w}" for w in want]
    for name, res in report.items():
        assert res["spill_stores"] == res["spill_loads"] == res["stack"] == 0, (name, res)
        assert res["shared"] <= local_bytes("forward", f, cfg), (name, res)
