"""Honest figures: a scan is compared with the roofline only under the same conditions, and a busy machine
is said in words (and ``quiet: false``) instead of an impossible roofline fraction."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from scanweaver.runtime import roofline
from scanweaver.runtime.toolchain import missing_reason

needs_cc = pytest.mark.skipif(missing_reason() is not None, reason=f"no C compiler: {missing_reason()}")


def sw(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scanweaver", *args], capture_output=True, text=True,
                          timeout=timeout)


def _uneven(short: float = 2e-4, long: float = 3e-3):
    """A call whose rounds take ``short`` and ``long`` seconds in turn: a spread a busy machine makes."""
    state = {"n": 0}

    def call() -> None:
        state["n"] += 1
        time.sleep(long if state["n"] % 2 else short)

    return call


@needs_cc
def test_a_spread_of_rounds_is_reported_busy_in_words():
    cmp = roofline.compare(_uneven(), 4, 1024, "float32", threads=1, repeats=8, min_seconds=0.05)
    assert cmp.quiet is False
    assert cmp.reason.startswith("the machine was busy") and "varied by" in cmp.reason
    assert cmp.spreads["scan"] > roofline.BUSY_SPREAD
    assert cmp.fraction is None or cmp.fraction <= roofline.MAX_FRACTION


@needs_cc
def test_an_impossible_fraction_is_never_reported_as_one():
    # a "scan" that returns at once beats any kernel that moves the bytes: the fraction would be far above 1
    cmp = roofline.compare(lambda: None, 64, 4096, "float32", threads=1, repeats=5, min_seconds=0.05)
    assert cmp.roofline_s is not None and cmp.roofline_s / cmp.seconds > roofline.MAX_FRACTION
    assert cmp.fraction is None and cmp.quiet is False
    assert "no scan can beat" in cmp.reason


def test_judge_keeps_a_possible_fraction_from_quiet_rounds():
    rounds = {"scan": roofline.Rounds((2.0, 2.02, 1.98, 2.0)), "roofline": roofline.Rounds((1.0, 1.01, 0.99, 1.0))}
    cmp = roofline.judge(rounds, threads=2)
    assert cmp.quiet is True and cmp.reason == "" and cmp.fraction == pytest.approx(0.5)
    assert cmp.threads == 2


def test_a_gpu_scan_gets_no_host_roofline():
    assert roofline.scan_threads("cuda", {}) is None
    assert roofline.scan_threads("julia", {"device": "cuda"}) is None
    assert roofline.scan_threads("cpu", {"threads": 0}) == 0 and roofline.scan_threads("numpy", {}) == 1
    cmp = roofline.compare(lambda: None, 4, 64, "float32", threads=None, repeats=3, min_seconds=0.0)
    assert cmp.roofline_s is None and cmp.fraction is None and "accelerator" in cmp.reason


def _busy_process() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


@needs_cc
@pytest.mark.parametrize("shape", ["1,8,256", "2,64,4096"])
def test_run_on_a_loaded_machine_prints_no_impossible_fraction(shape):
    busy = _busy_process()
    try:
        out = sw("run", "--shape", shape, "--repeats", "5", "--json")
        text = sw("run", "--shape", shape, "--repeats", "5")
    finally:
        busy.kill()
        busy.wait()
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert isinstance(res["quiet"], bool)
    assert res["roofline_fraction"] is None or res["roofline_fraction"] <= roofline.MAX_FRACTION
    if not res["quiet"]:
        assert "busy" in res["note"]
    if res["roofline_fraction"] is not None and res["backend"] == "cpu":
        assert res["roofline_threads"] == res["config"]["threads"]  # the roofline ran on the scan's threads
    assert text.returncode == 0, text.stderr
    (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith("roofline_fraction")]
    shown = re.match(r"roofline_fraction\s+([0-9.]+)", line)
    assert shown is None or float(shown.group(1)) <= roofline.MAX_FRACTION
    (quiet,) = [ln for ln in text.stdout.splitlines() if ln.startswith("quiet")]
    if quiet.split()[1] == "no":  # (the explanation column says "no = busy" on every line)
        assert "note: the machine was busy" in text.stdout


@needs_cc
def test_bench_judges_its_roofline_fraction_by_the_same_rule():
    from scanweaver.benchmarks import harness, report, suites
    from scanweaver.benchmarks.cases import Settings

    busy = _busy_process()
    try:
        run = harness.run(suites.get("paper", quick=True), Settings.for_mode(True), backend="cpu", progress=False)
    finally:
        busy.kill()
        busy.wait()
    data = report.to_json(run)
    judged = [r for r in data["ratios"].values() if r]
    assert judged and all(isinstance(r["quiet"], bool) for r in judged)
    for r in judged:
        assert r["roofline_fraction"] is None or r["roofline_fraction"] <= roofline.MAX_FRACTION
        if not r["quiet"]:
            assert "busy" in r["note"]
    assert data["quiet"] == all(r["quiet"] for r in judged)
    ratios = report.markdown(run).split("## Ratios")[1].split("\n## ")[0]
    for cell in re.findall(r"^\| [^|]+ \| [^|]+ \| ([0-9.]+)(?: \(busy\))? \|", ratios, re.M):
        assert float(cell) <= roofline.MAX_FRACTION
