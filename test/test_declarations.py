"""Every operation is declared once: its entry points share one signature, and the front door's checks hold."""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

import scanweaver
from scanweaver.calls import route
from scanweaver.calls.declare import OPERATIONS
from scanweaver.errors import ScanInputError

ADAPTERS = ("torch", "jax", "dask")


def _adapter(name):
    try:
        return importlib.import_module(f"scanweaver.{name}")
    except ImportError as exc:  # the framework is not installed here
        pytest.skip(f"scanweaver.{name} needs its framework: {exc}")


def test_every_public_operation_is_declared():
    names = set(OPERATIONS.names())
    public = {"delta_rule", "delta_rule_step", "gated_delta_rule", "gated_delta_rule_step", "kda", "kda_step",
              "linear_attention", "linear_attention_step", "log_scan", "mamba2_scan", "mamba2_state_update",
              "mamba2_step", "mamba_selective_scan", "retention", "rwkv6", "rwkv6_step", "rwkv7", "rwkv7_step",
              "selective_scan", "simple_gla"}
    assert public <= names
    for name in names:
        assert getattr(scanweaver, name).declaration is OPERATIONS.get(name)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_entry_point_has_the_declared_signature(adapter):
    mod = _adapter(adapter)
    carried = [op for op in OPERATIONS.values() if adapter in op.frameworks]
    assert carried, f"scanweaver.{adapter} carries no operation"
    for op in carried:
        numpy_entry = getattr(scanweaver, op.name)
        entry = getattr(mod, op.name)
        assert inspect.signature(entry) == inspect.signature(numpy_entry) == op.signature, op.name
        assert entry.__doc__ == numpy_entry.__doc__ == op.doc, op.name
    for op in OPERATIONS.values():
        if adapter not in op.frameworks:
            assert not hasattr(mod, op.name) or getattr(mod, op.name).declaration is not op


def test_booleans_must_be_booleans():
    a = np.full((1, 4), 0.5)
    with pytest.raises(ScanInputError, match="reverse must be True or False, got 'no'"):
        scanweaver.selective_scan(a, a, a, reverse="no")
    q = np.ones((1, 3, 1, 2))
    with pytest.raises(ScanInputError, match="output_final_state must be True or False"):
        scanweaver.linear_attention(q, q, q, output_final_state=1)

    @scanweaver.recurrence
    def ema(h, alpha, x):
        return alpha * h + (1 - alpha) * x

    with pytest.raises(ScanInputError, match="return_state must be True or False"):
        ema(a, a, return_state="yes")
    assert scanweaver.selective_scan(a, a, a, reverse=np.bool_(True), backend="numpy").shape == a.shape


def test_unknown_keyword_names_parameters_tunables_and_the_nearest():
    q = np.ones((1, 3, 1, 2))
    with pytest.raises(ScanInputError) as exc:
        scanweaver.linear_attention(q, q, q, revers=True)
    msg = str(exc.value)
    assert "unknown keyword 'revers'" in msg and "did you mean 'reverse'?" in msg
    assert "parameter (q, k, v" in msg and "tunable (" in msg and "block_v" in msg
    a = np.full((1, 4), 0.5)
    with pytest.raises(ScanInputError, match="did you mean 'reverse'"):
        scanweaver.selective_scan(a, a, a, revrse=True)
    with pytest.raises(ScanInputError, match="did you mean 'delta_softplus'"):
        scanweaver.mamba_selective_scan(np.ones((1, 2, 3)), np.ones((1, 2, 3)), -np.ones((2, 2)),
                                        np.ones((1, 2, 3)), np.ones((1, 2, 3)), delta_softplu=True)


def test_router_refuses_mixed_frameworks_with_a_message():
    torch = pytest.importorskip("torch")
    with pytest.raises(ScanInputError, match="mix PyTorch tensors and NumPy arrays"):
        route.framework("linear_attention", [torch.ones(2), np.ones(2)])
    q = torch.ones(1, 3, 1, 2)
    with pytest.raises(ScanInputError, match="linear_attention: operands mix PyTorch tensors and NumPy arrays"):
        scanweaver.linear_attention(q, q, np.ones((1, 3, 1, 2)))
    with pytest.raises(ScanInputError, match="log_scan: takes NumPy arrays only"):
        scanweaver.log_scan(torch.zeros(1, 3), torch.ones(1, 3, requires_grad=True))


def test_outputs_in_the_callers_array_type():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.normal(size=(1, 5, 2, 3))) for _ in range(3))
    o, h = scanweaver.linear_attention(q, k, v, output_final_state=True)
    assert isinstance(o, torch.Tensor) and isinstance(h, torch.Tensor)
    o_np, _ = scanweaver.linear_attention(q.numpy(), k.numpy(), v.numpy())
    np.testing.assert_allclose(o.numpy(), o_np, rtol=1e-12)
    s = torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    o1, s1 = scanweaver.linear_attention_step(s, q[:, 0], k[:, 0], v[:, 0])
    assert isinstance(o1, torch.Tensor) and isinstance(s1, torch.Tensor)


def test_adapters_register_with_the_router_not_the_core():
    import sys

    for name in ADAPTERS:
        mod = sys.modules.get(f"scanweaver.{name}")
        if mod is not None:
            assert route.ADAPTERS.get(name) is mod


def test_in_place_writes_are_declared_on_array_parameters():
    """``writes`` names what a call changes in place (the adapters tell their frameworks); only array parameters."""
    from scanweaver.calls.declare import operation

    assert OPERATIONS.get("mamba2_state_update").writes == ("state",)
    assert all(not op.writes for op in OPERATIONS.values() if op.name != "mamba2_state_update")
    with pytest.raises(TypeError, match=r"writes names \['scale'\]"):
        @operation(arrays=("x",), writes=("scale",), name="not_registered_demo")
        def demo(x, scale=1.0):
            return x
