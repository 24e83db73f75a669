"""What a tune says: the budget bounds what is measured, the bar counts to it, a reused cache is said, the
confirmed verdict is the one shown and stored, the report prints as its table (real Kernel Tuner runs, C)."""

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

pytest.importorskip("kernel_tuner", reason="Kernel Tuner is not installed (pip install scanweaver[tune])")

import scanweaver  # noqa: E402
from scanweaver.cli import main  # noqa: E402
from scanweaver.tuning import store  # noqa: E402
from scanweaver.tuning.langs import get_target  # noqa: E402
from scanweaver.tuning.report import summarize  # noqa: E402
from scanweaver.tuning.session import read_cached  # noqa: E402
from scanweaver.tuning.space import build_space  # noqa: E402

SHAPE = (2, 301)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    why = get_target("cpu").unavailable()
    if why:
        pytest.skip(f"cpu cannot be tuned here: {why}")
    return tmp_path


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["tune", "--backend", "cpu", "--shape", ",".join(map(str, SHAPE)), *args])
    return rc, out.getvalue(), err.getvalue()


def test_max_fevals_bounds_brute_force_and_the_bar_counts_to_the_budget():
    rc, out, err = _cli("--max-fevals", "3", "--no-store")
    assert rc == 0, err
    counts = [(int(a), int(b)) for a, b in re.findall(r"(\d+)/(\d+) \[", err)]
    assert counts and {b for _, b in counts} == {3} and max(a for a, _ in counts) <= 3  # total = the budget
    assert "random sample" in out and "evaluated" in out
    cachefile = re.search(r"Kernel Tuner's cache (\S+\.json)", out) or None
    assert cachefile is None  # a first tune reuses nothing
    rc, out, err = _cli("--max-fevals", "3", "--no-store", "--json", "--no-progress")
    rep = json.loads(out)
    assert rep["evaluated"] + rep["skipped"] <= 3 < rep["space_size"]
    assert len(read_cached(Path(rep["kt_cache"]))) <= 3  # what Kernel Tuner measured, not only what we show
    assert any("reused" in n and "--fresh" in n for n in rep["notes"])  # the second tune said it reused the cache
    assert err == ""  # --json and --no-progress: no bar


@pytest.mark.parametrize("strategy", ["random_sample", "genetic_algorithm"])
def test_max_fevals_bounds_other_strategies(strategy):
    rep = scanweaver.tune(backend="cpu", shape=SHAPE, strategy=strategy, max_fevals=4, progress=False,
                          record=False)
    assert 0 < len(rep.evaluations) <= 4
    assert len(read_cached(Path(rep.kt_cache))) <= 4


def test_confirm_verdict_is_the_one_shown_and_stored():
    rc, out, err = _cli("--max-fevals", "4", "--confirm", "3", "--json", "--values", "chunk=256,16384")
    assert rc == 0, err
    rep = json.loads(out)
    best, default = (sorted(rep["confirmed"][k])[1] for k in ("best", "default"))  # medians of 3
    assert rep["speedup_vs_default"] == pytest.approx(default / best)
    (stored,) = store.load()
    chosen = rep["default_config"] if rep["stored"] == "default" else rep["best_config"]
    assert rep["stored"] == ("default" if default <= best else "best")
    assert {"schedule": stored.schedule, **stored.config} == chosen
    assert stored.time_ms == pytest.approx(min(best, default) if rep["stored"] == "default" else best)
    assert stored.default_ms == pytest.approx(default)  # `tune --show`'s ratio is the table's
    _, table, _ = _cli("--max-fevals", "4", "--confirm", "3", "--values", "chunk=256,16384", "--no-progress")
    assert re.search(r"stored the (best|default) ", table)


def test_report_prints_as_its_table_with_a_readable_plot():
    rep = scanweaver.tune(backend="cpu", shape=SHAPE, max_fevals=5, progress=False, record=False)
    assert str(rep) == rep.table() == repr(rep)
    assert "Evaluation(" not in repr(rep) and repr(rep).count("\n") >= 5
    pytest.importorskip("matplotlib")
    fig = rep.figure()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(lbl.startswith("worst ") for lbl in labels) and any(lbl.startswith("best ") for lbl in labels)
    low, high = ax.get_ylim()
    assert low < rep.best.time_ms and rep.worst.time_ms < high  # the worst point is inside the axes


def test_a_tune_with_a_wide_spread_of_runs_says_the_machine_was_busy():
    space = build_space("cpu", schedules=("sequential",), lanes=2, L=301, values={"threads": (1, 2)})
    quiet, noisy = space.join("sequential", {"threads": 1}), space.join("sequential", {"threads": 2})
    results = [{**quiet, "time": 1.0, "times": [1.0, 1.01, 0.99, 1.0, 1.0]},
               {**noisy, "time": 1.5, "times": [1.5, 9.0, 1.4, 12.0, 1.5]}]
    meta = dict(backend="cpu", device="d", strategy="brute_force", signature="s", dtype="float32", shape=SHAPE)
    calm = summarize(results[:1], space, default=quiet, **meta)
    assert calm.to_json()["quiet"] is True and "busy" not in calm.table()
    loaded = summarize(results, space, default=noisy, **meta)
    assert loaded.to_json()["quiet"] is False
    assert "the machine was busy" in loaded.table() and "default configuration varied" in loaded.table()
