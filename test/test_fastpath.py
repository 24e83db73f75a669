"""Repeated calls reuse a plan per signature, give the full path's results, and still check everything."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scanweaver
from scanweaver.core import recurrence as api
from scanweaver.api import SELECTIVE
from scanweaver.errors import ScanInputError
from scanweaver.runtime import REGISTRY
from scanweaver.runtime.fastcall import Slot, extension, invoker
from scanweaver.tuning import store

from conftest import loop_reference

CPU = REGISTRY.get("cpu").availability().ok
needs_cpu = pytest.mark.skipif(not CPU, reason="the cpu backend needs a C compiler")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    return tmp_path


def ops(rng, shape, dtype):
    return (rng.uniform(0.5, 1.0, shape).astype(dtype),
            *(rng.standard_normal(shape).astype(dtype) for _ in range(3)))


CALL = st.fixed_dictionaries({
    "shape": st.sampled_from([(1, 1), (3, 7), (2, 2, 33), (1, 300), (4, 64)]),
    "dtype": st.sampled_from([np.float32, np.float64]),
    "h0": st.booleans(), "reset": st.booleans(), "reverse": st.booleans(), "return_state": st.booleans(),
    "with_c": st.booleans(), "out": st.booleans(), "backend": st.sampled_from(["auto", "numpy"]),
})


@needs_cpu
@settings(max_examples=60, deadline=None)
@given(calls=st.lists(CALL, min_size=2, max_size=8), seed=st.integers(0, 2**16))
def test_repeated_calls_with_changing_signatures_match_the_reference(calls, seed):
    rng = np.random.default_rng(seed)
    for spec in calls + calls:  # every signature is called at least twice: the second runs from its plan
        a, b, x, c = ops(rng, spec["shape"], spec["dtype"])
        c = c if spec["with_c"] else None
        h0 = rng.standard_normal(spec["shape"][:-1]).astype(spec["dtype"]) if spec["h0"] else None
        reset = rng.random(spec["shape"]) < 0.2 if spec["reset"] else None
        out = np.empty(spec["shape"], spec["dtype"]) if spec["out"] else None
        got = scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=spec["reverse"],
                                        return_state=spec["return_state"], out=out, backend=spec["backend"])
        y, h = got if spec["return_state"] else (got, None)
        want_y, want_h = loop_reference(a, b, x, c, h0=h0, reset=reset, reverse=spec["reverse"])
        tol = 1e-4 if spec["dtype"] == np.float32 else 1e-10
        np.testing.assert_allclose(y, want_y, rtol=tol, atol=tol)
        assert y.dtype == spec["dtype"] and y.shape == spec["shape"]
        if out is not None:
            assert y is out
        if h is not None:
            np.testing.assert_allclose(h, want_h, rtol=tol, atol=tol)


@needs_cpu
def test_a_repeated_call_skips_validation_and_resolution(rng, monkeypatch):
    a, b, x, c = ops(rng, (4, 100), np.float32)
    first = scanweaver.selective_scan(a, b, x, c)

    def refuse(*args, **kwargs):
        raise AssertionError("the full path ran for a repeated signature")

    monkeypatch.setattr(api, "prepare", refuse)
    monkeypatch.setattr(api, "pick_backend", refuse)
    np.testing.assert_array_equal(scanweaver.selective_scan(a, b, x, c), first)
    assert SELECTIVE.last.backend == "cpu"


@needs_cpu
def test_changed_arrays_take_the_full_path_with_its_errors(rng):
    a, b, x, c = ops(rng, (4, 100), np.float32)
    scanweaver.selective_scan(a, b, x, c)
    with pytest.raises(ScanInputError, match="same shape"):
        scanweaver.selective_scan(a, b, x[:, :50], c)
    with pytest.raises(ScanInputError, match="h0 has shape"):
        scanweaver.selective_scan(a, b, x, c, h0=np.zeros(3, np.float32))
    with pytest.raises(ScanInputError, match="out has shape"):
        scanweaver.selective_scan(a, b, x, c, out=np.empty((4, 99), np.float32))
    with pytest.raises(ScanInputError, match="out overlaps operand x"):
        scanweaver.selective_scan(a, b, x, c, out=x)
    # a strided view and a float64 operand are converted by the full path and still right
    big = np.ascontiguousarray(np.repeat(x, 2, axis=1))
    y = scanweaver.selective_scan(a, b, big[:, ::2], c)
    np.testing.assert_allclose(y, loop_reference(a, b, x, c)[0], rtol=1e-4, atol=1e-4)
    y = scanweaver.selective_scan(a, b, x.astype(np.float64), c)
    assert y.dtype == np.float64


@needs_cpu
def test_a_store_written_by_another_process_is_seen_by_the_next_call(cache, rng):
    a, b, x, c = ops(rng, (64, 1024), np.float32)
    scanweaver.selective_scan(a, b, x, c)
    scanweaver.selective_scan(a, b, x, c)
    assert SELECTIVE.last.source == "default"
    be = REGISTRY.get("cpu")
    code = ("from scanweaver.tuning import store\n"
            f"store.record(store.Entry(backend='cpu', device={be.availability().device!r}, "
            f"signature={SELECTIVE.signature('float32')!r}, dtype='float32', lanes=64, L=1024, "
            "schedule='chunked', config={'chunk': 512, 'interleave': 1, 'threads': 1}, time_ms=1.0))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    time.sleep(store.RECHECK_S)  # calls look at the store files at most this often
    y = scanweaver.selective_scan(a, b, x, c)
    assert SELECTIVE.last.source == "tuned" and SELECTIVE.last.config["chunk"] == 512
    np.testing.assert_allclose(y, loop_reference(a, b, x, c)[0], rtol=1e-4, atol=1e-4)
    scanweaver.selective_scan(a, b, x, c)
    assert SELECTIVE.last.source == "tuned"
    store.remove(backend="cpu")
    scanweaver.selective_scan(a, b, x, c)
    assert SELECTIVE.last.source == "default"


@needs_cpu
def test_an_explicit_plan_runs_and_names_what_does_not_fit(rng):
    p = scanweaver.plan(scanweaver.selective_scan, (3, 50), np.float64, h0=True, return_state=True)
    a, b, x, c = ops(rng, (3, 50), np.float64)
    h0 = rng.standard_normal(3)
    out = np.empty((3, 50))
    y, h = p(a, b, x, c, h0=h0, out=out)
    want_y, want_h = loop_reference(a, b, x, c, h0=h0)
    assert y is out
    np.testing.assert_allclose(y, want_y, rtol=1e-12)
    np.testing.assert_allclose(h, want_h, rtol=1e-12)
    with pytest.raises(ScanInputError, match=r"x has shape \(3, 49\), dtype float64; this plan takes"):
        p(a, b, np.ascontiguousarray(x[:, :49]), c, h0=h0)
    with pytest.raises(ScanInputError, match="c has shape .* dtype float32"):
        p(a, b, x, c.astype(np.float32), h0=h0)
    with pytest.raises(ScanInputError, match="not C-contiguous"):
        p(a, b, np.asfortranarray(np.repeat(x, 2, 0)[:3]), c, h0=h0)
    with pytest.raises(ScanInputError, match="built without reset"):
        p(a, b, x, c, h0=h0, reset=np.zeros((3, 50), bool))
    with pytest.raises(ScanInputError, match="takes 4 operands"):
        p(a, b, x, h0=h0)


def test_the_trampoline_checks_buffers_before_calling():
    import ctypes

    libc = ctypes.CDLL(None)
    memset = ctypes.cast(libc.memset, ctypes.c_void_p).value
    call = invoker(memset, (Slot(16, 8, written=True), Slot(8, 8)))
    buf, other = np.zeros(2), np.zeros(1)
    assert call((buf, other), 0, 16) is not None
    with pytest.raises(ValueError, match="holds 8 bytes; the kernel needs 16"):
        call((np.zeros(1), other), 0, 16)
    with pytest.raises(ValueError, match="not aligned"):
        call((np.frombuffer(bytearray(24), np.uint8)[1:17].view(np.float64), other), 0, 16)
    with pytest.raises((ValueError, BufferError)):
        ro = np.zeros(2)
        ro.flags.writeable = False
        call((ro, other), 0, 16)
    with pytest.raises(ValueError, match="overlaps"):
        call((buf, buf[:1]), 0, 16)
    with pytest.raises(ValueError, match="required"):
        call((None, other), 0, 16)
    with pytest.raises(ValueError, match="sizes"):
        call((buf, other), 0)


@pytest.mark.parametrize("in_c", [True, False], ids=["extension", "ctypes"])
def test_addresses_are_read_after_the_trampolines_checks(monkeypatch, in_c):
    from scanweaver.runtime import fastcall

    if not in_c:
        monkeypatch.setattr(fastcall, "extension", lambda: None)
    elif fastcall.extension() is None:
        pytest.skip("no Python.h or no C compiler here: the ctypes case covers the checks")
    addresses = fastcall.addresser((Slot(16, 8, written=True), Slot(8, 8), Slot(0, 8, optional=True)))
    buf, other = np.zeros(2), np.zeros(1)
    assert addresses((buf, other, None)) == (buf.ctypes.data, other.ctypes.data, 0)
    assert addresses((buf, other, np.zeros(1))) == (buf.ctypes.data, other.ctypes.data, 0)  # a zero-byte slot
    with pytest.raises(ValueError, match="holds 8 bytes; the kernel needs 16"):
        addresses((np.zeros(1), other, None))
    with pytest.raises(ValueError, match="overlaps"):
        addresses((buf, buf[1:], None))
    with pytest.raises((ValueError, BufferError)):
        ro = np.zeros(2)
        ro.flags.writeable = False
        addresses((ro, other, None))
    with pytest.raises(ValueError, match="required"):
        addresses((buf, None, None))
    with pytest.raises(ValueError):
        addresses((buf, other))


def test_the_trampoline_is_built_where_python_headers_exist():
    import sysconfig
    from pathlib import Path

    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.exists() or not CPU:
        pytest.skip("no Python.h or no C compiler here: calls go through ctypes (tested above either way)")
    assert extension() is not None


@needs_cpu
def test_misaligned_arrays_with_a_known_signature_are_copied_by_the_full_path(rng):
    a, b, x, c = ops(rng, (2, 64), np.float64)
    want = scanweaver.selective_scan(a, b, x, c)  # builds the plan for aligned float64 (2, 64)
    raw = np.frombuffer(bytearray(a.nbytes + 1), np.uint8)[1:]
    shifted = raw.view(np.float64).reshape(2, 64)
    shifted[...] = x
    assert not shifted.flags.aligned
    np.testing.assert_array_equal(scanweaver.selective_scan(a, b, shifted, c), want)
    p = scanweaver.plan(scanweaver.selective_scan, (2, 64), np.float64)
    with pytest.raises(ScanInputError, match="not aligned to 8 bytes.*call the recurrence, which copies them"):
        p(a, b, shifted, c)


@needs_cpu
def test_large_outputs_are_skewed_against_the_inputs_and_reused_once_dropped(rng):
    from scanweaver.runtime import host_pool

    a, b, x, c = ops(rng, (4, 8192), np.float32)  # 128 KiB per operand: past SKEW_MIN_BYTES
    want = loop_reference(a, b, x, c)[0]
    first = scanweaver.selective_scan(a, b, x, c)  # the full path allocates a skewed y too
    assert (first.ctypes.data - a.ctypes.data) % host_pool.PAGE == host_pool.SKEW
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-4)
    big = ops(rng, (64, 8192), np.float32)  # 2 MiB: the plan takes y from the pool
    y1 = scanweaver.selective_scan(*big)
    y2 = scanweaver.selective_scan(*big)
    assert (y2.ctypes.data - big[0].ctypes.data) % host_pool.PAGE == host_pool.SKEW
    assert y1.ctypes.data != y2.ctypes.data  # y1 is still referenced: not reused
    address = y2.ctypes.data
    del y2
    y3 = scanweaver.selective_scan(*big)
    assert y3.ctypes.data == address  # nothing referred to it any more
    np.testing.assert_array_equal(y3, y1)


@scanweaver.recurrence
def decay(h, a, x):
    return a * h + x


@needs_cpu
@pytest.mark.parametrize("kind", ["python float", "numpy scalar", "0-d array", "(1, 1) array", "per lane"])
def test_scalar_and_per_lane_operands_are_planned_and_read_each_call(rng, monkeypatch, kind):
    """A gate given as a number or per lane keys its plan by type and shape, never by value: every call
    reads the value it is given, without the full path."""
    shape = (3, 50)
    x = rng.standard_normal(shape).astype(np.float32)
    gates = [0.5, 0.9, 0.25]

    def gate(g):
        if kind == "python float":
            return g
        if kind == "numpy scalar":
            return np.float32(g)
        if kind == "0-d array":
            return np.array(g, np.float32)
        if kind == "(1, 1) array":
            return np.full((1, 1), g, np.float32)
        return np.full((3, 1), g, np.float32) * np.array([[1.0], [0.5], [0.25]], np.float32)

    def want(g):
        a = np.broadcast_to(np.asarray(gate(g), np.float64), shape)
        h, y = np.zeros(shape[0]), np.empty(shape)
        for t in range(shape[1]):
            h = a[:, t] * h + x[:, t]
            y[:, t] = h
        return y

    np.testing.assert_allclose(decay(gate(gates[0]), x), want(gates[0]), rtol=1e-5, atol=1e-5)
    assert any(p.layouts for p in decay._plans.values()), "no plan kept a small operand"

    def refuse(*args, **kwargs):
        raise AssertionError("the full path ran for a repeated signature")

    monkeypatch.setattr(api, "prepare", refuse)
    for g in gates[1:] + gates[:1]:
        y = decay(gate(g), x)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, want(g), rtol=1e-5, atol=1e-5)


@needs_cpu
def test_a_filter_with_python_float_coefficients_is_planned(rng, monkeypatch):
    """The biquad of bench/filters.py: coefficients as Python floats, one short signal, repeated calls."""
    @scanweaver.recurrence(state_size=2)
    def biquad(h, b0, b1, b2, a1, a2, x):
        return (b1 * x - a1 * (h[0] + b0 * x) + h[1], b2 * x - a2 * (h[0] + b0 * x)), h[0] + b0 * x

    x = rng.standard_normal((1, 256))
    coeffs = (0.2, 0.3, 0.1, -1.7, 0.81)
    first = biquad(*coeffs, x)
    monkeypatch.setattr(api, "prepare", lambda *a, **k: (_ for _ in ()).throw(AssertionError("full path")))
    np.testing.assert_array_equal(biquad(*coeffs, x), first)
    other = biquad(0.1, 0.3, 0.1, -1.7, 0.81, x)  # another value of b0, same plan
    monkeypatch.undo()
    np.testing.assert_allclose(other, biquad(0.1, 0.3, 0.1, -1.7, 0.81, x, backend="numpy"), rtol=1e-12, atol=1e-12)
    assert not np.allclose(other, first)


@pytest.mark.skipif(not REGISTRY.get("opencl").availability().ok,
                    reason="no OpenCL device here (PoCL is installed by .ci/run)")
def test_repeated_calls_on_opencl_run_from_their_plans(rng, monkeypatch):
    """The plan path of a backend without a direct-call entry (its run on host arrays), on PoCL."""
    specs = [((3, 40), np.float32, {}), ((2, 2, 17), np.float64, {"reverse": True, "return_state": True}),
             ((5, 33), np.float32, {"h0": True, "reset": True})]
    calls = []
    for shape, dtype, flags in specs:
        a, b, x, c = ops(rng, shape, dtype)
        h0 = rng.standard_normal(shape[:-1]).astype(dtype) if flags.get("h0") else None
        reset = rng.random(shape) < 0.2 if flags.get("reset") else None
        want = loop_reference(a, b, x, c, h0=h0, reset=reset, reverse=flags.get("reverse", False))
        calls.append(((a, b, x, c), dict(h0=h0, reset=reset, reverse=flags.get("reverse", False),
                                          return_state=flags.get("return_state", False), backend="opencl"), want))
    for args, kw, _ in calls:
        scanweaver.selective_scan(*args, **kw)
    monkeypatch.setattr(api, "prepare", lambda *a, **k: (_ for _ in ()).throw(AssertionError("full path")))
    for args, kw, want in calls + calls:
        got = scanweaver.selective_scan(*args, **kw)
        y, h = got if kw["return_state"] else (got, None)
        tol = 1e-4 if args[0].dtype == np.float32 else 1e-10
        np.testing.assert_allclose(y, want[0], rtol=tol, atol=tol)
        if h is not None:
            np.testing.assert_allclose(h, want[1], rtol=tol, atol=tol)
        assert SELECTIVE.last.backend == "opencl"
