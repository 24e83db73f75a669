"""The benchmark harness on tiny shapes: it checks before it times, records, plots and skips with reasons."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import loop_reference

from scanweaver.benchmarks import harness, peers, report
from scanweaver.benchmarks.cases import Case, Settings, make_inputs, oracle64, relative_error
from scanweaver.benchmarks.suites import Suite, get

QUICK = Settings.for_mode(True)


class WrongPeer(peers.Peer):
    """Computes the scan with the gate off by 1%: a wrong answer the harness must refuse to time."""

    name = "test-wrong"
    label = "deliberately wrong"

    def __init__(self):
        self.calls = 0

    def prepare(self, ops):
        def run():
            self.calls += 1
            return oracle64({**ops, "a": ops["a"] * 0.99}).astype(ops["a"].dtype)

        return run


class AbsentPeer(peers.Peer):
    """Needs a library that is not installed."""

    name = "test-absent"
    label = "absent library"

    def availability(self):
        return peers.installed("scanweaver_no_such_library", "scanweaver-no-such-library")

    def prepare(self, ops):
        raise AssertionError("an unavailable peer must never be prepared")


class RaisingPeer(peers.Peer):
    """Raises on its first call: reported as an error, and the run goes on."""

    name = "test-raises"
    label = "raises"

    def prepare(self, ops):
        def run():
            raise RuntimeError("kernel launch failed")

        return run


class RightPeer(peers.Peer):
    """The float64 oracle rounded to the operands' dtype: always right."""

    name = "test-right"
    label = "oracle in float32"

    def prepare(self, ops):
        return lambda: oracle64(ops).astype(ops["a"].dtype)


@pytest.fixture
def test_peers():
    made = [WrongPeer(), AbsentPeer(), RaisingPeer(), RightPeer()]
    for p in made:
        peers.add(p)
    yield {p.name: p for p in made}
    for p in made:
        peers.remove(p.name)


def small_suite(names: set[str]) -> Suite:
    cases = (Case("2x3x37", (2, 3, 37), headline=True), Case("L=2^6", (1, 2, 64), group="sweep"),
             Case("L=2^10", (1, 2, 1024), group="sweep"))
    return Suite("test", cases, tuple((c.name, lambda case, p: p.name in names) for c in cases))


def by_entry(run, case):
    return {r.entry: r for r in run.results if r.case == case}


def test_oracle_matches_plain_loop(rng):
    for shape, block in (((2, 3, 37), 8), ((1, 1, 1), 4), ((1, 2, 100), 16), ((3, 1, 64), 16)):
        ops = make_inputs(Case("t", shape, dtype="float64"), seed=int(rng.integers(1 << 30)))
        want, _ = loop_reference(ops["a"], ops["b"], ops["x"], ops["c"])
        assert relative_error(oracle64(ops, block=block), want) < 1e-13, shape


def test_relative_error_flags_nan_and_wrong_shape():
    ref = np.ones((1, 4))
    assert relative_error(np.array([[1.0, np.nan, 1.0, 1.0]]), ref) == float("inf")
    assert relative_error(np.ones((1, 3)), ref) == float("inf")
    assert relative_error(ref * (1 + 1e-3), ref) == pytest.approx(1e-3)


def test_wrong_result_is_failed_not_timed_and_absent_peer_skipped(test_peers):
    run = harness.run(small_suite({"test-wrong", "test-absent", "test-raises", "test-right", "numpy-loop"}),
                      QUICK, progress=False)
    for case in ("2x3x37", "L=2^6", "L=2^10"):
        got = by_entry(run, case)
        wrong = got["test-wrong"]
        assert wrong.status == "failed" and "wrong result" in wrong.reason
        assert wrong.median_s is None and wrong.repeats == 0
        assert got["test-absent"].status == "skipped"
        assert "scanweaver_no_such_library" in got["test-absent"].reason
        assert got["test-raises"].status == "error" and "kernel launch failed" in got["test-raises"].reason
        for name in ("test-right", "numpy-loop"):
            ok = got[name]
            assert ok.status == "ok", ok.reason
            assert ok.repeats >= QUICK.min_repeats and ok.min_s <= ok.median_s <= ok.max_s
            assert ok.q25_s <= ok.median_s <= ok.q75_s and ok.error < 1e-5
    # the wrong peer ran once per case (the checked warm-up), never in a timing loop
    assert test_peers["test-wrong"].calls == 3


def test_cap_skips_slow_entries_with_the_estimate(test_peers):
    slow = Settings(quick=True, min_repeats=1, max_repeats=2, budget_s=0.0, max_call_s=1e-9)
    run = harness.run(small_suite({"test-right"}), slow, progress=False)
    assert all(r.status == "skipped" and r.reason.startswith("capped") for r in run.results)


def test_time_calls_repeats_until_budget():
    calls = []
    times = harness.time_calls(lambda: calls.append(1), Settings(min_repeats=4, max_repeats=7, budget_s=10.0))
    assert len(times) == len(calls) == 7
    times = harness.time_calls(lambda: None, Settings(min_repeats=3, max_repeats=50, budget_s=0.0))
    assert len(times) == 3
    s = harness.summarise([3.0, 1.0, 2.0, 10.0])
    assert s["median_s"] == 2.5 and s["min_s"] == 1.0 and s["max_s"] == 10.0 and s["q25_s"] <= s["q75_s"]


def test_scanweaver_entries_and_report_files(test_peers, tmp_path):
    names = {"test-wrong", "test-right", "numpy-loop", "scanweaver:numpy:sequential", "scanweaver:numpy:auto",
             "accelerated-scan", "accelerated-scan-triton", "gpu-roofline", "torch-loop-cuda",
             "torch-assoc-compiled-cuda"}
    run = harness.run(small_suite(names), QUICK, backend="numpy", progress=False)
    got = by_entry(run, "2x3x37")
    ours = got["scanweaver:numpy:auto"]
    assert ours.status == "ok", ours.reason
    assert ours.details["backend"] == "numpy" and ours.details["config_source"] in ("default", "tuned")
    assert got["scanweaver:numpy:sequential"].status == "ok"
    for gpu in ("accelerated-scan", "accelerated-scan-triton", "gpu-roofline", "torch-loop-cuda",
                "torch-assoc-compiled-cuda"):
        if got[gpu].status == "skipped":
            assert "GPU" in got[gpu].reason
    msgs = report.write(run, tmp_path)
    data = json.loads((tmp_path / "test.json").read_text())
    assert {"meta", "settings", "results", "ratios", "targets", "paper"} <= set(data)
    assert len(data["results"]) == len(run.results)
    rat = data["ratios"]["2x3x37"]
    assert rat["ours"] == "scanweaver:numpy:auto"
    assert rat["speedup"]["numpy-loop"] == pytest.approx(got["numpy-loop"].median_s / ours.median_s)
    general = [got[n] for n in ("numpy-loop", "test-right")]
    assert rat["fastest_general_peer"] == min(general, key=lambda r: r.median_s).entry
    md = (tmp_path / "test.md").read_text()
    assert "deliberately wrong | failed" in md and "Paper comparison at L = 1024" in md
    naive = [p for p in data["paper"] if p["paper_ms"] == 0.469]
    assert naive and naive[0]["shape"] == [1, 2, 1024] and naive[0]["here_s"] > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert any("matplotlib is not installed" in m for m in msgs)
        pytest.skip("matplotlib not installed: PNG output not checked")
    pngs = sorted(tmp_path.glob("*.png"))
    assert {p.name for p in pngs} == {"test_latency.png", "test_2x3x37.png"}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000 for p in pngs)


def test_suites_shapes():
    full = get("all")
    names = [c.name for c in full.cases]
    assert len(names) == len(set(names))
    assert {c.shape for c in full.cases if c.group == "shape"} == {(1, 1, 2**24), (8, 512, 4096), (8, 1536, 4096)}
    assert [c.L for c in get("paper").cases] == [2**k for k in range(6, 21)]
    assert sum(c.headline for c in full.cases) == 1
    assert max(c.elements for c in get("all", quick=True).cases) <= 2**13


def test_cli_quick_json(tmp_path, capsys):
    from scanweaver.cli import main

    rc = main(["bench", "--suite", "paper", "--quick", "--backend", "numpy", "--json", "--no-progress",
               "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["meta"]["suite"] == "paper" and data["settings"]["quick"] is True
    statuses = {r["entry"]: r["status"] for r in data["results"] if r["case"] == "L=2^10"}
    assert statuses["scanweaver:numpy:blelloch"] == "ok"
    assert (tmp_path / "paper.json").exists() and (tmp_path / "paper.md").exists()


def test_import_loads_no_peer_library():
    code = ("import sys, scanweaver.benchmarks, scanweaver.benchmarks.peers as p, scanweaver.cli.bench; "
            "p.load_all(); heavy = {'torch', 'jax', 'scipy', 'matplotlib', 'cupy', 'rich', 'tqdm'} & set(sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_suite_skips_every_entry_with_its_reason_without_cuda():
    from scanweaver.runtime import REGISTRY

    if REGISTRY["cuda"].availability().ok:
        pytest.skip("CUDA is present: bench/gpu_scoreboard.sh runs this suite for real")
    suite = get("gpu", quick=True)
    assert all(c.device == "cuda" for c in suite.cases)
    run = harness.run(suite, QUICK, progress=False)
    assert run.results and {r.status for r in run.results} == {"skipped"}
    assert all(r.reason for r in run.results)
    names = {r.entry for r in run.results}
    assert {"gpu-roofline", "accelerated-scan", "accelerated-scan-triton", "jax-assoc", "scanweaver:auto:auto"} <= names


def test_gpu_training_script_checks_every_entry_on_a_cpu_smoke_run(tmp_path):
    """bench/gpu_training.py as a CPU smoke run: ours and the peers that need no GPU are checked against the
    float64 reference and timed; accelerated-scan is skipped with its reason; without a GPU it exits 3."""
    pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install 'scanweaver[torch]'")
    script = ["bench/gpu_training.py", "--device", "cpu", "--shape", "2,3,64", "--repeats", "2", "--skip-compile",
              "--out", str(tmp_path / "t.json")]
    run = subprocess.run([sys.executable, *script], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    rec = json.loads((tmp_path / "t.json").read_text())
    entries = rec["entries"]
    ours = entries["ScanWeaver (scanweaver.torch)"]
    assert ours["status"] == "ok" and max(ours["grad_rel_errors"].values()) < 1e-5
    assert entries["PyTorch loop + autograd"]["status"] == "ok"
    assert all(v["status"].startswith("skipped") for k, v in entries.items() if "accelerated" in k)
    assert "PyTorch associative_scan (torch.compile)" not in entries
    assert rec["speedup_vs_fastest_peer"] is not None
    import torch

    if not torch.cuda.is_available():
        no_gpu = subprocess.run([sys.executable, "bench/gpu_training.py"], capture_output=True, text=True,
                                timeout=120, check=False)
        assert no_gpu.returncode == 3 and "NO GPU RUN" in no_gpu.stderr
