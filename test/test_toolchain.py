"""The C toolchain and the compiled-kernel cache: keys, corruption, concurrency, failures."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import CompileError
from scanweaver.runtime import toolchain
from scanweaver.runtime.roofline import measure_roofline, roofline_ns_per_element
from scanweaver.targets.c_target import CRenderer

pytestmark = pytest.mark.skipif(toolchain.missing_reason() is not None,
                                reason=f"no C compiler: {toolchain.missing_reason()}")


def unique_source(value: int = 7) -> str:
    """A source no other test builds, so nothing has it loaded or cached yet."""
    return f"/* {uuid.uuid4().hex} */\nint sw_value(int v) {{ return v * {value}; }}\n"


@pytest.fixture
def tc():
    return toolchain.find_toolchain()


def test_flags_are_probed_and_key_covers_source_flags_and_compiler(tc):
    assert "-O3" in tc.flags and "-fPIC" in tc.flags
    assert tc.key("a") != tc.key("b")
    other = toolchain.Toolchain(tc.command, tuple(f for f in tc.flags if f != "-O3"), tc.identity)
    assert other.key("a") != tc.key("a")
    assert toolchain.Toolchain(tc.command, tc.flags, tc.identity + "x").key("a") != tc.key("a")


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch, tc):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    assert toolchain.cache_dir() == tmp_path
    lib = tc.build(unique_source())
    assert lib.parent == tmp_path / "c" and lib.with_suffix(".sha256").exists()


def test_corrupt_cache_entry_is_rebuilt_not_loaded(tmp_path, monkeypatch, tc):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    src = unique_source(3)
    lib = tc.build(src)
    lib.write_bytes(b"\x7fELF garbage, not a shared object" * 10)
    assert tc.load(src).sw_value(5) == 15
    assert tc.build(src) == lib and toolchain._verified(lib)


def test_half_written_entry_without_checksum_is_rebuilt(tmp_path, monkeypatch, tc):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    src = unique_source(4)
    lib = tc.build(src)
    lib.with_suffix(".sha256").unlink()
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    assert tc.load(src).sw_value(2) == 8


def test_compile_errors_carry_the_compiler_log(tmp_path, monkeypatch, tc):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    with pytest.raises(CompileError, match="sw_undeclared_thing"):
        tc.build("int f(void) { return sw_undeclared_thing; }")


def test_broken_compiler_script_gives_compile_error(tmp_path):
    script = tmp_path / "badcc"
    script.write_text("#!/bin/sh\necho 'badcc: out of cheese' >&2\nexit 1\n")
    script.chmod(0o755)
    broken = toolchain.Toolchain((str(script),), toolchain.BASE_FLAGS, "badcc")
    with pytest.raises(CompileError, match="out of cheese") as info:
        broken.build(unique_source(), tmp_path)
    assert "exit 1" in str(info.value)
    assert not list(tmp_path.glob("*.so"))


def test_two_processes_compiling_the_same_source_both_succeed(tmp_path):
    src = unique_source(11)
    code = textwrap.dedent(f"""
        from scanweaver.runtime.toolchain import find_toolchain
        print(find_toolchain().load({src!r}).sw_value(3))
    """)
    env = {**os.environ, "SCANWEAVER_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "33"
    assert len(list((tmp_path / "c").glob("*.so"))) == 1
    assert not list((tmp_path / "c").glob("*.tmp*"))


def test_kernel_tuner_variant_builds_as_c_and_cxx_and_times_itself(tmp_path, monkeypatch, tc):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    stages = scanweaver.api.SELECTIVE.lower(backend="cpu", schedule="chunked", dtype="float32")
    src = CRenderer().render(stages, kernel_tuner=True)
    assert 'extern "C"' in src and "float sw_scan_timed(" in src
    kt = "#define chunk 300\n#define interleave 4\n#define threads 1\n#define kernel_tuner 1\n" + src
    gxx = toolchain.shutil.which("g++")
    if gxx:
        cxx = tmp_path / "k.cc"
        cxx.write_text(kt)
        proc = subprocess.run([gxx, "-fsyntax-only", "-fopenmp", str(cxx)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    fn = tc.load(kt).sw_scan_timed
    fn.restype = ctypes.c_float
    rng = np.random.default_rng(0)
    lanes, L = 3, 1001
    a, b, x, c = (rng.uniform(0.5, 1.0, (lanes, L)).astype(np.float32) for _ in range(4))
    y, h0, hlast = np.empty_like(a), np.zeros(lanes, np.float32), np.empty(lanes, np.float32)
    reset = np.zeros((lanes, L), np.uint8)
    ptrs = [arr.ctypes.data_as(ctypes.c_void_p) for arr in (a, b, x, c, y, h0, hlast, reset)]
    ms = fn(*ptrs, ctypes.c_long(lanes), ctypes.c_long(L))
    assert ms > 0
    want = scanweaver.selective_scan(a.astype(np.float64), b, x, c, backend="numpy")
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_roofline_kernel_times_something(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    seconds = measure_roofline(8, 4099, "float32", repeats=3)
    assert 0 < seconds < 1
    assert roofline_ns_per_element(2, 1000, "float64", repeats=2) > 0
    with pytest.raises(scanweaver.ScanInputError, match="dtype"):
        measure_roofline(1, 1, "float16")
