"""The Python side of ScanWeaver.jl, checked without Julia: packaging, errors, kernel signatures."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from scanweaver.julia import kernels

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "python" / "scanweaver"
SRC = ROOT / "src"


#: juliacall's own variables: when set they win over juliapkg's, so tests of juliapkg's path clear them.
NO_JULIACALL_ENV = {"PYTHON_JULIACALL_EXE": None, "PYTHON_JULIACALL_PROJECT": None}


def _run(code: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``env`` over this one's (a ``None`` value removes the variable)."""
    merged = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in merged.items() if v is not None})


def test_juliapkg_json_points_at_the_julia_package():
    spec = json.loads((PKG / "juliapkg.json").read_text())
    project = tomllib.loads((ROOT / "Project.toml").read_text())
    sw = spec["packages"]["ScanWeaver"]
    assert sw["dev"] is True
    assert sw["uuid"] == project["uuid"] and project["name"] == "ScanWeaver"
    for sub in ("Project.toml", "src", "ext"):
        resolved = (PKG / sw["path"] / sub).resolve()
        assert resolved == (ROOT / sub).resolve(), f"{sw['path']}/{sub} resolves to {resolved}"
    assert (PKG / sw["path"] / "src" / "ScanWeaver.jl").is_file()
    ka = spec["packages"]["KernelAbstractions"]
    assert ka["uuid"] == project["deps"]["KernelAbstractions"]
    assert ka["version"] == project["compat"]["KernelAbstractions"]
    assert spec["julia"] == "^" + project["compat"]["julia"]


def test_juliapkg_accepts_the_compat_bounds():
    if importlib.util.find_spec("juliapkg") is None:
        pytest.skip("juliapkg is not installed (pip install 'scanweaver[julia]')")
    from juliapkg.compat import Compat

    spec = json.loads((PKG / "juliapkg.json").read_text())
    assert str(Compat.parse(spec["julia"]))
    assert str(Compat.parse(spec["packages"]["KernelAbstractions"]["version"]))


def test_import_scanweaver_loads_no_juliacall():
    proc = _run("import sys, scanweaver, scanweaver.julia, scanweaver.julia.backend, scanweaver.julia.kernels\n"
                "from scanweaver.runtime import REGISTRY; REGISTRY.load()\n"
                "print(sorted(m for m in ('juliacall', 'juliapkg') if m in sys.modules))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_only_the_session_module_imports_juliacall():
    importers = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+juliacall", p.read_text(), re.M)]
    assert importers == ["julia/session.py"]


def test_missing_julia_fails_fast_and_clearly():
    code = ("import time, numpy as np, scanweaver\n"
            "t = time.perf_counter()\n"
            "try:\n"
            "    scanweaver.selective_scan(np.ones((2, 5)), np.ones((2, 5)), np.ones((2, 5)), backend='julia')\n"
            "except scanweaver.BackendUnavailable as exc:\n"
            "    print(f'{time.perf_counter() - t:.3f}'); print(exc)\n"
            "t = time.perf_counter()\n"
            "try:\n"
            "    scanweaver.selective_scan(np.ones((2, 5)), np.ones((2, 5)), np.ones((2, 5)), backend='julia')\n"
            "except scanweaver.BackendUnavailable:\n"
            "    print(f'{time.perf_counter() - t:.3f}')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHON_JULIAPKG_EXE": "", "PYTHON_JULIAPKG_PROJECT": "/nonexistent/env",
           **NO_JULIACALL_ENV}
    started = time.perf_counter()
    proc = _run(code, env=env, timeout=30)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr
    first, message, again = proc.stdout.strip().split("\n", 2)
    assert float(first) < 5 and float(again) < 0.5 and wall < 15
    assert "julia" in message.lower() and ("pip install" in message or "install Julia" in message)


def test_failed_start_becomes_one_backend_unavailable():
    if importlib.util.find_spec("juliacall") is None:
        pytest.skip("juliacall is not installed; the start-up failure path needs it (pip install 'scanweaver[julia]')")
    code = ("import time\nfrom scanweaver.julia import session\nfrom scanweaver.errors import BackendUnavailable\n"
            "for _ in range(2):\n"
            "    t = time.perf_counter()\n"
            "    try:\n        session.main(check=False)\n"
            "    except BackendUnavailable as exc:\n        print(f'{time.perf_counter() - t:.3f}', '|', exc)\n")
    env = {"PYTHON_JULIAPKG_EXE": "/nonexistent/julia", "PYTHON_JULIAPKG_OFFLINE": "yes", **NO_JULIACALL_ENV}
    proc = _run(code, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, second = [line for line in proc.stdout.splitlines() if " | " in line]
    assert float(first.split("|")[0]) < 5 and float(second.split("|")[0]) < 0.1
    assert "juliapkg.resolve()" in first and "/nonexistent/julia" in first


def _find_julia(env: dict) -> list[str]:
    code = "from scanweaver.julia.session import find_julia\nprint(*find_julia(), sep='|')"
    proc = _run(code, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split("|")


def test_juliacall_variables_win_over_juliapkgs(tmp_path):
    env = {"PYTHON_JULIAPKG_EXE": "/nonexistent/julia", "PYTHON_JULIACALL_EXE": sys.executable,
           "PYTHON_JULIACALL_PROJECT": str(tmp_path)}
    exe, origin = _find_julia(env)
    assert exe == shutil.which(sys.executable) and origin.startswith(f"PYTHON_JULIACALL_EXE={sys.executable}")
    exe, origin = _find_julia({**env, **NO_JULIACALL_ENV})
    assert exe == "None" and origin == "PYTHON_JULIAPKG_EXE=/nonexistent/julia"


def test_juliacall_variables_come_as_a_pair(tmp_path):
    exe, origin = _find_julia({"PYTHON_JULIACALL_EXE": sys.executable, "PYTHON_JULIACALL_PROJECT": None})
    assert exe == "None" and "without PYTHON_JULIACALL_PROJECT (juliacall needs both)" in origin
    exe, origin = _find_julia({"PYTHON_JULIACALL_EXE": None, "PYTHON_JULIACALL_PROJECT": str(tmp_path)})
    assert exe == "None" and "without PYTHON_JULIACALL_EXE" in origin
    exe, origin = _find_julia({"PYTHON_JULIACALL_EXE": sys.executable,
                               "PYTHON_JULIACALL_PROJECT": str(tmp_path / "missing")})
    assert exe == "None" and origin.endswith("missing does not exist")


def _existing_environment() -> tuple[str, str] | None:
    """The Julia executable and environment this session's variables point at, when both are named."""
    for exe_key, project_key in (("PYTHON_JULIACALL_EXE", "PYTHON_JULIACALL_PROJECT"),
                                 ("PYTHON_JULIAPKG_EXE", "PYTHON_JULIAPKG_PROJECT")):
        exe, project = os.environ.get(exe_key), os.environ.get(project_key)
        if exe and project and shutil.which(exe) and os.path.isdir(project):
            return shutil.which(exe), project
    return None


def _needs_julia_environment() -> tuple[str, str]:
    """The Julia and environment this session's variables name; skips the test when there are none."""
    found = _existing_environment()
    if importlib.util.find_spec("juliacall") is None or found is None:
        pytest.skip("needs juliacall and a Julia with an environment holding PythonCall and ScanWeaver, named by "
                    "PYTHON_JULIACALL_EXE/PROJECT or PYTHON_JULIAPKG_EXE/PROJECT (see the README's Julia section)")
    return found


SCAN_CHECK = ("import numpy as np, scanweaver\n"
              "rng = np.random.default_rng(0)\n"
              "a, b, x, c = (rng.random((3, 200), dtype=np.float32) for _ in range(4))\n"
              "y = scanweaver.selective_scan(a, b, x, c, backend='julia')\n"
              "want = scanweaver.selective_scan(a, b, x, c, backend='numpy')\n"
              "print(float(np.abs(y - want).max()))\n")


@pytest.mark.parametrize("family", ["juliacall", "juliapkg"])
def test_an_existing_julia_and_environment_run_offline(family):
    exe, project = _needs_julia_environment()
    if family == "juliacall":
        env = {"PYTHON_JULIACALL_EXE": exe, "PYTHON_JULIACALL_PROJECT": project, "PYTHON_JULIAPKG_EXE": None,
               "PYTHON_JULIAPKG_PROJECT": None}
    else:
        env = {"PYTHON_JULIAPKG_EXE": exe, "PYTHON_JULIAPKG_PROJECT": project, "PYTHON_JULIAPKG_OFFLINE": "yes",
               **NO_JULIACALL_ENV}
    proc = _run(SCAN_CHECK, env={**env, "JULIA_PKG_OFFLINE": "true"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.strip().splitlines()[-1]) < 1e-5


PLAN_CHECK = ("import numpy as np, scanweaver\n"
              "from scanweaver.api import SELECTIVE\n"
              "rng = np.random.default_rng(1)\n"
              "a = rng.uniform(0.5, 0.99, (2, 3, 300)).astype(np.float32)\n"
              "b, x, c = (rng.standard_normal((2, 3, 300)).astype(np.float32) for _ in range(3))\n"
              "h0 = rng.standard_normal((2, 3)).astype(np.float32); reset = rng.random((2, 3, 300)) < 0.02\n"
              "want, want_h = scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=True,\n"
              "                                        return_state=True, backend='numpy')\n"
              "for _ in range(3):  # the first call plans, the others run the plan\n"
              "    y, h = scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=True, return_state=True,\n"
              "                                     backend='julia', device='cpu')\n"
              "    print(float(np.abs(y - want).max()), float(np.abs(h - want_h).max()))\n"
              "plan = next(p for p in SELECTIVE._plans.values() if p.backend.name == 'julia')\n"
              "print(plan.invoke is not None, SELECTIVE.last.stages.schedule.schedule)\n"
              "try:\n"
              "    scanweaver.selective_scan(a, b, x, c, h0=h0, reset=reset, reverse=True, return_state=True,\n"
              "                              backend='julia', device='cpu', out=c)\n"
              "except scanweaver.ScanInputError as exc:\n"
              "    print('refused:', exc)\n")


def test_julia_cpu_calls_run_their_plan_through_one_julia_closure():
    _needs_julia_environment()
    proc = _run(PLAN_CHECK, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    errors = [float(v) for line in lines[:3] for v in line.split()]
    assert max(errors) < 1e-4, lines
    assert lines[3] == "True sequential"  # device="cpu" defaults to ScanWeaver.jl's own CPU scan
    assert lines[4].startswith("refused:") and "out" in lines[4]


THREADS_CHECK = ("import threading, numpy as np, scanweaver\n"
                 "from scanweaver.julia import session\n"
                 "gc = session.function('GC.gc')\n"
                 "t = threading.Thread(target=gc, daemon=True); t.start(); t.join(60)\n"
                 "print('collected from another thread:', not t.is_alive(), flush=True)\n"
                 "rng = np.random.default_rng(2)\n"
                 "a = rng.uniform(0.5, 0.99, (2, 8, 600)).astype(np.float32)\n"
                 "b, x, c = (rng.standard_normal((2, 8, 600)).astype(np.float32) for _ in range(3))\n"
                 "bad = []\n"
                 "def work(i):\n"
                 "    for k in range(12):  # new shapes: planning and compiling allocate, and collect\n"
                 "        n = 600 - 7 * (k % 4) - i\n"
                 "        args = [v[..., :n] for v in (a, b, x, c)]\n"
                 "        got = scanweaver.selective_scan(*args, backend='julia', device='cpu')\n"
                 "        if not np.allclose(got, scanweaver.selective_scan(*args, backend='numpy'), atol=1e-4):\n"
                 "            bad.append((i, k))\n"
                 "        if k % 4 == 0: gc()\n"
                 "ts = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(3)]\n"
                 "[t.start() for t in ts]; [t.join(240) for t in ts]\n"
                 "print('threads finished:', sum(not t.is_alive() for t in ts), 'wrong:', bad, flush=True)\n")


def test_julia_runs_from_several_python_threads_and_collects_without_hanging():
    """Julia's collector waits for every Julia thread; the thread that started Julia would never come while it
    runs Python, so a collection from another Python thread hung the process (and two threads in Julia at once
    could hang on the GIL). The session starts Julia on a thread of its own and lets one thread in at a time."""
    _needs_julia_environment()
    try:
        proc = _run(THREADS_CHECK, timeout=420)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process hung: {exc.stdout!r}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "collected from another thread: True" in proc.stdout, proc.stdout
    assert "threads finished: 3 wrong: []" in proc.stdout, proc.stdout


FORK_CHECK = ("import os, sys, numpy as np, scanweaver\n"
              "a = np.full((2, 64), 0.5, np.float32)\n"
              "y = scanweaver.selective_scan(a, a, a, a, backend='julia', device='cpu')\n"
              "print('parent', float(y.sum()))\n"
              "sys.stdout.flush()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n"
              "    try:\n"
              "        scanweaver.selective_scan(a, a, a, a, backend='julia', device='cpu')\n"
              "        print('child ran julia')\n"
              "    except scanweaver.BackendUnavailable as exc:\n"
              "        print('child refused:', exc)\n"
              "    sys.stdout.flush(); os._exit(0)\n"
              "os.waitpid(pid, 0)\n"
              "y = scanweaver.selective_scan(a, a, a, a, backend='julia', device='cpu')\n"
              "print('parent again', float(y.sum()))\n")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_child_forked_after_julia_started_refuses_julia_clearly():
    _needs_julia_environment()
    proc = _run(FORK_CHECK, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == lines[2].replace("parent again", "parent"), lines  # the parent is unaffected
    assert lines[1].startswith("child refused:") and "forked" in lines[1] and "spawn" in lines[1], lines


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
@pytest.mark.parametrize("state", ["started", "starting"])
def test_the_fork_guard_refuses_every_julia_entry_in_the_child(state):
    """Without Julia: the guard itself, with the session marked as started (or still starting, on another
    thread) in the parent, and a device the parent had made ready."""
    mark = ("session._main = object()" if state == "started" else
            "import threading; session._host = (threading.Event(), {})")
    code = ("import os, sys\n"
            "from scanweaver.julia import devices, session\n"
            f"{mark}\n"
            "devices._ready['cpu'] = 'ready in the parent'\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    out = [session.probe()[0], 'forked' in session.probe()[1]]\n"
            "    for f in (session.main, lambda: session.locked(len)(()), lambda: session.seval('1'),\n"
            "              lambda: session.exclusive().__enter__(), lambda: devices.activate('cpu')):\n"
            "        try:\n"
            "            f(); out.append('ran')\n"
            "        except session.BackendUnavailable as exc:\n"
            "            out.append('spawn' in str(exc))\n"
            "    print(out); sys.stdout.flush(); os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print(session.locked(len)((1, 2)), devices.activate('cpu'))\n")
    proc = _run(code, env=NO_JULIACALL_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["[False, True, True, True, True, True, True]",
                                           "2 ready in the parent"], proc.stdout


RESERVE_CHECK = """from scanweaver.julia import session
print(session.seval('''let m = PythonCall.JlWrap.Cjl
    moved = false
    for a in (m.PYJLVALUES, m.PYJLFREEVALUES)
        p, n = pointer(a), length(a)
        append!(a, fill(eltype(a) === Int ? 0 : nothing, 4096))  # taken back at once
        moved |= pointer(a) != p
        resize!(a, n)
    end
    moved
end'''))
"""


def test_pythoncalls_tables_of_wrapped_values_have_room_reserved():
    """PythonCall 0.9.34 grows these where a collection can re-enter them (crashes later; fixed upstream after
    0.9.34): the session reserves room once, so 4096 more entries do not move them."""
    _needs_julia_environment()
    proc = _run(RESERVE_CHECK, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout  # (Julia's false, as Python prints it)


def test_julia_devices_lists_every_device_with_a_reason():
    from scanweaver.julia import julia_devices

    t = time.perf_counter()
    devices = julia_devices()
    assert time.perf_counter() - t < 5
    assert [d["name"] for d in devices] == ["cpu", "cuda", "amdgpu", "oneapi", "metal"]
    assert all(isinstance(d["ok"], bool) and d["reason"] for d in devices)


def test_device_tunable_is_validated():
    from scanweaver.errors import ScanInputError
    from scanweaver.julia.backend import JuliaBackend

    (device,) = JuliaBackend.extra_tunables
    assert device.check("cuda", "t") == "cuda"
    with pytest.raises(ScanInputError, match="device='tpu' is invalid"):
        device.check("tpu", "t")


def test_emitted_kernel_text_names_the_kernel_and_its_vals():
    from scanweaver.api import SELECTIVE
    from scanweaver.julia.backend import JuliaBackend
    from scanweaver.passes import lower

    stages = SELECTIVE.lower(backend="numpy", schedule="blelloch", dtype="float32", workgroup_size=64)
    lowered = lower(stages.scan, "blelloch", {"workgroup_size": 64, "device": "cuda"}, JuliaBackend.extra_tunables)
    text = JuliaBackend().emit(lowered).kernel
    assert "blelloch_scan!(backend, 64)" in text and "Val(64)" in text and "Blelloch(64)" in text


# --- kernel signatures: kernels.py against the Julia source -----------------------------------------------

def _julia_tree():
    pytest.importorskip("julia_checks", reason="test/julia_checks.py is not importable")
    if shutil.which("fatou") is None:
        pytest.skip("fatou is not installed (pip install fatou); the Julia source cannot be parsed")
    from julia_checks import parse_julia

    return [parse_julia(p.read_text()) for p in sorted(SRC.rglob("*.jl"))]


def _signature(node):
    from julia_checks import head

    while head(node) == "where":
        node = node[1]
    return node


def _julia_kernels() -> dict[str, tuple[list[str], list[str]]]:
    """``@kernel`` name -> (argument names, ``Val`` parameter names), parsed from src/."""
    from julia_checks import head, walk

    found = {}
    for tree in _julia_tree():
        for node in walk(tree):
            if head(node) == "macrocall" and node[1] == "@kernel":
                sig = _signature(node[2][1])
                args, vals = [], []
                for arg in sig[2:]:
                    if head(arg) == "::-pre" and head(arg[1]) == "curly" and arg[1][1] == "Val":
                        vals.append(arg[1][2])
                    else:
                        assert not vals, f"{sig[1]}: Val parameters must come after the kernel arguments"
                        args.append(arg[2] if head(arg) == "macrocall-p" else arg)
                found[sig[1]] = (args, vals)
    return found


def _julia_structs() -> dict[str, tuple[str, ...]]:
    """``struct T <: ScanSchedule`` name -> its field names, parsed from src/."""
    from julia_checks import head, walk

    found = {}
    for tree in _julia_tree():
        for node in walk(tree):
            if head(node) == "struct" and head(node[1]) == "<:" and node[1][2] == "ScanSchedule":
                found[node[1][1]] = tuple(f[1] for f in node[2][1:] if head(f) == "::-i")
    return found


def test_kernel_signatures_match_the_julia_source():
    source = _julia_kernels()
    listed = kernels.all_kernels()
    assert set(source) == set(listed), "kernels.py and src/ list different @kernel functions"
    for name, sig in listed.items():
        args, vals = source[name]
        assert tuple(args) == sig.args, f"{name}: arguments {args} in src/, {sig.args} in kernels.py"
        assert tuple(vals) == sig.vals, f"{name}: Val order {vals} in src/, {sig.vals} in kernels.py"


def test_schedule_types_match_the_julia_registry():
    from julia_checks import head, walk

    structs = _julia_structs()
    registry = {}
    for tree in _julia_tree():
        for node in walk(tree):
            if head(node) == "const" and node[1][1] == "SCHEDULES":
                registry = {item[1]: item[2] for item in node[1][2][1:] if head(item) == "="}
    assert registry == {name: s.julia_type for name, s in kernels.SCHEDULES.items()}
    for sched in kernels.SCHEDULES.values():
        fields = structs[sched.julia_type]
        assert fields == sched.julia_tunables, f"{sched.julia_type} fields {fields}, kernels.py {sched.julia_tunables}"
        assert fields[0] == "workgroupsize"
        for kernel in sched.kernels:
            assert kernel.vals == fields, f"{kernel.name} takes Vals {kernel.vals}, {sched.julia_type} has {fields}"


def test_mamba_launcher_and_kernels_match_the_julia_source():
    from julia_checks import head, walk

    structs, call, entry = {}, None, None
    for tree in _julia_tree():
        for node in walk(tree):
            if head(node) == "struct" and node[1] == kernels.MAMBA.julia_type:
                structs[node[1]] = tuple(f[1] for f in node[2][1:] if head(f) == "::-i")
            if head(node) in ("function", "function-="):
                sig = _signature(node[1])
                if head(sig) in ("call", "call-,") and head(sig[1]) == "::-i" and "MambaLauncher" in str(sig[1]):
                    call = sig
                elif head(sig) in ("call", "call-,") and sig[1] == kernels.MAMBA.entry:
                    entry = sig
    assert structs[kernels.MAMBA.julia_type] == kernels.MAMBA.julia_tunables == ("workgroupsize", "chunk")
    assert entry is not None and call is not None
    positional = [a for a in call[2:] if head(a) != "parameters"]
    args = positional[:len(kernels.MAMBA_ARGS)]
    assert tuple(args) == kernels.MAMBA_ARGS
    vals = [a[1][2] for a in positional[len(kernels.MAMBA_ARGS):]]
    assert tuple(vals) == kernels.MAMBA.julia_tunables
    for kernel in kernels.MAMBA.kernels:
        assert kernel.vals[1:] == kernels.MAMBA.julia_tunables


def test_launchers_take_the_kernel_arguments_then_vals():
    from julia_checks import head, walk

    entries, call = {}, None
    for tree in _julia_tree():
        for node in walk(tree):
            if head(node) in ("function", "function-="):
                sig = _signature(node[1])
                if head(sig) not in ("call", "call-,"):
                    continue
                if head(sig[1]) == "::-i" and "ScheduleLauncher" in str(sig[1]):
                    call = sig
                elif isinstance(sig[1], str) and head(node[2]) in ("call", "call-,") and \
                        head(node[2][1]) == "curly" and node[2][1][1] == "ScheduleLauncher":
                    assert [a[1] if head(a) == "::-i" else a for a in sig[2:]] == ["backend", "workgroupsize"]
                    entries[sig[1]] = node[2][1][2]  # ScheduleLauncher{T}(...) -> T
    assert call is not None, "no (launch::ScheduleLauncher)(...) method in src/"
    positional = [a[1] if head(a) == "::-i" else a for a in call[2:] if head(a) != "parameters"]
    assert tuple(positional[:len(kernels.KERNEL_ARGS)]) == kernels.KERNEL_ARGS
    assert positional[len(kernels.KERNEL_ARGS):] == [["...", ["::-i", "tunables", "Val"]]]
    assert entries == {s.entry: s.julia_type for s in kernels.SCHEDULES.values()}


def test_kernel_tuner_problem_and_arguments():
    p = kernels.kernel_tuner_problem("blelloch", "float32", "amdgpu", lanes=12)
    assert p["compiler_options"] == ["amd"] and p["grid_div_x"] == [] and p["problem_size"] == (12,)
    assert p["kernel_name"] in p["kernel_source"] and p["kernel_source"].startswith("using KernelAbstractions")
    assert kernels.kernel_tuner_problem("sequential", device="cpu")["grid_div_x"] == ["workgroup_size"]
    with pytest.raises(ValueError, match="float64"):
        kernels.kernel_tuner_problem("hybrid", "float64", "metal")
    rng = np.random.default_rng(0)
    a, b, x = rng.random((3, 3, 17))
    args = kernels.kernel_tuner_arguments(a, b, x, reset=rng.random((3, 17)) < 0.2, reverse=True)
    assert len(args) == len(p["arg_names"])
    assert args[2].shape == (17, 3) and np.shares_memory(args[2], args[2].base) and args[2].flags.f_contiguous
    np.testing.assert_array_equal(args[2], a.astype(np.float32).T)
    assert args[7].dtype == np.uint8 and args[-1] is True


def test_devices_without_float64_refuse_it_until_julia_answers():
    from scanweaver.julia import devices

    assert devices.runtime_dtypes("oneapi") == ("float32", "complex64") == devices.runtime_dtypes("metal")
    assert "float64" in devices.runtime_dtypes("cuda") and "complex128" in devices.runtime_dtypes("cpu")
    for device in ("oneapi", "metal"):
        with pytest.raises(ValueError, match="not float64"):
            kernels.kernel_tuner_problem("hybrid", "float64", device)
    assert kernels.kernel_tuner_problem("hybrid", "float32", "oneapi")["compiler_options"] == ["intel"]


@pytest.mark.parametrize("module", ["scanweaver.julia.backend", "scanweaver.julia.devices", "scanweaver.julia.kernels",
                                    "scanweaver.julia.mamba", "scanweaver.julia.matrix", "scanweaver.julia.fusedcall",
                                    "scanweaver.julia.session", "scanweaver.targets.fused",
                                    "scanweaver.targets.fused_julia"])
def test_docstring_examples_of_the_julia_facade_run(module, monkeypatch, tmp_path):
    """The examples in the façade's docstrings (Kernel Tuner entry names, what renders on ``julia``) are run,
    so they cannot drift from the code; none of them starts Julia. They run with juliacall's variables set,
    as where a Julia is configured, and leave them as they were."""
    import doctest
    import importlib

    monkeypatch.setenv("PYTHON_JULIACALL_EXE", str(tmp_path / "julia"))
    monkeypatch.setenv("PYTHON_JULIACALL_PROJECT", str(tmp_path / "env"))
    before = dict(os.environ)
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS, report=False)
    assert result.failed == 0, f"{module}: {result.failed} of {result.attempted} docstring examples fail " \
                               f"(python -m doctest shows them)"
    assert dict(os.environ) == before, f"{module}: docstring examples changed the environment"


def test_kernel_tuner_julia_backend_is_the_one_described():
    spec = importlib.util.find_spec("kernel_tuner")
    if spec is None:
        pytest.skip("kernel_tuner is not installed (pip install 'scanweaver[tune]')")
    backends = Path(spec.origin).parent / "backends"
    helper_py = (backends / "julia_helper.py").read_text()
    helper_jl = (backends / "julia_helper.jl").read_text()
    names = set(re.findall(r'"module_backend": "(\w+)"', helper_py))
    assert {"CUDABackend", "ROCBackend", "oneAPIBackend", "MetalBackend", "CPU"} <= names
    assert "configured_kernel(args..., val_params...; ndrange=ndrange)" in helper_jl
    assert "applicable(kernel, kt_julia_backend, workgroupsize)" in helper_jl
    from scanweaver.julia.devices import DEVICES

    kt_names = set(re.findall(r'^    "(\w+)": \{', helper_py, re.M))
    assert {d.kernel_tuner.upper() for d in DEVICES.values()} == kt_names


def test_wheel_package_data_ships_every_julia_source():
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = spec["package-data"]["scanweaver"]
    shipped = {p.resolve() for g in globs for p in PKG.glob(g)}
    sources = {p.resolve() for p in [ROOT / "Project.toml", *SRC.rglob("*.jl"), *(ROOT / "ext").glob("*.jl")]}
    assert sources <= shipped, f"not shipped in the wheel: {sorted(map(str, sources - shipped))}"
    assert "scanweaver.julia.ScanWeaver*" in spec["packages"]["find"]["exclude"]
