"""The MLIR target: modules in upstream dialects that IREE's parser reads back, gates through the expression printer.

Text checks run everywhere; the round trip through ``iree.compiler.ir.Module.parse`` needs
``scanweaver[iree]`` and skips with the reason without it.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
import sys

import numpy as np
import pytest

import scanweaver
from scanweaver.api import SELECTIVE, SELECTIVE_NO_C
from scanweaver.ir.expr import call, inp
from scanweaver.ir.functions import FUNCTIONS
from scanweaver.ir.stages import Features
from scanweaver.passes import lower
from scanweaver.schedules import schedules_for
from scanweaver.targets.mlir_expr import Body, float_literal
from scanweaver.targets.mlir_target import MLIRRenderer

HAVE_IREE = importlib.util.find_spec("iree") is not None and importlib.util.find_spec("iree.compiler") is not None
needs_iree = pytest.mark.skipif(not HAVE_IREE, reason="IREE is not installed (pip install scanweaver[iree])")
SMALL = {"sequential": {}, "chunked": {"chunk": 256}, "blelloch": {"workgroup_size": 32}}
FEATURES = [Features(), Features(reverse=True, has_h0=True, has_reset=True, return_state=True),
            Features(has_reset=True), Features(reverse=True)]


def module(schedule: str, features: Features = Features(), dtype: str = "float32", rec=SELECTIVE) -> str:
    stages = lower(rec.scan_ir(dtype, features), schedule, SMALL[schedule], ())
    return MLIRRenderer().render(stages)


def parse(text: str) -> str:
    from iree.compiler import ir

    with ir.Context():
        return str(ir.Module.parse(text))


def test_the_mlir_target_renders_exactly_the_three_schedules():
    assert set(schedules_for("mlir")) == {"sequential", "chunked", "blelloch"}
    assert not MLIRRenderer.implements("sequential", "dense")


@pytest.mark.parametrize("schedule", sorted(SMALL))
def test_modules_use_upstream_dialects_and_one_function_per_schedule_op(schedule):
    text = module(schedule, FEATURES[1])
    dialects = set(re.findall(r"\b([a-z_]+)\.[a-z_]+\b(?= |\()", text)) - {"call"}
    assert dialects <= {"func", "arith", "math", "tensor", "linalg"}, dialects
    stage = lower(SELECTIVE.scan_ir("float32", FEATURES[1]), schedule, SMALL[schedule], ()).schedule
    for op in stage.ops:
        if op.name != "blelloch.root" or schedule == "blelloch":
            assert f"@{op.name.replace('.', '_')}(" in text, op.name
    head = text.splitlines()[1]
    assert head.startswith("func.func @sw_scan(%in_a: tensor<?x?xf32>, %in_b: tensor<?x?xf32>, %in_x")
    assert "%h0: tensor<?xf32>, %reset: tensor<?x?xi8>) -> (tensor<?x?xf32>, tensor<?xf32>)" in head
    assert "@sw_flip(" in text and "@sw_flip_mask(" in text


def test_every_expression_function_has_a_lowering_and_constants_are_exact():
    for name, fn in FUNCTIONS.items():
        body = Body("f64", {"x": "%x", "y": "%y", "z": "%z"})
        body.expr(call(name, *(inp(v) for v in "xyz"[:fn.arity])))
        assert body.lines, name
    assert float(float_literal(0.1, "f64")) == 0.1
    assert float_literal(float("inf"), "f32") == "0x7F800000"
    shared = Body("f32", {"a": "%a"})
    e = call("exp", inp("a"))
    assert shared.expr(e) == shared.expr(call("exp", inp("a"))) and len(shared.lines) == 1


@needs_iree
@pytest.mark.parametrize("schedule,features,dtype",
                         [(s, f, d) for s, f, d in itertools.product(sorted(SMALL), FEATURES, ("float32", "float64"))])
def test_every_module_round_trips_through_the_iree_parser(schedule, features, dtype):
    for rec in (SELECTIVE, SELECTIVE_NO_C):
        text = module(schedule, features, dtype, rec)
        printed = parse(text)
        assert "func.func @sw_scan" in printed and "linalg.generic" in printed
        assert parse(printed) == printed


@scanweaver.recurrence
def gated(h, d, g, x):
    """Every function of the expression table in one gate."""
    decay = np.exp(-scanweaver.softplus(d)) * scanweaver.sigmoid(g) * (0.75 + 0.25 * np.tanh(np.sin(d) * np.cos(g)))
    drive = (scanweaver.silu(x) + np.log1p(np.abs(x)) + np.expm1(np.minimum(x, 0.5)) * np.sign(g)
             + np.sqrt(np.maximum(np.abs(g), 0.1)) * np.log(1 + np.abs(d)) + np.power(np.abs(x) + 1, 0.5))
    return decay * h + drive


def test_gates_written_as_expressions_lower_to_math_and_arith():
    text = gated.lower(backend="iree", schedule="sequential").text()["mlir"]
    for op in ("math.exp", "math.log1p", "math.tanh", "math.sin", "math.cos", "math.absf", "math.sqrt",
               "math.log ", "math.expm1", "math.powf", "arith.maximumf", "arith.minimumf", "arith.select",
               "arith.cmpf"):
        assert op in text, op
    if HAVE_IREE:
        parse(text)


@needs_iree
def test_gated_recurrence_runs_on_iree_like_the_numpy_oracle(rng):
    d, g, x = (rng.standard_normal((3, 37)).astype(np.float32) for _ in range(3))
    want = gated(*(v.astype(np.float64) for v in (d, g, x)), backend="numpy")
    got = gated(d, g, x, backend="iree", schedule="chunked", chunk=256)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    assert "mlir" in gated.stages.text() and gated.last.backend == "iree"


@scanweaver.recurrence
def tanh_gate(h, g, x):
    return (0.5 + 0.4 * np.tanh(g)) * h + x


@needs_iree
def test_float64_tanh_is_exact_and_float64_sin_fails_with_the_reason(rng):
    from scanweaver.errors import CompileError

    g = np.concatenate([rng.standard_normal((2, 20)), np.array([[1e-9, -1e-12, 30.0, -30.0] * 5] * 2)], axis=1)
    x = rng.standard_normal(g.shape)
    np.testing.assert_allclose(tanh_gate(g, x, backend="iree"), tanh_gate(g, x, backend="numpy"), rtol=1e-13)
    with pytest.raises(CompileError, match="float64 sin or cos"):
        gated(g, g, x, backend="iree", schedule="sequential")


def test_ir_cli_prints_the_mlir_module():
    out = subprocess.run([sys.executable, "-m", "scanweaver", "ir", "--mlir", "--schedule", "blelloch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("module {") and "@blelloch_down(" in out.stdout
    if HAVE_IREE:
        parse(out.stdout)
