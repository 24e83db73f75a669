"""Arrays from anywhere: buffers whose elements are not aligned run (copied once), on every backend."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import scanweaver
from scanweaver.arrays import aligned, prepare
from scanweaver.runtime import REGISTRY

LANES, L = 3, 203
#: Bytes before the data: not a multiple of any element size.
HEADER = 3


def _backends() -> list:
    out = []
    for name in ("numpy", "cpu", "opencl"):
        avail = REGISTRY[name].availability()
        mark = () if avail.ok else pytest.mark.skip(reason=f"backend {name!r} unavailable here: {avail.reason}")
        out.append(pytest.param(name, marks=mark))
    return out


def _operands(dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {"a": rng.uniform(0.6, 0.99, (LANES, L)).astype(dtype),
            **{n: rng.standard_normal((LANES, L)).astype(dtype) for n in "bxc"}}


def _packed(ops: dict[str, np.ndarray]) -> bytes:
    """A header of HEADER bytes, then the operands back to back."""
    return b"\x01" * HEADER + b"".join(v.tobytes() for v in ops.values())


def _views(buffer, ops: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The operands read from ``buffer`` at HEADER + their offsets (unaligned views, no copies)."""
    out, offset = {}, HEADER
    for n, v in ops.items():
        out[n] = np.frombuffer(buffer, v.dtype, count=v.size, offset=offset).reshape(v.shape)
        offset += v.nbytes
    return out


def _check(views: dict[str, np.ndarray], ops: dict[str, np.ndarray], backend: str) -> None:
    assert not any(v.flags.aligned for v in views.values())
    want = scanweaver.selective_scan(**ops, backend="numpy")
    got = scanweaver.selective_scan(**views, backend=backend)
    tol = 1e-5 if ops["a"].dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", _backends())
def test_frombuffer_at_an_odd_offset(backend, dtype):
    ops = _operands(dtype)
    _check(_views(_packed(ops), ops), ops, backend)


@pytest.mark.parametrize("backend", _backends())
def test_memory_mapped_file_with_a_header(tmp_path, backend):
    ops = _operands(np.float32)
    path = tmp_path / "operands.bin"
    path.write_bytes(_packed(ops))
    offset, views = HEADER, {}
    for n, v in ops.items():
        views[n] = np.memmap(path, v.dtype, mode="r", offset=offset, shape=v.shape)
        offset += v.nbytes
    _check(views, ops, backend)


@pytest.mark.parametrize("backend", _backends())
def test_bytes_received_from_another_process(backend):
    ops = _operands(np.float64)
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        rng = np.random.default_rng(5)
        ops = [rng.uniform(0.6, 0.99, ({LANES}, {L}))] + [rng.standard_normal(({LANES}, {L})) for _ in range(3)]
        sys.stdout.buffer.write(b"\\x01" * {HEADER} + b"".join(v.tobytes() for v in ops))
    """)
    data = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=60).stdout
    assert data == _packed(ops)
    _check(_views(data, ops), ops, backend)


@pytest.mark.parametrize("backend", _backends())
def test_shared_memory_written_by_another_process(backend):
    from multiprocessing import shared_memory

    ops = _operands(np.float32)
    payload = _packed(ops)
    shm = shared_memory.SharedMemory(create=True, size=len(payload))
    try:
        code = textwrap.dedent(f"""
            import sys
            from multiprocessing import resource_tracker, shared_memory
            shm = shared_memory.SharedMemory(name={shm.name!r})
            resource_tracker.unregister(shm._name, "shared_memory")  # the creator owns it
            data = sys.stdin.buffer.read()
            shm.buf[:len(data)] = data
            shm.close()
        """)
        subprocess.run([sys.executable, "-c", code], input=payload, check=True, timeout=60)
        _check(_views(shm.buf, ops), ops, backend)
    finally:
        shm.close()
        shm.unlink()


@pytest.mark.parametrize("backend", _backends())
def test_unaligned_h0_out_and_dense_operands(backend):
    rng = np.random.default_rng(9)
    ops = _operands(np.float64)
    raw = bytearray(HEADER + LANES * 8 + LANES * L * 8)
    h0 = np.frombuffer(raw, np.float64, count=LANES, offset=HEADER)
    h0[...] = rng.standard_normal(LANES)
    out = np.frombuffer(raw, np.float64, count=LANES * L, offset=HEADER + LANES * 8).reshape(LANES, L)
    assert not (h0.flags.aligned or out.flags.aligned)
    want = scanweaver.selective_scan(**ops, h0=h0.copy(), backend="numpy")
    got = scanweaver.selective_scan(**ops, h0=h0, out=out, backend=backend)
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)

    @scanweaver.recurrence(state_size=2)
    def biquad(h, a1, a2, b0, x):
        return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])

    coef = {n: rng.uniform(-0.4, 0.4, (LANES, L)) for n in ("a1", "a2", "b0")}
    coef["x"] = ops["x"]
    views = _views(_packed(coef), coef)
    want = biquad(**coef, backend="numpy")
    if "dense" not in REGISTRY[backend].kinds:
        pytest.skip(f"backend {backend!r} runs no dense transitions")
    np.testing.assert_allclose(biquad(**views, backend=backend), want, rtol=1e-12, atol=1e-12)


def test_aligned_operands_are_not_copied():
    ops = _operands(np.float32)
    arrays = prepare("test", ops)
    assert all(np.shares_memory(arrays.inputs[n], ops[n]) for n in ops)
    views = _views(_packed(ops), ops)
    copied = prepare("test", views)
    assert all(v.flags.aligned and v.flags.c_contiguous for v in copied.inputs.values())
    assert aligned(copied.inputs["a"]) is copied.inputs["a"]


@pytest.mark.parametrize("backend", _backends())
def test_repeated_calls_mix_aligned_and_unaligned_arrays(backend):
    """Later calls with the signature of an earlier one reuse its call plan; unaligned arrays still run through
    the recurrence (copied), and an explicit plan refuses them with advice."""
    ops = _operands(np.float32)
    views = _views(_packed(ops), ops)
    want = scanweaver.selective_scan(**ops, backend="numpy")
    tol = dict(rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    raw = bytearray(HEADER + want.nbytes)
    out = np.frombuffer(raw, np.float32, count=want.size, offset=HEADER).reshape(want.shape)
    args = [ops[n] for n in "abxc"]
    for _ in range(2):  # the second round reuses the call plans of the first
        np.testing.assert_allclose(scanweaver.selective_scan(*args, backend=backend), want, **tol)
        np.testing.assert_allclose(scanweaver.selective_scan(*[views[n] for n in "abxc"], backend=backend), want, **tol)
        out[...] = np.nan
        assert scanweaver.selective_scan(*args, out=out, backend=backend) is out
        np.testing.assert_allclose(out, want, **tol)
    p = scanweaver.plan(scanweaver.selective_scan, (LANES, L), np.float32, backend=backend)
    if backend == "cpu":  # an explicit plan is for hot loops: it copies nothing and says so
        with pytest.raises(scanweaver.ScanInputError, match="aligned"):
            p(*[views[n] for n in "abxc"])
    else:
        np.testing.assert_allclose(p(*[views[n] for n in "abxc"]), want, **tol)
