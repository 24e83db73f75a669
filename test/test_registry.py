"""The plug-in registry and the schedule-completeness contract.

Every schedule declares the targets that implement it
(``Schedule.implementations``); every target says what it implements
(``implements(schedule, kind)``).  The two must agree both ways, so a schedule
cannot be half-added (an interpreter op, a C body, GPU kernels or a Julia
mapping missing) and no implementation exists that its schedule does not claim.
"""

from __future__ import annotations

import sys
import textwrap
import threading

import pytest

from scanweaver.errors import UnknownPluginError
from scanweaver.fused import PARTS
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused import FusedOp
from scanweaver.ir.stages import ScheduleOp
from scanweaver.registry import Discovery, Registry
from scanweaver.runtime import REGISTRY as BACKENDS
from scanweaver.schedules import REGISTRY as SCHEDULES
from scanweaver.schedules import Schedule
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import KERNELS as FUSED_KERNELS
from scanweaver.targets.fused import implements as fused_implements

KINDS = ("diagonal", "dense")


def completeness_problems(schedules=None) -> list[str]:
    """Every disagreement between the schedules' declarations and the targets' implementations."""
    problems = []
    schedules = dict(SCHEDULES.items()) if schedules is None else schedules
    for name, sched in schedules.items():
        for target, kinds in sched.implementations.items():
            if target not in TARGETS:
                problems.append(f"{name}: claims unknown target {target!r}")
                continue
            for kind in kinds:
                if not TARGETS.get(target).implements(name, kind):
                    problems.append(f"{name}: claims {target} implements {kind} transitions, but it does not")
        for target, cls in TARGETS.items():
            for kind in KINDS:
                if cls.implements(name, kind) and kind not in sched.implementations.get(target, ()):
                    problems.append(f"{name}: {target} implements {kind} transitions the schedule does not claim")
    return problems


def test_every_schedule_is_implemented_where_it_claims_and_claims_what_is_implemented():
    assert completeness_problems() == []


def test_the_interpreter_claim_matches_the_kinds_its_ops_handle():
    for name, sched in SCHEDULES.items():
        assert set(sched.implementations.get("numpy", ())) == set(sched.kinds), name


def test_backends_run_exactly_the_schedules_their_target_implements():
    for name, cls in BACKENDS.items():
        assert cls.target in TARGETS, name
        want = tuple(s for s, sch in SCHEDULES.items() if cls.target in sch.implementations)
        assert cls.schedules == want, name
        assert cls.schedules, f"backend {name} runs no schedule"


def fused_problems(ops=None) -> list[str]:
    """Every disagreement between the fused operations' declarations and the targets' renderings."""
    problems = []
    ops = dict(FUSED.items()) if ops is None else ops
    for name, op in ops.items():
        for target, parts in op.implementations.items():
            if target not in TARGETS:
                problems.append(f"{name}: claims unknown target {target!r}")
                continue
            for part in parts:
                if not fused_implements(target, name, part):
                    problems.append(f"{name}: claims {target} renders its {part}, but it does not")
        for target in TARGETS.names():
            for part in PARTS:
                if fused_implements(target, name, part) and part not in op.implementations.get(target, ()):
                    problems.append(f"{name}: {target} renders its {part}, which the operation does not claim")
    return problems


def test_every_fused_operation_is_rendered_where_it_claims_and_claims_what_is_rendered():
    assert fused_problems() == []
    assert FUSED.get("mamba1").runs_on("c", "backward")


def test_backends_run_exactly_the_fused_operations_their_target_renders():
    for name, cls in BACKENDS.items():
        want = tuple(n for n, op in FUSED.items() if cls.target in op.implementations)
        assert cls.fused == want, name


def test_a_half_added_fused_operation_is_reported():
    class Planted(FusedOp):
        name = "planted"
        description = "claims a C backward and a TPU rendering that were never written"
        implementations = {"numpy": PARTS, "c": PARTS, "tpu": ("forward",)}

        def params(self, part):
            return ()

        def shapes(self, part, features, sizes):
            return {}

        def reference(self, part, features, arrays, sizes):
            return None

    problems = fused_problems({"planted": Planted()})
    assert "planted: claims numpy renders its forward, but it does not" in problems
    assert "planted: claims c renders its backward, but it does not" in problems
    assert "planted: claims unknown target 'tpu'" in problems
    mamba = FUSED.get("mamba1")

    class Unclaimed(type(mamba)):
        implementations = {"numpy": PARTS}  # the C kernels exist but are not claimed

    assert "mamba1: c renders its backward, which the operation does not claim" in \
        fused_problems({"mamba1": Unclaimed()})


def test_a_half_added_schedule_is_reported():
    class Planted(Schedule):
        name = "planted"
        description = "a schedule whose C body and interpreter op were never written"
        implementations = {"numpy": ("diagonal",), "c": ("diagonal",), "tpu": ("diagonal",)}

        def ops(self, config):
            return (ScheduleOp("planted.scan"),)

    SCHEDULES.add("planted", Planted())
    try:
        problems = completeness_problems({"planted": Planted()})
    finally:
        SCHEDULES.remove("planted")
    assert "planted: claims numpy implements diagonal transitions, but it does not" in problems
    assert "planted: claims c implements diagonal transitions, but it does not" in problems
    assert "planted: claims unknown target 'tpu'" in problems


def test_an_unclaimed_implementation_is_reported():
    sched = SCHEDULES.get("chunked")

    class Unclaimed(type(sched)):
        implementations = {"numpy": ("diagonal", "dense")}  # the C body exists but is not claimed

    problems = completeness_problems({"chunked": Unclaimed()})
    assert "chunked: c implements diagonal transitions the schedule does not claim" in problems


@pytest.fixture
def plugin_package(tmp_path, monkeypatch):
    """A throwaway package with one good plug-in module, one whose dependency is missing, and support code."""
    pkg = tmp_path / "swplugins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from scanweaver.registry import Discovery, Registry\n"
                                     "THINGS = Registry('thing', (Discovery('swplugins', ('*_thing',)),))\n")
    (pkg / "good_thing.py").write_text(textwrap.dedent("""
        from . import THINGS

        @THINGS.register
        class Good:
            name = "good"
    """))
    (pkg / "optional_thing.py").write_text("import a_module_that_is_not_installed\n")
    (pkg / "helpers.py").write_text("raise RuntimeError('support code must not be imported by discovery')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for mod in [m for m in sys.modules if m == "swplugins" or m.startswith("swplugins.")]:
        del sys.modules[mod]


def test_discovery_imports_plugins_by_name_lazily_and_explains_failures(plugin_package):
    import swplugins

    assert "swplugins.good_thing" not in sys.modules
    assert swplugins.THINGS.get("good").__name__ == "Good"
    assert "swplugins.good_thing" in sys.modules and "swplugins.helpers" not in sys.modules
    with pytest.raises(UnknownPluginError) as info:
        swplugins.THINGS.get("fancy")
    msg = str(info.value)
    assert msg.startswith("thing: unknown thing 'fancy'; known: good")
    assert "could not load: swplugins.optional_thing (ModuleNotFoundError" in msg
    assert swplugins.THINGS.get("fancy", None) is None


def test_threads_asking_at_once_all_wait_for_every_plug_in(plugin_package):
    (plugin_package / "slow_thing.py").write_text(textwrap.dedent("""
        import time

        from . import THINGS

        time.sleep(0.3)

        @THINGS.register
        class Slow:
            name = "slow"
    """))
    import swplugins

    found: list = []
    threads = [threading.Thread(target=lambda: found.append(swplugins.THINGS.get("slow", None))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(found) == 4 and all(f is not None and f.__name__ == "Slow" for f in found)


def test_names_collide_loudly_and_registration_is_idempotent():
    reg: Registry = Registry("widget")

    class A:
        name = "a"

    reg.register(A)
    reg.register(A)
    assert reg.names() == ("a",)

    class Other:
        name = "a"

    with pytest.raises(ValueError, match="already registered"):
        reg.register(Other)
    assert Discovery("scanweaver.schedules").modules()[0].startswith("scanweaver.schedules.")


def test_every_kind_of_plug_in_goes_through_a_registry():
    from scanweaver.targets.c_source import C_SCHEDULES
    from scanweaver.targets.gpu import SCHEDULES as GPU_SCHEDULES
    from scanweaver.targets.mlir_target import MLIR_SCHEDULES
    from scanweaver.targets.reference import OPS
    from scanweaver.tuning.langs import TARGETS as TUNING

    for reg in (SCHEDULES, BACKENDS, TARGETS, C_SCHEDULES, GPU_SCHEDULES, MLIR_SCHEDULES, OPS, TUNING, FUSED,
                FUSED_KERNELS):
        assert isinstance(reg, Registry)
        assert reg.failures == {}, reg.failures
    assert set(BACKENDS.names()) >= {"numpy", "cpu", "opencl", "cuda", "julia", "iree"}
    assert set(TARGETS.names()) == {"numpy", "c", "opencl", "cuda", "julia", "mlir"}
    assert set(TUNING.names()) == {"cpu", "opencl", "cuda", "julia", "iree"}


def test_device_array_owners_come_from_the_backends_declarations():
    """No hand-kept table: a backend that declares an array module owns that module's arrays."""
    from scanweaver.runtime import device_arrays
    from scanweaver.runtime.numpy_backend import NumpyBackend

    assert device_arrays.owners() == {"cupy": "cuda", "pyopencl": "opencl"}

    class Planted(NumpyBackend):
        name = "planted"
        array_modules = ("plantedarrays",)
        auto_priority = -1

    Fake = type("FakeArray", (), {"__module__": "plantedarrays.core"})
    assert device_arrays.kind(Fake()) is None
    BACKENDS.add("planted", Planted)
    try:
        assert device_arrays.kind(Fake()) == "planted"
    finally:
        BACKENDS.remove("planted")
    assert device_arrays.kind(Fake()) is None
