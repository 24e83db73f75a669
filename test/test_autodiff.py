"""Gradients on arrays (``scanweaver.vjp`` and the backward of every backend) against finite differences.

The loss is a random linear functional of y (and of the final state): its
directional derivative along a random direction of every operand, by central
differences of the float64 forward, must equal the inner product of that
direction with our gradients.  Non-uniform data, odd lengths, every feature.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.api import SELECTIVE
from scanweaver.core.autodiff import backward, forward, prepare_call
from scanweaver.ir.derivative import diff
from scanweaver.ir import expr as E
from scanweaver.ir.functions import FUNCTIONS, NUMPY
from scanweaver.runtime import REGISTRY
from scanweaver.runtime.cpu_adjoint import fused_backward
from scanweaver.passes.adjoint import adjoint
from scanweaver.runtime.base import Cotangents

def _available(name):
    avail = REGISTRY[name].availability()
    if not avail.ok:
        pytest.skip(f"backend {name!r} unavailable: {avail.reason}")


@scanweaver.recurrence
def gated(h, delta, A, x, z):
    """Mamba-like gate and an output that reads the old state through a sigmoid."""
    g = np.exp(delta * A)
    return g * h + (1 - g) * x, scanweaver.sigmoid(z) * h + np.tanh(z) * h * 0.5


@scanweaver.recurrence(state_size=2)
def biquad(h, a1, a2, b0, x):
    return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])


@scanweaver.recurrence(state_size=3)
def mixed(h, c, s, x, w):
    M = np.array([[c, -s, 0.0], [s, c, 0.0], [1.0, 0.0, 0.9]], dtype=object)
    hn = M @ h + np.array([x, 0.0, 0.0], dtype=object)
    return hn, w * hn[0] + hn[2] - 0.5 * h[1]


def _operands(rng, rec, shape):
    if rec is gated:
        return [rng.uniform(0.05, 0.5, shape), -rng.uniform(0.5, 2.0, shape), rng.standard_normal(shape),
                rng.standard_normal(shape)]
    if rec is biquad:
        return [rng.uniform(0.3, 0.6, shape), rng.uniform(-0.3, 0.3, shape), rng.standard_normal(shape),
                rng.standard_normal(shape)]
    if rec is mixed:
        th = rng.uniform(0.1, 1.0, shape)
        return [0.8 * np.cos(th), 0.8 * np.sin(th), rng.standard_normal(shape), rng.standard_normal(shape)]
    return [rng.uniform(0.5, 1.0, shape), *(rng.standard_normal(shape) for _ in range(3))]


def check_gradients(rec, ops, *, backend, h0=None, reset=None, reverse=False, cu_seqlens=None, states="recompute",
                    rtol=1e-6, rng=None):
    """Central differences of the float64 numpy forward vs. our backward on ``backend``."""
    rng = rng or np.random.default_rng(7)
    kw = dict(h0=h0, reset=reset, reverse=reverse, cu_seqlens=cu_seqlens)
    res = prepare_call(rec, dict(zip(rec.inputs, ops, strict=True)), backend=backend, **kw)
    y, h_last = forward(res, states=states)
    wy, wh = rng.standard_normal(y.shape), rng.standard_normal(h_last.shape)
    grads, dh0 = backward(res, wy, wh)
    dirs = [rng.standard_normal(np.shape(v)) for v in ops]
    dh = None if h0 is None else rng.standard_normal(np.shape(h0))

    def loss(t):
        o = [v + t * d for v, d in zip(ops, dirs, strict=True)]
        y, hl = rec(*o, h0=None if h0 is None else h0 + t * dh, reset=reset, reverse=reverse,
                    cu_seqlens=cu_seqlens, return_state=True, backend="numpy")
        return float(np.sum(wy * y) + np.sum(wh * hl))

    eps = 1e-6
    numeric = (loss(eps) - loss(-eps)) / (2 * eps)
    ours = sum(float(np.sum(grads[n] * d)) for n, d in zip(rec.inputs, dirs, strict=True))
    if h0 is not None:
        ours += float(np.sum(dh0 * dh))
    assert ours == pytest.approx(numeric, rel=rtol, abs=rtol), (ours, numeric)
    for n, v in zip(rec.inputs, ops, strict=True):
        assert grads[n].shape == np.shape(v)
    return grads, dh0


BACKENDS = ["numpy", "cpu"]


FEATURES = ["plain", "h0", "reverse", "reset", "cu_seqlens", "h0+reset+reverse"]
# Every feature on every backend, except that dense states on cpu (2k compiled scans per feature
# combination) take the plainest and the fullest combination: the scans are the cpu kernels that
# the forward tests cover, and the numpy backend runs the same generic backward for every feature.
CASES = [(backend, rec, feature) for backend in BACKENDS for rec in (SELECTIVE, gated, biquad, mixed)
         for feature in FEATURES
         if not (backend == "cpu" and rec.state_size > 1 and feature not in ("plain", "h0+reset+reverse"))]


@pytest.mark.parametrize("backend, rec, feature", CASES, ids=lambda v: getattr(v, "name", v))
def test_gradients_match_finite_differences(backend, rec, feature, rng):
    _available(backend)
    shape = (2, 3, 37)
    ops = _operands(rng, rec, shape)
    k = rec.state_size
    kw = {}
    if "h0" in feature:
        kw["h0"] = rng.standard_normal(shape[:-1] if k == 1 else (*shape[:-1], k))
    if "reset" in feature:
        kw["reset"] = rng.random(shape) < 0.1
    if "reverse" in feature:
        kw["reverse"] = True
    if feature == "cu_seqlens":
        kw["cu_seqlens"] = [0, 5, 20, 37]
    check_gradients(rec, ops, backend=backend, rng=rng, **kw)


@pytest.mark.parametrize("rec", [SELECTIVE, biquad], ids=lambda r: r.name)
def test_saved_states_equal_recomputed(rec, rng):
    _available("cpu")
    ops = _operands(rng, rec, (3, 41))
    h0 = rng.standard_normal((3,) if rec.state_size == 1 else (3, rec.state_size))
    g1, d1 = check_gradients(rec, ops, backend="cpu", h0=h0, states="save", rng=np.random.default_rng(1))
    g2, d2 = check_gradients(rec, ops, backend="cpu", h0=h0, states="recompute", rng=np.random.default_rng(1))
    for n in g1:
        np.testing.assert_allclose(g1[n], g2[n], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(d1, d2, rtol=1e-12)


def test_broadcast_operands_get_summed_gradients(rng):
    A = -rng.uniform(0.5, 2.0, (3, 1))
    ops = [rng.uniform(0.05, 0.5, (2, 3, 29)), A, rng.standard_normal((2, 3, 29)), rng.standard_normal(29)]
    grads, _ = check_gradients(gated, ops, backend="cpu", rng=rng)
    assert grads["A"].shape == (3, 1) and grads["z"].shape == (29,)


@pytest.mark.parametrize("lanes, L, threads, reverse", [(1, 3001, 2, True), (2, 9000, 2, False), (3, 2500, 1, False)])
@pytest.mark.parametrize("saved", [False, True])
def test_fused_kernel_tiles_agree_with_generic(lanes, L, threads, reverse, saved, rng):
    """Several tiles per lane (phase of aggregates and carries) against the NumPy backward."""
    _available("cpu")
    ops = _operands(rng, SELECTIVE, (lanes, L))
    res = prepare_call(SELECTIVE, dict(zip(SELECTIVE.inputs, ops, strict=True)), h0=rng.standard_normal(lanes),
                       reset=rng.random((lanes, L)) < 0.01, reverse=reverse, backend="numpy")
    forward(res, states="save" if saved else "recompute")
    adj = adjoint(res.affine, dh0=True, dh_last=True, saved_states=saved)
    dy, dhl = rng.standard_normal((lanes, L)), rng.standard_normal(lanes)

    def run(fused):
        cot = Cotangents(dy=dy, grads={n: np.empty((lanes, L)) for n in adj.wrt}, dh_last=dhl,
                         states=res.states, dh0=np.empty(lanes))
        if fused:
            assert fused_backward(adj, res.arrays, cot, threads=threads)
        else:
            res.backend.backward(adj, res.arrays, cot)
        return cot

    want, got = run(False), run(True)
    for n in adj.wrt:
        np.testing.assert_allclose(got.grads[n], want.grads[n], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got.dh0, want.dh0, rtol=1e-9, atol=1e-9)


def test_opencl_backward_runs_its_own_scans(rng):
    _available("opencl")
    check_gradients(SELECTIVE, _operands(rng, SELECTIVE, (2, 19)), backend="opencl", h0=rng.standard_normal(2),
                    reset=rng.random((2, 19)) < 0.2, reverse=True, rng=rng, rtol=1e-5)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_function_has_a_correct_derivative(name):
    """Each rule of the function table against central differences, away from kinks."""
    f = FUNCTIONS[name]
    rng = np.random.default_rng(3)
    args = [rng.uniform(0.3, 1.7, 64) for _ in range(f.arity)]
    if name in ("max", "min"):
        args[1] = args[0] + rng.choice([-0.5, 0.5], 64)
    e = E.call(name, *(E.inp(f"v{i}") for i in range(f.arity)))
    env = {f"v{i}": a for i, a in enumerate(args)}
    for i in range(f.arity):
        d = E.evaluate(diff(e, f"v{i}"), env.__getitem__, NUMPY)
        h = 1e-6
        up = [a + h if j == i else a for j, a in enumerate(args)]
        dn = [a - h if j == i else a for j, a in enumerate(args)]
        numeric = (f.numpy(*up) - f.numpy(*dn)) / (2 * h)
        np.testing.assert_allclose(np.broadcast_to(d, numeric.shape), numeric, rtol=1e-6, atol=1e-8)


def test_bad_cotangent_and_complex_are_clear_errors(rng):
    ops = _operands(rng, SELECTIVE, (2, 5))
    y, pullback = scanweaver.vjp(scanweaver.selective_scan, *ops, backend="numpy")
    with pytest.raises(scanweaver.ScanInputError, match=r"selective_scan: dy has shape \(2, 4\); it needs \(2, 5\)"):
        pullback(np.ones((2, 4)))
    with pytest.raises(scanweaver.ScanInputError, match="complex"):
        scanweaver.vjp(scanweaver.selective_scan, *(o.astype(np.complex128) for o in ops), backend="numpy")
    with pytest.raises(scanweaver.ScanInputError, match="states must be one of recompute, save"):
        scanweaver.vjp(scanweaver.selective_scan, *ops, states="keep")


@pytest.mark.parametrize("rec", [SELECTIVE, gated, mixed], ids=lambda r: r.name)
def test_backward_scans_compile_for_cuda(tmp_path, rec):
    """The scans the ``cuda`` backend runs for a backward (states and adjoint, with the keep operand and
    dL/dh_L) compile with nvcc; nothing CUDA runs here (no GPU)."""
    import shutil
    import subprocess

    from scanweaver.ir.stages import Features
    from scanweaver.passes import lower
    from scanweaver.passes.adjoint import adjoint_scan, state_scan
    from scanweaver.runtime import get_backend

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (CUDA toolkit not installed)")
    cuda = get_backend("cuda", require_available=False)
    feats = Features(reverse=True, has_h0=True, has_reset=True)
    fwd = lower(rec.scan_ir("float32", feats)).affine
    adj = adjoint(fwd, dh0=True, dh_last=True)
    lanes, L = 512, 4096
    for scan in (state_scan(fwd, rec.state_size - 1), adjoint_scan(adj, 0)):
        kind = "dense" if rec.state_size > 1 else "diagonal"
        schedule = cuda.default_schedule_for(kind, lanes, L)
        stages = cuda.emit(lower(scan, schedule, cuda.default_config(schedule, lanes, L, "float32"),
                                 cuda.extra_tunables))
        src = tmp_path / f"{scan.name}.cu"
        src.write_text(stages.kernel)
        proc = subprocess.run([nvcc, "-ptx", "-o", str(tmp_path / "k.ptx"), str(src)], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr


COMPILERS = {"aarch64-gcc": ["aarch64-linux-gnu-gcc", "-O3", "-fopenmp"],
             "aarch64-clang": ["clang", "-O3", "--target=aarch64-linux-gnu"],
             "x86-clang": ["clang", "-O3", "-march=native"], "x86-g++": ["g++", "-x", "c++", "-O3", "-march=native"]}


@pytest.mark.parametrize("cc", list(COMPILERS.values()), ids=list(COMPILERS))
def test_backward_kernels_build_with_other_compilers(tmp_path, cc):
    """The fused backward's C (vector and element-wise scans, both dtypes, saved and recomputed states)
    compiles for ARM64 and with Clang and as C++, warnings as errors except the unused helpers."""
    import shutil
    import subprocess

    from scanweaver.ir.stages import Features
    from scanweaver.passes import lower
    from scanweaver.targets.c_backward import render_backward

    if shutil.which(cc[0]) is None:
        pytest.skip(f"{cc[0]} is not installed")
    feats = Features(reverse=True, has_h0=True, has_reset=True)
    for rec, dtype, saved in ((SELECTIVE, "float32", False), (gated, "float64", True)):
        adj = adjoint(lower(rec.scan_ir(dtype, feats)).affine, dh0=True, dh_last=True, saved_states=saved)
        src = tmp_path / "bw.c"
        src.write_text(render_backward(adj))
        flags = ["-c", "-fPIC", "-fno-math-errno", "-Wall", "-Werror", "-Wno-unused-function", "-Wno-unknown-pragmas"]
        proc = subprocess.run([*cc, *flags, str(src), "-o", str(tmp_path / "bw.o")], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
