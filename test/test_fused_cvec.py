"""The SIMD prelude of the fused C kernels: math accuracy in ulps, special values, transposes.

Each width is built twice: with the ISA instructions the compiler targets here, and with the
portable bit-level path forced (``SW_VEC_GENERIC``), so both are checked on any machine.
"""

from __future__ import annotations

import ctypes
import itertools

import numpy as np
import pytest

from scanweaver.runtime import toolchain
from scanweaver.targets.cvec import vector_prelude

HARNESS = r"""
#include <string.h>
#include <math.h>
#define SW_INLINE static inline __attribute__((always_inline))
@GENERIC@
@PRE@
#define SW_MAP(name, fn) void name(const SW_T* x, SW_T* y, long n) { \
  for (long i = 0; i + SW_W <= n; i += SW_W) sw_vstore(y + i, fn(sw_vload(x + i))); }
SW_MAP(f_exp2, sw_vexp2)
SW_MAP(f_exp, sw_vexp)
SW_MAP(f_log1p, sw_vlog1p01)
SW_MAP(f_softplus, sw_vsoftplus)
SW_MAP(f_sigmoid, sw_vsigmoid)
void f_hsum(const SW_T* x, SW_T* y, long n) {
  for (long i = 0; i + SW_W <= n; i += SW_W) y[i / SW_W] = sw_vhsum(sw_vload(x + i)); }
void f_tin(const SW_T* src, long stride, int rows, int cols, SW_T* out) {
  sw_v o[SW_W]; sw_tile_in(src, stride, rows, cols, o); memcpy(out, o, sizeof o); }
void f_tout(const SW_T* in, SW_T* dst, long stride, int rows, int cols) {
  sw_v o[SW_W]; memcpy(o, in, sizeof o); sw_tile_out(o, dst, stride, rows, cols); }
"""

CASES = list(itertools.product(("float32", "float64"), (1, 4, 8, 16), (False, True)))


def build(dtype: str, width: int, generic: bool):
    src = HARNESS.replace("@PRE@", vector_prelude(dtype, width)).replace(
        "@GENERIC@", "#define SW_VEC_GENERIC 1" if generic else "")
    return toolchain.find_toolchain().load(src)


def apply(lib, name: str, x: np.ndarray, out_len: int | None = None) -> np.ndarray:
    y = np.zeros(out_len or x.size, x.dtype)
    fn = getattr(lib, name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    fn(x.ctypes.data, y.ctypes.data, x.size)
    return y


def padded(x: np.ndarray, width: int) -> np.ndarray:
    return np.concatenate([x, np.zeros((-x.size) % width, x.dtype)])


def ulps(got: np.ndarray, want: np.ndarray, dtype) -> float:
    """Largest relative error in units of the dtype's epsilon."""
    return float(np.max(np.abs(got.astype(np.float64) / want - 1)) / np.finfo(dtype).eps)


@pytest.mark.parametrize("dtype, width, generic", CASES)
def test_vector_math_accuracy_and_special_values(rng, dtype, width, generic):
    if toolchain.missing_reason():
        pytest.skip(toolchain.missing_reason())
    lib = build(dtype, width, generic)
    dt = np.dtype(dtype)
    x = padded(np.concatenate([rng.uniform(-120, 120, 2048), rng.uniform(-0.5, 0.5, 512)]).astype(dt), width)
    assert ulps(apply(lib, "f_exp2", x), np.exp2(x.astype(np.float64)), dt) < 2
    e = padded(rng.uniform(-80, 80, 2048).astype(dt), width)
    assert ulps(apply(lib, "f_exp", e), np.exp(e.astype(np.float64)), dt) < 2
    v = padded(np.concatenate([rng.uniform(0, 1, 1024), 10.0 ** rng.uniform(-30, 0, 1024)]).astype(dt), width)
    assert ulps(apply(lib, "f_log1p", v), np.log1p(v.astype(np.float64)), dt) < 4
    s = padded(rng.uniform(-60, 60, 2048).astype(dt), width)
    assert ulps(apply(lib, "f_softplus", s), np.logaddexp(0, s.astype(np.float64)), dt) < 4
    assert ulps(apply(lib, "f_sigmoid", s), 1 / (1 + np.exp(-s.astype(np.float64))), dt) < 4
    special = padded(np.array([np.inf, -np.inf, np.nan, 5000, -5000, 0.0], dt), width)
    with np.errstate(over="ignore"):
        want = np.exp2(special.astype(np.float64)).astype(dt)
    np.testing.assert_array_equal(apply(lib, "f_exp2", special), want)
    np.testing.assert_array_equal(apply(lib, "f_exp", special)[:6], [np.inf, 0, np.nan, np.inf, 0, 1])
    h = padded(rng.standard_normal(64 * width).astype(dt), width)
    np.testing.assert_allclose(apply(lib, "f_hsum", h, h.size // width), h.reshape(-1, width).sum(1),
                               rtol=10 * np.finfo(dt).eps, atol=10 * np.finfo(dt).eps)


@pytest.mark.parametrize("dtype, width", [c[:2] for c in CASES if not c[2]])
def test_tile_transposes_full_and_partial(rng, dtype, width):
    if toolchain.missing_reason():
        pytest.skip(toolchain.missing_reason())
    lib = build(dtype, width, False)
    stride = 37
    src = rng.standard_normal((width, stride)).astype(dtype)
    tin, tout = lib.f_tin, lib.f_tout
    tin.argtypes = tout.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    for rows, cols in {(width, width), (max(width - 1, 1), width), (width, max(width - 1, 1)), (1, 1)}:
        out = np.full((width, width), np.nan, dtype)
        tin(src.ctypes.data, stride, rows, cols, out.ctypes.data)
        want = np.zeros((width, width), dtype)
        want[:cols, :rows] = src[:rows, :cols].T
        np.testing.assert_array_equal(out, want)
        back = np.zeros((width, stride), dtype)
        tout(want.ctypes.data, back.ctypes.data, stride, rows, cols)
        expect = np.zeros((width, stride), dtype)
        expect[:rows, :cols] = src[:rows, :cols]
        np.testing.assert_array_equal(back, expect)
