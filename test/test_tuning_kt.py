"""Real Kernel Tuner runs: C on the CPU, OpenCL on PoCL, failing configurations, replays, the CLI."""

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("kernel_tuner", reason="Kernel Tuner is not installed (pip install scanweaver[tune])")

import scanweaver  # noqa: E402
from scanweaver.api import SELECTIVE  # noqa: E402
from scanweaver.cli import main  # noqa: E402
from scanweaver.runtime import REGISTRY  # noqa: E402
from scanweaver.tuning import store  # noqa: E402
from scanweaver.tuning.kt import replay  # noqa: E402
from scanweaver.tuning.langs import KernelSpec, get_target  # noqa: E402
from scanweaver.tuning.session import SKIP_REASON, KernelTunerSession, read_cached  # noqa: E402
from scanweaver.tuning.space import VALUE_FILTERS, Limits, build_space  # noqa: E402

DATA = Path(__file__).parent / "data" / "tuning"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    return tmp_path


def operands(shape, seed=3):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.6, 0.99, shape).astype(np.float32)
    return a, *(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def available(backend):
    why = get_target(backend).unavailable()
    if why:
        pytest.skip(f"{backend} cannot be tuned here: {why}")


def test_cli_tunes_the_cpu_in_c_and_the_next_scan_uses_it(cache):
    available("cpu")
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["tune", "--backend", "cpu", "--shape", "3,5,301", "--values", "chunk=128,256",
                   "--values", "interleave=4", "--json", "--out", str(cache / "report")])
    assert rc == 0
    rep = json.loads(out.getvalue())
    for key in ("backend", "device", "strategy", "evaluated", "skipped", "best_config", "best_ms", "median_ms",
                "default_ms", "speedup_vs_median", "speedup_vs_default", "store_path"):
        assert key in rep, key
    assert rep["backend"] == "cpu" and rep["strategy"] == "brute_force"
    declared = next(t.values for t in REGISTRY["cpu"].extra_tunables if t.name == "threads")
    threads = VALUE_FILTERS["threads"](declared, Limits(lanes=15, L=301))  # as many as this machine's cores
    assert rep["evaluated"] + rep["skipped"] == rep["space_size"] == 2 * len(threads) + 2  # chunked x threads + seq
    assert rep["skipped"] == 0 and rep["best_ms"] <= rep["median_ms"]
    assert rep["default_ms"] > 0 and rep["speedup_vs_default"] == pytest.approx(rep["default_ms"] / rep["best_ms"])
    assert (cache / "report" / "tune.png").stat().st_size > 1000
    assert Path(rep["store_path"]) == store.store_path()
    (stored,) = store.load()
    assert stored.host and stored.versions["kernel_tuner"] and stored.versions["scanweaver"]  # who, with what

    best = dict(rep["default_config"] if rep["stored"] == "default" else rep["best_config"])  # what was stored
    sched = best.pop("schedule")
    a, b, x, c = operands((3, 5, 301))
    y = scanweaver.selective_scan(a, b, x, c, backend="cpu")
    assert SELECTIVE.last.source == "tuned"
    assert SELECTIVE.last.schedule == sched and SELECTIVE.last.config == {**SELECTIVE.last.config, **best}
    ref = scanweaver.selective_scan(a, b, x, c, backend="numpy")
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["tune", "--show"]) == 0
    assert "lanes=15 L=301" in out.getvalue()


BROKEN = r"""
#if chunk == 256
#error this configuration deliberately does not compile
#endif
extern "C" float sw_scan_timed(const float* x, float* y, long n) {
  for (long i = 0; i < n; ++i) y[i] = (chunk == 512) ? x[i] + 1.0f : x[i];
  return 0.001f * (float)chunk;
}
"""


def test_failing_configurations_are_skipped_with_their_reason_and_the_tune_goes_on(cache):
    space = build_space("cpu", schedules=("chunked",), lanes=1, L=4096, values={"chunk": (256, 512, 1024, 2048),
                                                                              "threads": (1,), "interleave": (8,)})
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    spec = KernelSpec(lang="C", kernel_name="sw_scan_timed", kernel_source=BROKEN, problem_size=64,
                      arguments=[x, np.zeros_like(x), np.int64(64)], output=1, compiler="g++",
                      compiler_options=["-O1"])
    check = lambda y: None if np.array_equal(y, x) else "wrong result: y != x"  # noqa: E731
    session = KernelTunerSession(spec, space, cache / "kt.json", check=check, answer=x)
    results = session.run()
    by_chunk = {r["chunk"]: r for r in results}
    assert set(by_chunk) == {256, 512, 1024, 2048}
    assert "compile failed" in by_chunk[256][SKIP_REASON] and "deliberately" in by_chunk[256][SKIP_REASON]
    assert by_chunk[512][SKIP_REASON] == "wrong result: y != x"
    assert by_chunk[1024]["time"] == pytest.approx(1.024) and SKIP_REASON not in by_chunk[1024]
    assert by_chunk[2048]["time"] == pytest.approx(2.048)
    cached = {r["chunk"]: r for r in read_cached(cache / "kt.json")}
    assert cached[512][SKIP_REASON] == "wrong result: y != x"  # on record for the next run and for replays
    again = {r["chunk"]: r for r in session.run()}
    assert again[512][SKIP_REASON] == by_chunk[512][SKIP_REASON]


def test_opencl_tune_on_pocl_times_with_events_and_is_used(cache):
    available("opencl")
    rep = scanweaver.tune(backend="opencl", shape=(4, 200), schedule="blelloch",
                          values={"workgroup_size": (32, 64)}, progress=False)
    assert rep.backend == "opencl" and "OpenCL" in rep.device and "events" in rep.timing
    assert [e.schedule for e in rep.ok] == ["blelloch", "blelloch"] and not rep.skipped
    a, b, x, c = operands((4, 200))
    y = scanweaver.selective_scan(a, b, x, c, backend="opencl")
    assert SELECTIVE.last.source == "tuned"
    assert SELECTIVE.last.schedule == "blelloch"
    assert SELECTIVE.last.config["workgroup_size"] == rep.best.config["workgroup_size"]
    np.testing.assert_allclose(y, scanweaver.selective_scan(a, b, x, c, backend="numpy"), rtol=1e-4, atol=1e-4)


def copy_replay_data(cache):
    for f in ("cpu_replay.json", "cpu_replay.space.json"):
        shutil.copy(DATA / f, cache / f)
    return cache / "cpu_replay.json"


def test_replay_of_a_committed_cache_selects_deterministically(cache):
    cachefile = copy_replay_data(cache)
    raw = {",".join(str(r[k]) for k in ("schedule", "chunk", "threads", "interleave")): r
           for r in read_cached(DATA / "cpu_replay.json")}
    keys = json.loads((DATA / "cpu_replay.space.json").read_text())["space"]["params"]
    med = {k: float(np.median(v["times"])) for k, v in raw.items()}
    full = replay(cachefile)
    assert full.strategy == "brute_force" and len(full.ok) == full.space_size == len(full.evaluations)
    in_space = (k for k in med if all(str(v) in map(str, keys[n]) for n, v in zip(keys, k.split(","), strict=True)))
    best_key = min(in_space, key=med.get)
    assert full.best.time_ms == pytest.approx(med[best_key])
    assert full.median_ms == pytest.approx(np.median([e.time_ms for e in full.ok]))
    assert full.default is not None and full.default.config.get("threads") == 0
    assert full.speedup(full.default_ms) == pytest.approx(full.default_ms / full.best.time_ms)

    one = replay(cachefile, strategy="random_sample", max_fevals=4, seed=7)
    two = replay(cachefile, strategy="random_sample", max_fevals=4, seed=7)
    assert [e.label() for e in one.evaluations] == [e.label() for e in two.evaluations]
    assert len(one.evaluations) == 4 and one.best.time_ms == min(e.time_ms for e in one.ok)
    assert one.best.time_ms >= full.best.time_ms
