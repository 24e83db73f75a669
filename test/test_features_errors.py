"""Bad input to the Mamba front end, reset masks, cu_seqlens, dtypes and log-space scans: precise errors."""

from __future__ import annotations

import importlib
import re

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver import log_scan
from scanweaver.runtime import REGISTRY
from conftest import make_operands

BATCH, DM, N, L = 2, 6, 4, 11


def mamba_ops(rng, **over):
    ops = dict(u=rng.standard_normal((BATCH, DM, L)), delta=rng.uniform(0.1, 1, (BATCH, DM, L)),
               A=-rng.uniform(0.5, 2, (DM, N)), B=rng.standard_normal((BATCH, N, L)),
               C=rng.standard_normal((BATCH, N, L)))
    ops.update(over)
    return ops


MAMBA_BAD = [
    ("u", (DM, L), r"u has shape \(6, 11\); it needs \(batch, D, L\)"),
    ("delta", (BATCH, DM, L + 1), r"delta has shape \(2, 6, 12\); it needs u's shape \(batch, D, L\) = \(2, 6, 11\)"),
    ("A", (DM + 1, N), r"A has shape \(7, 4\); it needs \(D, N\) with D = 6"),
    ("A", (DM,), r"A has shape \(6,\); it needs \(D, N\) with D = 6"),
    ("B", (BATCH, N + 1, L), r"B has shape \(2, 5, 11\); it needs \(batch, N, L\) = \(2, 4, 11\) when it varies"),
    ("B", (BATCH, N, L - 1), r"B has shape \(2, 4, 10\); it needs \(batch, N, L\)"),
    ("B", (BATCH + 1, N, L), r"B has shape \(3, 4, 11\); it needs \(batch, N, L\)"),
    ("C", (DM, N + 1), r"C has shape \(6, 5\); it needs \(D, N\) = \(6, 4\) when fixed over time"),
    ("C", (BATCH, 4, N, L), r"C has G = 4 groups \(shape \(2, 4, 4, 11\)\); G must divide D = 6"),
    ("B", (BATCH, 3, N + 1, L), r"B has shape \(2, 3, 5, 11\); it needs \(batch, G, N, L\)"),
    ("B", (1, BATCH, 1, N, L), r"B has shape \(1, 2, 1, 4, 11\); it needs \(D, N\), \(batch, N, L\) or "
                               r"\(batch, G, N, L\)"),
    ("D", (DM, 1), r"D has shape \(6, 1\); it needs \(D,\) = \(6,\)"),
    ("z", (BATCH, DM), r"z has shape \(2, 6\); it needs u's shape"),
    ("delta_bias", (DM + 2,), r"delta_bias has shape \(8,\); it needs \(D,\) = \(6,\)"),
    ("h0", (BATCH, DM), r"h0 has shape \(2, 6\); it needs \(batch, D, N\) = \(2, 6, 4\)"),
]


@pytest.mark.parametrize("name, shape, message", MAMBA_BAD)
def test_mamba_operand_shapes(rng, name, shape, message):
    ops = mamba_ops(rng, **{name: rng.standard_normal(shape)})
    with pytest.raises(ScanInputError, match="^mamba_selective_scan: " + message):
        scanweaver.mamba_selective_scan(**ops, backend="numpy")


def test_mamba_accepts_every_documented_b_c_layout(rng):
    for shape in ((DM, N), (BATCH, N, L), (BATCH, 1, N, L), (BATCH, 2, N, L), (BATCH, 3, N, L), (BATCH, 6, N, L)):
        y = scanweaver.mamba_selective_scan(**mamba_ops(rng, B=rng.standard_normal(shape),
                                                        C=rng.standard_normal(shape)), backend="numpy")
        assert y.shape == (BATCH, DM, L)


def test_mamba_dtype_errors(rng):
    with pytest.raises(ScanInputError, match="mamba_selective_scan: u has dtype int64; supported dtypes are"):
        scanweaver.mamba_selective_scan(**mamba_ops(rng, u=np.ones((BATCH, DM, L), np.int64)), backend="numpy")
    cplx = mamba_ops(rng, A=mamba_ops(rng)["A"] + 0.5j)
    with pytest.raises(ScanInputError, match="log_space=True needs a real A"):
        scanweaver.mamba_selective_scan(**cplx, log_space=True)
    with pytest.raises(ScanInputError, match="log_space=True runs as a NumPy front end; got backend='cpu'"):
        scanweaver.mamba_selective_scan(**mamba_ops(rng), log_space=True, backend="cpu")


def test_reset_mask_of_the_wrong_shape(rng):
    ops = make_operands(rng, (2, 3, 10))
    for bad in (np.zeros((2, 3, 9), bool), np.zeros((3, 10), bool), np.zeros(10, bool)):
        message = f"selective_scan: reset has shape {bad.shape}; it needs the operands' shape (2, 3, 10)"
        with pytest.raises(ScanInputError, match="^" + re.escape(message)):
            scanweaver.selective_scan(**ops, reset=bad, backend="numpy")
    with pytest.raises(ScanInputError, match="reset has dtype float64; it needs a boolean mask"):
        scanweaver.selective_scan(**ops, reset=np.zeros((2, 3, 10)), backend="numpy")


CU_BAD = [
    ([0, 6, 3, 10], r"never decreasing.*got cu_seqlens\[1\] = 6 followed by cu_seqlens\[2\] = 3"),
    ([0, 4, 9], r"ending at T; got cu_seqlens\[-1\] = 9"),
    ([0, 4, 12], r"ending at T; got cu_seqlens\[-1\] = 12"),
    ([1, 4, 10], r"starting at 0.*got cu_seqlens\[0\] = 1"),
    ([0.0, 4.0, 10.0], r"got shape \(3,\), dtype float64"),
    ([0, 3.5, 10], r"got shape \(3,\), dtype float64"),
    ([[0, 10]], r"got shape \(1, 2\)"),
    ([[0, 4], [4, 10]], r"got shape \(2, 2\)"),
    ([], r"got an empty cu_seqlens"),
]

def test_empty_packed_sequences_are_allowed(rng):
    ops = make_operands(rng, (3, 10))
    cu = [0, 5, 5, 10]
    from conftest import loop_reference

    reset = np.zeros((3, 10), bool)
    reset[:, 5] = True
    want, _ = loop_reference(**ops, reset=reset)
    np.testing.assert_allclose(scanweaver.selective_scan(**ops, cu_seqlens=cu, backend="numpy"), want, rtol=1e-12)


@pytest.mark.parametrize("cu, message", CU_BAD)
def test_cu_seqlens_validation(rng, cu, message):
    ops = make_operands(rng, (3, 10))
    with pytest.raises(ScanInputError, match="^selective_scan: cu_seqlens must be 1-D integers .*" + message):
        scanweaver.selective_scan(**ops, cu_seqlens=cu, backend="numpy")


def test_cu_seqlens_on_mamba_is_validated(rng):
    with pytest.raises(ScanInputError, match=r"mamba_selective_scan: cu_seqlens must be .*T = 11.*\[-1\] = 10"):
        scanweaver.mamba_selective_scan(**mamba_ops(rng), cu_seqlens=[0, 3, 10], backend="numpy")


@pytest.mark.parametrize("backend", ["cpu", "opencl", "cuda", "julia"])
def test_complex_where_unsupported(rng, backend):
    if backend not in REGISTRY or not REGISTRY[backend].availability().ok:
        pytest.skip(f"backend {backend!r} is not available here")
    if "complex64" in REGISTRY[backend].dtypes:
        pytest.skip(f"backend {backend!r} supports complex64")
    ops = make_operands(rng, (2, 10), np.float32)
    ops["a"] = ops["a"] * np.complex64(1j)
    with pytest.raises(ScanInputError, match=f"^selective_scan: backend '{backend}' does not support dtype complex64 "
                                             r"\(it runs .*\); use backend='(\w+)'") as err:
        scanweaver.selective_scan(**ops, backend=backend)
    suggested = re.search(r"use backend='(\w+)'", str(err.value)).group(1)
    assert "complex64" in REGISTRY[suggested].dtypes and REGISTRY[suggested].availability().ok, str(err.value)


def test_complex_h0_needs_complex_operands(rng):
    ops = make_operands(rng, (2, 10))
    with pytest.raises(ScanInputError, match="h0 has dtype complex128; it needs a real float dtype"):
        scanweaver.selective_scan(**ops, h0=np.zeros(2, complex), backend="numpy")


def test_half_paths(rng):
    ops = make_operands(rng, (2, 10), np.float16)
    y, h = scanweaver.selective_scan(**ops, h0=np.ones(2, np.float16), return_state=True, backend="numpy")
    assert y.dtype == np.float16 and h.dtype == np.float32
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs the optional ml_dtypes package")
    bf = {k: v.astype(ml_dtypes.bfloat16) for k, v in ops.items()}
    assert scanweaver.selective_scan(**bf, backend="numpy").dtype == ml_dtypes.bfloat16
    with pytest.raises(ScanInputError, match="h0 has dtype <U1; it needs a real float dtype"):
        scanweaver.selective_scan(**bf, h0=np.array(["a", "b"]), backend="numpy")


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk": 1}, "chunk must be an int >= 2, got 1"),
    ({"chunk": 4.0}, "chunk must be an int >= 2, got 4.0"),
    ({"h0": np.zeros(3)}, r"h0 has shape \(3,\); it needs the leading shape \(2,\)"),
    ({"reset": np.zeros((2, 4), bool)}, r"reset has shape \(2, 4\); it needs to broadcast to \(2, 5\)"),
])
def test_log_scan_errors(kwargs, message):
    with pytest.raises(ScanInputError, match="^log_scan: " + message):
        log_scan(np.zeros((2, 5)), np.ones((2, 5)), **kwargs)
    with pytest.raises(ScanInputError, match="^log_scan: log_a has complex dtype complex128"):
        log_scan(np.zeros((2, 5), complex), np.ones((2, 5)))


def test_an_integer_operand_is_told_the_dtypes_its_operation_takes(rng):
    """An int64 q of a real-only operation is not offered complex dtypes that the operation then refuses."""
    q = np.ones((1, 4, 1, 3), np.int64)
    k, v = rng.standard_normal((1, 4, 1, 3)), rng.standard_normal((1, 4, 1, 2))
    g, beta = -rng.uniform(0.1, 1, (1, 4, 1)), rng.uniform(0, 1, (1, 4, 1))
    with pytest.raises(ScanInputError, match=r"^gated_delta_rule: q has dtype int64; supported dtypes are float16, "
                                             r"bfloat16, float32 and float64 \(complex64 and complex128 where the "
                                             r"operation takes complex operands\): convert it with "
                                             r"q\.astype\(np\.float32\)"):
        scanweaver.gated_delta_rule(q, k, v, g, beta)
    with pytest.raises(ScanInputError, match=r"convert it with np\.asarray\(q, np\.float32\)"):  # no astype on a list
        scanweaver.gated_delta_rule(q.tolist(), k, v, g, beta)
    with pytest.raises(ScanInputError, match="q has dtype complex128; it needs a real floating-point dtype"):
        scanweaver.gated_delta_rule(q + 0.5j, k, v, g, beta)


@pytest.mark.parametrize("library", ["torch", "jax"])
def test_an_integer_operand_is_told_its_own_libraries_conversion(rng, library):
    """Tensors are checked as NumPy views, and JAX arrays by the JAX front end: the hint is the caller's library's,
    from the operation's own entry point and from the NumPy one alike."""
    pytest.importorskip(library)
    front = importlib.import_module(f"scanweaver.{library}")
    if library == "torch":
        import torch

        convert, how = torch.from_numpy, r"q\.to\(torch\.float32\)"
    else:
        import jax.numpy as jnp

        convert, how = jnp.asarray, r"q\.astype\(jnp\.float32\)"
    q = convert(np.ones((1, 4, 1, 3), np.int32))
    k, v = (convert(rng.standard_normal(s).astype(np.float32)) for s in ((1, 4, 1, 3), (1, 4, 1, 2)))
    g, beta = (convert(x.astype(np.float32)) for x in (-rng.uniform(0.1, 1, (1, 4, 1)), rng.uniform(0, 1, (1, 4, 1))))
    message = r"^gated_delta_rule: q has dtype int32; supported dtypes are float16, bfloat16, float32 and float64 " \
        r"\(complex64 and complex128 where the operation takes complex operands\): convert it with " + how + r"(\n|$)"
    for call in (front.gated_delta_rule, scanweaver.gated_delta_rule):
        with pytest.raises(ScanInputError, match=message):
            call(q, k, v, g, beta)
    a = convert(np.ones((2, 5), np.int64))  # JAX makes it int32 (without x64)
    with pytest.raises(ScanInputError, match=r"a has dtype int(32|64); .*: convert it with a\." + how[3:]):
        front.selective_scan(a, convert(np.ones((2, 5), np.float32)), convert(np.ones((2, 5), np.float32)))
    if library == "torch":  # the decode step runs the fused kernel on NumPy views of the tensors
        with pytest.raises(ScanInputError, match=r"^gated_delta_rule_step: q has dtype int32; .*: convert it with "
                                                 + how):
            scanweaver.gated_delta_rule_step(convert(np.zeros((1, 1, 3, 2), np.float32)), q[:, 0], k[:, 0], v[:, 0],
                                             g[:, 0], beta[:, 0])


def test_a_tensor_dtype_numpy_has_no_view_for_is_named_with_its_conversion(rng):
    """int8 and float8 tensors (no NumPy view) get the operation's own refusal, naming the argument, not a
    generic one from the adapter."""
    torch = pytest.importorskip("torch")
    import scanweaver.torch as swt

    q, k, v = (torch.from_numpy(rng.standard_normal((1, 4, 1, 3)).astype(np.float32)) for _ in range(3))
    for dtype in (torch.int8, torch.float8_e4m3fn):
        name = str(dtype).removeprefix("torch.")
        with pytest.raises(ScanInputError, match=rf"^linear_attention: k has dtype {name}; supported dtypes .*: "
                                                 r"convert it with k\.to\(torch\.float32\)$"):
            swt.linear_attention(q, k.to(dtype), v)
        with pytest.raises(ScanInputError, match=rf"^linear_attention: g has dtype {name};"):
            swt.linear_attention(q, k, v, g=(-k.abs()).to(dtype))


def test_a_decode_step_names_itself_in_the_kernels_refusals(rng):
    """The decode steps run the whole operation's fused kernel; its refusals name the step that was called."""
    S = np.zeros((1, 1, 3, 2), np.float32)
    q = rng.standard_normal((1, 1, 3)).astype(np.float32)
    v, beta = rng.standard_normal((1, 1, 2)).astype(np.float32), np.ones((1, 1), np.float32)
    with pytest.raises(ScanInputError, match=r"^gated_delta_rule_step: q has dtype int32;"):
        scanweaver.gated_delta_rule_step(S, q.astype(np.int32), q, v, -np.ones((1, 1), np.float32), beta)
    with pytest.raises(ScanInputError, match=r"^kda_step: g has dtype int32;"):
        scanweaver.kda_step(S, q, q, v, np.full((1, 1, 3), -1, np.int32), beta)
    with pytest.raises(ScanInputError, match=r"^delta_rule_step: k has dtype int64;"):
        scanweaver.delta_rule_step(S, q, q.astype(np.int64), v, beta)
