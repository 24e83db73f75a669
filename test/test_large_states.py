"""Large state sizes N in the fused Mamba-1 kernels, called from a thread with a small stack.

The C kernels kept their N-state arrays on the stack and the GPU kernels keep them in private memory, so a
large N (or a small thread stack) crashed the interpreter.  Each check runs in a subprocess with a timeout:
a crash shows as a signal, never as a broken test run.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scanweaver.runtime import REGISTRY

SCRIPT = r"""
import json, sys, threading
import numpy as np
import scanweaver
from scanweaver import mamba
from scanweaver.calls import runner
from scanweaver.errors import ScanInputError
from scanweaver.fused.mamba1 import backward_reference, forward_reference

backend, part = sys.argv[1], sys.argv[2]
sizes = [int(n) for n in sys.argv[3].split(",")]
out = {}

def case(N):
    rng = np.random.default_rng(N)
    L = 8
    u, dl = rng.normal(size=(1, 2, L)), rng.uniform(0.1, 1, (1, 2, L))
    A, B, C = -rng.uniform(0.5, 1, (2, N)), rng.normal(size=(1, N, L)), rng.normal(size=(1, N, L))
    ops = [v.astype(np.float32) for v in (u, dl, A, B, C)]
    if part == "forward":
        y = scanweaver.mamba_selective_scan(*ops, backend=backend)
        want = forward_reference(u, dl, A, B[:, None], C[:, None])[0]
        got = y
    else:
        prep = mamba.prepare(*ops)
        dout = np.ones((1, 2, L), np.float32)
        got = mamba.backward(prep, dout, backend=backend)["dA"]
        want = backward_reference(u, dl, A, B[:, None], C[:, None], dout=dout.astype(np.float64))["dA"]
    err = float(np.abs(got - want).max() / np.abs(want).max())
    ran = runner.last["mamba1"].backend if "mamba1" in runner.last else "scan path"
    try:  # fused=True beyond what the backend's kernel holds: a clear error, never a crash
        scanweaver.mamba_selective_scan(*ops, backend=backend, fused=True)
        forced = "ran"
    except ScanInputError as e:
        forced = "error: " + str(e)
    return {"err": err, "ran": ran, "forced": forced}

def run():
    for N in sizes:
        runner.last.pop("mamba1", None)
        out[N] = case(N)

threading.stack_size(256 * 1024)
t = threading.Thread(target=run)
t.start()
t.join()
print(json.dumps(out))
"""


def _run(backend: str, part: str, sizes: tuple[int, ...]) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, backend, part, ",".join(map(str, sizes))],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{backend} {part} N={sizes}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def _need(backend: str) -> None:
    cls = REGISTRY.get(backend, None)
    if cls is None or not cls.availability().ok:
        pytest.skip(f"backend {backend!r} unavailable: {cls.availability().reason if cls else 'not registered'}")


@pytest.mark.parametrize("backend", ["cpu", "numpy", "opencl"])
def test_forward_large_n_from_a_small_stack(backend):
    _need(backend)
    res = _run(backend, "forward", (16, 2**17))
    for N, r in res.items():
        assert r["err"] < 1e-4, (N, r)
    assert res[16]["ran"] == backend
    if backend == "opencl":  # beyond the private-memory budget: the scan path, and fused=True says why
        assert res[2**17]["ran"] == "scan path"
        assert res[2**17]["forced"].startswith("error: ") and "workgroup_size" in res[2**17]["forced"]
    else:
        assert all(r["ran"] == backend and r["forced"] == "ran" for r in res.values()), res


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_backward_large_n_from_a_small_stack(backend):
    _need(backend)
    res = _run(backend, "backward", (3000,) if backend == "opencl" else (2048,))
    for N, r in res.items():
        assert r["err"] < 1e-3, (N, r)
