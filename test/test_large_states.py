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


MATRIX_SCRIPT = r"""
import json, sys, threading
import numpy as np
import torch
import scanweaver.torch as swt

K, stack = int(sys.argv[1]), int(sys.argv[2])
out = {}

def loop(q, k, v, g):
    # the defining recurrence in float64: S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T, o_t = S_t^T q_t
    S = torch.zeros(q.shape[-1], v.shape[-1], dtype=torch.float64)
    o = []
    for t in range(q.shape[1]):
        S = torch.exp(g[0, t, 0])[:, None] * S + torch.outer(k[0, t, 0], v[0, t, 0])
        o.append(S.T @ q[0, t, 0])
    return torch.stack(o)[None, :, None]

def run():
    rng = np.random.default_rng(K)
    T, V = 3, 4
    arrays = [rng.normal(size=(1, T, 1, K)), rng.normal(size=(1, T, 1, K)), rng.normal(size=(1, T, 1, V)),
              -rng.uniform(0.01, 0.5, (1, T, 1, K))]
    got = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = [torch.tensor(a, requires_grad=True) for a in arrays]
    o, _ = swt.linear_attention(*got[:3], g=got[3], scale=1.0, backend="cpu", threads=1)
    ref = loop(*want)
    w = torch.tensor(rng.normal(size=ref.shape))
    (o * w).sum().backward()
    (ref * w).sum().backward()
    out["forward"] = float((o - ref).abs().max() / ref.abs().max())
    out["backward"] = max(float((a.grad - b.grad).abs().max() / b.grad.abs().max()) for a, b in zip(got, want))

if stack:
    threading.stack_size(stack)
    t = threading.Thread(target=run)
    t.start()
    t.join()
else:
    run()
print(json.dumps(out))
"""


@pytest.mark.parametrize(("K", "stack"), [(65536, 0), (16384, 256 * 1024)])
def test_matrix_state_large_k(K, stack):
    """The recurrent matrix-state kernels keep no buffer that scales with K on the stack: K = 65536 in float64
    on the main thread (an 8 MiB stack), and K = 16384 from a thread with a 256 KiB stack, forward and backward,
    against a float64 loop of the recurrence."""
    _need("cpu")
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", MATRIX_SCRIPT, str(K), str(stack)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"K={K}, stack {stack}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["forward"] < 1e-12 and res["backward"] < 1e-12, res
