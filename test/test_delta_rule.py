"""``scanweaver.delta_rule`` (DeltaNet) against a float64 loop of its defining recurrence, the fused
operation's NumPy backward against finite differences, and its GPU rendering: run on OpenCL (PoCL here)
against the NumPy definition, its CUDA text compiled for sm_90 with nvcc."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

import scanweaver
from scanweaver import BackendUnavailable, ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures, backward_reference, forward_reference
from scanweaver.runtime import REGISTRY, get_backend
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for


def loop(q, k, v, beta, scale, h0=None, cu=None):
    """The recurrence as written in the DeltaNet paper, one (sequence, head) at a time, in float64 matrices."""
    batch, T, H, K = q.shape
    V = v.shape[-1]
    segs = [(b, b, 0, T) for b in range(batch)] if cu is None else \
        [(i, 0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = np.zeros((batch, T, H, V))
    hs = np.zeros((len(segs), H, K, V))
    for row, b, start, stop in segs:
        for h in range(H):
            S = np.zeros((K, V)) if h0 is None else h0[row, h].astype(np.float64)
            for t in range(start, stop):
                kt, bt = k[b, t, h].astype(np.float64), float(beta[b, t, h])
                S = (np.eye(K) - bt * np.outer(kt, kt)) @ S + bt * np.outer(kt, v[b, t, h])
                o[b, t, h] = scale * S.T @ q[b, t, h]
            hs[row, h] = S
    return o, hs


def operands(rng, batch=2, T=9, H=3, K=4, V=5, dtype=np.float64):
    q, k = rng.normal(size=(2, batch, T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.normal(size=(batch, T, H, V))
    beta = rng.uniform(0.05, 0.95, (batch, T, H))
    return tuple(a.astype(dtype) for a in (q, k, v, beta))


def backend_or_skip(name: str) -> str:
    """``name`` when that backend can run here, else a skip saying why."""
    cls = REGISTRY.get(name)
    if not cls.availability().ok:
        pytest.skip(f"backend {name!r} unavailable: {cls.availability().reason}")
    return name


@pytest.mark.parametrize("backend, packed", [("numpy", False), ("numpy", True), ("cpu", False), ("cpu", True),
                                             ("opencl", True)])
def test_delta_rule_matches_the_float64_loop(rng, backend, packed):
    q, k, v, beta = operands(rng, batch=1 if packed else 2, T=11)
    cu = np.array([0, 4, 4, 11]) if packed else None
    h0 = rng.normal(size=(3 if packed else 2, 3, 4, 5))
    o, h = scanweaver.delta_rule(q, k, v, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                 backend=backend_or_skip(backend))
    want, want_h = loop(q, k, v, beta, 4 ** -0.5, h0, cu)
    np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, want_h, rtol=1e-12, atol=1e-12)
    o2, none = scanweaver.delta_rule(q, k, v, beta, scale=0.3, cu_seqlens=cu, backend=backend)
    assert none is None
    np.testing.assert_allclose(o2, loop(q, k, v, beta, 0.3, None, cu)[0], rtol=1e-12, atol=1e-12)


def test_float32_inputs_compute_in_float32(rng):
    q, k, v, beta = operands(rng, dtype=np.float32)
    o, h = scanweaver.delta_rule(q, k, v, beta, output_final_state=True, backend="numpy")
    assert o.dtype == np.float32 and h.dtype == np.float32
    np.testing.assert_allclose(o, loop(q, k, v, beta, 0.5)[0], rtol=1e-4, atol=1e-5)


def test_backward_definition_matches_finite_differences(rng):
    q, k, v, beta = operands(rng, batch=1, T=7, H=2, K=3, V=4)
    cu = np.array([0, 3, 7])
    arrays = {"q": q, "k": k, "v": v, "beta": beta, "h0": rng.normal(size=(2, 2, 3, 4))}
    do, dhlast = rng.normal(size=v.shape), rng.normal(size=(2, 2, 3, 4))

    def loss():
        o, h = forward_reference(*(arrays[n] for n in ("q", "k", "v", "beta")), h0=arrays["h0"], cu_seqlens=cu)
        return float((o * do).sum() + (h * dhlast).sum())

    grads = backward_reference(q, k, v, beta, h0=arrays["h0"], cu_seqlens=cu, do=do, dhlast=dhlast)
    eps = 1e-6
    for name, x in arrays.items():
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            keep = x[i]
            x[i] = keep + eps
            hi = loss()
            x[i] = keep - eps
            lo = loss()
            x[i] = keep
            fd[i] = (hi - lo) / (2 * eps)
        np.testing.assert_allclose(grads["d" + name], fd, rtol=1e-6, atol=1e-7, err_msg=name)


def test_numpy_backend_runs_the_fused_backward(rng):
    q, k, v, beta = operands(rng)
    do = rng.normal(size=v.shape)
    op = FUSED.get("delta_rule")
    features = DeltaRuleFeatures("float64", 4, 5)
    sizes = {"batch": 2, "T": 9, "H": 3, "Hq": 3, "nseq": 2}
    out = {n: np.full(s, np.nan) for n, s in op.shapes("backward", features, sizes).items()
           if n in ("dq", "dk", "dv", "dbeta")}
    get_backend("numpy").run_fused(op.call("backward", features, {}), {"q": q, "k": k, "v": v, "beta": beta,
                                                                       "do": do, **out}, sizes)
    want = backward_reference(q, k, v, beta, do=do)
    for name, got in out.items():
        np.testing.assert_allclose(got, want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_bad_input_names_the_argument(rng):
    q, k, v, beta = operands(rng)
    with pytest.raises(ScanInputError, match=r"beta has shape \(2, 9\)"):
        scanweaver.delta_rule(q, k, v, beta[..., 0])
    with pytest.raises(ScanInputError, match="k has shape"):
        scanweaver.delta_rule(q, k[..., :3], v, beta)
    with pytest.raises(ScanInputError, match="cu_seqlens"):
        scanweaver.delta_rule(q, k, v, beta, cu_seqlens=[0, 9])
    with pytest.raises(ScanInputError, match="initial_state has shape"):
        scanweaver.delta_rule(q, k, v, beta, initial_state=np.zeros((2, 3, 5, 4)))
    with pytest.raises(ScanInputError, match="dtype complex"):
        scanweaver.delta_rule(q.astype(complex), k, v, beta)
    with pytest.raises(BackendUnavailable, match="no fused delta_rule forward kernel"):
        scanweaver.delta_rule(q, k, v, beta, backend="iree")


#: (dtype, packed, has_h0, has_dhlast, K, V, config): V split over workgroups, tiles that do not divide T.
GPU_CASES = [("float64", False, True, True, 4, 6, {"workgroup_size": 8, "time_tile": 4, "key_split": 2}),
             ("float32", True, False, False, 5, 19, {"workgroup_size": 8, "time_tile": 3, "key_split": 4})]


def gpu_problem(rng, dtype, packed, has_h0, has_dhlast, K, V):
    batch, T, H = (1 if packed else 2), 13, 3
    cu = np.array([0, 4, 4, 9, T], np.int64) if packed else None
    nseq = 4 if packed else batch
    q, k, v, beta = operands(rng, batch=batch, T=T, H=H, K=K, V=V, dtype=dtype)
    state = (nseq, H, K, V)
    arrays = {"q": q, "k": k, "v": v, "beta": beta, "cu_seqlens": cu, "do": rng.normal(size=v.shape).astype(dtype),
              "h0": rng.normal(size=state).astype(dtype) if has_h0 else None,
              "dhlast": rng.normal(size=state).astype(dtype) if has_dhlast else None}
    return DeltaRuleFeatures(dtype, K, V, has_h0, packed, has_dhlast), {"batch": batch, "T": T, "H": H,
                                                                          "Hq": H, "nseq": nseq}, arrays


@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_opencl_forward_and_backward_match_the_definition(rng, case):
    be = get_backend(backend_or_skip("opencl"))
    *spec, config = case
    features, sizes, a = gpu_problem(rng, *spec)
    op = FUSED.get("delta_rule")
    ins = [a[n] for n in ("q", "k", "v", "beta")]
    o, hlast = forward_reference(*ins, h0=a["h0"], cu_seqlens=a["cu_seqlens"])
    out = {"o": np.full_like(o, np.nan), "hlast": np.full_like(hlast, np.nan)}
    be.run_fused(op.call("forward", features, config), {**a, **out}, sizes)
    tol = {"float32": 2e-5, "float64": 1e-12}[features.dtype]
    np.testing.assert_allclose(out["o"], o, rtol=tol, atol=tol)
    np.testing.assert_allclose(out["hlast"], hlast, rtol=tol, atol=tol)
    want = backward_reference(*ins, h0=a["h0"], cu_seqlens=a["cu_seqlens"], do=a["do"], dhlast=a["dhlast"])
    grads = {n: np.full_like(w, np.nan) for n, w in want.items() if op.enabled(n, features)}
    be.run_fused(op.call("backward", features, config), {**a, **grads}, sizes)
    assert set(grads) >= {"dq", "dk", "dv", "dbeta"}
    for name, got in grads.items():
        np.testing.assert_allclose(got, want[name], rtol=tol, atol=tol * max(1.0, float(np.abs(want[name]).max())),
                                   err_msg=name)


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_cuda_kernels_compile_to_ptx_and_sm90(tmp_path, rng, case):
    """Nothing CUDA runs here: the kernels that ran on OpenCL compile for sm_90."""
    *spec, config = case
    features, _, _ = gpu_problem(rng, *spec)
    for part, entries in (("forward", ["forward"]), ("backward", ["bwd_deltas", "bwd_values", "bwd_keys"])):
        source = kernel_for("cuda", "delta_rule").render(TARGETS.get("cuda")(), FUSED.get("delta_rule").call(
            part, features, config))
        cu, ptx = tmp_path / f"{part}.cu", tmp_path / f"{part}.ptx"
        cu.write_text(source)
        for args in (["-ptx", "-o", str(ptx), str(cu)], ["-cubin", "-arch=sm_90", "-o", str(tmp_path / "k.cubin"),
                                                          str(ptx)]):
            proc = subprocess.run([NVCC, *args], capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
        text = ptx.read_text()
        assert all(f".entry sw_delta_rule_{e}(" in text for e in entries)
