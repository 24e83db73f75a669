"""The cpu backend's one-thread cut-off is measured on the machine, stored once, and overridable."""

from __future__ import annotations

import pytest

from scanweaver.runtime import REGISTRY, calibrate

pytestmark = pytest.mark.skipif(not REGISTRY.get("cpu").availability().ok,
                                reason="the cpu backend needs a C compiler")


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(calibrate.ENV, raising=False)
    monkeypatch.setattr(calibrate, "_cutoff", {})
    return tmp_path


def test_the_cutoff_is_measured_once_and_read_back(fresh, monkeypatch):
    value = calibrate.threads_cutoff()
    assert calibrate.LOW <= value <= calibrate.HIGH
    stored = calibrate._read()[calibrate._key()]
    assert stored["threads_cutoff"] == value
    assert [r["elements"] for r in stored["ladder"]] == sorted(r["elements"] for r in stored["ladder"])
    assert all(r["one_thread_us"] > 0 and r["every_core_us"] > 0 for r in stored["ladder"])
    monkeypatch.setattr(calibrate, "_cutoff", {})
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured again although it was stored"))
    assert calibrate.threads_cutoff() == value


def test_the_rule_picks_the_smallest_size_from_which_every_core_wins():
    ladder = [(1024, 2.0, 3.0), (2048, 3.0, 3.5), (4096, 5.0, 4.0), (8192, 9.0, 9.5), (16384, 17.0, 10.0),
              (32768, 33.0, 18.0)]
    rows = [{"elements": n, "one_thread_us": a, "every_core_us": b} for n, a, b in ladder]
    assert calibrate.cutoff_of(rows) == 16384  # 4096 wins alone, 8192 does not: the cut-off is where winning stays
    assert calibrate.cutoff_of(rows[:4]) == calibrate.HIGH  # never winning for good: one thread up to HIGH


def test_the_environment_sets_the_cutoff_without_measuring(fresh, monkeypatch):
    monkeypatch.setenv(calibrate.ENV, "4096")
    monkeypatch.setattr(calibrate, "measure", lambda: pytest.fail("measured despite the override"))
    assert calibrate.threads_cutoff() == 4096
    be = REGISTRY.get("cpu")()
    assert be.default_config("chunked", 2, 1024, "float32")["threads"] == 1
    assert "threads" not in be.default_config("chunked", 8, 1024, "float32")
    assert be.default_config("chunked", 1, 100, "float32")["threads"] == 1
