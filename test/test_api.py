"""The public API on the NumPy backend: semantics, features and bad input."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from conftest import loop_reference, make_operands

SCHEDULES = [("sequential", {}), ("chunked", {"chunk": 7}), ("chunked", {}), ("blelloch", {"workgroup_size": 4}),
             ("blelloch", {})]


@pytest.mark.parametrize("schedule, cfg", SCHEDULES)
@pytest.mark.parametrize("L", [1, 2, 33, 64, 65])
def test_interpreter_schedules_match_loop(rng, schedule, cfg, L):
    ops = make_operands(rng, (2, 3, L))
    h0 = rng.standard_normal((2, 3))
    reset = rng.random((2, 3, L)) < 0.1
    for reverse in (False, True):
        y, hl = scanweaver.selective_scan(**ops, h0=h0, reset=reset, reverse=reverse, return_state=True,
                                          backend="numpy", schedule=schedule, **cfg)
        ey, eh = loop_reference(**ops, h0=h0, reset=reset, reverse=reverse)
        np.testing.assert_allclose(y, ey, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(hl, eh, rtol=1e-12, atol=1e-12)


def test_without_c_output_is_the_state(rng):
    ops = make_operands(rng, (5, 17), with_c=False)
    y = scanweaver.selective_scan(**ops, backend="numpy")
    np.testing.assert_allclose(y, loop_reference(**ops)[0], rtol=1e-13)


def test_float32_in_float32_out(rng):
    ops = make_operands(rng, (4, 100), np.float32)
    y = scanweaver.selective_scan(**ops, backend="numpy")
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, loop_reference(**ops)[0], rtol=1e-4, atol=1e-5)


def test_empty_length_returns_empty_and_h0(rng):
    ops = make_operands(rng, (2, 3, 0))
    h0 = rng.standard_normal((2, 3))
    y, hl = scanweaver.selective_scan(**ops, h0=h0, return_state=True, backend="numpy")
    assert y.shape == (2, 3, 0)
    np.testing.assert_array_equal(hl, h0)


def test_one_dimensional_operands(rng):
    ops = make_operands(rng, (23,))
    np.testing.assert_allclose(scanweaver.selective_scan(**ops, backend="numpy"), loop_reference(**ops)[0])


def test_non_contiguous_and_negative_stride_views(rng):
    big = make_operands(rng, (4, 6, 80))
    views = {k: v[::2, :, ::-2] for k, v in big.items()}
    assert not views["a"].flags.c_contiguous
    y = scanweaver.selective_scan(**views, backend="numpy")
    np.testing.assert_allclose(y, loop_reference(**{k: v.copy() for k, v in views.items()})[0], rtol=1e-12)


def test_nan_and_inf_propagate_as_in_the_loop(rng):
    ops = make_operands(rng, (3, 20))
    ops["x"][0, 5] = np.nan
    ops["b"][1, 7] = np.inf
    ops["a"][2, 9] = 0.0
    ops["x"][2, 3] = np.inf
    y = scanweaver.selective_scan(**ops, backend="numpy")
    ey = loop_reference(**ops)[0]
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ey))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ey))
    fin = np.isfinite(ey)
    np.testing.assert_allclose(y[fin], ey[fin], rtol=1e-12)


def test_mismatched_shapes_name_each_argument(rng):
    ops = make_operands(rng, (2, 10))
    ops["x"] = ops["x"][:, :9]
    with pytest.raises(ScanInputError) as info:
        scanweaver.selective_scan(**ops, backend="numpy")
    msg = str(info.value)
    assert msg.startswith("selective_scan:")
    for part in ("a(2, 10)", "b(2, 10)", "x(2, 9)", "c(2, 10)"):
        assert part in msg


@pytest.mark.parametrize("bad, what", [(np.int32, "int32"), (object, "object"), (np.int8, "int8")])
def test_unsupported_dtypes(rng, bad, what):
    ops = make_operands(rng, (2, 10))
    ops["b"] = ops["b"].astype(bad)
    with pytest.raises(ScanInputError, match=f"b has .*{what}"):
        scanweaver.selective_scan(**ops, backend="numpy")


def test_h0_and_reset_shapes_are_checked(rng):
    ops = make_operands(rng, (2, 3, 10))
    with pytest.raises(ScanInputError, match=r"h0 has shape \(3,\); it needs .*\(2, 3\)"):
        scanweaver.selective_scan(**ops, h0=np.zeros(3), backend="numpy")
    with pytest.raises(ScanInputError, match=r"reset has shape \(2, 3\)"):
        scanweaver.selective_scan(**ops, reset=np.zeros((2, 3), bool), backend="numpy")


def test_unknown_names_are_explained(rng):
    ops = make_operands(rng, (2, 10))
    # the message starts with the call's name, then the argument's
    with pytest.raises(ScanInputError, match="^selective_scan: backend: unknown backend 'gpu'"):
        scanweaver.selective_scan(**ops, backend="gpu")
    with pytest.raises(ScanInputError, match="^selective_scan: schedule: unknown schedule 'fast'; known: .*chunked"):
        scanweaver.selective_scan(**ops, backend="numpy", schedule="fast")
    q = np.ones((1, 8, 1, 4))
    with pytest.raises(ScanInputError, match="^linear_attention: backend: unknown backend 'gpu'"):
        scanweaver.linear_attention(q, q, q, backend="gpu")
    with pytest.raises(ScanInputError, match="unknown keyword 'chunkk'.*did you mean 'chunk'"):
        scanweaver.selective_scan(**ops, backend="numpy", schedule="chunked", chunkk=3)
    with pytest.raises(ScanInputError, match="workgroup_size=3 is invalid: it must be a power of two"):
        scanweaver.selective_scan(**ops, backend="numpy", schedule="blelloch", workgroup_size=3)
    with pytest.raises(ScanInputError, match="chunk must be an int"):
        scanweaver.selective_scan(**ops, backend="numpy", schedule="chunked", chunk=2.5)



def test_a_refused_tunable_is_refused_after_an_equal_accepted_one(rng):
    """True == 1 and 3.0 == 3 with equal hashes: a call's memo (a plan, a lowering, a fused kernel's resolved
    configuration) must not let the refused value through once the accepted one has run."""
    ops = make_operands(rng, (2, 16))
    q, k, v = rng.standard_normal((3, 1, 5, 2, 3))
    u, delta, B, C = (rng.standard_normal(s) for s in ((1, 4, 16), (1, 4, 16), (1, 3, 16), (1, 3, 16)))
    A = -rng.uniform(0.5, 1.0, (4, 3))
    calls = [(lambda **t: scanweaver.selective_scan(**ops, backend="numpy", schedule="chunked", **t), "chunk", 4),
             (lambda **t: scanweaver.selective_scan(**ops, backend="cpu", **t), "threads", 1),
             (lambda **t: scanweaver.mamba_selective_scan(u, delta, A, B, C, backend="cpu", **t), "threads", 1),
             (lambda **t: scanweaver.linear_attention(q, k, v, backend="cpu", **t), "chunk", 1)]
    for call, name, good in calls:
        for bad in (True, float(good)):
            with pytest.raises(ScanInputError, match=f"{name} must be an int"):
                call(**{name: bad})
            call(**{name: good})
            with pytest.raises(ScanInputError, match=f"{name} must be an int"):
                call(**{name: bad})

def test_last_call_is_observable(rng):
    from scanweaver.api import SELECTIVE

    scanweaver.selective_scan(**make_operands(rng, (2, 9)), backend="numpy", schedule="chunked", chunk=4)
    assert SELECTIVE.last.backend == "numpy"
    assert SELECTIVE.last.config == {"chunk": 4}
    assert SELECTIVE.last.source == "explicit"
    assert "chunked.reduce chunk=4" in SELECTIVE.last.stages.text()["schedule"]


def test_import_loads_no_optional_dependency():
    heavy = ["kernel_tuner", "pyopencl", "cupy", "juliacall", "torch", "jax", "matplotlib", "scipy", "iree"]
    code = ("import sys, scanweaver; import numpy as np; "
            "scanweaver.selective_scan(np.ones((1, 4)), np.ones((1, 4)), np.ones((1, 4)), backend='numpy'); "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_out_buffer_is_written_and_returned(rng, backend):
    from scanweaver.runtime import REGISTRY

    if not REGISTRY[backend].availability().ok:
        pytest.skip(f"backend {backend!r} unavailable: {REGISTRY[backend].availability().reason}")
    ops = make_operands(rng, (3, 4, 50), np.float32)
    out = np.full((3, 4, 50), np.nan, np.float32)
    y = scanweaver.selective_scan(**ops, backend=backend, out=out)
    assert y is out
    np.testing.assert_allclose(out, loop_reference(**ops)[0], rtol=1e-4, atol=1e-5)


def test_out_buffer_errors(rng):
    ops = make_operands(rng, (2, 10), np.float32)
    with pytest.raises(ScanInputError, match=r"out has shape \(2, 9\) and dtype float32; it needs shape \(2, 10\)"):
        scanweaver.selective_scan(**ops, backend="numpy", out=np.empty((2, 9), np.float32))
    with pytest.raises(ScanInputError, match="dtype float64; it needs .*float32"):
        scanweaver.selective_scan(**ops, backend="numpy", out=np.empty((2, 10)))
    with pytest.raises(ScanInputError, match="C-contiguous"):
        scanweaver.selective_scan(**ops, backend="numpy", out=np.empty((10, 2), np.float32).T)
    with pytest.raises(ScanInputError, match="overlaps operand x"):
        scanweaver.selective_scan(**ops, backend="numpy", out=ops["x"])
