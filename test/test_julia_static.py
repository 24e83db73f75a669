"""ScanWeaver.jl checked without Julia: ``fatou lint`` and ``fatou format --check`` on every file, then
the defect classes a linter cannot see (``test/julia_checks.py``): ambiguous methods, local memory beyond
its declared budget, a Python device table that disagrees with the Julia backends, ``[compat]``
bounds that exclude today's GPU packages (or admit ones without the backend an extension uses), entry
points that launch kernels without validating the configuration, and kernels whose closures capture a
variable they reassign (a ``Core.Box``). Each check also runs on a planted defect, to show it fails."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", "build", "dist", "node_modules"}


def julia_files() -> list[Path]:
    """Every .jl file of the repository once (the wheel's symbolic links lead to the same files)."""
    seen, files = set(), []
    for path in sorted(ROOT.rglob("*.jl")):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts):
            continue
        real = path.resolve()
        if real not in seen:
            seen.add(real)
            files.append(real)
    return files


@pytest.fixture(scope="module")
def fatou() -> str:
    exe = shutil.which("fatou")
    if exe is None:
        pytest.skip("fatou is not installed (pip install fatou)")
    return exe


def test_there_are_julia_files():
    names = {p.relative_to(ROOT).as_posix() for p in julia_files()}
    assert {"src/ScanWeaver.jl", "test/runtests.jl", "ext/ScanWeaverCUDAExt.jl"} <= names


@pytest.mark.parametrize("command", [["lint"], ["format", "--check"]], ids=["lint", "format"])
def test_fatou_is_clean(fatou, command):
    files = [str(p) for p in julia_files()]
    proc = subprocess.run([fatou, *command, "--color", "never", *files], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout + proc.stderr


# --- checks of defect classes fatou cannot see (test/julia_checks.py) --------------------------------------

def _sources() -> dict[str, str]:
    from julia_checks import read_sources

    return read_sources(ROOT)


def _schedules() -> dict[str, tuple[str, ...]]:
    from scanweaver.julia import kernels

    return {name: tuple(k.name for k in s.kernels) for name, s in kernels.SCHEDULES.items()}


#: The methods that made every scan without ``c`` ambiguous (``project(nothing, 1f0, t, l)``).
PLANTED_AMBIGUITY = """
@inline project(::Nothing, h, t, l) = h
@inline project(c, h::Number, t, l) = @inbounds c[t, l] * h
@inline project(c, h::StaticVector, t, l) = @inbounds sum(c[t, l] .* h)
"""

PLANTED_KERNEL = """
@kernel function planted_kernel!(y, @Const(a), ::Val{workgroup_size}) where {workgroup_size}
    tree = @localmem P (4 * workgroup_size,)
    carry = @localmem S (1,)
end
@kernel function runtime_sized_kernel!(y, @Const(a), ::Val{workgroup_size}) where {workgroup_size}
    tree = @localmem P (size(a, 1),)
end
local_memory(::Val{:planted}, config, P, S) = local_bytes(P, 2 * config.workgroup_size) + local_bytes(S, 1)
local_memory(::Val{:runtime}, config, P, S) = local_bytes(P, 2 * config.workgroup_size)
"""


@pytest.mark.usefixtures("fatou")
def test_no_ambiguous_methods_in_the_package():
    from julia_checks import find_ambiguities

    found, undecided = find_ambiguities(_sources())
    assert found == [], "\n".join(map(str, found))
    assert undecided == 0, "extend KNOWN_SUPERTYPES in test/julia_checks.py so every pair is decided"


@pytest.mark.usefixtures("fatou")
def test_ambiguity_check_reports_the_planted_defect():
    from julia_checks import find_ambiguities

    found, _ = find_ambiguities({"planted.jl": PLANTED_AMBIGUITY})
    texts = sorted(f"{a.first.text} | {a.second.text}" for a in found)
    assert texts == ["project(::Nothing, h, t, l) | project(c, h::Number, t, l)",
                     "project(::Nothing, h, t, l) | project(c, h::StaticVector, t, l)"]
    resolved = PLANTED_AMBIGUITY + "project(::Nothing, h::Number, t, l) = h\n" \
                                   "project(::Nothing, h::StaticVector, t, l) = h\n"
    assert find_ambiguities({"resolved.jl": resolved})[0] == []


#: A vararg pair this check caught while the fused Mamba kernels were written: ``store_tuple!(nothing, t, i)``.
PLANTED_VARARG_AMBIGUITY = """
@inline store_tuple!(::Nothing, v, I...) = nothing
@inline function store_tuple!(A, v::NTuple{N}, I...) where {N}
    return nothing
end
"""


@pytest.mark.usefixtures("fatou")
def test_ambiguity_check_compares_vararg_methods():
    from julia_checks import find_ambiguities

    found, undecided = find_ambiguities({"planted.jl": PLANTED_VARARG_AMBIGUITY})
    assert [f"{a.first.text} | {a.second.text}" for a in found] == \
        ["store_tuple!(::Nothing, v, I...) | store_tuple!(A, v::NTuple{N}, I...)"]
    fixed = PLANTED_VARARG_AMBIGUITY.replace("store_tuple!(A, v", "store_tuple!(A::AbstractArray, v")
    assert find_ambiguities({"fixed.jl": fixed}) == ([], 0)


@pytest.mark.usefixtures("fatou")
def test_every_localmem_is_counted_by_its_schedule():
    from julia_checks import check_local_memory

    schedules = _schedules()
    assert {"blelloch", "hybrid"} <= set(schedules)
    assert check_local_memory(_sources(), schedules) == []


@pytest.mark.usefixtures("fatou")
def test_local_memory_check_reports_the_planted_defects():
    from julia_checks import check_local_memory

    problems = check_local_memory({"planted.jl": PLANTED_KERNEL},
                                  {"planted": ("planted_kernel!",), "runtime": ("runtime_sized_kernel!",)})
    assert len(problems) == 2
    assert any("schedule planted: local_memory declares" in p for p in problems)
    assert any("runtime_sized_kernel!" in p and "not sized by" in p for p in problems)
    orphan = check_local_memory({"planted.jl": PLANTED_KERNEL}, {})
    assert sorted(orphan) == ["planted_kernel!: allocates @localmem but belongs to no schedule",
                              "runtime_sized_kernel!: allocates @localmem but belongs to no schedule"]


@pytest.mark.usefixtures("fatou")
def test_configs_are_checked_against_the_local_memory_budget():
    from julia_checks import evaluate, head, parse_julia, walk

    def calls_in(function: str) -> set[str]:
        for text in _sources().values():
            for node in walk(parse_julia(text)):
                if head(node) in ("function", "function-="):
                    sig = node[1]
                    while head(sig) == "where":
                        sig = sig[1]
                    if head(sig) in ("call", "call-,") and sig[1] == function:
                        return {n[1] for n in walk(node[2]) if head(n) == "call" and isinstance(n[1], str)}
        raise AssertionError(f"no method {function} in src/")

    assert {"local_memory", "local_memory_budget", "max_workgroupsize"} <= calls_in("config_problem")
    assert {"local_memory", "local_memory_budget"} <= calls_in("default_workgroupsize")
    consts = {n[1][1]: n[1][2] for text in _sources().values() for n in walk(parse_julia(text))
              if head(n) == "const" and head(n[1]) == "=" and isinstance(n[1][1], str)}  # not `const V{T} = ...`
    assert evaluate(consts["LOCAL_MEMORY_BUDGET"], {}) == 48 * 1024


@pytest.mark.usefixtures("fatou")
def test_device_table_agrees_with_the_julia_backends():
    from julia_checks import check_device_dtypes, julia_device_backends
    from scanweaver.julia.devices import DEVICES

    assert julia_device_backends(_sources()) == {"cpu": "CPU", "cuda": "CUDABackend", "amdgpu": "ROCBackend",
                                                 "oneapi": "oneAPIBackend", "metal": "MetalBackend"}
    assert check_device_dtypes({n: d.dtypes for n, d in DEVICES.items()}, _sources()) == []


@pytest.mark.usefixtures("fatou")
def test_device_dtype_check_reports_the_planted_defect():
    from julia_checks import check_device_dtypes
    from scanweaver.julia.devices import DEVICES

    table = {n: d.dtypes for n, d in DEVICES.items()}
    table["oneapi"] = ("float32", "float64", "complex64", "complex128")
    table["tpu"] = ("float32",)
    problems = check_device_dtypes(table, _sources())
    assert len(problems) == 2
    assert any(p.startswith("device oneapi: the Python table lists") and "oneAPIKernels.jl" in p for p in problems)
    assert any(p.startswith("device tpu: no device_backend") for p in problems)


@pytest.mark.usefixtures("fatou")
def test_every_launching_entry_point_validates_its_configuration():
    from julia_checks import check_validated_launches

    assert check_validated_launches(_sources()) == []


#: The Kernel Tuner launcher as it was: any search-space configuration reached ``launch!`` unchecked.
PLANTED_UNCHECKED_LAUNCH = """
function (launch::ScheduleLauncher{T})(y, h_last, a, b, x, c, h0, reset, reversed, tunables::Val...) where {T}
    schedule = T(map(unval, tunables)...)
    launch!(schedule, launch.backend, y, h_last, ScanOperands(a, b, x, c, h0, reset), reversed)
    return nothing
end
run_mamba(s, backend, y, ops) = launch_mamba!(s, backend, y, nothing, ops, Val(4))
function launch!(s::Blelloch, backend, y, h_last, ops, reversed; workspace = nothing)
    return launch_checked!(blelloch_scan_kernel!(backend, s.workgroupsize), s.workgroupsize, 1, ())
end
"""


@pytest.mark.usefixtures("fatou")
def test_validated_launch_check_reports_the_planted_defect():
    from julia_checks import check_validated_launches

    problems = check_validated_launches({"planted.jl": PLANTED_UNCHECKED_LAUNCH})
    assert len(problems) == 2, problems
    assert problems[0].startswith("planted.jl: (::ScheduleLauncher{T}) calls launch! without")
    assert problems[1].startswith("planted.jl: run_mamba calls launch_mamba! without")
    fixed = PLANTED_UNCHECKED_LAUNCH.replace(
        "    launch!(schedule,", "    check_config(:launcher, schedule, launch.backend, P, S)\n    launch!(schedule,")
    assert len(check_validated_launches({"fixed.jl": fixed})) == 1


def test_compat_admits_todays_packages_and_excludes_too_old_ones():
    from julia_checks import compat_admits

    compat = tomllib.loads((ROOT / "Project.toml").read_text())["compat"]
    current = {"CUDA": "6.3.0", "AMDGPU": "2.8.0", "Metal": "1.10.3", "oneAPI": "2.9.1",
               "KernelAbstractions": "0.9.41"}
    for pkg, version in current.items():
        assert compat_admits(compat[pkg], version), f"[compat] {pkg} = {compat[pkg]!r} excludes {version}"
    assert compat_admits(compat["CUDA"], "5.11.3") and compat_admits(compat["AMDGPU"], "1.3.6")
    assert not compat_admits(compat["KernelAbstractions"], "0.9.0"), "KernelAbstractions 0.9.0 lacks supports_float64"
    assert not compat_admits("5", "6.3.0") and compat_admits("0.9", "0.9.0")
    assert not compat_admits(compat["oneAPI"], "1.1.0"), "oneAPI.jl 1.0-1.1 have no oneAPIBackend (from 1.2)"
    assert compat_admits(compat["oneAPI"], "1.2.0")


@pytest.mark.usefixtures("fatou")
def test_no_kernel_closure_captures_a_reassigned_variable():
    from julia_checks import check_boxed_closures

    assert check_boxed_closures(_sources()) == []


#: The fused Mamba replay loop as it was: the closure captured ``h``, which the loop reassigns.
PLANTED_BOXED_CLOSURE = """
@kernel function replay!(y, @Const(ops), ::Val{nstate}) where {nstate}
    t0 = @index(Global, Linear)
    h = initial_states(ops, Val(nstate))
    acc = ntuple(_ -> identity_pair(Float32), Val(nstate))
    for t in 1:size(y, 1)
        p = pairs_at(ops, t)
        h = ntuple(n -> apply_pair(p[n], h[n]), Val(nstate))
        y[t, t0] = sum(h)
    end
    map(acc) do q
        q + t0
    end
end
"""


@pytest.mark.usefixtures("fatou")
def test_boxed_closure_check_reports_the_planted_defect():
    from julia_checks import check_boxed_closures

    problems = check_boxed_closures({"planted.jl": PLANTED_BOXED_CLOSURE})
    assert len(problems) == 1, problems
    assert problems[0].startswith("planted.jl: @kernel replay!: the closure") and "captures h," in problems[0]
    fixed = PLANTED_BOXED_CLOSURE.replace("ntuple(n -> apply_pair(p[n], h[n]), Val(nstate))", "map(apply_pair, p, h)")
    assert check_boxed_closures({"fixed.jl": fixed}) == []


def test_the_gpu_test_environment_holds_the_test_targets_and_every_gpu_package():
    project = tomllib.loads((ROOT / "Project.toml").read_text())
    gpu = tomllib.loads((ROOT / "test" / "gpu" / "Project.toml").read_text())
    uuids = {**project["deps"], **project["weakdeps"], **project["extras"]}
    wanted = set(project["targets"]["test"]) | set(project["deps"]) | set(project["extensions"].values())
    assert wanted <= set(gpu["deps"]), sorted(wanted - set(gpu["deps"]))
    for name, uuid in gpu["deps"].items():
        assert uuids.get(name) == uuid, name
    for name in project["weakdeps"]:
        assert gpu["compat"].get(name, project["compat"][name]) == project["compat"][name], name
    runtests = (ROOT / "test" / "runtests.jl").read_text()
    assert "julia --project=test/gpu test/runtests.jl" in runtests


@pytest.mark.usefixtures("fatou")
def test_boxed_closure_check_reads_item_functions():
    from julia_checks import check_boxed_closures

    planted = PLANTED_BOXED_CLOSURE.replace("@kernel function replay!(y, @Const(ops), ::Val{nstate}) where {nstate}\n"
                                            "    t0 = @index(Global, Linear)",
                                            "@inline function replay_item!(t0, y, ops, ::Val{nstate}) where {nstate}")
    problems = check_boxed_closures({"planted.jl": planted})
    assert len(problems) == 1, problems
    assert problems[0].startswith("planted.jl: item function replay_item!: the closure"), problems


@pytest.mark.usefixtures("fatou")
def test_every_index_is_a_statement_of_its_kernel():
    from julia_checks import check_index_statements

    assert check_index_statements(_sources()) == []
    planted = """
@kernel function wrapper!(y, @Const(x))
    item!(@index(Global, Linear), y, x)
end
@kernel function guarded!(y)
    if size(y, 1) > 0
        i = @index(Global, Linear)
        y[i] = 0
    end
end
"""
    problems = check_index_statements({"planted.jl": planted})
    assert [p.split(":")[1].strip() for p in problems] == ["@kernel wrapper!", "@kernel guarded!"], problems
    fixed = planted.replace("    item!(@index(Global, Linear), y, x)",
                            "    w = @index(Global, Linear)\n    item!(w, y, x)")
    assert len(check_index_statements({"fixed.jl": fixed})) == 1


#: A helper a kernel inlines, as the chunked delta-rule adjoint's first version had it: the closure captures the
#: parameter ``s``, which the loop reassigns.
PLANTED_BOXED_HELPER = """
@inline function adjoint_steps(s, q, dout, ::Val{nk}) where {nk}
    for t in size(dout, 1):-1:1
        d = dout[t]
        s = ntuple(x -> s[x] + q[x, t] * d, Val(nk))
    end
    return s
end
"""


@pytest.mark.usefixtures("fatou")
def test_boxed_closure_check_reads_the_helpers_kernels_call():
    from julia_checks import check_boxed_closures

    problems = check_boxed_closures({"planted.jl": PLANTED_BOXED_HELPER})
    assert len(problems) == 1, problems
    assert problems[0].startswith("planted.jl: function adjoint_steps: the closure") and "captures s," in problems[0]
    fixed = PLANTED_BOXED_HELPER.replace("s = ntuple(x -> s[x] + q[x, t] * d, Val(nk))", "s = axpy(s, q, t, d)")
    assert check_boxed_closures({"fixed.jl": fixed}) == []


@pytest.mark.usefixtures("fatou")
def test_no_synchronize_in_divergent_control_flow():
    from julia_checks import check_synchronize

    assert check_synchronize(_sources()) == []
    # the package has barriers, under uniform loops only, so the check has something to look at
    assert sum(text.count("@synchronize") for text in _sources().values()) >= 10


#: Barriers as a draft of a tree scan might place them: one in a branch on the work-item's index, one in a
#: loop whose trip count depends on it, one behind `&&`; the last two are uniform and fine.
PLANTED_DIVERGENT_BARRIER = """
@kernel function planted_scan!(y, @Const(a), ::Val{workgroupsize}) where {workgroupsize}
    i = @index(Local, Linear)
    lane = @index(Group, Linear)
    @uniform steps = trailing_zeros(workgroupsize)
    r = 2i
    if r <= workgroupsize
        y[r] = a[r]
        @synchronize()
    end
    for s in 1:r
        @synchronize()
    end
    i == 1 && @synchronize()
    for s in 0:(steps - 1)
        @synchronize()
    end
    if lane > 1
        @synchronize()
    end
end
"""


@pytest.mark.usefixtures("fatou")
def test_synchronize_check_reports_the_planted_defects():
    from julia_checks import check_synchronize

    problems = check_synchronize({"planted.jl": PLANTED_DIVERGENT_BARRIER})
    assert [p.split("under ")[1].split(",")[0] for p in problems] == ["`if r <= workgroupsize`", "`for s in 1 : r`",
                                                                        "`&& i == 1`"], problems
    fixed = PLANTED_DIVERGENT_BARRIER.replace("        @synchronize()\n    end\n    for s in 1:r", "    end\n"
                                              "    @synchronize()\n    for s in 1:r")
    assert len(check_synchronize({"fixed.jl": fixed})) == 2
