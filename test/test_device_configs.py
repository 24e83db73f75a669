"""Per-device configuration files: used when the device name matches, overridden by the user's tuning."""

from __future__ import annotations

import json

import pytest

from scanweaver.tuning import devices, store


@pytest.fixture
def device_dir(tmp_path, monkeypatch):
    doc = {"format": devices.FORMAT, "version": devices.VERSION, "backend": "cpu", "device": "Test CPU 9000",
           "match": "CPU 9000", "entries": [
               {"dtype": "float32", "lanes": 4096, "L": 4096, "schedule": "chunked", "config": {"chunk": 512}},
               {"dtype": "float32", "lanes": 1, "L": 1 << 24, "schedule": "chunked", "config": {"chunk": 4096}},
               {"dtype": "float32", "lanes": 4096, "L": 64, "schedule": "no-such-schedule", "config": {}}]}
    (tmp_path / "test.json").write_text(json.dumps(doc))
    (tmp_path / "broken.json").write_text("{not json")
    monkeypatch.setenv(devices.ENV_DIR, str(tmp_path))
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path / "cache"))
    devices._load.cache_clear()
    yield tmp_path
    devices._load.cache_clear()


def _lookup(device="AMD Test CPU 9000 (2 threads)", lanes=4000, L=5000, dtype="float32"):
    return store.lookup(backend="cpu", device=device, signature="sig", dtype=dtype, lanes=lanes, L=L)


def test_matching_device_gets_the_nearest_size_class(device_dir):
    assert _lookup() == ("chunked", {"chunk": 512})
    assert _lookup(lanes=1, L=1 << 23) == ("chunked", {"chunk": 4096})


def test_other_devices_dtypes_and_far_sizes_get_nothing(device_dir):
    assert _lookup(device="Another CPU") is None
    assert _lookup(dtype="float64") is None
    assert _lookup(lanes=4096, L=8) is None, "the entry with an unknown schedule is ignored, the others are far"


def test_the_users_tuning_wins(device_dir):
    store.record(store.Entry(backend="cpu", device="AMD Test CPU 9000 (2 threads)", signature="sig",
                             dtype="float32", lanes=4096, L=4096, schedule="sequential", config={}, time_ms=1.0))
    assert _lookup() == ("sequential", {})


def test_a_device_file_steers_the_default_path_of_a_call(tmp_path, monkeypatch, rng):
    import numpy as np

    import scanweaver
    from scanweaver.runtime import get_backend

    device = get_backend("cpu").availability().device
    doc = {"format": devices.FORMAT, "version": devices.VERSION, "backend": "cpu", "device": device,
           "match": device, "entries": [{"dtype": "float64", "lanes": 8, "L": 2048, "schedule": "sequential",
                                         "config": {}}]}
    (tmp_path / "synthetic.json").write_text(json.dumps(doc))
    monkeypatch.setenv(devices.ENV_DIR, str(tmp_path))
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path / "cache"))
    devices._load.cache_clear()
    try:
        a = rng.uniform(0.5, 1.0, (8, 2000))
        y = scanweaver.selective_scan(a, a, a, backend="cpu")
        assert scanweaver.api.SELECTIVE_NO_C.last.schedule == "sequential"
        assert scanweaver.api.SELECTIVE_NO_C.last.source == "tuned"
        np.testing.assert_allclose(y, scanweaver.selective_scan(a, a, a, backend="numpy"), rtol=1e-12)
        monkeypatch.setenv(devices.ENV_DIR, str(tmp_path / "none"))
        devices._load.cache_clear()
        b = a[:, :1999].copy()  # another signature: no plan from the call above
        scanweaver.selective_scan(b, b, b, backend="cpu")
        assert scanweaver.api.SELECTIVE_NO_C.last.source == "default"
    finally:
        devices._load.cache_clear()


def test_the_shipped_h200_file_answers_for_an_h200_and_for_no_other_device():
    """The file measured on an H200 (``bench/gpu_session.sh``'s defaults step): every entry is a valid
    configuration of its schedule, and it steers the cuda backend's default on an H200 only."""
    from scanweaver.passes.materialize_schedule import resolve_config

    shipped = [d for d in devices._load((str(devices.SHIPPED),)) if d["match"] == "H200"]
    assert len(shipped) == 1 and shipped[0]["backend"] == "cuda" and shipped[0]["entries"]
    for e in shipped[0]["entries"]:
        resolve_config(e["schedule"], dict(e["config"]), "device file")
        assert e["roofline_fraction"] > 0.5, e  # each size class's best measured configuration
    got = devices.lookup(backend="cuda", device="NVIDIA H200", dtype="float32", lanes=12288, L=4096)
    assert got is not None and got[0] == "hybrid"
    assert devices.lookup(backend="cuda", device="NVIDIA A100-SXM4-80GB", dtype="float32", lanes=12288,
                          L=4096) is None
    assert devices.lookup(backend="opencl", device="NVIDIA H200", dtype="float32", lanes=12288, L=4096) is None
