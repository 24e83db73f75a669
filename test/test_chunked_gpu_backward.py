"""The chunked backward of the matrix-state scans on the GPU backends, against a float64 loop of the adjoint.

Runs on OpenCL (PoCL here): every gradient (dq, dk, dv, dg, du, dh0, with dhlast) of decays, growth (positive
log decays), mixed signs, hard resets (-inf), tiny and huge log decays mixed (-1e-4 with -1e4), per head and
per key, both readouts; reverse; groups (H > Hq); packed sequences of 3, 0, 6 and 4 steps at chunks of 4 (shorter
than a chunk, empty, straddling one); T = 1 and lengths around the default chunk; float32 and float64; each
against the loop below and against the GPU recurrent backward on the same data; the public call's
``algorithm="chunked"`` and ``chunk_size=`` and what :data:`scanweaver.matrix.last` reports.  The CUDA text
compiles for sm_90 with nvcc and spills nothing at K = V = 128 and at K = 256, V = 512 (nothing CUDA runs here).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import scanweaver
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for
from scanweaver.targets.fused_gpu_matrix_state import local_bytes
from test_chunked_gpu import close, log_decays, nvcc

OP = FUSED.get("matrix_state")
NVCC = shutil.which("nvcc")
GRADS = ("dq", "dk", "dv", "dg", "du", "dh0")


def adjoint_loop(a, decay, readout="after", cu=None, reverse=False):
    """Every gradient of ``sum(o * do) + sum(hlast * dhlast)`` in float64, by running the recurrence
    S_t = exp(g_t) o S_{t-1} + k_t v_t^T forward (read as o_t = S_t^T q_t, or RWKV-6's o_t = S_{t-1}^T q_t +
    (q_t . (u o k_t)) v_t) and its adjoint G (dL/dS) back, step by step; head h reads q/k head h // (H // Hq)."""
    q, k, v, do = (np.asarray(a[n], np.float64) for n in ("q", "k", "v", "do"))
    g = None if a["g"] is None else np.asarray(a["g"], np.float64)
    u = None if a["u"] is None else np.asarray(a["u"], np.float64)
    B, T, H, V = v.shape
    Hq, K = q.shape[2:]
    segs = [(b, b, 0, T) for b in range(B)] if cu is None else [(i, 0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    out = {"dq": np.zeros_like(q), "dk": np.zeros_like(k), "dv": np.zeros_like(v),
           "dg": None if g is None else np.zeros_like(g), "du": None if u is None else np.zeros_like(u),
           "dh0": np.zeros((len(segs), H, K, V))}
    with np.errstate(over="ignore", invalid="ignore"):
        for row, b, s, e in segs:
            steps = list(range(e - 1, s - 1, -1) if reverse else range(s, e))
            for h in range(H):
                hq = h // (H // Hq)
                S = np.zeros((K, V)) if a["h0"] is None else np.array(a["h0"][row, h], np.float64)
                states, decays = [S], []
                for t in steps:
                    d = np.ones((K, 1)) if g is None else np.exp(g[b, t, h])[:, None] if decay == "key" \
                        else np.full((K, 1), np.exp(g[b, t, h]))
                    S = d * S + np.outer(k[b, t, hq], v[b, t, h])
                    states.append(S)
                    decays.append(d)
                G = np.zeros((K, V)) if a["dhlast"] is None else np.array(a["dhlast"][row, h], np.float64)
                for n in range(len(steps) - 1, -1, -1):
                    t, prev, d = steps[n], states[n], decays[n]
                    qt, kt, vt, dt = q[b, t, hq], k[b, t, hq], v[b, t, h], do[b, t, h]
                    if readout == "after":
                        G = G + np.outer(qt, dt)
                        out["dq"][b, t, hq] += states[n + 1] @ dt
                    else:
                        w = vt @ dt
                        out["dq"][b, t, hq] += prev @ dt + u[h] * kt * w
                        out["dk"][b, t, hq] += u[h] * qt * w
                        out["du"][h] += qt * kt * w
                        out["dv"][b, t, h] += (qt @ (u[h] * kt)) * dt
                    out["dk"][b, t, hq] += G @ vt
                    out["dv"][b, t, h] += G.T @ kt
                    if g is not None:
                        dgk = (G * d * prev).sum(axis=1)
                        if decay == "key":
                            out["dg"][b, t, h] += dgk
                        else:
                            out["dg"][b, t, h] += dgk.sum()
                    G = d * G + (np.outer(qt, dt) if readout == "bonus" else 0.0)
                out["dh0"][row, h] = G
    return out


def problem(rng, decay, readout, dtype, *, T=13, H=2, Hq=1, K=5, V=7, kind="decay", reverse=False, cu=None):
    """Features, sizes and operands (in ``dtype``) of one problem with h0, do and dhlast; batch 2, or 1 packed."""
    batch = 1 if cu is not None else 2
    nseq = len(cu) - 1 if cu is not None else batch
    q, k = (rng.normal(size=(batch, T, Hq, K)).astype(dtype) for _ in range(2))
    v, do = (rng.normal(size=(batch, T, H, V)).astype(dtype) for _ in range(2))
    shape = (batch, T, H, K) if decay == "key" else (batch, T, H)
    a = {"q": q, "k": k / np.sqrt(K).astype(dtype), "v": v, "do": do, "cu_seqlens": cu,
         "g": log_decays(rng, kind, shape).astype(dtype) if decay != "none" else None,
         "u": rng.normal(size=(H, K)).astype(dtype) if readout == "bonus" else None,
         "h0": rng.normal(size=(nseq, H, K, V)).astype(dtype),
         "dhlast": rng.normal(size=(nseq, H, K, V)).astype(dtype)}
    f = MatrixStateFeatures(dtype, K, V, decay, readout, reverse, True, cu is not None, True)
    return f, {"batch": batch, "T": T, "H": H, "Hq": Hq, "nseq": nseq}, a


def run_backward(be, f, sizes, a, **tunables):
    """The fused backward on ``be`` with ``tunables`` over the backend's defaults (outputs start at zero, as the
    kernels need)."""
    cfg = OP.resolve("gpu", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    shapes = OP.shapes("backward", f, sizes)
    grads = {n: np.zeros(shapes[n], f.dtype) for n in GRADS if OP.enabled(n, f)}
    be.run_fused(OP.call("backward", f, cfg), {**a, **grads}, sizes)
    return grads


def check(be, f, sizes, a, tol, recurrent, **tunables):
    """The chunked backward against the loop (and, if ``recurrent``, against the GPU recurrent backward)."""
    want = adjoint_loop(a, f.decay, f.readout, a["cu_seqlens"], f.reverse)
    got = run_backward(be, f, sizes, a, algorithm="chunked", **tunables)
    rec = run_backward(be, f, sizes, a, algorithm="recurrent", **{n: x for n, x in tunables.items() if n != "chunk"}) \
        if recurrent else {}
    assert set(got) == {n for n in GRADS if want[n] is not None}
    for n, x in got.items():
        assert np.isfinite(x).all(), f"{n} is not finite"
        close(x, want[n], tol, n)
        if recurrent:
            close(x, rec[n].astype(np.float64), tol, f"{n}: chunked vs recurrent")
    return got


#: (decay, readout, kind, dtype, reverse, packed, Hq, against the recurrent backward too): every kind, per key and
#: per head for resets and tiny/huge log decays, both readouts, both dtypes (kept to few builds: PoCL's take seconds).
CASES = [
    ("key", "after", "decay", "float64", False, False, 1, False),
    ("key", "bonus", "growth", "float64", True, True, 2, False),
    ("key", "bonus", "reset", "float32", False, True, 1, True),
    ("key", "after", "tiny_huge", "float64", False, True, 1, False),
    ("scalar", "after", "mixed", "float32", True, False, 2, False),
    ("scalar", "bonus", "reset", "float64", True, True, 2, True),
    ("scalar", "after", "tiny_huge", "float32", False, True, 1, False),
    ("none", "bonus", "decay", "float32", True, True, 2, False),
]


@pytest.mark.parametrize("decay, readout, kind, dtype, reverse, packed, Hq, recurrent", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_chunked_backward_matches_the_adjoint_loop(gpu, decay, readout, kind, dtype, reverse, packed, Hq,
                                                   recurrent):
    """Chunks of 4 over 13 steps (and over packed sequences of 3, 0, 6 and 4 steps), several value and key tiles,
    odd K and V."""
    rng = np.random.default_rng(100 + CASES.index((decay, readout, kind, dtype, reverse, packed, Hq, recurrent)))
    cu = np.array([0, 3, 3, 9, 13], np.int64) if packed else None
    f, sizes, a = problem(rng, decay, readout, dtype, kind=kind, reverse=reverse, cu=cu, Hq=Hq)
    check(gpu, f, sizes, a, {"float32": 3e-5, "float64": 1e-12}[dtype], recurrent, chunk=4, workgroup_size=8,
          time_tile=3, state_per_item=4)


@pytest.mark.parametrize("T", [1, 65, 130])
def test_lengths_around_the_default_chunk(gpu, T):
    """The default chunk (64) and workgroups: T = 1, one step past one chunk, two chunks and a bit (float32)."""
    rng = np.random.default_rng(T)
    f, sizes, a = problem(rng, "key", "bonus", "float32", T=T, K=16, V=24, H=4, Hq=2, kind="mixed")
    check(gpu, f, sizes, a, 3e-5, T == 130)


def test_public_calls_run_the_chunked_backward_and_report_it(gpu):
    """``algorithm="chunked"`` and ``chunk_size=`` select the chunked backward on gpu, and
    :data:`scanweaver.matrix.last` says so; the default stays the recurrence (asked of an empty sequence, which
    resolves the configuration and runs no kernel)."""
    from scanweaver import matrix

    rng = np.random.default_rng(7)
    f, sizes, a = problem(rng, "scalar", "after", "float32", T=37, H=2, Hq=2, K=8, V=8, kind="reset")
    a["h0"] = a["dhlast"] = None
    want = adjoint_loop(a, "scalar")
    ops = matrix.operands("test", a["q"], a["k"], a["v"], a["g"], decay="scalar")
    for kwargs, source, chunk in (({"algorithm": "chunked", "chunk": 16}, "explicit", 16),
                                  ({"chunk_size": 16}, "hint", 16)):
        got = matrix.backward(ops, a["do"], backend=gpu.name, **kwargs)
        info = scanweaver.matrix.last
        assert (info.backend, info.part, info.algorithm, info.config["chunk"], info.source) == \
            (gpu.name, "backward", "chunked", chunk, source)
        for n in ("dq", "dk", "dv", "dg"):
            close(got[n], want[n], 3e-5, f"{n} ({source})")
    empty = matrix.operands("test", a["q"][:, :0], a["k"][:, :0], a["v"][:, :0], a["g"][:, :0], decay="scalar")
    matrix.backward(empty, a["do"][:, :0], backend=gpu.name)
    info = scanweaver.matrix.last
    assert (info.backend, info.part, info.algorithm) == (gpu.name, "backward", "recurrent"), info


#: (decay, readout): RWKV-6, its per-head form, and both decays read after.
NON_FINITE = {"rwkv6": ("key", "bonus"), "head-bonus": ("scalar", "bonus"), "key-after": ("key", "after"),
              "head-after": ("scalar", "after")}


@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_a_non_finite_input_leaves_every_gradient_no_wider_than_the_recurrence(gpu, cpu, case):
    """A NaN or inf in one element of h0, u, dhlast, or of one step's q, k, v, g or do (in the first, a middle and
    the last of five chunks of 16): the GPU backward, recurrent and chunked, is non-finite only where the C
    recurrent backward is, and equal to it elsewhere."""
    from conftest import no_wider
    from test_chunked import fused, operands

    decay, readout = NON_FINITE[case]
    f = MatrixStateFeatures("float64", 5, 4, decay, readout, has_h0=True, has_dhlast=True)
    rng = np.random.default_rng(77)
    a, sizes = operands(rng, f, 1, 70, 2, 1, kinds=("decay",))
    args = {**a, "do": rng.normal(size=a["v"].shape), "dhlast": rng.normal(size=a["h0"].shape)}
    for name in ("q", "k", "v", "g", "do", "h0", "u", "dhlast"):
        if args.get(name) is None:
            continue
        for value in (np.nan, np.inf):
            for t in ((0,) if name in ("h0", "u", "dhlast") else (3, 37, 66)):
                b = {n: x.copy() for n, x in args.items()}
                at = {"h0": (0, 1, 2, 3), "dhlast": (0, 1, 2, 3), "u": (1, 2)}.get(name, (0, t, 0, 1))
                b[name][at[:b[name].ndim]] = value
                with np.errstate(all="ignore"):
                    rec = fused(cpu, f, b, sizes, "backward", algorithm="recurrent")
                    for algorithm in ("recurrent", "chunked"):
                        got = run_backward(gpu, f, sizes, b, algorithm=algorithm, chunk=16)
                        no_wider(got, rec, f"{algorithm}: {name}[{t}] = {value}")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("K, V, decay, readout, dtype, reverse", [(128, 128, "key", "after", "float32", False),
                                                                  (256, 512, "key", "bonus", "float32", True),
                                                                  (256, 512, "scalar", "after", "float64", False),
                                                                  (64, 64, "none", "bonus", "float32", False)])
def test_cuda_chunked_backward_compiles_for_sm90_without_spills(K, V, decay, readout, dtype, reverse):
    """The defaults at a model's batch (8 packed sequences of 2048 steps, 16 heads) with the chunked backward:
    every kernel compiles without a warning, spills nothing, keeps no stack frame, and its shared memory is within
    :func:`local_bytes`; the plan launches exactly the compiled kernels."""
    f = MatrixStateFeatures(dtype, K, V, decay, readout, reverse, has_h0=True, has_seqlens=True, has_dhlast=True)
    sizes = {"batch": 1, "T": 8 * 2048, "H": 16, "Hq": 16, "nseq": 8}
    kernel = kernel_for("cuda", "matrix_state")
    cfg = OP.resolve("gpu", {"algorithm": "chunked"}, kernel.defaults(f, sizes), "test")
    call = OP.call("backward", f, cfg)
    report = nvcc(kernel.render(TARGETS.get("cuda")(), call))
    launched = [x.kernel for x in kernel.plan(call, sizes).launches]
    assert len(launched) == len(set(launched)) == (8 if decay != "none" else 6)
    assert set(report) - set(launched) == ({"sw_matrix_state_chunk_bwd_decay"} if decay == "none" else set())
    for name, res in report.items():
        assert res["spill_stores"] == res["spill_loads"] == res["stack"] == 0, (name, res)
        assert res["shared"] <= local_bytes("backward", f, cfg), (name, res)
