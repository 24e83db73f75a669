"""Regression tests of the runtime under concurrency and untrusted cache directories.

Covers: compile locks with deadlines and per kernel (a stopped holder, a slow
compile of another kernel), the output pool's liveness without reference
counts (Python 3.14 counts one reference fewer), the plan caches' eviction
under threads, and the kernel cache's trust rules (private directories, a
planted library, symbolic links).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver.runtime import host_pool, private_dir, toolchain

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT / "python"), **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full)


@pytest.fixture(scope="module")
def tc():
    if toolchain.missing_reason():
        pytest.skip(f"no C compiler: {toolchain.missing_reason()}")
    return toolchain.find_toolchain()


# -- item: compile locks without deadlines ---------------------------------------------------------------------


def test_a_stopped_lock_holder_does_not_block_a_build_forever(tmp_path, tc):
    """Another process holds the kernel's lock and never lets go: the build goes ahead after the deadline."""
    source = "int sw_answer(void) { return 41; }"
    key = tc.key(source)
    (tmp_path / "c").mkdir(mode=0o700)
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, time
            fd = os.open({str(tmp_path / 'c' / f'sw_{key}.lock')!r}, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.lockf(fd, fcntl.LOCK_EX)  # the lock of this version
            fcntl.flock(fd, fcntl.LOCK_EX)  # and the one earlier versions took
            print('held', flush=True)
            time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        proc = _python(f"""
            from scanweaver.runtime import toolchain
            toolchain.LOCK_TIMEOUT_S = 1.0
            import ctypes
            lib = ctypes.CDLL(str(toolchain.find_toolchain().build({source!r})))
            print(lib.sw_answer())
        """, timeout=60, env={"SCANWEAVER_CACHE_DIR": str(tmp_path)})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "41"
        assert "without the lock" in proc.stderr
    finally:
        holder.kill()
        holder.wait()


def test_threads_loading_different_kernels_do_not_wait_for_each_other(tmp_path, monkeypatch, tc):
    """While one kernel's compile is stuck, another thread loads a different kernel."""
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    release, started = threading.Event(), threading.Event()
    slow_source = "int sw_slow(void) { return 1; }"
    real = toolchain.Toolchain._compile

    def compile_(self, src, out, extra_flags=()):
        if "sw_slow" in Path(src).read_text():
            started.set()
            release.wait(60)
        return real(self, src, out, extra_flags)

    monkeypatch.setattr(toolchain.Toolchain, "_compile", compile_)
    slow = threading.Thread(target=lambda: tc.load(slow_source))
    slow.start()
    try:
        assert started.wait(60)
        done: list[int] = []
        fast = threading.Thread(target=lambda: done.append(tc.load("int sw_fast(void) { return 7; }").sw_fast()))
        fast.start()
        fast.join(30)
        assert done == [7], "loading a second kernel waited for another kernel's compile"
    finally:
        release.set()
        slow.join(60)


# -- item: the output pool's liveness ---------------------------------------------------------------------------


def _count_like_python_314(monkeypatch) -> None:
    """``sys.getrefcount`` as Python 3.14 reports it: one fewer for a local (and one fewer for this wrapper's
    own argument)."""
    real = sys.getrefcount
    monkeypatch.setattr(sys, "getrefcount", lambda obj: real(obj) - 2)


def test_pool_keeps_a_held_result_when_reference_counts_read_one_lower(monkeypatch):
    """Python 3.14 reports one reference fewer for locals; a held array must never be handed out again."""
    _count_like_python_314(monkeypatch)
    pool = host_pool.HostPool(1 << 24)
    held = pool.empty((64, 64), np.float32)
    held[...] = 3.0
    again = pool.empty((64, 64), np.float32)
    again[...] = -1.0
    assert not np.shares_memory(held, again)
    assert float(held.min()) == 3.0


def test_pool_reuses_a_buffer_once_every_view_of_it_is_gone():
    pool = host_pool.HostPool(1 << 24)
    first = pool.empty((128, 64), np.float32)
    address = first.ctypes.data
    view = first.reshape(-1)[10:]
    del first
    assert pool.empty((128, 64), np.float32).ctypes.data != address, "reused while a view was alive"
    del view
    assert pool.empty((128, 64), np.float32).ctypes.data == address, "a dead buffer was not reused"
    assert pool.nbytes == 2 * 128 * 64 * 4


def test_repeated_plan_calls_never_overwrite_a_held_result(monkeypatch, rng):
    """The pooled ``y`` of a repeated call (a plan) while the caller holds the previous ``y``."""
    _count_like_python_314(monkeypatch)
    shape = (16, 8192)  # large enough for the pool
    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    first = [scanweaver.selective_scan(a, b, b, a, backend="numpy") for _ in range(2)][-1]
    expect = first.copy()
    second = scanweaver.selective_scan(a, 2 * b, b, a, backend="numpy")
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, expect)


# -- item: plan-cache eviction under threads --------------------------------------------------------------------


def test_plan_caches_evict_safely_from_many_threads():
    """Threads inserting past ``MAX_PLANS`` (1 us switch interval) never see an error from the cache."""
    proc = _python("""
        import sys, threading
        import numpy as np
        import scanweaver
        from scanweaver.core import fastpath
        fastpath.MAX_PLANS = 2
        sys.setswitchinterval(1e-6)
        errors = []
        shapes = [(2, n) for n in range(3, 11)]
        ops = {s: [np.full(s, 0.5, np.float32)] * 4 for s in shapes}
        cache = fastpath.PlanCache()
        def work(k):
            try:
                for i in range(600):
                    s = shapes[(i + k) % len(shapes)]
                    scanweaver.selective_scan(*ops[s], backend="numpy")
                    cache.put((k, i % 5), i)
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert len(cache) <= fastpath.MAX_PLANS, len(cache)
        print("errors", len(errors), errors[:3])
    """, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "errors 0 []", proc.stdout


# -- item: the kernel cache's trust rules -----------------------------------------------------------------------

PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void sw_planted(void) {
  FILE *f = fopen(getenv("SW_PLANTED_MARK"), "w"); if (f) { fputs("ran", f); fclose(f); }
}
"""


def _plant(tc, directory: Path, source: str, mark: Path) -> None:
    """Builds a library with a constructor and places it (with a matching checksum) under ``source``'s name."""
    import hashlib

    evil = directory.parent / "evil.c"
    evil.write_text(PLANTED + source)
    lib = directory / f"sw_{tc.key(source)}{tc.suffix}"
    subprocess.run([*tc.command, *tc.flags, str(evil), "-o", str(lib)], check=True, capture_output=True)
    lib.with_suffix(".sha256").write_text(hashlib.sha256(lib.read_bytes()).hexdigest())


@pytest.mark.skipif(os.name != "posix", reason="ownership and modes are POSIX")
def test_a_library_planted_in_a_world_writable_cache_is_never_loaded(tmp_path, tc):
    cache = tmp_path / "shared-cache"
    (cache / "c").mkdir(parents=True)
    os.chmod(cache / "c", 0o777)
    source = "int sw_answer(void) { return 42; }"
    mark = tmp_path / "mark"
    _plant(tc, cache / "c", source, mark)
    proc = _python(f"""
        import warnings
        from scanweaver.runtime import toolchain
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            print(toolchain.find_toolchain().load({source!r}).sw_answer())
        print(any("writable by its group or by others" in str(x.message) for x in w))
    """, timeout=120, env={"SCANWEAVER_CACHE_DIR": str(cache), "SW_PLANTED_MARK": str(mark)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["42", "True"]
    assert not mark.exists(), "the planted library's constructor ran"


@pytest.mark.skipif(os.name != "posix", reason="ownership and modes are POSIX")
def test_cache_directories_are_created_private_and_links_are_not_followed(tmp_path, monkeypatch, tc):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path / "fresh" / "cache"))
    source = "int sw_linked(void) { return 5; }"
    directory = toolchain.cache_dir() / "c"
    lib = tc.build(source)
    assert lib.parent == directory
    for d in (directory, directory.parent, directory.parent.parent):
        assert d.stat().st_mode & 0o777 == 0o700, oct(d.stat().st_mode)
    target = tmp_path / "elsewhere.so"
    target.write_bytes(lib.read_bytes())
    lib.unlink()
    lib.symlink_to(target)  # a link with a matching checksum beside it
    assert not toolchain._verified(lib)
    with pytest.raises(OSError):
        private_dir.read_bytes(lib)
    other = tmp_path / "victim.txt"
    other.write_text("keep")
    src = directory / f"sw_{tc.key('int sw_other(void) { return 6; }')}.c"
    src.symlink_to(other)  # a planted source link: the build must not write through it
    assert tc.load("int sw_other(void) { return 6; }").sw_other() == 6
    assert other.read_text() == "keep"


def test_a_directory_owned_by_someone_else_is_refused(monkeypatch, tmp_path):
    """Simulated ownership: a uid other than ours owns the directory."""
    if os.name != "posix":
        pytest.skip("ownership is POSIX")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    with pytest.warns(RuntimeWarning, match="owned by uid"):
        got = private_dir.private_directory(tmp_path / "c")
    assert got != tmp_path / "c"
