"""The fused Mamba-1 C kernels built for ARM64 (GCC, and Clang as a cross compiler) and run under qemu,
and built by Clang for this x86 machine (its AVX-512/AVX paths).

Each unit is linked statically with a small driver that reads the kernel's arguments from stdin
(in the ABI order of :meth:`Mamba1.params`) and writes its outputs to stdout; NEON widths (16-byte
vectors: the ``vrndn``/``vmax`` path) and a 32-byte width (the portable path) are both checked,
forward and backward, against the NumPy definition in float64.
"""

from __future__ import annotations

import shutil
import struct
import subprocess

import numpy as np
import pytest

from scanweaver import mamba
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.mamba1 import backward_reference, forward_reference
from scanweaver.runtime import cflags
from scanweaver.targets.fused import kernel_for

from mamba_oracle import extras, operands

GCC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64")
#: What each build needs, and where to get it.
NEEDS = {"gcc": ("aarch64-linux-gnu-gcc", "qemu-aarch64"), "clang": ("clang", "aarch64-linux-gnu-gcc", "qemu-aarch64"),
         "clang-x86": ("clang",)}

DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
int sw_mamba1_@PART@(@DECL@);
static void rd(void* p, size_t n) { if (n && fread(p, 1, n, stdin) != n) exit(2); }
int main(void) {
  int64_t sizes[5], nb[@NPTR@], mode[@NPTR@];
  void* p[@NPTR@];
  rd(sizes, sizeof sizes);
  for (int i = 0; i < @NPTR@; ++i) {
    rd(&nb[i], 8); rd(&mode[i], 8);
    p[i] = NULL;
    if (mode[i] == 0) continue;
    p[i] = aligned_alloc(64, (size_t)(nb[i] + 64) / 64 * 64);
    if (mode[i] == 1) rd(p[i], (size_t)nb[i]);
  }
  const int rc = sw_mamba1_@PART@(@ARGS@);
  fwrite(&rc, 4, 1, stdout);
  for (int i = 0; i < @NPTR@; ++i) if (mode[i] == 2) fwrite(p[i], 1, (size_t)nb[i], stdout);
  return 0;
}
"""


def build(tmp_path, part: str, features, width: int, compiler: list[str]):
    op = FUSED.get("mamba1")
    params = op.params(part)
    ptrs = [p for p in params if p.kind != "int"]
    call = op.call(part, features, {"chunk": 16, "width": width, "threads": 2})
    unit = kernel_for("c", "mamba1").render(None, call)
    decl = ", ".join(["void*"] * len(ptrs) + ["long"] * 5)
    args = ", ".join([f"p[{i}]" for i in range(len(ptrs))] + [f"(long)sizes[{i}]" for i in range(5)])
    driver = DRIVER.replace("@PART@", part).replace("@DECL@", decl).replace("@ARGS@", args) \
        .replace("@NPTR@", str(len(ptrs)))
    (tmp_path / "unit.c").write_text(unit)
    (tmp_path / "driver.c").write_text(driver)
    exe = tmp_path / f"{part}-{width}-{features.dtype}"
    proc = subprocess.run([*compiler, "-O2", *cflags.DIAGNOSTIC_FLAGS, "-static", str(tmp_path / "unit.c"),
                           str(tmp_path / "driver.c"), "-o", str(exe), "-lm"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe, ptrs


def run(exe, ptrs, arrays: dict, sizes: dict, runner: list[str]) -> dict:
    blob = struct.pack("<5q", *(sizes[k] for k in ("batch", "dim", "L", "groups_b", "groups_c")))
    outs = []
    for p in ptrs:
        a = arrays.get(p.name)
        if a is None:
            blob += struct.pack("<2q", 0, 0)
        elif p.kind == "out":
            blob += struct.pack("<2q", a.nbytes, 2)
            outs.append((p.name, a))
        else:
            blob += struct.pack("<2q", a.nbytes, 1) + np.ascontiguousarray(a).tobytes()
    proc = subprocess.run([*runner, str(exe)], input=blob, capture_output=True, timeout=300)
    assert proc.returncode == 0 and struct.unpack("<i", proc.stdout[:4])[0] == 0, proc.stderr[-2000:]
    got, at = {}, 4
    for name, a in outs:
        got[name] = np.frombuffer(proc.stdout[at:at + a.nbytes], a.dtype).reshape(a.shape)
        at += a.nbytes
    return got


@pytest.mark.parametrize("compiler, dtype, width", [
    ("gcc", "float32", 4), ("gcc", "float64", 2), ("gcc", "float32", 8),
    ("clang", "float32", 4), ("clang-x86", "float32", 16), ("clang-x86", "float64", 4),
])
def test_fused_kernels_built_elsewhere_match_the_definition(tmp_path, rng, compiler, dtype, width):
    missing = [t for t in NEEDS[compiler] if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (Debian: gcc-aarch64-linux-gnu qemu-user clang)")
    runner = [QEMU]
    if compiler.startswith("clang"):
        # without OpenMP (no ARM64 libomp here; libomp-dev optional on x86): one thread
        cc = ["clang", "--target=aarch64-linux-gnu"] if compiler == "clang" else ["clang", "-march=native"]
        runner = [QEMU] if compiler == "clang" else []
    else:
        cc = [GCC, "-fopenmp"]
    batch, Dm, N, L = 2, 6, 5, 37
    ops = operands(rng, batch, Dm, N, L, "group", "fixed", groups=3, dtype=dtype)
    ext = extras(rng, batch, Dm, N, L, dtype=dtype)
    prep = mamba.prepare(**ops, **ext, cu_seqlens=[0, 20, L])
    feats = prep.features(has_dhlast=True)
    wide = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype != np.uint8 else v)
            for k, v in prep.arrays().items()}
    ey, eh = forward_reference(wide["u"], wide["delta"], wide["A"], wide["B"], wide["C"], wide["D"], wide["z"],
                               wide["delta_bias"], True, wide["h0"], prep.reset)
    exe, ptrs = build(tmp_path, "forward", feats, width, cc)
    got = run(exe, ptrs, {**prep.arrays(), "y": np.empty_like(prep.u), "hlast": np.empty_like(prep.h0)},
              prep.sizes, runner)
    tol = {"float32": 2e-5, "float64": 1e-12}[dtype]
    np.testing.assert_allclose(got["y"], ey, rtol=tol, atol=tol * np.abs(ey).max())
    np.testing.assert_allclose(got["hlast"], eh, rtol=tol, atol=tol * np.abs(eh).max())
    dout, dh = (rng.standard_normal(s).astype(dtype) for s in (prep.u.shape, prep.h0.shape))
    want = backward_reference(wide["u"], wide["delta"], wide["A"], wide["B"], wide["C"], wide["D"], wide["z"],
                              wide["delta_bias"], True, wide["h0"], prep.reset, dout=dout.astype(np.float64),
                              dhlast=dh.astype(np.float64))
    exe, ptrs = build(tmp_path, "backward", feats, width, cc)
    outs = {k: np.empty(np.shape(want[k]), dtype) for k in want}
    got = run(exe, ptrs, {**prep.arrays(), "dout": dout, "dhlast": dh, **outs}, prep.sizes, runner)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=50 * tol, atol=50 * tol * max(1.0, np.abs(v).max()), err_msg=k)
