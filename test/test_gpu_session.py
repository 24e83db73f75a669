"""``bench/gpu_session.sh --dry-run``: the whole GPU session on the CPU, PoCL standing in for the GPU.

The session's flow is what one GPU run runs (``bench/gpu_session.py``): every step in priority
order under its own time limit, each step's result written as it finishes, at most eight files back.
Here the GPU-only entries report why they skipped, and the steps that have a stand-in run it: the device
tests, a kernel family against its float64 reference (``backend="opencl"``), the device-defaults sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scanweaver.runtime import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
OCL = REGISTRY["opencl"].availability()
pytestmark = [pytest.mark.skipif(not OCL.ok, reason=f"PoCL stands in for the GPU: {OCL.reason}"),
              pytest.mark.skipif(sys.platform == "win32", reason="the session is a bash script")]
pytest.importorskip("torch", reason="the families step runs through scanweaver.torch")


def session(out: Path, *args: str, timeout: float = 300, path: str = "") -> tuple[subprocess.CompletedProcess, dict]:
    env = dict(os.environ, PYTHONPATH=path + str(ROOT / "python"), OUT="", PYTHON=sys.executable)
    proc = subprocess.run(["bash", "bench/gpu_session.sh", "--dry-run", "--out", str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc, json.loads((out / "summary.json").read_text())


def test_dry_run_of_the_whole_session(tmp_path):
    proc, summary = session(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    steps = {r["name"]: r for r in summary["steps"]}
    assert list(steps) == ["setup", "tests", "kernels", "families", "chunked", "gpu_check", "scoreboard", "models",
                           "defaults", "training"]
    for name in ("setup", "tests", "families", "chunked", "gpu_check", "scoreboard", "defaults"):
        assert steps[name]["status"] == "ok", (name, steps[name])
    assert steps["kernels"]["status"] == steps["models"]["status"] == steps["training"]["status"] == "skipped"
    assert all(r.get("limit_s", 0) <= summary["deadline_s"] for r in summary["steps"])
    assert summary["elapsed_s"] < summary["deadline_s"] and summary["correctness_failures"] == []
    families = json.loads((tmp_path / "families.json").read_text())
    assert families["status"] == "ok" and families["families"]
    for row in families["families"]:
        assert row["status"] == "ok" and max(row["errors"].values()) <= families["tolerance"], row
        assert {"y", "dx", "ddt", "dz"} <= set(row["errors"]), "the output and every gradient are checked"
    chunked = json.loads((tmp_path / "gpu_chunked.json").read_text())
    assert {(r["model"], r["algorithm"]) for r in chunked if r["kind"] == "check"} == {
        (m, a) for m in ("gla", "simple_gla", "mamba2", "gated_delta", "rwkv7") for a in ("recurrent", "chunked")}
    assert all(r["ran_forward"] == r["algorithm"] for r in chunked if r["kind"] == "check")
    assert all(r["status"] == "ok" for r in chunked), [r for r in chunked if r["status"] != "ok"]
    assert all(r["chunked_train_ms"] > 0 for r in chunked if r["kind"] == "time")
    # where the time goes, from the backend's kernel log: each part's kernels with their device times
    kernels = next(r for r in chunked if r["kind"] == "time" and r["model"] == "gla")["kernels"]
    assert set(kernels["chunked"]["forward"]) == {"sw_matrix_state_chunk_prefix", "sw_matrix_state_chunk_local",
                                                  "sw_matrix_state_chunk_carry", "sw_matrix_state_chunk_output"}
    assert set(kernels["recurrent"]["forward"]) == {"sw_matrix_state_forward"}
    delta = next(r for r in chunked if r["kind"] == "time" and r["model"] == "gated_delta")["kernels"]
    assert set(delta["chunked"]["forward"]) == {"sw_delta_chunk_prep", "sw_delta_chunk_state"}
    assert {"sw_delta_chunk_adjoint", "sw_delta_rule_bwd_keys"} <= set(delta["chunked"]["backward"])
    assert "sw_matrix_state_chunk_adjoint_carry" in kernels["chunked"]["backward"]
    assert all(ms > 0 for alg in kernels.values() for part in alg.values() for ms in part.values())
    device = json.loads((tmp_path / summary["device_file"]).read_text())
    assert device["format"] == "scanweaver-device-configs" and device["backend"] == "opencl" and device["entries"]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "no_gpu"
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) <= 8 and all((tmp_path / f).is_file() for f in files), files
    log = (tmp_path / "session.log").read_text()
    assert "== families" in log and "mamba2_gated" in log


def test_a_step_past_its_limit_is_cut_and_reported(tmp_path):
    """A 6 s deadline leaves the scoreboard a few seconds, and its process is made to take a minute (a
    ``sitecustomize`` that sleeps in the scoreboard's interpreter only, so the cut does not depend on how fast
    this machine imports): it is killed with its children at its limit, reported as cut, and the session still
    writes its summary and exits 0."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text('import sys, time\nif "--suite" in sys.argv:\n    time.sleep(60)\n')
    out = tmp_path / "out"
    t0 = time.time()
    proc, summary = session(out, "--deadline", "6", "--min-step", "1", "--steps", "scoreboard",
                            path=str(slow) + os.pathsep)
    elapsed = time.time() - t0
    assert proc.returncode == 0, proc.stdout[-3000:]
    steps = {r["name"]: r for r in summary["steps"]}
    assert steps["tests"]["status"] == "skipped" and "--steps" in steps["tests"]["note"]
    assert steps["scoreboard"]["status"] == "timeout", steps["scoreboard"]
    assert steps["scoreboard"]["seconds"] <= steps["scoreboard"]["limit_s"] + 2
    assert elapsed < 6 + 10, f"the session took {elapsed:.0f} s past a 6 s deadline"


def test_a_deadline_under_the_budgets_cuts_the_last_steps_not_the_first(tmp_path):
    """80 s for the tests (60 s budget) and gpu_check (70 s): the tests, first in priority, get their budget
    and run (they were skipped on an H200 when the deadline was under the sum of the budgets, the time
    being kept for later steps); gpu_check gets what is left."""
    proc, summary = session(tmp_path, "--deadline", "80", "--steps", "tests gpu_check")
    assert proc.returncode == 0, proc.stdout[-3000:]
    steps = {r["name"]: r for r in summary["steps"]}
    assert steps["tests"]["status"] == "ok" and steps["tests"]["limit_s"] >= 60, steps["tests"]
    assert steps["gpu_check"]["status"] in ("ok", "skipped"), steps["gpu_check"]
    assert all(r.get("limit_s", 0) <= summary["deadline_s"] for r in summary["steps"])
