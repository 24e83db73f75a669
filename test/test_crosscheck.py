"""The cpu backend's C kernels on ARM64 (GCC and Clang, run under qemu) and built by Clang on x86.

Each toolchain builds every kernel of :func:`scanweaver.tools.crosscheck_jobs.jobs` (scans, the fused
backward of gradients, fused operations) into one executable with a small C driver and runs all of them
against the float64 oracle, on the golden vectors where they apply.  CI installs the
tools (``.ci/run``) and sets ``SCANWEAVER_REQUIRE_CROSS=1``, so that a missing tool fails there instead of
skipping.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil

import numpy as np
import pytest

from scanweaver.ir.functions import FUNCTIONS
from scanweaver.runtime import cflags
from scanweaver.runtime.host import cpu_flags
from scanweaver.targets.c_target import MAX_DENSE_STATE
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.tools import crosscheck, crosscheck_jobs, golden

#: name -> (compiler command, runner, executables that must exist).  Every vector width of the chunked
#: kernel runs in every test run: 16 bytes (NEON's own) with GCC, 32 with Clang on ARM64, 64 with Clang on
#: x86 (AVX-512 where the CPU has it, two AVX2 halves elsewhere), and the machine's own in the rest of the suite.
TOOLCHAINS = {
    "aarch64-gcc-qemu": (["aarch64-linux-gnu-gcc", "-O3", "-static", "-fopenmp"], ["qemu-aarch64"],
                         ("aarch64-linux-gnu-gcc", "qemu-aarch64")),
    "aarch64-clang-qemu-32": (["clang", "--target=aarch64-linux-gnu", "-O3", "-static", "-DSW_VBYTES=32"],
                              ["qemu-aarch64"], ("clang", "aarch64-linux-gnu-gcc", "qemu-aarch64")),
    "x86-clang-64": (["clang", "-O3", "-march=native", "-DSW_VBYTES=64"], [], ("clang",)),
    # the x86 machines of other kinds, natively: AVX2 (32-byte vectors) and the SSE2 baseline (16 bytes)
    "x86-gcc-avx2": (["gcc", "-O3", "-march=haswell", "-fopenmp"], [], ("gcc",)),
    "x86-gcc-sse2": (["gcc", "-O3", "-march=x86-64", "-fopenmp"], [], ("gcc",)),
}


@pytest.fixture(scope="module")
def jobs():
    return crosscheck_jobs.jobs()


def _require(tools: tuple[str, ...]) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        why = f"{', '.join(missing)} not installed (Debian: gcc-aarch64-linux-gnu qemu-user clang libomp-dev)"
        if os.environ.get("SCANWEAVER_REQUIRE_CROSS"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.mark.parametrize("name", list(TOOLCHAINS))
def test_every_kernel_matches_the_oracle(name, jobs):
    compiler, runner, tools = TOOLCHAINS[name]
    _require(tools)
    if name.startswith("x86-gcc"):
        if platform.machine().lower() not in ("x86_64", "amd64"):
            pytest.skip(f"builds for x86-64 and runs natively; this machine is {platform.machine()}")
        if name.endswith("avx2") and not {"avx2", "fma"} <= set(cpu_flags().split()):
            pytest.skip("this CPU has no AVX2/FMA to run the AVX2 build")
    omp = ["-shared", "-fPIC", "-fopenmp"]
    if name.startswith("x86-clang") and cflags.accepts(["clang"], omp, cflags.PROBE_SOURCE)[0]:  # libomp present
        compiler = [*compiler, "-fopenmp"]
    n, bad = crosscheck.check([*compiler, *cflags.DIAGNOSTIC_FLAGS], runner, jobs)
    assert n == len(jobs)
    assert not bad, "\n".join(bad)


def _exprs(aff):
    out = aff.output
    for e in (aff.A, aff.U, out.new, out.old, out.const):
        yield from (e if isinstance(e, tuple) else (e,))


def test_the_jobs_cover_every_kernel_variant(jobs):
    stages = [j.stages for j in jobs if j.stages is not None]
    assert {(s.schedule.schedule, s.affine.dtype) for s in stages} == {
        (sched, dt) for sched in ("chunked", "sequential") for dt in ("float32", "float64")}
    assert {s.affine.state_size for s in stages} == set(range(1, MAX_DENSE_STATE + 1))
    for sched in ("chunked", "sequential"):
        for dense in (False, True):
            feats = [s.affine.features for s in stages
                     if s.schedule.schedule == sched and (s.affine.state_size > 1) == dense]
            for field in ("reverse", "has_h0", "has_reset"):
                assert {getattr(f, field) for f in feats} == {False, True}, (sched, dense, field)
    called = {n.name for s in stages for e in _exprs(s.affine) for n in e.walk() if n.op == "call"}
    assert called == set(FUNCTIONS)
    outputs = [s.affine.output for s in stages if s.affine.state_size == 1]
    assert any(o.is_identity for o in outputs)
    assert any(o.old.inputs() and o.const.inputs() for o in outputs)
    layouts = {(s.schedule.schedule, s.affine.state_size > 1, layout) for s in stages
               for _, layout in s.affine.features.operands}
    assert layouts == {(sched, dense, layout) for sched in ("chunked", "sequential") for dense in (False, True)
                       for layout in ("scalar", "lane")}
    configs = [s.schedule.config for s in stages if s.schedule.schedule == "chunked"]
    assert {c["threads"] for c in configs} == {1, 2} and {c["interleave"] for c in configs} == {1, 2, 4}
    assert {j.name.split()[1] for j in jobs if j.name.startswith("golden")} == {c.name for c in golden.CASES}


def test_fused_and_backward_kernels_are_among_the_jobs(jobs):
    entries = {j.entry for j in jobs}
    assert "sw_backward" in entries
    for name in FUSED.names():
        for part in FUSED.get(name).implementations.get("c", ()):
            assert any(j.name.startswith(f"fused {name} {part}") for j in jobs), (name, part)
    assert all(j.expected for j in jobs)


def test_a_wrong_kernel_or_a_wrong_answer_is_reported(jobs):
    _require(("gcc",))
    picked = next(j for j in jobs if j.stages is not None and j.stages.schedule.schedule == "chunked"
                  and "golden basic_f32" in j.name)
    broken = picked.source.replace("h = A * h + U;", "h = A * h - U;").replace("u = a * us + u;", "u = a * us - u;")
    assert broken != picked.source
    bad_kernel = dataclasses.replace(picked, name="broken", source=broken)
    y_at = min(picked.expected)
    y = np.array(picked.expected[y_at], np.float64)
    y.flat[5] += 0.01
    wrong_answer = dataclasses.replace(picked, name="wrong", expected={**picked.expected, y_at: y})
    n, bad = crosscheck.check(["gcc", "-O2"], [], [picked, bad_kernel, wrong_answer])
    assert n == 3 and [line.split(":")[0] for line in bad] in (["broken", "broken", "wrong"], ["broken", "wrong"])
