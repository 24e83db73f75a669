"""The ``scanweaver`` command line, run as a user would (subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def sw(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scanweaver", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_every_subcommand():
    out = sw("--help")
    assert out.returncode == 0
    for name in ("run", "devices", "ir"):
        assert name in out.stdout


def test_run_json_reports_ok_on_numpy():
    out = sw("run", "--backend", "numpy", "--shape", "2,3,129", "--repeats", "1", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    for key in ("backend", "schedule", "shape", "dtype", "time_ms", "gbps", "roofline_fraction", "max_abs_err",
                "max_rel_err", "ok"):
        assert key in res
    assert res["ok"] is True and res["backend"] == "numpy" and res["shape"] == [2, 3, 129]
    assert res["max_rel_err"] < 1e-4


def test_run_table_on_the_default_backend():
    out = sw("run", "--shape", "4,64,256", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    assert "roofline_fraction" in out.stdout and "ok" in out.stdout


def test_run_rejects_a_bad_shape():
    out = sw("run", "--shape", "8,x,y")
    assert out.returncode == 2
    assert "--shape" in out.stderr


def test_devices_json_lists_every_backend():
    out = sw("devices", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["backend"]: r for r in json.loads(out.stdout)}
    assert rows["numpy"]["available"] is True
    for r in rows.values():
        assert r["available"] or r["reason"], f"{r['backend']} unavailable without a reason"


@pytest.mark.parametrize("schedule", ["sequential", "chunked", "blelloch"])
def test_ir_prints_every_stage(schedule):
    out = sw("ir", "--target", "numpy", "--schedule", schedule)
    assert out.returncode == 0, out.stderr
    for stage in ("scan", "affine_scan", "assoc_scan", "schedule"):
        assert f"IR after {stage} " in out.stdout
    assert f"scanweaver.schedule @selective_scan {schedule}" in out.stdout


def test_ir_single_stage_and_params():
    out = sw("ir", "--target", "numpy", "--schedule", "chunked", "--param", "chunk=96", "--stage", "schedule")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("scanweaver.schedule") and "chunk=96" in out.stdout


def test_ir_unknown_tunable_is_an_error_not_a_traceback():
    out = sw("ir", "--target", "numpy", "--schedule", "chunked", "--param", "chunkz=3")
    assert out.returncode == 1
    assert "unknown tunable" in out.stderr and "Traceback" not in out.stderr
