"""``@scanweaver.recurrence(state_shape=(...))``: matrix-state steps traced, classified and lowered to matrix_state."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import scanweaver
from scanweaver import NotAffineError, ScanInputError, ScanWeaverError

RNG = np.random.default_rng(5)


@scanweaver.recurrence(state_shape=("K", "V"))
def gla(S, q, k, v, g):
    S = np.exp(g)[:, None] * S + k[:, None] * v[None, :]
    return S, q @ S


@scanweaver.recurrence(state_shape=("P", "N"))
def ssd(S, x, dt, A, B, C):
    S = np.exp(dt * A) * S + np.outer(dt * x, B)
    return S, S @ C


@scanweaver.recurrence(state_shape=("K", "V"))
def rwkv(S, r, k, v, w, u):
    return np.exp(w)[:, None] * S + np.outer(k, v), r @ (S + np.outer(u * k, v))


def test_gla_step_matches_linear_attention():
    q, k, g = RNG.normal(size=(3, 2, 9, 3, 4))
    v, h0 = RNG.normal(size=(2, 9, 3, 5)), RNG.normal(size=(2, 3, 4, 5))
    y, h = gla(q, k, v, -np.abs(g), h0=h0, return_state=True)
    o, h2 = scanweaver.linear_attention(q, k, v, g=-np.abs(g), scale=1.0, initial_state=h0, output_final_state=True)
    np.testing.assert_allclose(y, o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, h2, rtol=1e-12, atol=1e-12)
    assert gla.ir.transition == "diagonal on rows" and gla.ir.input == "outer product"
    assert gla.ir.lowering["decay"] == "key" and not gla.ir.lowering["transpose"]


def test_mamba2_step_transposes_roles_and_matches_mamba2_scan():
    b, L, H, P, N = 1, 11, 2, 3, 4
    x = RNG.normal(size=(b, L, H, P))
    dt, A = RNG.uniform(0.1, 1, (b, L, H)), -RNG.uniform(0.5, 2, H)
    B, C = RNG.normal(size=(2, b, L, H, N))
    h0 = RNG.normal(size=(b, H, P, N))
    y, h = ssd(x, dt, A, B, C, return_state=True, cu_seqlens=[0, 4, 11])  # A (H,): one per head
    want, wh = scanweaver.mamba2_scan(x, dt, A, B, C, initial_states=h0, return_final_states=True)
    y1, h1 = ssd(x, dt, A, B, C, h0=h0, return_state=True)
    np.testing.assert_allclose(y1, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h1, wh, rtol=1e-12, atol=1e-12)
    assert y.shape == x.shape and h.shape == (2, H, P, N)
    ir = ssd.traced(frozenset("xBC"))[0]
    assert ir.transition == "scalar" and ir.readout_axis == "columns" and ir.lowering["transpose"]


def test_rwkv_bonus_readout_matches_rwkv6():
    r, k, w = RNG.normal(size=(3, 1, 8, 2, 3))
    v, u = RNG.normal(size=(1, 8, 2, 4)), RNG.normal(size=(2, 3))
    y = rwkv(r, k, v, -np.exp(w), u)
    o, _ = scanweaver.rwkv6(r, k, v, -np.exp(w), u, scale=1.0)
    np.testing.assert_allclose(y, o, rtol=1e-12, atol=1e-12)
    ir = rwkv.traced(frozenset("rkvwu"))[0]
    assert ir.readout_of == "before" and ir.bonus


def test_scalar_and_column_decays_and_the_state_before_the_update():
    @scanweaver.recurrence(state_shape=("K", "V"))
    def retnet(S, q, k, v, gamma):  # gamma (H,): a constant decay per head, not a log
        return gamma * S + np.outer(k, v), q @ S

    q, k = RNG.normal(size=(2, 1, 6, 2, 3))
    v, gamma = RNG.normal(size=(1, 6, 2, 4)), RNG.uniform(0.5, 0.9, 2)
    y = retnet(q, k, v, gamma)
    S, want = np.zeros((2, 3, 4)), np.zeros((1, 6, 2, 4))
    for t in range(6):
        want[0, t] = np.einsum("hk,hkv->hv", q[0, t], S)
        S = gamma[:, None, None] * S + k[0, t][:, :, None] * v[0, t][:, None, :]
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    assert retnet.traced(frozenset("qkv"))[0].transition == "scalar"

    @scanweaver.recurrence(state_shape=("K", "V"))
    def cols(S, k, v, g, c):  # a decay over the columns, read by S @ c: the transposed form
        S = S * np.exp(g)[None, :] + np.outer(k, v)
        return S, S @ c

    k, c = RNG.normal(size=(2, 1, 5, 1, 3))
    v, g = RNG.normal(size=(1, 5, 1, 2)), -RNG.uniform(0, 1, (1, 5, 1, 2))
    c = RNG.normal(size=(1, 5, 1, 2))
    y = cols(k, v, g, c)
    S, want = np.zeros((3, 2)), np.zeros((1, 5, 1, 3))
    for t in range(5):
        S = S * np.exp(g[0, t, 0])[None, :] + np.outer(k[0, t, 0], v[0, t, 0])
        want[0, t, 0] = S @ c[0, t, 0]
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    assert cols.traced(frozenset("kvgc"))[0].transition == "diagonal on columns"


def test_not_affine_and_unsupported_forms():
    with pytest.raises(NotAffineError, match=r"\(S \* S\)"):
        scanweaver.recurrence(lambda S, q, k, v: (S * S + np.outer(k, v), q @ S), state_shape=("K", "V"))
    with pytest.raises(NotAffineError, match=r"exp\(S\)"):
        scanweaver.recurrence(lambda S, q, k, v: (np.exp(S) + np.outer(k, v), q @ S), state_shape=("K", "V"))

    @scanweaver.recurrence(state_shape=("K", "V"))
    def delta(S, q, k, v, beta):
        S = S - beta * k[:, None] * (k @ S)[None, :] + beta * np.outer(k, v)
        return S, q @ S

    assert delta.ir.transition == "diagonal plus low rank"
    q, k = RNG.normal(size=(2, 1, 4, 1, 3))
    with pytest.raises(ScanInputError, match="no diagonal plus low rank transition"):
        delta(q, k, RNG.normal(size=(1, 4, 1, 2)), RNG.uniform(size=(1, 4, 1)))

    @scanweaver.recurrence(state_shape=("K", "V"))
    def rows_read_cols(S, k, v, g, c):
        return np.exp(g)[:, None] * S + np.outer(k, v), S @ c

    assert "decay over the contracted axis" in rows_read_cols.ir.unsupported
    with pytest.raises(ScanWeaverError, match="state_shape must be two axis names"):
        scanweaver.recurrence(lambda S, q: (S, q @ S), state_shape=("K",))
    with pytest.raises(ScanWeaverError, match=r"return \(S_new, readout\)"):
        scanweaver.recurrence(lambda S, k, v: S + np.outer(k, v), state_shape=("K", "V"))
    with pytest.raises(ScanInputError, match="takes 4 operands"):
        gla(np.ones((1, 2, 1, 3)))


def test_stages_print_and_the_cli_shows_them():
    text = gla.stages()
    assert "transition: diagonal on rows  D_t = exp(g)" in text["matrix_scan"]
    assert "input:      outer(k, v)" in text["matrix_scan"]
    assert text["matrix_state"].startswith("matrix_state decay=key readout=after")
    out = subprocess.run([sys.executable, "-m", "scanweaver", "ir", "--recurrence", "mamba2"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "stage matrix_scan" in out.stdout and "(state transposed)" in out.stdout


def test_documented_matrix_example_computes_what_it_says():
    from doc_examples import namespace_after

    ns = namespace_after("mamba2_step")
    want, _ = scanweaver.linear_attention(ns["q"], ns["k"], ns["v"], g=ns["g"], scale=1.0)
    np.testing.assert_allclose(ns["o2"], want, rtol=1e-12)
    assert ns["h"].shape == (2, 4, 8, 16) and ns["y1"].shape == (2, 4, 8)


def test_matrix_steps_on_tensors_have_gradients():
    """The step's gates are computed by PyTorch (so they differentiate), the scan by the named operations."""
    torch = pytest.importorskip("torch")

    @scanweaver.recurrence(state_shape=("K", "V"))
    def gated(S, q, k, v, a):
        S = np.exp(-np.exp(a))[:, None] * S + k[:, None] * v[None, :]
        return S, q @ S

    def t(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    def check(fn, inputs):  # fast mode: the Jacobian checked along random directions
        assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)

    q, k, a, v, h0 = t(1, 4, 1, 2), t(1, 4, 1, 2), t(1, 4, 1, 2), t(1, 4, 1, 3), t(1, 1, 2, 3)
    check(lambda *x: gated(*x[:4], h0=x[4], return_state=True), (q, k, v, a, h0))
    x, dt, A, B, C = t(1, 4, 2, 2), torch.rand(1, 4, 2, dtype=torch.float64, requires_grad=True), t(2), \
        t(1, 4, 2, 3), t(1, 4, 2, 3)
    check(lambda *z: ssd(*z, return_state=True), (x, dt, A, B, C))
    r, w, u = t(1, 4, 1, 2), t(1, 4, 1, 2), t(1, 2)
    check(lambda *z: rwkv(*z[:3], -torch.exp(z[3]), z[4], return_state=True), (r, k, v, w, u))


BUDGET_SCRIPT = r"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
import numpy as np
import scanweaver
from scanweaver import ScanInputError

def squares(S, q, k, v, a):
    for _ in range(26):
        a = a * a
    return a * S + np.outer(k, v), q @ S

def chain(S, q, k, v, a):
    for _ in range(300):
        a = a + 1.0
    return a * S + np.outer(k, v), q @ S

for step, want in ((squares, "expand to"), (chain, "nest 201 operations deep")):
    try:
        scanweaver.recurrence(step, state_shape=("K", "V"))
    except ScanInputError as e:
        assert step.__name__ in str(e) and want in str(e) and "at most" in str(e), str(e)
    else:
        raise SystemExit(f"{step.__name__} was traced")
print("refused")
"""


def test_the_expression_budget_covers_matrix_steps():
    """A gate squared 26 times (2**26 terms written out) or a chain 300 deep is refused when traced, by the same
    budget and message as the vector front end, in a subprocess under a 2 GiB address-space limit."""
    proc = subprocess.run([sys.executable, "-c", BUDGET_SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("refused")
