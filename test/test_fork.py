"""A process forked after multi-threaded kernels ran must not hang in its next kernel.

GNU libgomp's thread pool does not survive ``fork``; the child runs its kernels on one thread
(:mod:`scanweaver.runtime.forksafe`) and says so once.  Every check runs in a subprocess with a timeout: a hang
fails the test instead of stopping the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scanweaver.runtime import toolchain

SCRIPT = r"""
import json, multiprocessing as mp, os, sys
import numpy as np
import scanweaver

rng = np.random.default_rng(0)
a = rng.uniform(0.5, 1, (64, 4096)).astype(np.float32)
b, x, c = (rng.standard_normal((64, 4096)).astype(np.float32) for _ in range(3))
u = rng.standard_normal((1, 64, 256)).astype(np.float32)
dl = rng.uniform(0.1, 1, (1, 64, 256)).astype(np.float32)
A = -rng.uniform(0.5, 1, (64, 16)).astype(np.float32)
B, C = (rng.standard_normal((1, 16, 256)).astype(np.float32) for _ in range(2))

def kernels():
    y = scanweaver.selective_scan(a, b, x, c, backend="cpu", schedule="chunked", threads=2)
    m = scanweaver.mamba_selective_scan(u, dl, A, B, C, backend="cpu", threads=2)
    return float(y.sum()), float(m.sum())

want = kernels()  # the parent runs both kernels on two threads: libgomp's pool now exists

def child_check(_=None):
    return kernels()

how = sys.argv[1]
if how == "fork":
    pid = os.fork()
    if pid == 0:
        got = kernels()
        os._exit(0 if np.allclose(got, want, rtol=1e-5) else 3)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": os.waitstatus_to_exitcode(status)}))
else:
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(child_check).get(timeout=60)
    print(json.dumps({"status": 0 if np.allclose(got, want, rtol=1e-5) else 3}))
"""


@pytest.mark.parametrize("how", ["fork", "multiprocessing"])
def test_a_child_forked_after_threaded_kernels_does_not_hang(how):
    if toolchain.missing_reason():
        pytest.skip(f"no C toolchain: {toolchain.missing_reason()}")
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{how}: the forked child hung in its first kernel after the fork")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": 0}
    assert proc.stderr.count("forked after compiled kernels ran") == 1, proc.stderr[-2000:]


MATRIX_SCRIPT = r"""
import json, os, sys
import numpy as np
import scanweaver

rng = np.random.default_rng(1)
B, T, H, K, V = 2, 512, 4, 32, 32
q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
v = rng.standard_normal((B, T, H, V)).astype(np.float32)
g = -rng.uniform(0.01, 0.5, (B, T, H, K)).astype(np.float32)

def run():
    return scanweaver.linear_attention(q, k, v, g=g, backend="cpu", threads=2)[0]

want = run()  # two threads in the parent: libgomp's pool now exists
pid = os.fork()
if pid == 0:
    os._exit(0 if np.allclose(run(), want, rtol=1e-5, atol=1e-6) else 3)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status)}))
"""


def test_a_child_forked_after_a_threaded_matrix_kernel_does_not_hang():
    """The matrix-state kernels read the same thread policy as the scans, so the fork cap reaches them."""
    if toolchain.missing_reason():
        pytest.skip(f"no C toolchain: {toolchain.missing_reason()}")
    try:
        proc = subprocess.run([sys.executable, "-c", MATRIX_SCRIPT], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the forked child hung in its first matrix-state kernel after the fork")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": 0}


THREADS_SCRIPT = r"""
import json, os
os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one processor: at most 4 threads on it
import numpy as np
import scanweaver

rng = np.random.default_rng(2)
B, T, H, K, V = 2, 512, 4, 16, 16
q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
v = rng.standard_normal((B, T, H, V)).astype(np.float32)
before = len(os.listdir("/proc/self/task"))
scanweaver.linear_attention(q, k, v, g_head=-rng.uniform(0, 1, (B, T, H)).astype(np.float32), backend="cpu",
                            threads=1024)
print(json.dumps({"started": len(os.listdir("/proc/self/task")) - before}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc/self/task"),
                    reason="needs Linux's sched_setaffinity and /proc/self/task to count threads")
def test_the_matrix_kernels_clamp_threads_to_four_per_processor():
    if toolchain.missing_reason():
        pytest.skip(f"no C toolchain: {toolchain.missing_reason()}")
    proc = subprocess.run([sys.executable, "-c", THREADS_SCRIPT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    started = json.loads(proc.stdout.strip().splitlines()[-1])["started"]
    assert started <= 4, f"threads=1024 on one processor started {started} OS threads (at most 4 per processor)"


OPENCL_SCRIPT = r"""
import json, os, signal
import numpy as np
import scanweaver
from scanweaver.errors import BackendUnavailable

a = np.full((2, 8), 0.5, np.float32)
b = np.ones((2, 8), np.float32)
want = scanweaver.selective_scan(a, b, b, backend="opencl")  # OpenCL (PoCL's threads) started in the parent
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hanging child ends instead of outliving the test
    try:
        scanweaver.selective_scan(a, b, b, backend="opencl")
        os._exit(3)  # the device threads are gone in the child: a call must not run, let alone hang
    except BackendUnavailable as exc:
        if "forked" not in str(exc) or "spawn" not in str(exc):
            os._exit(4)
    got = scanweaver.selective_scan(a, b, b, backend="auto")  # auto passes OpenCL over
    os._exit(0 if np.allclose(got, want) else 5)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status)}))
"""


def test_a_child_forked_after_opencl_started_refuses_it_instead_of_hanging():
    """OpenCL does not survive fork (PoCL's first transfer in the child waited forever): the child refuses the
    backend, naming fork and the way out, and ``auto`` runs elsewhere."""
    from scanweaver.runtime import get_backend
    from scanweaver.errors import BackendUnavailable

    try:
        get_backend("opencl")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    try:
        proc = subprocess.run([sys.executable, "-c", OPENCL_SCRIPT], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the child forked after OpenCL started hung in its first OpenCL call")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": 0}, proc.stderr[-2000:]


POOL_SCRIPT = r"""
import json, os, sys
import numpy as np
import scanweaver
from scanweaver.runtime import host_pool

rng = np.random.default_rng(2)
B, T, H, K, V = 1, 512, 4, 32, 32  # o of 256 KiB: from the host pool
q, k = (rng.standard_normal((B, T, H, K)).astype(np.float32) for _ in range(2))
v = rng.standard_normal((B, T, H, V)).astype(np.float32)
g = -rng.uniform(0.01, 0.5, (B, T, H, K)).astype(np.float32)

def run():
    return scanweaver.linear_attention(q, k, v, g=g, backend="cpu", threads=1)[0]

want = run()
host_pool.POOL._lock.acquire()  # as if another thread were inside the pool when the fork happens
pid = os.fork()
if pid == 0:
    os._exit(0 if np.allclose(run(), want, rtol=1e-6, atol=1e-6) else 3)
_, status = os.waitpid(pid, 0)
host_pool.POOL._lock.release()
print(json.dumps({"status": os.waitstatus_to_exitcode(status)}))
"""


def _child_status_is_zero(script: str, timeout: float, hang: str) -> None:
    """Runs ``script`` (which forks and prints the child's exit status as JSON) in a subprocess: a hang past
    ``timeout`` fails with ``hang``; the child must have exited 0."""
    try:
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(hang)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": 0}


def test_a_child_forked_while_the_host_pool_is_locked_does_not_hang():
    """Another thread inside the host pool at the fork leaves its lock held in the child; the child takes a new
    one, so its first pooled output does not wait for ever."""
    if toolchain.missing_reason():
        pytest.skip(f"no C toolchain: {toolchain.missing_reason()}")
    _child_status_is_zero(POOL_SCRIPT, 120, "the forked child hung on the host pool's lock")


FILELOCK_SCRIPT = r"""
import json, os, pathlib, sys, tempfile, threading
from scanweaver.runtime.filelock import LockError, locked

path = pathlib.Path(tempfile.mkdtemp()) / "store.json"
inside, done = threading.Event(), threading.Event()

def writer():  # another thread of the parent holds the file's lock across the fork (a compile in progress)
    with locked(path, timeout=5):
        inside.set()
        done.wait(1)  # then lets it go: the child's lock of the file waits for the parent process until then

t = threading.Thread(target=writer)
t.start()
inside.wait(30)
pid = os.fork()
if pid == 0:
    try:
        with locked(path, timeout=5):
            path.write_text("{}")
        os._exit(0)
    except LockError:
        os._exit(3)
_, status = os.waitpid(pid, 0)
t.join()
print(json.dumps({"status": os.waitstatus_to_exitcode(status)}))
"""


def test_a_child_forked_while_a_thread_holds_a_file_lock_takes_the_lock():
    """A parent thread inside a file's writer lock at the fork, for one more second: the child takes the file's
    lock once the parent process lets it go (its parent's thread locks are not carried over, where the copy of
    the writer's would stay held in the child for ever, and the child would wait out its timeout and fail)."""
    _child_status_is_zero(FILELOCK_SCRIPT, 60, "the forked child hung on a file lock")
