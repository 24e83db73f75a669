"""Kernel Tuner's Julia backend (``lang="julia"``) driven by ScanWeaver: the inputs checked against Kernel
Tuner's own conversion code without Julia, a real tune on the KernelAbstractions CPU backend with it."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.julia.kernels import kernel_tuner_arguments, kernel_tuner_problem
from scanweaver.tuning.session import kernel_tuner_inputs

kernel_tuner = pytest.importorskip("kernel_tuner", reason="Kernel Tuner is not installed (scanweaver[tune])")

#: ``tune_kernel`` raises this for a non-dict ``objectives`` after it has converted every Julia input, so a
#: call that reaches it shows those conversions accepted what ScanWeaver passes (nothing is compiled or run).
PAST_THE_CONVERSIONS = "objectives should be a dict"


def _tune_kernel_inputs(tune_params, strategy_options):
    kt = kernel_tuner_problem("blelloch", "float32", "cpu", lanes=4)
    args = kernel_tuner_arguments(*(np.ones((4, 100), np.float32),) * 3, reverse=True)
    with pytest.raises(ValueError) as err:
        kernel_tuner.tune_kernel(kt["kernel_name"], kt["kernel_source"], kt["problem_size"], args, tune_params,
                                 lang="julia", block_size_names=kt["block_size_names"], grid_div_x=kt["grid_div_x"],
                                 compiler_options=kt["compiler_options"], strategy="random_sample",
                                 strategy_options=strategy_options, objectives="time")
    return str(err.value)


def test_kernel_tuner_converts_the_julia_tunables_and_strategy_options():
    params, options = kernel_tuner_inputs("julia", {"workgroup_size": [32, 64]}, {"max_fevals": 3, "time_limit": 9})
    assert params == [("workgroup_size", [32, 64])] and options == [("max_fevals", 3), ("time_limit", 9)]
    assert PAST_THE_CONVERSIONS in _tune_kernel_inputs(params, options)


def test_the_dicts_kernel_tuner_refuses_for_julia():
    assert "should not be a Julia dict" in _tune_kernel_inputs({"workgroup_size": [32, 64]}, None)
    pairs, _ = kernel_tuner_inputs("julia", {"workgroup_size": [32, 64]}, None)
    assert "too many values to unpack" in _tune_kernel_inputs(pairs, {"max_fevals": 3})


def test_other_languages_keep_their_dicts():
    params, options = {"chunk": [512]}, {"max_fevals": 3}
    assert kernel_tuner_inputs("C", params, options) == (params, options)
    assert kernel_tuner_inputs("cupy", params, None) == (params, None)


def test_the_device_is_chosen_where_there_is_a_choice():
    from scanweaver.errors import ScanInputError
    from scanweaver.tuning import tune
    from scanweaver.tuning.langs import get_target

    with pytest.raises(ScanInputError, match="backend 'cpu' has no device choice"):
        tune(backend="cpu", shape=(2, 64), device="cuda")
    target = get_target("julia")
    with pytest.raises(ScanInputError, match="unknown julia device 'tpu'"):
        target.select_device("tpu")
    target.select_device("cpu")
    assert target.tuned_device() == "cpu"
    values, fixed = target.fused_values({})
    assert fixed == {"device": "cpu"} and values["chunk"] and min(values["chunk"]) > 0


def _julia_tunable():
    """Skips unless the julia backend can be tuned on the CPU device, which the tunes below use."""
    from scanweaver.tuning.langs import get_target

    target = get_target("julia")
    target.select_device("cpu")
    why = target.unavailable()
    if why:
        pytest.skip(f"julia cannot be tuned here: {why}")


@pytest.mark.parametrize("strategy", ["brute_force", "random_sample"])
def test_cli_tunes_julia_on_the_cpu_and_the_next_scan_uses_it(tmp_path, monkeypatch, strategy):
    import io
    import json
    from contextlib import redirect_stdout

    import scanweaver
    from scanweaver.api import SELECTIVE
    from scanweaver.cli import main

    _julia_tunable()
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["tune", "--backend", "julia", "--device", "cpu", "--shape", "4,1500", "--strategy", strategy,
                   "--max-fevals", "3", "--values", "workgroup_size=32,64,128", "--json"])
    assert rc == 0
    rep = json.loads(out.getvalue())
    assert rep["backend"] == "julia" and rep["strategy"] == strategy and rep["skipped"] == 0
    assert rep["evaluated"] >= 2 and 0 < rep["best_ms"] <= rep["median_ms"]
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 0.99, (4, 1500)).astype(np.float32)
    b, x, c = (rng.standard_normal((4, 1500)).astype(np.float32) for _ in range(3))
    y = scanweaver.selective_scan(a, b, x, c, backend="julia")
    assert SELECTIVE.last.source == "tuned"
    assert SELECTIVE.last.config["workgroup_size"] == rep["best_config"]["workgroup_size"]
    np.testing.assert_allclose(y, scanweaver.selective_scan(a, b, x, c, backend="numpy"), rtol=1e-4, atol=1e-4)
