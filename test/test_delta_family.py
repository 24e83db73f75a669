"""The fused ``delta_rule`` operation's NumPy definition (forward and backward) for DeltaNet, Gated DeltaNet,
KDA and RWKV-7: against float64 loops of the four recurrences (``delta_family.loop``), against
flash-linear-attention 0.6's naive references (outputs, final states, and gradients by PyTorch autograd), and
its backward against finite differences; packed sequences with an empty one, grouped value heads, in-kernel
L2 normalisation, T = 1, log decays from -20 to -1e-4 and -inf (an exact reset, never NaN).
"""

from __future__ import annotations

import numpy as np
import pytest
from delta_family import FAMILIES, inputs_of, loop, problem

from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import DeltaRuleFeatures, backward_reference, forward_reference
from scanweaver.runtime import get_backend

OP = FUSED.get("delta_rule")

#: name -> problem() keywords: plain with h0; grouped heads with l2norm; packed with an empty sequence;
#: T = 1; strong and weak decays.
CASES = {"plain": {}, "groups_l2norm": {"Hq": 1, "H": 3, "l2norm": True},
         "packed": {"seqlens": [4, 0, 7, 1], "Hq": 1}, "one_step": {"T": 1},
         "decays": {"T": 23, "lo": -20.0, "hi": -1e-4, "K": 6, "V": 3}}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_forward_matches_the_float64_loop(family, case):
    rng = np.random.default_rng(len(family) * 31 + len(case))
    f, a, sizes = problem(rng, family, **CASES[case])
    o, h = forward_reference(a["q"], a["k"], a["v"], **inputs_of(a), l2norm=f.l2norm)
    want_o, want_h = loop(family, a, 0.7, f.l2norm)
    np.testing.assert_allclose(0.7 * o, want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)
    out = {"o": np.full_like(o, np.nan), "hlast": np.full_like(h, np.nan)}
    get_backend("numpy").run_fused(OP.call("forward", f, {}), {**a, **out}, sizes)
    np.testing.assert_array_equal(out["o"], o)
    np.testing.assert_array_equal(out["hlast"], h)


def loss_and_grads(f, a, do):
    """The loss sum(o * do) + sum(hlast * dhlast) of the definition, and its gradients by the backward."""
    def loss():
        o, h = forward_reference(a["q"], a["k"], a["v"], **inputs_of(a), l2norm=f.l2norm)
        return float((o * do).sum() + (h * a["dhlast"]).sum())

    grads = backward_reference(a["q"], a["k"], a["v"], **inputs_of(a), l2norm=f.l2norm, do=do, dhlast=a["dhlast"])
    return loss, grads


def finite_differences(loss, x, eps=1e-6):
    fd = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        keep = x[i]
        x[i] = keep + eps
        hi = loss()
        x[i] = keep - eps
        lo = loss()
        x[i] = keep
        fd[i] = (hi - lo) / (2 * eps)
    return fd


GRAD_CASES = {"groups_l2norm": {"batch": 1, "T": 6, "Hq": 1, "H": 2, "K": 3, "V": 2, "l2norm": True},
              "packed": {"seqlens": [3, 0, 4], "Hq": 1, "H": 2, "K": 3, "V": 2}}


@pytest.mark.parametrize("case", GRAD_CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_backward_matches_finite_differences(family, case):
    rng = np.random.default_rng(len(family) + 7 * len(case))
    f, a, sizes = problem(rng, family, dhlast=True, **GRAD_CASES[case])
    do = rng.normal(size=a["v"].shape)
    loss, grads = loss_and_grads(f, a, do)
    for name in ("q", "k", "v", "g", "beta", "a", "b", "h0"):
        if name in a:
            np.testing.assert_allclose(grads["d" + name], finite_differences(loss, a[name]), rtol=1e-6, atol=1e-8,
                                       err_msg=name)
    out = {n: np.full_like(g, np.nan) for n, g in grads.items() if g is not None}
    get_backend("numpy").run_fused(OP.call("backward", f, {}), {**a, "do": do, **out}, sizes)
    for n, g in out.items():
        np.testing.assert_array_equal(g, grads[n], err_msg=n)


@pytest.mark.parametrize("family", ["gated", "kda", "rwkv7"])
def test_minus_infinity_log_decays_reset_exactly(family):
    """g = -inf zeroes the state (D = 0): outputs as the loop, every gradient finite and as differences say."""
    rng = np.random.default_rng(3)
    f, a, _ = problem(rng, family, batch=1, T=7, H=2, Hq=2, K=3, V=2, dhlast=True)
    a["g"][0, 2] = -np.inf
    a["g"][0, 5, 1] = -np.inf
    o, h = forward_reference(a["q"], a["k"], a["v"], **inputs_of(a))
    want_o, want_h = loop(family, a)
    np.testing.assert_allclose(o, want_o, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h, want_h, rtol=1e-10, atol=1e-10)
    do = rng.normal(size=o.shape)
    loss, grads = loss_and_grads(f, a, do)
    assert all(np.isfinite(g).all() for g in grads.values() if g is not None)
    assert (grads["dg"][0, 2] == 0).all()
    for name in ("q", "k", "v", "g", "h0"):
        np.testing.assert_allclose(grads["d" + name], finite_differences(loss, a[name]), rtol=1e-6, atol=1e-8,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_accumulates_in_float32(dtype):
    rng = np.random.default_rng(11)
    f, a, sizes = problem(rng, "kda", T=12, dtype=dtype, dhlast=True)
    o, h = forward_reference(a["q"], a["k"], a["v"], **inputs_of(a))
    assert o.dtype.name == dtype and h.dtype == np.float32
    want_o, want_h = loop("kda", a)
    tol = {"float16": 4e-3, "bfloat16": 3e-2}[dtype]
    np.testing.assert_allclose(o.astype(np.float64), want_o, atol=tol * np.abs(want_o).max(), rtol=0)
    np.testing.assert_allclose(h, want_h, atol=1e-5 * np.abs(want_h).max(), rtol=0)
    grads = backward_reference(a["q"], a["k"], a["v"], **inputs_of(a), do=np.ones_like(o), dhlast=a["dhlast"])
    assert grads["dq"].dtype.name == dtype and grads["dh0"].dtype == np.float32
    out = {"o": np.empty_like(o), "hlast": np.empty_like(h)}
    get_backend("numpy").run_fused(OP.call("forward", f, {}), {**a, **out}, sizes)
    np.testing.assert_array_equal(out["o"], o)


# ---- flash-linear-attention's naive references --------------------------------------------------------


def fla_run(family, a, scale):
    """fla's naive reference of ``family`` on torch float32 leaves (the dtype its references compute in):
    ``(o, final state, leaves)`` with o and the state in the fused operation's layouts."""
    import matrix_peers as peers
    import torch

    mods = {"deltanet": "delta_rule/naive", "gated": "gated_delta_rule/naive", "kda": "kda/naive",
            "rwkv7": "generalized_delta_rule/dplr/naive"}
    mod = peers.fla(mods[family])
    if mod is None:
        pytest.skip(peers.FLA_WHY)
    leaves = {n: torch.tensor(x, dtype=torch.float32, requires_grad=True) for n, x in a.items()
              if n not in ("cu_seqlens", "dhlast")}
    t = leaves
    K = a["q"].shape[-1]
    if family == "gated":
        o, h = mod.naive_recurrent_gated_delta_rule(t["q"], t["k"], t["v"], t["beta"], t["g"], scale=scale,
                                                    initial_state=t["h0"], output_final_state=True)
    elif family == "kda":
        o, h = mod.naive_recurrent_kda(t["q"], t["k"], t["v"], t["g"], t["beta"], scale=scale,
                                       initial_state=t["h0"], output_final_state=True)
    else:  # (B, H, T, K) layouts and the scale K**-0.5 built in
        bh = {n: x.transpose(1, 2) for n, x in t.items() if n != "h0"}
        if family == "deltanet":
            o, h = mod.delta_rule_recurrence(bh["q"], bh["k"], bh["v"], bh["beta"], initial_state=t["h0"],
                                             output_final_state=True)
        else:
            o, h = mod.dplr_recurrence(bh["q"], bh["k"], bh["v"], bh["a"], bh["b"], bh["g"],
                                       initial_state=t["h0"], output_final_state=True)
        o = o.transpose(1, 2) * (scale / K ** -0.5)
    return o, h, leaves


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_fla_naive_references_and_their_autograd(family):
    import torch

    rng = np.random.default_rng(17)
    H = 2
    f, a, _ = problem(rng, family, batch=2, T=33, H=H * (2 if family == "kda" else 1), Hq=H, K=8, V=6,
                      lo=-5.0, hi=-1e-3, dhlast=True)
    scale = 8 ** -0.5
    o_fla, h_fla, leaves = fla_run(family, a, scale)
    o, h = forward_reference(a["q"], a["k"], a["v"], **inputs_of(a))
    np.testing.assert_allclose(scale * o, o_fla.detach().numpy(), rtol=0, atol=2e-5 * np.abs(o).max())
    np.testing.assert_allclose(h, h_fla.detach().numpy(), rtol=0, atol=2e-5 * np.abs(h).max())
    do = rng.normal(size=o.shape)
    ((o_fla * torch.tensor(do, dtype=torch.float32)).sum()
     + (h_fla * torch.tensor(a["dhlast"], dtype=torch.float32)).sum()).backward()
    grads = backward_reference(a["q"], a["k"], a["v"], **inputs_of(a), do=scale * do, dhlast=a["dhlast"])
    for n, leaf in leaves.items():
        want = leaf.grad.numpy()
        np.testing.assert_allclose(grads["d" + n], want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()), err_msg=n)


def test_bad_features_and_heads_are_clear_errors():
    with pytest.raises(ScanInputError, match="gate='diag'"):
        DeltaRuleFeatures("float32", 4, 4, gate="diag")
    with pytest.raises(ScanInputError, match="form"):
        DeltaRuleFeatures("float32", 4, 4, form="dense")
    with pytest.raises(ScanInputError, match="dtype"):
        DeltaRuleFeatures("int32", 4, 4)
    rng = np.random.default_rng(0)
    f, a, sizes = problem(rng, "gated", H=3, Hq=3)
    out = {"o": np.empty(a["v"].shape), "hlast": np.empty(a["h0"].shape)}
    with pytest.raises(ScanInputError, match="multiple of Hq = 2"):
        get_backend("numpy").run_fused(OP.call("forward", f, {}), {**a, **out}, {**sizes, "Hq": 2})
    with pytest.raises(ScanInputError, match="needs g"):
        get_backend("numpy").run_fused(OP.call("forward", f, {}), {**a, "g": None, **out}, sizes)
