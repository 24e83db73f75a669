"""Repeated Mamba-1 calls reuse their resolved fused kernel and still give the full path's answers."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.ops.mamba1 import api as mamba_api
from scanweaver.runtime import REGISTRY

pytestmark = pytest.mark.skipif(not REGISTRY.get("cpu").availability().ok, reason="the cpu backend needs a compiler")


def operands(rng, b, D, N, L, dtype, layout):
    ops = {"u": rng.standard_normal((b, D, L)), "delta": rng.uniform(0.01, 0.2, (b, D, L)),
           "A": -rng.uniform(0.5, 2.0, (D, N))}
    shapes = {"step": (b, N, L), "group": (b, 2, N, L), "fixed": (D, N)}[layout]
    ops["B"], ops["C"] = rng.standard_normal(shapes), rng.standard_normal(shapes)
    return {k: v.astype(dtype) for k, v in ops.items()}


@pytest.mark.parametrize("layout", ["step", "group", "fixed"])
def test_repeated_calls_match_the_numpy_definition_while_signatures_change(rng, layout):
    for b, D, N, L, dtype, extras in [(1, 4, 4, 16, np.float32, {}), (2, 6, 3, 33, np.float64, {"D": True}),
                                      (1, 4, 4, 16, np.float32, {"z": True, "softplus": True}),
                                      (1, 4, 4, 16, np.float64, {"h0": True})] * 2:
        ops = operands(rng, b, D, N, L, dtype, layout)
        kw = {}
        if extras.get("D"):
            kw["D"] = rng.standard_normal(D).astype(dtype)
        if extras.get("z"):
            kw["z"] = rng.standard_normal((b, D, L)).astype(dtype)
        if extras.get("h0"):
            kw["h0"] = rng.standard_normal((b, D, N)).astype(dtype)
        soft = extras.get("softplus", False)
        y, h = scanweaver.mamba_selective_scan(**ops, **kw, delta_softplus=soft, return_state=True)
        want_y, want_h = scanweaver.mamba_selective_scan(**ops, **kw, delta_softplus=soft, return_state=True,
                                                         backend="numpy")
        tol = 1e-4 if dtype == np.float32 else 1e-10
        np.testing.assert_allclose(y, want_y, rtol=tol, atol=tol)
        np.testing.assert_allclose(h, want_h, rtol=tol, atol=tol)
        assert y.dtype == dtype


def test_a_repeated_call_skips_preparation(rng, monkeypatch):
    ops = operands(rng, 1, 4, 4, 16, np.float32, "step")
    first = scanweaver.mamba_selective_scan(**ops)
    monkeypatch.setattr(mamba_api, "prepare", lambda *a, **k: pytest.fail("the full path ran again"))
    np.testing.assert_array_equal(scanweaver.mamba_selective_scan(**ops), first)
    assert scanweaver.mamba.last.backend == "cpu"


def test_misaligned_and_converted_operands_take_the_full_path(rng):
    ops = operands(rng, 1, 4, 4, 16, np.float32, "step")
    want = scanweaver.mamba_selective_scan(**ops)
    raw = np.frombuffer(bytearray(ops["u"].nbytes + 1), np.uint8)[1:].view(np.float32).reshape(ops["u"].shape)
    raw[...] = ops["u"]
    assert not raw.flags.aligned
    np.testing.assert_allclose(scanweaver.mamba_selective_scan(**{**ops, "u": raw}), want, rtol=0, atol=0)
    y = scanweaver.mamba_selective_scan(**{**ops, "u": ops["u"].astype(np.float16)})
    assert y.dtype == np.float16
    with pytest.raises(scanweaver.ScanInputError, match="delta has shape"):
        scanweaver.mamba_selective_scan(**{**ops, "delta": ops["delta"][:, :, :5]})
