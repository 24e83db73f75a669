"""mamba_selective_scan against a plain NumPy transcription of the Mamba-1 equations, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.runtime import REGISTRY

from mamba_oracle import extras, operands, s6_reference

BACKENDS = ("numpy", "cpu", "opencl", "cuda", "julia")


def need(name: str) -> None:
    """Skips with the reason when backend ``name`` cannot run here."""
    if name not in REGISTRY:
        pytest.skip(f"backend {name!r} is not part of this build (no module registers it)")
    avail = REGISTRY[name].availability()
    if not avail.ok:
        pytest.skip(f"backend {name!r} unavailable: {avail.reason}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bshape, cshape", [("step", "step"), ("group", "group"), ("fixed", "fixed"),
                                            ("group", "step"), ("step", "fixed")])
def test_full_semantics_match_transcription(rng, backend, bshape, cshape):
    need(backend)
    batch, Dm, N, L = 2, 6, 3, 13
    ops = operands(rng, batch, Dm, N, L, bshape, cshape, groups=3)
    ext = extras(rng, batch, Dm, N, L)
    ey, eh = s6_reference(**ops, **ext)
    for sched in REGISTRY[backend].schedules:
        y, h = scanweaver.mamba_selective_scan(**ops, **ext, return_state=True, backend=backend, schedule=sched)
        assert y.shape == (batch, Dm, L) and h.shape == (batch, Dm, N)
        np.testing.assert_allclose(y, ey, rtol=1e-10, atol=1e-10, err_msg=f"{backend}/{sched}")
        np.testing.assert_allclose(h, eh, rtol=1e-10, atol=1e-10, err_msg=f"{backend}/{sched}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L", [1, 2, 65, 513])
def test_float32_minimal_arguments(rng, backend, L):
    need(backend)
    ops = operands(rng, 1, 5, 4, L, dtype=np.float32)
    ey, _ = s6_reference(**ops)
    y = scanweaver.mamba_selective_scan(**ops, backend=backend)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, ey, rtol=2e-5, atol=2e-5 * np.abs(ey).max())


def test_one_lane_and_many_lanes(rng):
    for batch, Dm, N in ((1, 1, 1), (3, 16, 8)):
        ops = operands(rng, batch, Dm, N, 37, groups=4 if Dm % 4 == 0 else 1)
        np.testing.assert_allclose(scanweaver.mamba_selective_scan(**ops, backend="numpy"),
                                   s6_reference(**ops)[0], rtol=1e-10, atol=1e-10)


def test_the_gate_is_computed_inside_the_kernel(rng):
    scanweaver.mamba_selective_scan(**operands(rng), backend="numpy", fused=False)
    stages = scanweaver.ops.mamba1.scan_path._s6_step.last.stages
    assert "exp(delta * A)" in stages.text()["affine_scan"]


def test_state_carries_across_a_split(rng):
    ops = operands(rng, 2, 4, 3, 20)
    full, h_full = scanweaver.mamba_selective_scan(**ops, return_state=True, backend="numpy")
    cut = 7
    first = {k: (v[..., :cut] if v.ndim >= 3 else v) for k, v in ops.items()}
    second = {k: (v[..., cut:] if v.ndim >= 3 else v) for k, v in ops.items()}
    y1, h1 = scanweaver.mamba_selective_scan(**first, return_state=True, backend="numpy")
    y2, h2 = scanweaver.mamba_selective_scan(**second, h0=h1, return_state=True, backend="numpy")
    np.testing.assert_allclose(np.concatenate([y1, y2], -1), full, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h2, h_full, rtol=1e-12, atol=1e-12)


def test_cu_seqlens_equals_separate_sequences(rng):
    ops = operands(rng, 1, 4, 3, 17)
    cu = [0, 5, 6, 17]
    y = scanweaver.mamba_selective_scan(**ops, cu_seqlens=cu, backend="numpy")
    for s, e in zip(cu[:-1], cu[1:], strict=True):
        part = {k: (v[..., s:e] if v.ndim >= 3 else v) for k, v in ops.items()}
        np.testing.assert_allclose(y[..., s:e], s6_reference(**part)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cshape", ["step", "group"])
def test_log_space_matches_in_float64(rng, cshape):
    ops = operands(rng, 2, 4, 3, 150, "group", cshape)
    ext = extras(rng, 2, 4, 3, 150)
    ey, eh = s6_reference(**ops, **ext)
    y, h = scanweaver.mamba_selective_scan(**ops, **ext, return_state=True, log_space=True, chunk=8)
    np.testing.assert_allclose(y, ey, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, eh, rtol=1e-10, atol=1e-10)


def test_complex_transitions_on_numpy(rng):
    ops = operands(rng, 1, 4, 2, 21)
    ops["A"] = (ops["A"] + 1j * rng.uniform(-3, 3, (4, 2))).astype(np.complex64)
    ops["B"] = (ops["B"] + 1j * rng.standard_normal(ops["B"].shape)).astype(np.complex64)
    ops["u"], ops["delta"], ops["C"] = (ops[k].astype(np.float32) for k in ("u", "delta", "C"))
    y, h = scanweaver.mamba_selective_scan(**ops, return_state=True, backend="numpy")
    ey, eh = s6_reference(**ops)
    assert y.dtype == np.complex64 and h.dtype == np.complex64
    np.testing.assert_allclose(y, ey, rtol=1e-4, atol=1e-5 * np.abs(ey).max())
    np.testing.assert_allclose(h, eh, rtol=1e-4, atol=1e-5 * np.abs(eh).max())


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "numpy"])
def test_complex_on_a_real_only_backend_names_it(rng, backend):
    need(backend)
    if "complex64" in REGISTRY[backend].dtypes:
        pytest.skip(f"backend {backend!r} supports complex64")
    ops = operands(rng, dtype=np.float32)
    ops["A"] = ops["A"].astype(np.complex64)
    with pytest.raises(ScanInputError, match=f"backend '{backend}' does not support dtype complex64"):
        scanweaver.mamba_selective_scan(**ops, backend=backend)
