"""The chunked matrix-state C kernels built for ARM64 and run under qemu: NEON vectors (float32, 4 lanes), the
portable vectors (float64, 4 lanes: two NEON registers each) and the 12-row register blocks of a 32-register ISA;
forward against the float64 loop of :mod:`test_chunked`, backward against this machine's build of the same kernel
(itself checked against the loop's finite differences), with resets, growth and a chunk that does not divide T."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.matrix_state import MatrixStateFeatures
from scanweaver.targets.fused import kernel_for
from test_chunked import fused, loop_of, operands

OP = FUSED.get("matrix_state")
GCC, QEMU = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
INPUTS = ("q", "k", "v", "g", "u", "h0", "do", "dhlast")
OUTPUTS = ("o", "hlast", "dq", "dk", "dv", "dg", "du", "dh0")

DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
typedef @T@ T;
int sw_matrix_state_forward(const T*, const T*, const T*, const T*, const T*, const T*, const int64_t*, T*, T*,
                            long, long, long, long, long);
int sw_matrix_state_backward(const T*, const T*, const T*, const T*, const T*, const T*, const int64_t*, const T*,
                             const T*, T*, T*, T*, T*, T*, T*, long, long, long, long, long);
static T* rd(long n) {
  T* p = malloc(sizeof(T) * (size_t)(n + 1));
  if (fread(p, sizeof(T), (size_t)n, stdin) != (size_t)n) exit(2);
  return p;
}
int main(void) {
  long s[5], n[8], m[8];
  if (fread(s, sizeof s, 1, stdin) != 1 || fread(n, sizeof n, 1, stdin) != 1 || fread(m, sizeof m, 1, stdin) != 1)
    return 2;
  T *a[8], *b[8];
  for (int i = 0; i < 8; ++i) a[i] = rd(n[i]);
  for (int i = 0; i < 8; ++i) b[i] = calloc((size_t)m[i] + 1, sizeof(T));
  int rc = sw_matrix_state_forward(a[0], a[1], a[2], a[3], a[4], a[5], NULL, b[0], b[1], s[0], s[1], s[2], s[3], s[4]);
  rc |= sw_matrix_state_backward(a[0], a[1], a[2], a[3], a[4], a[5], NULL, a[6], a[7], b[2], b[3], b[4], b[5], b[6],
                                 b[7], s[0], s[1], s[2], s[3], s[4]);
  for (int i = 0; i < 8; ++i) fwrite(b[i], sizeof(T), (size_t)m[i], stdout);
  return rc;
}
"""


@pytest.mark.skipif(GCC is None or QEMU is None, reason="needs aarch64-linux-gnu-gcc and qemu-aarch64 "
                    "(Debian: gcc-aarch64-linux-gnu, qemu-user)")
@pytest.mark.parametrize("decay,readout,dtype", [("key", "bonus", "float64"), ("scalar", "after", "float32")])
def test_arm64_build_matches(cpu, tmp_path, decay, readout, dtype):  # noqa: F811
    rng = np.random.default_rng(64)
    f = MatrixStateFeatures(dtype, 6, 10, decay, readout, has_h0=True, has_dhlast=True)
    tol = 1e-12 if dtype == "float64" else 2e-6
    a, sizes = operands(rng, f, 2, 37, 4, 2, kinds=("decay", "reset", "growth", "tiny_huge"))
    want_o, want_h = loop_of(f, a)
    a["do"], a["dhlast"] = rng.normal(size=want_o.shape).astype(dtype), rng.normal(size=want_h.shape).astype(dtype)
    if "u" not in a:
        a["u"] = np.zeros(1, dtype)
    cfg = OP.resolve("c", {"algorithm": "chunked", "chunk": 7, "threads": 1, "width": 4}, {}, "test")
    units = [tmp_path / f"{part}.c" for part in ("forward", "backward")]
    for unit in units:
        unit.write_text(kernel_for("c", OP.name).render(None, OP.call(unit.stem, f, cfg)))
    (tmp_path / "main.c").write_text(DRIVER.replace("@T@", "double" if dtype == "float64" else "float"))
    exe = tmp_path / "kernel"
    subprocess.run([GCC, "-O2", "-static", "-fno-math-errno", "-o", str(exe), *map(str, units),
                    str(tmp_path / "main.c"), "-lm"], check=True, capture_output=True)
    shapes = {"o": want_o.shape, "hlast": want_h.shape, "dq": a["q"].shape, "dk": a["k"].shape, "dv": a["v"].shape,
              "dg": a["g"].shape, "du": a["u"].shape, "dh0": a["h0"].shape}
    header = np.array([sizes[n] for n in ("batch", "T", "H", "Hq", "nseq")] + [a[n].size for n in INPUTS]
                      + [int(np.prod(shapes[n])) for n in OUTPUTS], np.int64)
    blob = header.tobytes() + b"".join(np.ascontiguousarray(a[n], dtype).tobytes() for n in INPUTS)
    run = subprocess.run([QEMU, str(exe)], input=blob, capture_output=True, check=True, timeout=300)
    flat = np.frombuffer(run.stdout, dtype)
    got, at = {}, 0
    for n in OUTPUTS:
        size = int(np.prod(shapes[n]))
        got[n], at = flat[at:at + size].reshape(shapes[n]), at + size
    np.testing.assert_allclose(got["o"], want_o, rtol=0, atol=tol * np.abs(want_o).max())
    np.testing.assert_allclose(got["hlast"], want_h, rtol=0, atol=tol * np.abs(want_h).max())
    here = fused(cpu, f, {n: a[n] for n in INPUTS if n != "u" or readout == "bonus"}, sizes, "backward",
                 algorithm="chunked", chunk=7, threads=1)
    for n in ("dq", "dk", "dv", "dg", "dh0") + (("du",) if readout == "bonus" else ()):
        np.testing.assert_allclose(got[n], here[n], rtol=0, atol=10 * tol * max(1.0, np.abs(here[n]).max()), err_msg=n)
