"""The matrix-state operations (and Mamba-1) on device arrays stay on the device: checked without a GPU.

The ``cuda`` backend is replaced by :class:`device_standin.ReplayCUDA`, whose
launches are replayed on PoCL with the OpenCL rendering of the same kernels,
and the operands are stand-in device arrays that refuse every way to the host
(``numpy.asarray``, ``asnumpy``, ``.get()``, ``float()``, ``bool()`` ...).  So
each call below runs the whole device path of the kernel pairs (operand
checks and conversions, Mamba-2's gates and their gradients, the output scale,
the outputs' allocation, the fused kernels) and fails if any operand touches
the host.  Results are compared with float64 loops of the defining recurrences
written here (PyTorch autograd through them gives the reference gradients).
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.calls.device import place
from scanweaver.calls.pairs import PAIRS
from scanweaver.ops.matrix_state.grad import la_options, mamba2_options, rwkv6_options
from scanweaver.runtime import REGISTRY

from device_standin import DeviceArray, HostTouched, device, install

torch = pytest.importorskip("torch", reason="the reference gradients come from PyTorch autograd")
TOL = 2e-4


@pytest.fixture
def replay(monkeypatch):
    """The stand-in ``cuda`` backend (its launches replayed on OpenCL), or a skip saying why it cannot run."""
    ocl = REGISTRY["opencl"].availability()
    if not ocl.ok:
        pytest.skip(f"opencl backend unavailable for the replay: {ocl.reason}")
    return install(monkeypatch)


def _t(a):
    return torch.tensor(a, dtype=torch.float64, requires_grad=True)


def _close(got, want, name: str) -> None:
    assert isinstance(got, DeviceArray), f"{name} came back as {type(got).__name__}, not a device array"
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got._a.astype(np.float64) - want).max()) / scale
    assert err <= TOL, f"{name}: relative error {err:.2e}"


def _la_loop(q, k, v, g, h0, scale):
    """GLA in float64: S_t = exp(g_t)[:, None] * S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t (grouped q/k)."""
    group = v.shape[2] // q.shape[2]
    S, outs = h0, []
    for t in range(v.shape[1]):
        qt, kt = q[:, t].repeat_interleave(group, 1), k[:, t].repeat_interleave(group, 1)
        S = torch.exp(g[:, t])[..., None] * S + kt[..., None] * v[:, t][:, :, None, :]
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", qt, S))
    return torch.stack(outs, 1), S


def _rwkv6_loop(r, k, v, w, u, h0, scale):
    """RWKV-6 in float64: o_t = scale * (S_{t-1}^T r_t + (r_t . (u * k_t)) v_t), S_t = exp(w_t) S_{t-1} + k_t v_t^T."""
    S, outs = h0, []
    for t in range(v.shape[1]):
        bonus = (r[:, t] * u * k[:, t]).sum(-1)
        outs.append(scale * (torch.einsum("bhk,bhkv->bhv", r[:, t], S) + bonus[..., None] * v[:, t]))
        S = torch.exp(w[:, t])[..., None] * S + k[:, t][..., None] * v[:, t][:, :, None, :]
    return torch.stack(outs, 1), S


def _mamba2_loop(x, dt, A, B, C, D, z, dt_bias, h0, lo, hi):
    """Mamba-2 in float64 with softplus, the clamp, D and the z gate; states (batch, H, P, N)."""
    group = x.shape[2] // B.shape[2]
    step = torch.clamp(torch.nn.functional.softplus(dt + dt_bias), lo, hi)
    S, outs = h0, []
    for t in range(x.shape[1]):
        Bt, Ct = B[:, t].repeat_interleave(group, 1), C[:, t].repeat_interleave(group, 1)
        S = torch.exp(step[:, t] * A)[..., None, None] * S + (step[:, t, :, None] * x[:, t])[..., None] * Bt[:, :, None]
        y = torch.einsum("bhpn,bhn->bhp", S, Ct) + D[:, None] * x[:, t]
        outs.append(y * z[:, t] * torch.sigmoid(z[:, t]))
    return torch.stack(outs, 1), S


def _grads(loss, leaves: dict) -> dict:
    loss.backward()
    return {n: t.grad for n, t in leaves.items()}


def test_linear_attention_forward_and_backward_stay_on_the_device(rng, replay):
    Bt, T, H, Hq, K, V, scale = 2, 9, 4, 2, 5, 6, 0.7
    host = {"q": rng.normal(size=(Bt, T, Hq, K)), "k": rng.normal(size=(Bt, T, Hq, K)),
            "v": rng.normal(size=(Bt, T, H, V)), "g": -rng.uniform(0.02, 1.5, (Bt, T, H, K)),
            "initial_state": rng.normal(size=(Bt, H, K, V))}
    dev = {n: device(a.astype(np.float32)) for n, a in host.items()}
    o, h = scanweaver.linear_attention(dev["q"], dev["k"], dev["v"], g=dev["g"], scale=scale,
                                       initial_state=dev["initial_state"], output_final_state=True)
    leaves = {n: _t(a) for n, a in host.items()}
    ro, rh = _la_loop(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["initial_state"], scale)
    _close(o, ro, "o")
    _close(h, rh, "final_state")
    assert replay.launched[-1] == ("matrix_state", ("sw_matrix_state_forward",))

    do, dh = rng.normal(size=(Bt, T, H, V)), rng.normal(size=(Bt, H, K, V))
    want = _grads((ro * torch.tensor(do)).sum() + (rh * torch.tensor(dh)).sum(), leaves)
    inputs = [dev["q"], dev["k"], dev["v"], dev["g"], None, None, dev["initial_state"]]
    got = PAIRS.get("linear_attention").backward(inputs, [], [device(do.astype(np.float32)),
                                                              device(dh.astype(np.float32))],
                                                 [True, True, True, True, False, False, True],
                                                 la_options("linear_attention", {"scale": scale}))
    for (name, w), g in zip(want.items(), got, strict=True):
        _close(g, w, f"d{name}")
    assert replay.launched[-1][0] == "matrix_state" and "sw_matrix_state_bwd_keys" in replay.launched[-1][1]


def test_rwkv6_forward_and_backward_stay_on_the_device(rng, replay):
    Bt, T, H, K, V = 1, 7, 2, 4, 5
    host = {"r": rng.normal(size=(Bt, T, H, K)), "k": rng.normal(size=(Bt, T, H, K)),
            "v": rng.normal(size=(Bt, T, H, V)), "w": -rng.uniform(0.02, 1.5, (Bt, T, H, K)),
            "u": rng.normal(size=(H, K)), "initial_state": rng.normal(size=(Bt, H, K, V))}
    dev = [device(a.astype(np.float32)) for a in host.values()]
    o, _ = scanweaver.rwkv6(*dev[:5], initial_state=dev[5])
    leaves = {n: _t(a) for n, a in host.items()}
    ro, rh = _rwkv6_loop(*leaves.values(), K ** -0.5)
    _close(o, ro, "o")
    do = rng.normal(size=(Bt, T, H, V))
    want = _grads((ro * torch.tensor(do)).sum(), leaves)
    got = PAIRS.get("rwkv6").backward(dev, [], [device(do.astype(np.float32)), None], [True] * 6, rwkv6_options({}))
    for (name, w), g in zip(want.items(), got, strict=True):
        _close(g, w, f"d{name}")


def test_mamba2_gates_and_their_gradients_run_on_the_device(rng, replay):
    Bt, L, H, G, P, N = 2, 9, 4, 2, 3, 5
    lo, hi = 0.05, 1.2
    host = {"x": rng.normal(size=(Bt, L, H, P)), "dt": rng.normal(size=(Bt, L, H)), "A": -rng.uniform(0.5, 2, H),
            "B": rng.normal(size=(Bt, L, G, N)), "C": rng.normal(size=(Bt, L, G, N)), "D": rng.normal(size=H),
            "z": rng.normal(size=(Bt, L, H, P)), "dt_bias": rng.normal(size=H),
            "initial_states": rng.normal(size=(Bt, H, P, N))}
    dev = [device(a.astype(np.float32)) for a in host.values()]
    out, final = scanweaver.mamba2_scan(*dev[:5], D=dev[5], z=dev[6], dt_bias=dev[7], dt_softplus=True,
                                        dt_limit=(lo, hi), initial_states=dev[8], return_final_states=True)
    leaves = {n: _t(a) for n, a in host.items()}
    ry, rh = _mamba2_loop(*leaves.values(), lo, hi)
    clamped = np.clip(np.logaddexp(0, host["dt"] + host["dt_bias"]), lo, hi)
    assert 0 < np.mean(clamped == lo) + np.mean(clamped == hi) < 1, "the clamp acts on part of dt"
    _close(out, ry, "out")
    _close(final, rh, "final_states")
    dy, dh = rng.normal(size=(Bt, L, H, P)), rng.normal(size=(Bt, H, P, N))
    want = _grads((ry * torch.tensor(dy)).sum() + (rh * torch.tensor(dh)).sum(), leaves)
    got = PAIRS.get("mamba2").backward(dev, [], [device(dy.astype(np.float32)), device(dh.astype(np.float32))],
                                       [True] * 9, mamba2_options({"dt_softplus": True, "dt_limit": (lo, hi)}))
    for (name, w), g in zip(want.items(), got, strict=True):
        _close(g, w, f"d{name}")


def test_packed_sequences_upload_only_their_checked_offsets(rng, replay):
    q, k, v = (device(rng.normal(size=(1, 11, 2, 3)).astype(np.float32)) for _ in range(3))
    g = device(-rng.uniform(0.1, 1, (1, 11, 2)).astype(np.float32))
    o, h = scanweaver.linear_attention(q, k, v, g_head=g, cu_seqlens=[0, 4, 4, 11], output_final_state=True)
    assert isinstance(o, DeviceArray) and h.shape == (3, 2, 3, 3)
    with pytest.raises(scanweaver.ScanInputError, match="cu_seqlens"):
        scanweaver.linear_attention(q, k, v, g_head=g, cu_seqlens=[0, 12, 11])


def test_the_stand_in_catches_a_host_copy(rng, replay):
    """The detector works: a backend that takes host arrays only copies the operands to the host."""
    ops = [device(rng.normal(size=(1, 5, 2, 3)).astype(np.float32)) for _ in range(3)]
    assert place(ops, "matrix_state", "forward", "auto", api="t").on_device
    assert not place(ops, "matrix_state", "forward", "cpu", api="t").on_device
    with pytest.raises(HostTouched, match="asnumpy"):
        scanweaver.linear_attention(*ops, backend="cpu")
    with pytest.raises(HostTouched):
        np.asarray(ops[0])
    with pytest.raises(HostTouched):
        ops[0] * np.ones((1, 5, 2, 3), np.float32)


def test_decode_steps_compute_with_the_device_module(rng, replay):
    """The one-token steps are array expressions in the operands' own module: device arrays stay there."""
    S, q, k, g = (rng.normal(size=s) for s in ((2, 4, 3, 5), (2, 2, 3), (2, 2, 3), (2, 4, 3)))
    v = rng.normal(size=(2, 4, 5))
    o, S1 = scanweaver.linear_attention_step(*(device(a) for a in (S, q, k, v)), g=device(-np.abs(g)))
    qh, kh = np.repeat(q, 2, axis=1), np.repeat(k, 2, axis=1)
    want = np.exp(-np.abs(g))[..., None] * S + kh[..., None] * v[:, :, None, :]
    assert isinstance(o, DeviceArray) and isinstance(S1, DeviceArray)
    np.testing.assert_allclose(S1._a, want, rtol=1e-12)
    np.testing.assert_allclose(o._a, np.einsum("bhk,bhkv->bhv", qh, want) * 3 ** -0.5, rtol=1e-12)


def test_the_arrays_device_is_current_while_the_pair_computes(rng, replay, monkeypatch):
    """CuPy allocates and launches on its current device: the call makes the operands' device current."""
    entered = []

    class Device:
        def __enter__(self):
            entered.append("in")

        def __exit__(self, *exc):
            entered.append("out")

    monkeypatch.setattr(DeviceArray, "device", property(lambda self: Device()), raising=False)
    ops = [device(rng.normal(size=(1, 5, 2, 3)).astype(np.float32)) for _ in range(3)]
    o, _ = scanweaver.linear_attention(*ops)
    assert isinstance(o, DeviceArray) and entered == ["in", "out"]


def test_mixed_host_and_device_operands_are_refused(rng, replay):
    q = device(rng.normal(size=(1, 5, 2, 3)).astype(np.float32))
    with pytest.raises(scanweaver.ScanInputError, match="k is a ndarray; with device operands every array"):
        scanweaver.linear_attention(q, rng.normal(size=(1, 5, 2, 3)), q)


def test_mamba1_takes_the_same_device_path(rng, replay):
    from mamba_oracle import extras, operands, s6_reference

    from scanweaver.ops.mamba1.grad import options

    raw = {**operands(rng, 2, 6, 3, 17, "group", "group"), **extras(rng, 2, 6, 3, 17)}
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
    dev = [device(raw[n].astype(np.float32)) for n in names]
    opts = options({"delta_softplus": True, "backend": "auto"})
    y, h = PAIRS.get("mamba1").forward(dev, opts)
    want_y, want_h = s6_reference(**raw)
    _close(y, want_y, "y")
    _close(h, want_h, "h_last")
    assert replay.launched[-1] == ("mamba1", ("sw_mamba1_forward",))
    dy = device(rng.normal(size=y.shape).astype(np.float32))
    grads = PAIRS.get("mamba1").backward(dev, [], [dy, None], [True] * 9, opts)
    assert [g.shape for g in grads] == [d.shape for d in dev]
    assert all(isinstance(g, DeviceArray) for g in grads)
    assert replay.launched[-1] == ("mamba1", ("sw_mamba1_backward",))


def _cuda_torch():
    avail = REGISTRY["cuda"].availability()
    if not avail.ok or not torch.cuda.is_available():
        pytest.skip(f"needs a CUDA device with CuPy: {avail.reason or 'PyTorch sees no CUDA device'}")
    import cupy

    return cupy


@pytest.mark.parametrize("op", ["linear_attention", "rwkv6", "mamba2_scan"])
def test_cuda_tensors_stay_on_the_device_with_gradients(rng, monkeypatch, op):
    """On a GPU: CUDA tensors in, CUDA tensors out, every gradient right, and ``cupy.asnumpy`` never called."""
    cupy = _cuda_torch()
    import scanweaver.torch as swt

    def no_host(*a, **k):
        raise AssertionError("a CUDA tensor's data went through host memory")

    monkeypatch.setattr(cupy, "asnumpy", no_host)
    if op == "linear_attention":
        host = {"q": rng.normal(size=(2, 33, 2, 16)), "k": rng.normal(size=(2, 33, 2, 16)) / 4,
                "v": rng.normal(size=(2, 33, 4, 24)), "g": -rng.uniform(0.02, 1.5, (2, 33, 4, 16)),
                "initial_state": rng.normal(size=(2, 4, 16, 24))}
        call = lambda t: swt.linear_attention(t["q"], t["k"], t["v"], g=t["g"], scale=0.5,  # noqa: E731
                                              initial_state=t["initial_state"], output_final_state=True)
        ref = lambda t: _la_loop(*t.values(), 0.5)  # noqa: E731
    elif op == "rwkv6":
        host = {"r": rng.normal(size=(1, 33, 2, 16)), "k": rng.normal(size=(1, 33, 2, 16)) / 4,
                "v": rng.normal(size=(1, 33, 2, 24)), "w": -rng.uniform(0.02, 1.5, (1, 33, 2, 16)),
                "u": rng.normal(size=(2, 16)), "initial_state": rng.normal(size=(1, 2, 16, 24))}
        call = lambda t: swt.rwkv6(*list(t.values())[:5], initial_state=t["initial_state"],  # noqa: E731
                                   output_final_state=True)
        ref = lambda t: _rwkv6_loop(*t.values(), 16 ** -0.5)  # noqa: E731
    else:
        host = {"x": rng.normal(size=(2, 33, 4, 8)), "dt": rng.normal(size=(2, 33, 4)), "A": -rng.uniform(0.5, 2, 4),
                "B": rng.normal(size=(2, 33, 2, 16)), "C": rng.normal(size=(2, 33, 2, 16)), "D": rng.normal(size=4),
                "z": rng.normal(size=(2, 33, 4, 8)), "dt_bias": rng.normal(size=4),
                "initial_states": rng.normal(size=(2, 4, 8, 16))}
        call = lambda t: swt.mamba2_scan(*list(t.values())[:5], D=t["D"], z=t["z"], dt_bias=t["dt_bias"],  # noqa: E731
                                         dt_softplus=True, dt_limit=(0.05, 1.2), initial_states=t["initial_states"],
                                         return_final_states=True)
        ref = lambda t: _mamba2_loop(*t.values(), 0.05, 1.2)  # noqa: E731
    dev = {n: torch.tensor(a, dtype=torch.float32, device="cuda", requires_grad=True) for n, a in host.items()}
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y, h = call(dev)
        wy, wh = torch.randn_like(y), torch.randn_like(h)
        ((y * wy).sum() + (h * wh).sum()).backward()
    stream.synchronize()
    assert y.is_cuda and h.is_cuda
    leaves = {n: _t(a) for n, a in host.items()}
    ry, rh = ref(leaves)
    want = _grads((ry * wy.cpu().double()).sum() + (rh * wh.cpu().double()).sum(), leaves)
    for got, w, name in ((y, ry, "y"), (h, rh, "state"), *((dev[n].grad, want[n], f"d{n}") for n in host)):
        assert got is not None and got.is_cuda, name
        g = got.detach().cpu().double()
        assert float((g - w).abs().max()) <= TOL * max(1.0, float(w.abs().max())), name
