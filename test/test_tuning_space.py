"""Search spaces and Kernel Tuner kernels of every backend, checked without running a tune."""

import shutil
import subprocess

import numpy as np
import pytest

import scanweaver
from scanweaver.api import SELECTIVE
from scanweaver.errors import BackendUnavailable, ScanInputError
from scanweaver.runtime import REGISTRY
from scanweaver.schedules import get_schedule
from scanweaver.tuning.fused import tune_fused
from scanweaver.tuning.langs import get_target
from scanweaver.tuning.problem import TuneProblem
from scanweaver.tuning.space import Limits, SearchSpace, build_space



def space_for(backend, lanes=64, L=1000, limits=None, **kw):
    target = get_target(backend)
    cls = REGISTRY[backend]
    scheds = target.schedules(cls.schedules)
    return build_space(backend, schedules=kw.pop("schedules", scheds), lanes=lanes, L=L,
                       limits=limits or Limits(lanes=lanes, L=L, cpu_count=2, max_workgroup=1024),
                       backend_owners=target.owners(scheds, [t.name for t in cls.extra_tunables]),
                       pins=target.pins(scheds), **kw)


def test_cpu_space_values_come_from_the_tunables_and_are_runtime_keywords():
    sp = space_for("cpu", L=1000)
    cls = REGISTRY["cpu"]
    assert set(sp.schedules) == {"chunked", "sequential"}
    assert sp.params["chunk"] == (256, 512, 1024)  # values past the first covering L run one chunk
    assert sp.params["threads"] == (1, 2)  # no more threads than cores; 0 ("all") equals 2 here
    declared = {t.name: t.values for t in (*get_schedule("chunked").tunables, *cls.extra_tunables)}
    assert set(sp.params["interleave"]) <= set(declared["interleave"])
    assert "interleave" not in sp.owners or "sequential" not in sp.owners["interleave"]
    configs = sp.configs()
    assert len(configs) == sp.size == 3 * 2 * len(sp.params["interleave"]) + 2
    assert len({sp.key(p) for p in configs}) == len(configs)
    rng = np.random.default_rng(1)
    a = rng.uniform(0.6, 0.99, (3, 1000)).astype(np.float32)
    for p in (configs[0], configs[-1]):
        sched, cfg = sp.split(p)
        y = scanweaver.selective_scan(a, a, a, a, backend="numpy", schedule=sched, **{k: v for k, v in cfg.items()
                                      if k in {t.name for t in get_schedule(sched).tunables}})
        assert y.shape == (3, 1000)
        assert sp.join(sched, cfg) == p


def test_invalid_combinations_are_ruled_out_before_compiling():
    sp = space_for("opencl", lanes=64, L=100)
    assert set(sp.schedules) == {"hybrid", "blelloch", "sequential"}  # one launch, no zeroed scratch
    bad = sp.join("hybrid", {"workgroup_size": 64, "items_per_thread": 4, "lanes_per_group": 128})
    assert 128 not in sp.params["lanes_per_group"]  # beyond the lanes there are
    assert "lanes_per_group" in sp.why_invalid(bad)
    assert "exceeds workgroup_size" in sp.why_rejected(bad)  # the schedule's own rule, before any compile
    assert all(p["lanes_per_group"] <= p["workgroup_size"] for p in sp.configs() if p["schedule"] == "hybrid")
    small = space_for("opencl", lanes=64, L=100, limits=Limits(lanes=64, L=100, max_workgroup=128))
    assert max(small.params["workgroup_size"]) == 128
    seq = [p for p in sp.configs() if p["schedule"] == "sequential"]
    assert len(seq) == 1  # tunables of other families are pinned, not multiplied


def test_values_narrow_a_space_and_bad_values_are_refused():
    sp = space_for("cpu", values={"chunk": (512,), "interleave": (4, 8)})
    assert sp.params["chunk"] == (512,) and sp.params["interleave"] == (4, 8)
    with pytest.raises(ScanInputError, match="interleave"):
        space_for("cpu", values={"interleave": (99,)})
    with pytest.raises(ScanInputError, match="no valid value in chunk"):  # --values chunk=abc: a TypeError before
        space_for("cpu", values={"chunk": ("abc",)})
    assert space_for("cpu", values={"chunk": (512, "abc", True)}).params["chunk"] == (512,)


def test_space_round_trips_through_json():
    sp = space_for("cpu")
    again = SearchSpace.from_json(sp.to_json())
    assert again.configs() == sp.configs() and again.pinned == sp.pinned


@pytest.mark.parametrize("backend", ["opencl", "cuda"])
def test_gpu_kernel_strings_rename_the_entry_and_match_the_launch(backend, tmp_path):
    problem = TuneProblem("selective_scan", backend, (4, 300))
    sp = space_for(backend, lanes=4, L=300, values={"workgroup_size": (64, 128), "items_per_thread": (4,),
                                                    "lanes_per_group": (1, 2)})
    spec = get_target(backend).kernel(problem, sp, problem.inputs(), tmp_path)
    assert spec.kernel_name == "sw_tuned" and spec.block_size_names == ["workgroup_size"]
    for p in sp.configs():
        src = spec.kernel_source(p)
        entry = {"hybrid": "sw_hybrid", "blelloch": "sw_blelloch", "sequential": "sw_sequential"}[p["schedule"]]
        assert f"#define {entry} sw_tuned" in src
        groups = spec.problem_size(p) // p["workgroup_size"]
        assert groups * p["workgroup_size"] == spec.problem_size(p) and groups >= 1
    assert len(spec.arguments) == len(problem.stages.affine.inputs) + 8


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_cuda_tuning_source_compiles_with_nvcc(tmp_path):
    problem = TuneProblem("selective_scan", "cuda", (4, 300))
    sp = space_for("cuda", lanes=4, L=300, schedules=("hybrid",), values={"workgroup_size": (128,),
                                                                          "items_per_thread": (4,),
                                                                          "lanes_per_group": (1,)})
    spec = get_target("cuda").kernel(problem, sp, problem.inputs(), tmp_path)
    p = sp.configs()[0]
    defines = "".join(f"#define {k} {v}\n" for k, v in p.items() if isinstance(v, int))
    (tmp_path / "k.cu").write_text(defines + spec.kernel_source(p))
    out = subprocess.run(["nvcc", "-ptx", str(tmp_path / "k.cu"), "-o", str(tmp_path / "k.ptx")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert ".entry sw_tuned" in (tmp_path / "k.ptx").read_text()


@pytest.mark.parametrize("backend", ["cuda", "julia"])
def test_tuning_without_the_runtime_says_why(backend):
    why = get_target(backend).unavailable()
    if why is None:
        pytest.skip(f"{backend} is available here; the skip path is not exercised")
    with pytest.raises(BackendUnavailable, match=backend):
        scanweaver.tune(SELECTIVE, backend=backend, shape=(2, 64), progress=False)


def test_unknown_backend_and_schedule_are_clear_errors():
    with pytest.raises(ScanInputError, match="tunable backends"):
        get_target("tpu")
    why = get_target("opencl").unavailable()
    if why:
        pytest.skip(f"the schedule check runs once the opencl target is available: {why}")
    with pytest.raises(ScanInputError, match="lookback"):
        scanweaver.tune(backend="opencl", shape=(2, 64), schedule="lookback", progress=False)


def test_julia_space_and_kernel_match_the_val_parameters(tmp_path):
    pytest.importorskip("scanweaver.julia.kernels", reason="the Julia kernels module is not part of this build")
    problem = TuneProblem("selective_scan", "julia", (4, 300))
    target = get_target("julia")
    cls = REGISTRY["julia"]
    scheds = target.schedules(cls.schedules)
    assert scheds == ("blelloch",)
    sp = build_space("julia", schedules=scheds, lanes=4, L=300,
                     backend_owners=target.owners(scheds, [t.name for t in cls.extra_tunables]))
    assert tuple(sp.params) == ("workgroup_size",)  # exactly the kernel's Val parameters
    spec = target.kernel(problem, sp, problem.inputs(), tmp_path)
    assert spec.lang == "julia" and spec.compiler_options and spec.kernel_name in spec.kernel_source
    answer = problem.oracle(problem.inputs())[0]
    y = target.answer_layout(answer)
    np.testing.assert_array_equal(target.as_lanes(y, problem), answer)
    assert spec.arguments[spec.output].shape == (300, 4)


def test_bad_strategy_and_budget_are_clear_errors():
    pytest.importorskip("kernel_tuner", reason="Kernel Tuner is not installed")
    with pytest.raises(ScanInputError, match="unknown strategy 'exhaustive'"):
        scanweaver.tune(backend="cpu", shape=(2, 64), strategy="exhaustive", progress=False)
    with pytest.raises(ScanInputError, match="max_fevals"):
        scanweaver.tune(backend="cpu", shape=(2, 64), max_fevals=0, progress=False)
    for limit in (float("nan"), -1.0, 0, "60"):  # NaN tuned without a limit, a negative limit measured nothing
        with pytest.raises(ScanInputError, match="time_limit must be a number of seconds > 0"):
            scanweaver.tune(backend="cpu", shape=(2, 64), time_limit=limit, progress=False)
        with pytest.raises(ScanInputError, match="time_limit must be a number of seconds > 0"):
            tune_fused("matrix_state", backend="cpu", shape=(1, 16, 1, 4, 4), time_limit=limit, progress=False)
