"""The delta-rule operations on device arrays stay on the device: checked without a GPU.

As in ``test_matrix_device.py``, the ``cuda`` backend is
:class:`device_standin.ReplayCUDA` (its launches replayed on PoCL with the
OpenCL rendering of the same kernels) and the operands are stand-in device
arrays that refuse every way to the host.  The calls go through
``scanweaver.torch.<op>``: its custom ops hand the kernel pairs stand-in arrays
where they would hand CUDA tensors' CuPy views (``to_array`` and ``from_array``
are replaced), so the whole device path runs (operand checks and conversions,
beta's sigmoid and its chain rule, the scale, the ``state_v_first``
transposes, the outputs' allocation, the fused kernels, PyTorch's autograd
around them), and a test fails if any operand touches the host.  Outputs are
compared with the float64 loops of ``delta_family.py``, gradients with PyTorch
autograd through its float64 loop.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.runtime import REGISTRY

from delta_family import loop, problem, torch_loop
from device_standin import DeviceArray, HostTouched, device, install
from device_standin import xp as standin

torch = pytest.importorskip("torch", reason="the calls go through scanweaver.torch, the reference through autograd")
swt = pytest.importorskip("scanweaver.torch")
TOL = 1e-9
#: Public operation -> (the loop's family, fla's positional arguments after q, k, v).
OPS = {"delta_rule": "deltanet", "gated_delta_rule": "gated", "kda": "kda", "rwkv7": "rwkv7"}


@pytest.fixture
def replay(monkeypatch):
    """The stand-in ``cuda`` backend, and ``scanweaver.torch`` handing its kernel pairs stand-in device arrays
    for tensors (as it hands CuPy views of CUDA tensors); a skip saying why when OpenCL cannot replay."""
    ocl = REGISTRY["opencl"].availability()
    if not ocl.ok:
        pytest.skip(f"opencl backend unavailable for the replay: {ocl.reason}")
    be = install(monkeypatch)

    def to_array(t):
        return None if t is None else DeviceArray(t.detach().numpy().copy())

    def from_array(a):
        assert isinstance(a, DeviceArray), f"a result came back as {type(a).__name__}, not a device array"
        return torch.from_numpy(a._a)

    monkeypatch.setattr(swt, "to_array", to_array)
    monkeypatch.setattr(swt, "from_array", from_array)
    # the CPU tensors stand in for CUDA tensors, which never take the NumPy views of CPU calls without autograd
    monkeypatch.setattr(swt, "_host_views", lambda *args: None)
    return be


def _leaves(arrays: dict) -> dict:
    return {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in arrays.items()
            if n != "cu_seqlens"}


def _call(op: str, t: dict, *, scale, l2norm=False, cu=None, **kw):
    """``scanweaver.torch.<op>`` on tensors ``t`` (the fused operation's names) with the final state."""
    fn, h0 = getattr(swt, op), t.get("h0")
    if op == "rwkv7":
        return fn(t["q"], t["g"], t["k"], t["v"], t["a"], t["b"], scale, h0, True, cu, **kw)
    gate = () if op == "delta_rule" else (t["g"],)
    return fn(t["q"], t["k"], t["v"], *gate, t["beta"], scale, h0, True, l2norm, cu_seqlens=cu, **kw)


def _close(got, want, name: str, tol: float = TOL) -> None:
    got, want = got.detach().double(), want.detach()
    scale = max(1.0, float(want.abs().max()))
    err = float((got - want).abs().max()) / scale
    assert err <= tol, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("op", list(OPS))
def test_forward_stays_on_the_device(rng, replay, op):
    family = OPS[op]
    l2norm = op == "gated_delta_rule"
    _, a, _ = problem(rng, family, batch=2, T=7, H=4, Hq=2 if l2norm else 4, K=5, V=6, l2norm=l2norm)
    t = {n: torch.tensor(x) for n, x in a.items()}
    o, h = _call(op, t, scale=0.6, l2norm=l2norm)
    want_o, want_h = loop(family, a, scale=0.6, l2norm=l2norm)
    _close(o, torch.tensor(want_o), "o")
    _close(h, torch.tensor(want_h), "final_state")
    info = scanweaver.matrix.last
    assert (info.backend, info.part, info.fallback) == ("cuda", "forward", "")
    assert replay.launched[-1] == ("delta_rule", ("sw_delta_rule_forward",))


@pytest.mark.parametrize("op", list(OPS))
def test_backward_stays_on_the_device(rng, replay, op):
    """Gradients of every input, packed sequences with an empty one, an initial and a final state; Gated
    DeltaNet with the L2 norm, shared q/k heads and beta through its sigmoid, KDA with the V-first state."""
    family = OPS[op]
    gated = op == "gated_delta_rule"
    seqlens = [3, 0, 5]
    _, a, _ = problem(rng, family, H=4, Hq=2 if gated else 4, K=5, V=6, seqlens=seqlens, l2norm=gated)
    cu = [int(c) for c in a["cu_seqlens"]]
    kw = {"use_beta_sigmoid_in_kernel": True} if gated else {"state_v_first": True} if op == "kda" else {}
    if gated:
        a["beta"] = rng.normal(size=a["beta"].shape)  # logits
    if op == "kda":
        a["h0"] = np.ascontiguousarray(np.swapaxes(a["h0"], -1, -2))
    leaves = _leaves(a)
    given = {n: x.detach().clone().requires_grad_(True) for n, x in leaves.items()}
    o, h = _call(op, given, scale=0.7, l2norm=gated, cu=cu, **kw)
    ref = dict(leaves)
    if gated:
        ref["beta"] = torch.sigmoid(leaves["beta"])
    if op == "kda":
        ref["h0"] = leaves["h0"].transpose(-1, -2)
    ro, rh = torch_loop(family, ref, scale=0.7, l2norm=gated, cu=cu)
    if op == "kda":
        rh = rh.transpose(-1, -2)
    _close(o, ro, "o")
    _close(h, rh, "final_state")
    do, dh = torch.tensor(rng.normal(size=o.shape)), torch.tensor(rng.normal(size=h.shape))
    ((o * do).sum() + (h * dh).sum()).backward()
    ((ro * do).sum() + (rh * dh).sum()).backward()
    for name in leaves:
        _close(given[name].grad, leaves[name].grad, f"d{name}", 1e-8)
    info = scanweaver.matrix.last
    assert (info.backend, info.part, info.fallback) == ("cuda", "backward", "")
    assert replay.launched[-1][0] == "delta_rule" and "sw_delta_rule_bwd_keys" in replay.launched[-1][1]


def test_a_backward_the_gpu_kernels_do_not_store_copies_to_the_host_once_and_says_so(rng, replay, monkeypatch):
    """The GPU kernels store no float16: Gated DeltaNet's backward on float16 device operands runs on the cpu
    backend on host copies made once (explicit, ``asnumpy``), the gradients go back to the device in float16, and
    the runner's report names the fallback."""
    _, a, _ = problem(rng, "gated", H=2, K=4, V=5)
    leaves = _leaves(a)
    given = {n: x.detach().to(torch.float32 if n == "h0" else torch.float16).requires_grad_(True)
             for n, x in leaves.items()}
    refuse = standin.asnumpy
    monkeypatch.setattr(standin, "asnumpy", lambda x: x._a.copy())  # the forward's fallback
    o, h = _call("gated_delta_rule", given, scale=1.0)
    monkeypatch.setattr(standin, "asnumpy", refuse)
    with pytest.raises(HostTouched, match="asnumpy"):
        (o.float().sum() + h.sum()).backward(retain_graph=True)
    copied = []

    def asnumpy(x):
        copied.append(x.shape)
        return x._a.copy()

    monkeypatch.setattr(standin, "asnumpy", asnumpy)
    for x in given.values():
        x.grad = None
    (o.float().sum() + h.sum()).backward()
    ro, rh = torch_loop("gated", leaves)
    (ro.sum() + rh.sum()).backward()
    for name in leaves:
        assert given[name].grad.dtype == given[name].dtype, name
        _close(given[name].grad, leaves[name].grad, f"d{name}", 3e-2)
    assert len(copied) == len(leaves) + 2  # every input and both cotangents, once
    info = scanweaver.matrix.last
    assert info.part == "backward" and info.backend != "cuda"
    assert "host copies of the device arrays" in info.fallback and "float16" in info.fallback


def test_plain_calls_keep_device_arrays_there_and_float16_says_where_it_ran(rng, replay, monkeypatch):
    """The NumPy entry given device arrays (CuPy's, say) runs the same device path; float16 operands, which the
    GPU kernels do not store, run on the cpu backend on host copies, and the report says so."""
    _, a, _ = problem(rng, "gated", K=4, V=5)
    names = ("q", "k", "v", "g", "beta")
    dev = {n: device(a[n].astype(np.float32)) for n in (*names, "h0")}
    o, h = scanweaver.gated_delta_rule(*(dev[n] for n in names), 0.5, dev["h0"], True)
    want_o, want_h = loop("gated", a, scale=0.5)
    assert isinstance(o, DeviceArray) and isinstance(h, DeviceArray)
    np.testing.assert_allclose(o._a, want_o, atol=2e-5)
    np.testing.assert_allclose(h._a, want_h, atol=2e-5)
    assert scanweaver.matrix.last.backend == "cuda"
    monkeypatch.setattr(standin, "asnumpy", lambda x: x._a.copy())
    half = [device(a[n].astype(np.float16)) for n in names]
    o16, _ = scanweaver.gated_delta_rule(*half, 0.5, dev["h0"])
    assert isinstance(o16, DeviceArray) and o16.dtype == np.float16
    np.testing.assert_allclose(o16._a, want_o, atol=2e-2)
    info = scanweaver.matrix.last
    assert info.backend != "cuda" and "float16" in info.fallback and "host copies" in info.fallback


def test_decode_steps_compute_with_the_device_module(rng, replay):
    """The one-token steps are array expressions in the operands' own module: device arrays stay there."""
    N, H, HV, K, V = 2, 1, 2, 3, 4
    S = rng.normal(size=(N, HV, K, V))
    q, k = rng.normal(size=(2, N, H, K))
    v, g, beta = rng.normal(size=(N, HV, V)), -rng.uniform(0.1, 1, (N, HV, K)), rng.uniform(0.1, 0.9, (N, HV))
    o, S1 = scanweaver.kda_step(*(device(x) for x in (S, q, k, v, g, beta)), scale=0.5, use_qk_l2norm_in_kernel=True)
    one = {"q": q[:, None], "k": k[:, None], "v": v[:, None], "g": g[:, None], "beta": beta[:, None], "h0": S}
    want_o, want_S = loop("kda", one, scale=0.5, l2norm=True)
    assert isinstance(o, DeviceArray) and isinstance(S1, DeviceArray)
    np.testing.assert_allclose(o._a, want_o[:, 0], rtol=1e-12)
    np.testing.assert_allclose(S1._a, want_S, rtol=1e-12)
