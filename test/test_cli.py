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


def test_unknown_options_are_reported_by_their_subcommand(capsys):
    """``scanweaver run --bogus`` printed the top level's usage (``COMMAND ...``), which lists none of run's
    options."""
    from scanweaver.cli import main

    for argv, usage, said in ((["run", "--bogus"], "usage: scanweaver run", "scanweaver run: error: unrecognized "
                               "arguments: --bogus"),
                              (["tune", "--nope", "1"], "usage: scanweaver tune", "scanweaver tune: error: "
                               "unrecognized arguments: --nope 1"),
                              (["--bogus"], "usage: scanweaver [-h]", "scanweaver: error: unrecognized arguments")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and usage in err and said in err, err


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


def test_version():
    import scanweaver

    out = sw("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"scanweaver {scanweaver.__version__}"


def test_run_says_it_builds_and_explains_each_figure():
    from scanweaver.cli.run import EXPLAIN

    out = sw("run", "--backend", "numpy", "--shape", "2,3,129", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("scanweaver run: building the numpy scan")  # said before the first build
    lines = out.stdout.splitlines()
    for key, meaning in EXPLAIN.items():
        (line,) = [ln for ln in lines if ln.split()[0] == key]
        assert line.rstrip().endswith(meaning)
    (frac,) = [ln for ln in lines if ln.startswith("roofline_fraction")]
    assert "roofline time / scan time" in frac
    (config,) = [ln for ln in lines if ln.startswith("config")]
    assert "(default)" in config or "(tuned)" in config  # which configuration ran, without --json


def test_devices_lists_julia_once_with_its_devices():
    out = sw("devices")
    assert out.returncode == 0, out.stderr
    assert [ln.split()[0] for ln in out.stdout.splitlines() if ln.startswith("julia")] == ["julia"]
    assert "cpu" in out.stdout.split("julia", 1)[1] and "metal" in out.stdout.split("julia", 1)[1]
    rows = {r["backend"]: r for r in json.loads(sw("devices", "--json").stdout)}
    assert not any(name.startswith("julia:") for name in rows)
    assert [d["name"] for d in rows["julia"]["devices"]] == ["cpu", "cuda", "amdgpu", "oneapi", "metal"]


def test_bench_bar_chart_has_a_colour_legend():
    pytest.importorskip("matplotlib")
    from scanweaver.benchmarks.harness import Result, Run
    from scanweaver.benchmarks.plots import KIND_LABELS, _pyplot, bar_figure

    def row(kind: str, label: str, s: float) -> Result:
        return Result(case="c", shape=(1, 4, 256), dtype="float32", group="shape", entry=label, label=label,
                      kind=kind, recurrence="time-varying", paper=False, checked=True, status="ok",
                      median_s=s, q25_s=s * 0.9, q75_s=s * 1.1, min_s=s * 0.8, max_s=s * 1.2, repeats=3)

    plt = _pyplot()
    fig = bar_figure(plt, [row("ours", "ScanWeaver cpu", 1e-4), row("peer", "numpy loop", 1e-2),
                           row("bound", "roofline", 5e-5)], Run("s", None, [], {"cpu": "cpu"}, []))
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    plt.close(fig)
    assert sorted(labels) == sorted(KIND_LABELS[k] for k in ("ours", "peer", "bound"))
