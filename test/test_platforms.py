"""The toolchain on every platform: flags probed from the compilers' answers, vector width, host facts.

Where a compiler can answer here it does (gcc, clang, aarch64-linux-gnu-gcc, and clang compiling for
``arm64-apple-macos``); what only a Mac can answer is recorded: Apple clang refuses ``-fopenmp``
("clang: error: unsupported option '-fopenmp'"), takes ``-Xpreprocessor -fopenmp``, and ld64 cannot
link ``-lomp`` without a library directory that holds ``libomp.dylib``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from scanweaver.runtime import cflags, host, toolchain
from scanweaver.runtime.cflags import Host
from scanweaver.targets.c_chunked import VECTOR_BYTES

MAC = Host("Darwin", "arm64")
#: The diagnostics every accepting compiler gets right after -O3.
DIAG = cflags.DIAGNOSTIC_FLAGS
#: Recorded: ``clang --version`` of Xcode 15's command-line tools on an Apple M2.
APPLE_CLANG_VERSION = ("Apple clang version 15.0.0 (clang-1500.3.9.4)\nTarget: arm64-apple-darwin23.4.0\n"
                       "Thread model: posix\nInstalledDir: /Library/Developer/CommandLineTools/usr/bin")


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")


def apple_clang(sdk: Path, mcpu_native: bool = True):
    """``check`` answering as Apple clang on Apple Silicon: recorded driver and linker answers,
    the compile itself by the real clang for the ``arm64-apple-macos11`` target (against a stand-in
    for the macOS SDK's ``math.h`` in ``sdk``: the SDK itself is not here)."""
    need("clang")
    sdk.mkdir(exist_ok=True)
    (sdk / "math.h").write_text("double sqrt(double);\nfloat sqrtf(float);\n")

    def check(command, flags, source):
        flags = list(flags)
        if "-fopenmp" in flags and "-Xpreprocessor" not in flags:
            return False, "clang: error: unsupported option '-fopenmp'"
        if "-march=native" in flags:
            return False, "clang: error: the clang compiler does not support '-march=native'"
        if "-mcpu=native" in flags and not mcpu_native:
            return False, "clang: error: the clang compiler does not support '-mcpu=native'"
        libdirs = [Path(f[2:]) for f in flags if f.startswith("-L")]
        if "-lomp" in flags and not any((d / "libomp.dylib").exists() for d in libdirs):
            return False, "ld: library not found for -lomp\nclang: error: linker command failed with exit code 1"
        compile_only = [f for f in flags if f not in ("-dynamiclib", "-mcpu=native", "-lomp")
                        and not f.startswith("-L")]
        return _compile(["clang", "--target=arm64-apple-macos11", "-isystem", str(sdk), *compile_only], source)

    return check


def _compile(cmd: list[str], source: str) -> tuple[bool, str]:
    proc = subprocess.run([*cmd, "-x", "c", "-c", "-", "-o", "/dev/null"], input=source, capture_output=True,
                          text=True, timeout=120)
    return proc.returncode == 0, proc.stderr


def homebrew_libomp(root: Path) -> Path:
    """A Homebrew prefix with libomp's layout: ``opt/libomp/include/omp.h`` and ``opt/libomp/lib/libomp.dylib``."""
    prefix = root / "opt" / "libomp"
    (prefix / "include").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "include" / "omp.h").write_text("int omp_get_max_threads(void);\nint omp_get_thread_num(void);\n")
    (prefix / "lib" / "libomp.dylib").write_bytes(b"")
    return prefix


def test_macos_arm64_apple_clang_with_homebrew_libomp(tmp_path):
    prefix = homebrew_libomp(tmp_path)
    found = cflags.probe(["cc"], MAC, apple_clang(tmp_path / "sdk"), env={"HOMEBREW_PREFIX": str(tmp_path)})
    assert found.flags == ("-dynamiclib", "-fPIC", "-fno-math-errno", "-O3", *DIAG, "-mcpu=native", "-Xpreprocessor",
                           "-fopenmp", f"-I{prefix}/include", f"-L{prefix}/lib", "-lomp")
    assert found.openmp == f"Homebrew libomp at {prefix}" and not found.notes and not found.missing


def test_macos_without_libomp_runs_one_thread_and_says_how_to_get_more(tmp_path):
    check = apple_clang(tmp_path / "sdk", mcpu_native=False)
    found = cflags.probe(["cc"], MAC, check, env={"HOMEBREW_PREFIX": str(tmp_path)})
    # neither native form: generic ARMv8
    assert found.flags == ("-dynamiclib", "-fPIC", "-fno-math-errno", "-O3", *DIAG)
    assert found.openmp == "" and "brew install libomp" in found.notes[0] and "one thread" in found.notes[0]


def test_homebrew_prefixes_are_searched_in_order(tmp_path):
    assert cflags.libomp_prefixes(Host("Linux", "x86_64"), {"HOMEBREW_PREFIX": str(tmp_path)}) == []
    assert cflags.libomp_prefixes(MAC, {"HOMEBREW_PREFIX": str(tmp_path)}) == [
        Path(p) for p in cflags.LIBOMP_PREFIXES if (Path(p) / "include" / "omp.h").is_file()]
    prefix = homebrew_libomp(tmp_path)
    assert cflags.libomp_prefixes(MAC, {"HOMEBREW_PREFIX": str(tmp_path)})[0] == prefix


def test_gcc_here():
    need("gcc")
    found = cflags.probe([shutil.which("gcc")], Host.current())
    if Host.current().arm64:
        assert found.flags[:6] == ("-shared", "-fPIC", "-fno-math-errno", "-O3", *DIAG)
    else:
        assert found.flags == ("-shared", "-fPIC", "-fno-math-errno", "-O3", *DIAG, "-march=native", "-fopenmp")
    assert found.openmp == "-fopenmp"


def test_clang_here():
    need("clang")
    found = cflags.probe(["clang"], Host.current())
    assert found.flags[:7] == ("-shared", "-fPIC", "-fno-math-errno", "-O3", *DIAG, "-march=native")
    omp_header = subprocess.run(["clang", "-fopenmp", "-x", "c", "-E", "-"], input=b"#include <omp.h>\n",
                                capture_output=True).returncode == 0
    assert (found.openmp == "-fopenmp") == (omp_header and found.flags[-1] == "-fopenmp")
    assert bool(found.notes) == (found.openmp == "")


def test_linux_arm64_gcc_takes_no_native_form_it_cannot_resolve():
    """aarch64-linux-gnu-gcc on this x86 machine rejects both native forms (there is no Arm CPU to ask),
    so the probe falls back to generic ARMv8 code, still with OpenMP."""
    need("aarch64-linux-gnu-gcc")
    found = cflags.probe(["aarch64-linux-gnu-gcc"], Host("Linux", "aarch64"))
    assert found.flags == ("-shared", "-fPIC", "-fno-math-errno", "-O3", *DIAG, "-fopenmp")


def test_a_compiler_without_vector_extensions_is_refused_with_the_reason():
    """MSVC-like answers: the vector probe fails, nothing else is tried, and the reason names the fix."""
    tried = []

    def msvc(command, flags, source):
        tried.append(tuple(flags))
        return False, "vec.c(2): error C2146: syntax error: missing ';' before identifier 'sw_v4'"

    found = cflags.probe(["cl"], Host("Windows", "AMD64"), msvc)
    assert tried == [("-shared", "-fno-math-errno")]
    assert "lacks GCC vector extensions" in found.missing and "not MSVC's cl" in found.missing
    assert "error C2146" in found.missing


def test_windows_without_a_compiler_says_what_to_install(monkeypatch):
    monkeypatch.setattr(toolchain.Host, "current", staticmethod(lambda: Host("Windows", "AMD64")))
    monkeypatch.setattr(toolchain, "_compiler_command", lambda: None)
    monkeypatch.delenv("CC", raising=False)
    why = toolchain.missing_reason()
    assert "MSVC's cl" in why and "LLVM (clang) or MinGW-w64 (gcc)" in why


@pytest.mark.parametrize("compiler,flags,want", [
    ("gcc", ["-march=x86-64"], 16), ("gcc", ["-mavx2"], 32), ("gcc", ["-mavx512f"], 64),
    ("clang", ["-mavx512f"], 64), ("aarch64-linux-gnu-gcc", [], 16),
    ("clang", ["--target=aarch64-linux-gnu"], 16), ("clang", ["--target=arm64-apple-macos11"], 16),
    ("gcc", ["-mavx512f", "-DSW_VBYTES=32"], 32),
])
def test_the_chunked_kernel_picks_the_vector_width_of_its_target(compiler, flags, want):
    need(compiler)
    tc = toolchain.Toolchain((compiler,), tuple(flags), "")
    text = tc.preprocess(VECTOR_BYTES + "\nsw_vector_bytes = SW_VBYTES;\n")
    assert f"sw_vector_bytes = {want};" in text


def test_host_facts_the_macos_way(monkeypatch):
    answers = {"machdep.cpu.brand_string": "Apple M2", "hw.logicalcpu": "8", "hw.perflevel0.logicalcpu": "4",
               "hw.perflevel1.logicalcpu": "4"}
    monkeypatch.setattr(host, "sysctl", answers.get)
    monkeypatch.setattr(host.os, "sched_getaffinity", None, raising=False)
    monkeypatch.delattr(host.os, "sched_getaffinity")
    assert host.cpu_model(MAC) == "Apple M2"
    assert host.cpu_threads(MAC) == 8
    assert host.core_kinds(MAC) == "4 performance + 4 efficiency"
    assert host.core_kinds(Host("Linux", "x86_64")) == ""
    assert MAC.library_suffix == ".dylib" and Host("Windows", "AMD64").library_suffix == ".dll"


def test_devices_report_the_vector_isa_and_openmp():
    from scanweaver.runtime import REGISTRY

    if not REGISTRY["cpu"].availability().ok:
        pytest.skip(f"cpu backend unavailable: {REGISTRY['cpu'].availability().reason}")
    details = REGISTRY["cpu"]().details()
    isa, vbytes = toolchain.vector_isa()
    assert details["vectors"] == f"{isa}, {vbytes}-byte vectors in the chunked kernel"
    assert isa in {name for _, name in host.ISAS} | {"generic"} and vbytes in (16, 32, 64)
    tc = toolchain.find_toolchain()
    assert details["flags"] == " ".join(tc.flags)
    assert details["openmp"] == ("yes" if tc.openmp else "; ".join(tc.notes))


def test_one_notice_when_kernels_cannot_use_every_core(monkeypatch):
    import warnings

    from scanweaver.runtime import cpu_backend

    if toolchain.missing_reason():
        pytest.skip(f"no C compiler: {toolchain.missing_reason()}")
    real = toolchain.find_toolchain()
    note = cflags.single_thread_note(MAC)
    single = toolchain.Toolchain(real.command, tuple(f for f in real.flags if f != "-fopenmp"), real.identity,
                                 notes=(note,))
    monkeypatch.setattr(cpu_backend, "cpu_threads", lambda: 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            cpu_backend._single_thread_notice(single)
            cpu_backend._single_thread_notice(real)
    assert [str(w.message) for w in caught] == [f"scanweaver cpu backend: {note}"]


def test_opencl_limits_of_pocl_and_of_apple_silicon():
    from types import SimpleNamespace

    from scanweaver.runtime.opencl_backend import APPLE_NOTE, limits

    #: Recorded: what Apple's OpenCL reports for the GPU of an Apple M1 (clinfo).
    m1 = SimpleNamespace(version="OpenCL 1.2 ", max_work_group_size=256, local_mem_size=32768,
                         extensions="cl_APPLE_SetMemObjectDestructor cl_APPLE_ContextLoggingFunctions "
                                    "cl_APPLE_clut cl_APPLE_query_kernel_names cl_APPLE_gl_sharing cl_khr_gl_event "
                                    "cl_khr_byte_addressable_store cl_khr_global_int32_base_atomics "
                                    "cl_khr_global_int32_extended_atomics cl_khr_local_int32_base_atomics "
                                    "cl_khr_local_int32_extended_atomics cl_khr_3d_image_writes "
                                    "cl_khr_image2d_from_buffer cl_khr_depth_images")
    got = limits(SimpleNamespace(name="Apple"), m1)
    assert got["opencl"] == "OpenCL 1.2" and got["float64"] is False and got["max_workgroup"] == 256
    assert got["local_memory_kib"] == 32 and got["note"].startswith(APPLE_NOTE) and "cpu backend" in got["note"]
    pytest.importorskip("pyopencl", reason="pyopencl is not installed (pip install pyopencl)")
    from scanweaver.runtime import REGISTRY

    avail = REGISTRY["opencl"].availability()
    if not avail.ok:
        pytest.skip(f"opencl unavailable here: {avail.reason}")
    real = REGISTRY["opencl"]().details()
    assert real["opencl"].startswith("OpenCL") and real["max_workgroup"] >= 1 and "note" not in real
