"""The public delta-rule operations (``delta_rule``, ``gated_delta_rule``, ``kda``, ``rwkv7``) and their decode steps,
called with flash-linear-attention's positional arguments: against float64 loops of the recurrences
(``delta_family.loop``, written from the models' formulas), against fla 0.6's naive references (outputs, final
states and autograd gradients), decode steps chained over T tokens against the full call, half storage, packed
sequences with empty ones, -inf decays, fla's flags (state_v_first, beta sigmoid), and the errors."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from delta_family import PUBLIC, call_public, loop, problem

import scanweaver
from scanweaver import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.runtime import REGISTRY

OPS = tuple(PUBLIC)
#: case -> problem() keywords (and l2norm): packed sequences with an empty one, grouped value heads, T = 1,
#: log decays from -20 to -1e-4.
CASES = {"plain": {}, "packed": {"seqlens": (4, 0, 7, 1)}, "grouped": {"H": 4, "Hq": 2},
         "l2norm": {"l2norm": True, "Hq": 1}, "T1": {"T": 1}, "decays": {"lo": -20.0, "hi": -1e-4, "T": 17}}


def backend_or_skip(name):
    cls = REGISTRY.get(name)
    if not cls.availability().ok:
        pytest.skip(f"backend {name!r} unavailable: {cls.availability().reason}")
    return name


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("op", OPS)
def test_public_call_matches_the_float64_loop(op, case, backend):
    kw = dict(CASES[case])
    l2norm = kw.pop("l2norm", False)
    if l2norm and op == "rwkv7":
        pytest.skip("rwkv7 has no in-kernel normalisation (fla's chunk_rwkv7 has none)")
    rng = np.random.default_rng(zlib.crc32(f"{op}/{case}".encode()))
    _, a, _ = problem(rng, PUBLIC[op], l2norm=l2norm, **kw)
    o, h = call_public(getattr(scanweaver, op), op, a, 0.7, l2norm, backend=backend_or_skip(backend))
    want_o, want_h = loop(PUBLIC[op], a, 0.7, l2norm)
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)
    assert scanweaver.matrix.last.op == "delta_rule" and scanweaver.matrix.last.backend == backend


@pytest.mark.parametrize("op", OPS)
def test_default_scale_and_no_final_state(op):
    rng = np.random.default_rng(3)
    _, a, _ = problem(rng, PUBLIC[op], K=9, h0=False)
    names = {"delta_rule": "q k v beta", "rwkv7": "q g k v a b"}.get(op, "q k v g beta").split()
    o, none = getattr(scanweaver, op)(*(a[n] for n in names))
    assert none is None
    scale = 1.0 if op == "rwkv7" else 9 ** -0.5
    np.testing.assert_allclose(o, loop(PUBLIC[op], a, scale)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("op", OPS)
def test_float32_computes_and_returns_float32(op):
    rng = np.random.default_rng(4)
    _, a, _ = problem(rng, PUBLIC[op], T=40, K=16, V=8, dtype="float32")
    o, h = call_public(getattr(scanweaver, op), op, a, 0.25)
    assert o.dtype == np.float32 and h.dtype == np.float32
    want_o, want_h = loop(PUBLIC[op], a, 0.25)
    np.testing.assert_allclose(o, want_o, rtol=0, atol=2e-5 * np.abs(want_o).max())
    np.testing.assert_allclose(h, want_h, rtol=0, atol=2e-5 * np.abs(want_h).max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["gated_delta_rule", "rwkv7"])
def test_half_storage_accumulates_in_float32(op, dtype):
    rng = np.random.default_rng(5)
    _, a, _ = problem(rng, PUBLIC[op], T=25, K=8, V=8, dtype=dtype)
    o, h = call_public(getattr(scanweaver, op), op, a, 0.5)
    assert o.dtype.name == dtype and h.dtype == np.float32
    want_o, want_h = loop(PUBLIC[op], a, 0.5)  # on the stored (rounded) operands, in float64
    tol = {"float16": 2e-3, "bfloat16": 1e-2}[dtype]
    np.testing.assert_allclose(o.astype(np.float64), want_o, rtol=0, atol=tol * np.abs(want_o).max())
    np.testing.assert_allclose(h, want_h, rtol=0, atol=1e-5 * np.abs(want_h).max())


def test_empty_sequences_and_empty_calls_are_exact():
    rng = np.random.default_rng(6)
    _, a, _ = problem(rng, "gated", seqlens=(0, 5, 0))
    o, h = call_public(scanweaver.gated_delta_rule, "gated_delta_rule", a)
    np.testing.assert_array_equal(h[0], a["h0"][0])
    np.testing.assert_array_equal(h[2], a["h0"][2])
    np.testing.assert_allclose(h[1], loop("gated", a, 0.5)[1][1], rtol=1e-12)
    q = np.zeros((1, 0, 2, 4))
    for cu, h0 in (([0], None), ([0, 0], rng.normal(size=(1, 2, 4, 3)))):
        o, h = scanweaver.kda(q, q, np.zeros((1, 0, 2, 3)), q, np.zeros((1, 0, 2)), None, h0, True, cu_seqlens=cu)
        assert o.shape == (1, 0, 2, 3) and h.shape == (len(cu) - 1, 2, 4, 3)
        if h0 is not None:
            np.testing.assert_array_equal(h, h0)


@pytest.mark.parametrize("op", ["gated_delta_rule", "kda", "rwkv7"])
def test_minus_infinity_decays_are_exact(op):
    """g = -inf at some steps (a decay of exactly 0: Gated DeltaNet and KDA restart there, RWKV-7 keeps only its
    rank-one term): finite, and equal to the loop, where exp(-inf) = 0."""
    rng = np.random.default_rng(7)
    _, a, _ = problem(rng, PUBLIC[op], batch=1, T=8)
    a["g"][0, 3] = -np.inf
    a["g"][0, 5, 0] = -np.inf
    o, h = call_public(getattr(scanweaver, op), op, a, 1.0)
    assert np.isfinite(o).all() and np.isfinite(h).all()
    want_o, want_h = loop(PUBLIC[op], a, 1.0)
    np.testing.assert_allclose(o, want_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, want_h, rtol=1e-12, atol=1e-12)


def test_unnormalised_keys_diverge_and_the_l2norm_guards():
    """The numerics note of the docs: raw keys of norm ~4 with beta near 1 make I - beta k k^T expand along k
    (eigenvalue 1 - beta |k|^2 ~ -15), as in fla; use_qk_l2norm_in_kernel keeps the state bounded."""
    rng = np.random.default_rng(8)
    q, k = rng.normal(size=(2, 1, 64, 1, 16))
    v, beta = rng.normal(size=(1, 64, 1, 16)), np.full((1, 64, 1), 0.95)
    _, h = scanweaver.delta_rule(q, k, v, beta, None, None, True)
    assert not np.isfinite(h).all() or np.abs(h).max() > 1e20
    _, h = scanweaver.delta_rule(q, k, v, beta, None, None, True, True)
    assert np.abs(h).max() < 100


@pytest.mark.parametrize("op", OPS)
def test_decode_steps_chain_to_the_full_call(op):
    rng = np.random.default_rng(9)
    l2norm = op != "rwkv7"
    _, a, _ = problem(rng, PUBLIC[op], batch=2, T=11, H=4, Hq=2, l2norm=l2norm)
    o, h = call_public(getattr(scanweaver, op), op, a, 0.6, l2norm)
    step = getattr(scanweaver, op + "_step")
    S = a["h0"]
    for t in range(11):
        x = {n: y[:, t] for n, y in a.items() if n != "h0"}
        if op == "rwkv7":
            ot, S = step(S, x["q"], x["g"], x["k"], x["v"], x["a"], x["b"], scale=0.6)
        elif op == "delta_rule":
            ot, S = step(S, x["q"], x["k"], x["v"], x["beta"], scale=0.6, use_qk_l2norm_in_kernel=True)
        else:
            ot, S = step(S, x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.6, use_qk_l2norm_in_kernel=True)
        np.testing.assert_allclose(ot, o[:, t], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(S, h, rtol=1e-10, atol=1e-12)


def _one_token(seed: int, K: int, V: int):
    """q, k ``(1, 2, K)``, v ``(1, 2, V)``, g and beta ``(1, 2)`` of one step."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 1, 2, K))
    return q, k, rng.normal(size=(1, 2, V)), -rng.uniform(0, 1, (1, 2)), rng.uniform(0, 1, (1, 2))


def test_a_step_with_a_wrong_state_says_where_the_sizes_come_from():
    """A state of the wrong V shows as v's mismatch: the message says the sizes come from the state."""
    q, k, v, g, beta = _one_token(3, 3, 2)
    with pytest.raises(ScanInputError, match=r"v has shape \(1, 2, 2\); it needs \(N, HV, V\) = \(1, 2, 1\) "
                                             r"\(N, HV, K, V from the state, H from q/r\)"):
        scanweaver.gated_delta_rule_step(np.zeros((1, 2, 3, 1)), q, k, v, g, beta)


def test_a_step_given_the_other_state_layout_names_state_v_first():
    """A V-first state without ``state_v_first`` (and the other way round) shows as q's mismatch; the message says
    which layout would fit, on the steps that take either."""
    q, k, v, g, beta = _one_token(4, 4, 3)
    with pytest.raises(ScanInputError, match=r"q has shape \(1, 2, 4\).*from the state \(1, 2, 3, 4\) .*a state laid "
                                             r"out \(N, HV, V, K\) needs state_v_first=True"):
        scanweaver.gated_delta_rule_step(np.zeros((1, 2, 3, 4)), q, k, v, g, beta)
    with pytest.raises(ScanInputError, match=r"needs state_v_first=False"):
        scanweaver.kda_step(np.zeros((1, 2, 4, 3)), q, k, v, -np.ones((1, 2, 4)), beta, state_v_first=True)
    with pytest.raises(ScanInputError) as info:  # delta_rule_step has one layout: no such hint
        scanweaver.delta_rule_step(np.zeros((1, 2, 3, 4)), q, k, v, beta)
    assert "state_v_first" not in str(info.value)


def test_scale_cu_seqlens_and_gate_messages_say_what_was_given():
    q = np.ones((1, 4, 1, 4))
    v, g, beta = np.ones((1, 4, 2, 3)), -np.ones((1, 4, 2)), np.full((1, 4, 2), 0.5)
    with pytest.raises(ScanInputError, match=r"cu_seqlens .* got an empty cu_seqlens"):
        scanweaver.gated_delta_rule(q, q, v, g, beta, cu_seqlens=[])
    with pytest.raises(ScanInputError, match=r"scale must be a real number or None, got ndarray of shape \(1,\)"):
        scanweaver.gated_delta_rule(q, q, v, g, beta, np.array([0.5]))
    with pytest.raises(ScanInputError, match=r"^simple_gla: give at most one of g \(per head and step\) and g_gamma "
                                             r"\(constant per head\); got g, g_gamma"):
        scanweaver.simple_gla(q, q, v[..., :1, :], g[..., :1], np.array([-0.1]))


def test_steps_on_tensors_are_differentiable_and_keep_dtypes():
    torch = pytest.importorskip("torch")
    S = torch.randn(2, 4, 3, 5, requires_grad=True)
    q, k = torch.randn(2, 2, 3, dtype=torch.bfloat16), torch.randn(2, 2, 3, dtype=torch.bfloat16)
    v, g = torch.randn(2, 4, 5, dtype=torch.bfloat16), -torch.rand(2, 4, 3)
    beta = torch.rand(2, 4, dtype=torch.bfloat16)
    o, S1 = scanweaver.kda_step(S, q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.bfloat16 and S1.dtype == torch.float32 and S1.shape == S.shape
    (o.float().sum() + S1.sum()).backward()
    assert S.grad is not None and torch.isfinite(S.grad).all()
    Sv = S.detach().transpose(-1, -2).contiguous()
    o2, S2 = scanweaver.kda_step(Sv, q, k, v, g, beta, use_qk_l2norm_in_kernel=True, state_v_first=True)
    torch.testing.assert_close(o2, o.detach())
    torch.testing.assert_close(S2.transpose(-1, -2), S1.detach())


@pytest.mark.parametrize("op", OPS)
def test_steps_on_tensors_and_jax_arrays_equal_the_numpy_step(op):
    """NumPy arrays and CPU tensors without gradients run the fused kernel at T = 1; tensors that need gradients
    and JAX arrays the expressions of their library."""
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax.numpy")
    rng = np.random.default_rng(13)
    _, a, _ = problem(rng, PUBLIC[op], batch=3, T=1, H=4, Hq=2, K=6, V=5, dtype="float32")
    names = {"delta_rule": "q k v beta", "rwkv7": "q g k v a b"}.get(op, "q k v g beta").split()
    kw = {} if op == "rwkv7" else {"use_qk_l2norm_in_kernel": True}
    step = getattr(scanweaver, op + "_step")
    o, S = step(a["h0"], *(a[n][:, 0] for n in names), **kw)
    want_o, want_h = loop(PUBLIC[op], a, 1.0 if op == "rwkv7" else 6 ** -0.5, op != "rwkv7")
    np.testing.assert_allclose(o, want_o[:, 0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(S, want_h, rtol=1e-5, atol=1e-5)
    grad = lambda x: torch.from_numpy(x).requires_grad_()  # noqa: E731
    for lib in (torch.from_numpy, grad, jnp.asarray):
        o2, S2 = step(lib(a["h0"]), *(lib(np.ascontiguousarray(a[n][:, 0])) for n in names), **kw)
        assert type(o2) is type(lib(a["h0"])) and str(o2.dtype).endswith("float32")
        assert (lib is grad) == (isinstance(o2, torch.Tensor) and o2.requires_grad)
        np.testing.assert_allclose(np.asarray(o2.detach() if lib is grad else o2), o, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(S2.detach() if lib is grad else S2), S, rtol=1e-5, atol=1e-5)


def test_state_v_first_and_beta_logits():
    rng = np.random.default_rng(10)
    _, a, _ = problem(rng, "gated", H=4, Hq=2)
    logits = rng.normal(size=a["beta"].shape)
    base = scanweaver.gated_delta_rule(a["q"], a["k"], a["v"], a["g"], 1 / (1 + np.exp(-logits)), 0.5, a["h0"], True)
    vfirst = scanweaver.gated_delta_rule(a["q"], a["k"], a["v"], a["g"], logits, 0.5, np.swapaxes(a["h0"], -1, -2),
                                         True, False, True, False, True)
    np.testing.assert_allclose(vfirst[0], base[0], rtol=1e-12)
    np.testing.assert_allclose(np.swapaxes(vfirst[1], -1, -2), base[1], rtol=1e-12)
    neg = scanweaver.kda(a["q"], a["k"], a["v"], np.repeat(a["g"][..., None], 4, -1), logits, 0.5, None, True,
                         use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    want = loop("kda", {**a, "g": np.repeat(a["g"][..., None], 4, -1), "beta": 2 / (1 + np.exp(-logits)),
                        "h0": None}, 0.5)
    np.testing.assert_allclose(neg[0], want[0], rtol=1e-10, atol=1e-12)


def test_fla_flags_without_a_meaning_here_are_refused_by_name():
    rng = np.random.default_rng(11)
    _, a, _ = problem(rng, "gated")
    args = (a["q"], a["k"], a["v"], a["g"], a["beta"])
    with pytest.raises(ScanInputError, match=r"gated_delta_rule: head_first has been removed\. Inputs must be in "):
        scanweaver.gated_delta_rule(*args, head_first=False)
    with pytest.raises(ScanInputError, match="cp_context=.* is not supported: context parallelism"):
        scanweaver.gated_delta_rule(*args, cp_context=object())
    with pytest.raises(ScanInputError, match="use_gate_in_kernel=True is not supported"):
        scanweaver.gated_delta_rule(*args, use_gate_in_kernel=True, A_log=np.zeros(2))
    with pytest.raises(ScanInputError, match="A_log is read only by fla's use_gate_in_kernel"):
        scanweaver.gated_delta_rule(*args, A_log=np.zeros(2))
    with pytest.raises(ScanInputError, match="allow_neg_eigval=True requires use_beta_sigmoid_in_kernel=True"):
        scanweaver.gated_delta_rule(*args, allow_neg_eigval=True)
    with pytest.raises(ScanInputError, match="transpose_state_layout is fla's deprecated name of state_v_first"):
        scanweaver.gated_delta_rule(*args, transpose_state_layout=True)
    # fla's fused_recurrent_gated_delta_rule by keyword: gk and gv taken as None, refused otherwise, naming KDA
    np.testing.assert_array_equal(scanweaver.gated_delta_rule(*args, gk=None, gv=None)[0],
                                  scanweaver.gated_delta_rule(*args)[0])
    with pytest.raises(ScanInputError, match=r"gk \(a decay of fla's fused_recurrent_gated_delta_rule\) must be None; "
                                             r".*scanweaver\.kda"):
        scanweaver.gated_delta_rule(*args, gk=np.zeros(a["q"].shape))
    with pytest.raises(ScanInputError, match="gv .* must be None"):
        scanweaver.gated_delta_rule(*args, gv=np.zeros(a["v"].shape))
    kd = (a["q"], a["k"], a["v"], np.repeat(a["g"][..., None], 4, -1), a["beta"])
    for flag in ("return_intermediate_states", "use_graph"):
        with pytest.raises(ScanInputError, match=f"kda: {flag}=True is not supported"):
            scanweaver.kda(*kd, **{flag: True})
    with pytest.raises(ScanInputError, match="lower_bound must be negative"):
        scanweaver.kda(*kd, lower_bound=0.5)
    o = scanweaver.kda(*kd, safe_gate=True, lower_bound=-5.0, disable_recompute=True, chunk_size=32)[0]
    ran = scanweaver.matrix.last  # chunk_size is a hint: the chunked form where the kernel has one
    if ran.backend == "cpu":
        chunked = FUSED.get("delta_rule").chooses("c")
        assert (ran.algorithm, ran.source) == (("chunked", "hint") if chunked else ("recurrent", "default"))
    # the same result up to rounding (another algorithm may sum in another order)
    np.testing.assert_allclose(o, scanweaver.kda(*kd)[0], rtol=1e-12, atol=1e-14)
    with pytest.raises(ScanInputError, match="did you mean 'output_final_state'"):
        scanweaver.kda(*kd, output_final_stat=True)


def test_bad_operands_name_the_argument():
    rng = np.random.default_rng(12)
    _, a, _ = problem(rng, "kda", H=4, Hq=2)
    q, k, v, g, beta = (a[n] for n in ("q", "k", "v", "g", "beta"))
    with pytest.raises(ScanInputError, match=r"kda: g has shape \(2, 9, 4\); it needs \(B, T, HV, K\)"):
        scanweaver.kda(q, k, v, g[..., 0], beta)
    with pytest.raises(ScanInputError, match=r"kda: v has 3 heads and q/k 2 .*HV must be a multiple of H"):
        scanweaver.kda(q, k, v[:, :, :3], g[:, :, :3], beta[:, :, :3])
    with pytest.raises(ScanInputError, match=r"initial_state has shape \(2, 4, 5, 4\); it needs \(N, HV, K, V\)"):
        scanweaver.kda(q, k, v, g, beta, None, np.zeros((2, 4, 5, 4)))
    with pytest.raises(ScanInputError, match="cu_seqlens packs sequences along T of one batch row"):
        scanweaver.kda(q, k, v, g, beta, cu_seqlens=[0, 9])
    with pytest.raises(ScanInputError, match=r"cu_seqlens_cpu must hold the offsets of cu_seqlens .*; they differ: "
                                             r"cu_seqlens\[1\] = 4, cu_seqlens_cpu\[1\] = 5"):
        scanweaver.kda(q[:1], k[:1], v[:1], g[:1], beta[:1], cu_seqlens=[0, 4, 9], cu_seqlens_cpu=[0, 5, 9])
    with pytest.raises(ScanInputError, match=r"they differ: 3 and 2 offsets"):
        scanweaver.kda(q[:1], k[:1], v[:1], g[:1], beta[:1], cu_seqlens=[0, 4, 9], cu_seqlens_cpu=[0, 4])
    with pytest.raises(ScanInputError, match="rwkv7: w has shape"):
        scanweaver.rwkv7(q, g[..., 0], k, v, g, g)
    # v with more heads than r/k, every per-value-head operand with r/k's: v is named, not w
    r, w = q[:, :, :1], g[:, :, :1]
    with pytest.raises(ScanInputError, match=r"^rwkv7: v has 4 heads and r/k 1 \(shapes \(2, 9, 4, 5\), "
                                             r"\(2, 9, 1, 4\)\), and w, a and b have the heads of r/k; "
                                             r"pass v with the heads of r/k \(H = 1\), or for grouped value heads "
                                             r".* w, a and b \(B, T, HV, K\) = \(2, 9, 4, 4\)"):
        scanweaver.rwkv7(r, w, r, v, w, w)
    with pytest.raises(ScanInputError, match=r"^gated_delta_rule: v has 4 heads and q/k 1 .* g and beta have the "
                                             r"heads of q/k; .* g and beta \(B, T, HV\) = \(2, 9, 4\)"):
        scanweaver.gated_delta_rule(r, r, v, w[..., 0], w[..., 0])
    with pytest.raises(ScanInputError, match=r"^rwkv7: w has shape \(2, 9, 1, 4\); it needs \(B, T, HV, K\)"):
        scanweaver.rwkv7(r, w, r, v, g, g)  # a and b per value head: w is the one that disagrees
    o, _ = scanweaver.rwkv7(r, g, r, v, g, g)  # grouped value heads: w, a, b per value head
    assert o.shape == v.shape
    with pytest.raises(ScanInputError, match="gated_delta_rule_step: g has shape"):
        scanweaver.gated_delta_rule_step(np.zeros((2, 4, 4, 5)), q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0])
    with pytest.raises(ScanInputError, match="scale must be finite"):
        scanweaver.delta_rule(q, k, v, beta, float("nan"))
    # beta logits are checked as given before the sigmoid (a complex beta lost its imaginary part; a ragged list
    # raised NumPy's own error)
    with pytest.raises(ScanInputError, match=r"^kda: beta has dtype complex128; it needs a real floating-point"):
        scanweaver.kda(q, k, v, g, beta.astype(complex), use_beta_sigmoid_in_kernel=True)
    with pytest.raises(ScanInputError, match=r"^kda: beta cannot be read as an array"):
        scanweaver.kda(q, k, v, g, [[1.0, 2.0], [3.0]], use_beta_sigmoid_in_kernel=True)


def test_offsets_are_one_dimensional_and_cu_seqlens_cpu_alone_packs():
    """The offsets follow linear_attention's rule: 1-D integers (a 2-D list is refused, not flattened), and
    cu_seqlens_cpu given alone is the offsets, checked, its errors naming it."""
    rng = np.random.default_rng(13)
    _, a, _ = problem(rng, "gated", seqlens=(3, 0, 6))
    args = [a[n] for n in ("q", "k", "v", "g", "beta")]
    for bad in ([[0, 3, 9]], [[0, 3], [3, 9]]):
        with pytest.raises(ScanInputError, match=r"gated_delta_rule: cu_seqlens must be 1-D integers .* got shape"):
            scanweaver.gated_delta_rule(*args, cu_seqlens=bad)
    cu = [int(c) for c in a["cu_seqlens"]]
    want = scanweaver.gated_delta_rule(*args, None, a["h0"], True, cu_seqlens=cu)
    got = scanweaver.gated_delta_rule(*args, None, a["h0"], True, cu_seqlens_cpu=np.array(cu))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    with pytest.raises(ScanInputError, match=r"kda: cu_seqlens_cpu must be 1-D .* got cu_seqlens_cpu\[-1\] = 8"):
        scanweaver.kda(*args[:3], np.repeat(a["g"][..., None], 4, -1), a["beta"], cu_seqlens_cpu=[0, 3, 8])
    with pytest.raises(ScanInputError, match=r"delta_rule: cu_seqlens_cpu must be 1-D integers .* got shape \(1, 3\)"):
        scanweaver.delta_rule(a["q"], a["k"], a["v"], a["beta"], cu_seqlens_cpu=[[0, 3, 9]])


@pytest.mark.parametrize("bad", ["abc", "0.5", True, [1.0], float("inf")])
def test_scale_and_lower_bound_are_real_numbers(bad):
    rng = np.random.default_rng(14)
    _, a, _ = problem(rng, "kda")
    args = [a[n] for n in ("q", "k", "v", "g", "beta")]
    need = "finite" if bad == float("inf") else "a real number or None, got"
    for op in ("gated_delta_rule", "kda"):
        gate = a["g"][..., 0] if op == "gated_delta_rule" else a["g"]
        with pytest.raises(ScanInputError, match=f"{op}: scale must be {need}"):
            getattr(scanweaver, op)(*args[:3], gate, a["beta"], scale=bad)
    with pytest.raises(ScanInputError, match=f"rwkv7: scale must be {need}"):
        scanweaver.rwkv7(a["q"], a["g"], a["k"], a["v"], -a["k"], a["k"], scale=bad)
    need = "finite" if bad == float("inf") else "a negative real number or None, got"
    with pytest.raises(ScanInputError, match=f"kda: lower_bound must be {need}"):
        scanweaver.kda(*args, lower_bound=bad)
    np.testing.assert_array_equal(scanweaver.kda(*args, scale=np.float32(0.5))[0], scanweaver.kda(*args, scale=0.5)[0])


def test_a_v_first_state_of_the_wrong_shape_is_reported_as_given():
    rng = np.random.default_rng(15)
    _, a, _ = problem(rng, "gated", batch=1, H=2, Hq=1, K=4, V=3)
    args = [a[n] for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ScanInputError, match=r"gated_delta_rule: initial_state has shape \(1, 2, 4, 3\); it needs "
                                             r"\(N, HV, V, K\) \(state_v_first\) .*= \(1, 2, 3, 4\)"):
        scanweaver.gated_delta_rule(*args, initial_state=a["h0"], state_v_first=True)
    with pytest.raises(ScanInputError, match=r"kda: initial_state has shape \(2, 4, 3\); it needs "
                                             r"\(N, HV, V, K\) \(state_v_first\) = \(1, 2, 3, 4\)"):
        scanweaver.kda(*args[:3], np.repeat(a["g"][..., None], 4, -1), a["beta"], initial_state=a["h0"][0],
                       state_v_first=True)


def test_mixed_dtypes_follow_the_documented_rule():
    """docs/delta-rule.md (Numerics): the operands set the accumulation dtype, o takes v's, the final state the
    accumulation dtype; a float64 initial state with float32 operands is rounded to float32."""
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 1, 8, 1, 4)).astype(np.float32)
    v, g = rng.normal(size=(1, 8, 2, 3)).astype(np.float32), -rng.uniform(0.1, 1, (1, 8, 2)).astype(np.float32)
    beta, h0 = rng.uniform(0, 1, (1, 8, 2)), rng.normal(size=(1, 2, 4, 3))
    o, S = scanweaver.gated_delta_rule(q, k, v, g, beta, None, None, True)  # beta float64
    assert (o.dtype, S.dtype) == (np.float32, np.float64)
    o, S = scanweaver.gated_delta_rule(q, k, v, g, beta.astype(np.float32), None, h0, True)
    assert (o.dtype, S.dtype) == (np.float32, np.float32)
    o32, _ = scanweaver.gated_delta_rule(q, k, v, g, beta.astype(np.float32), None, h0.astype(np.float32), True)
    np.testing.assert_array_equal(o, o32)  # the same as a float32 initial state
