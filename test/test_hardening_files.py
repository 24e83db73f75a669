"""Regression tests of untrusted files: tuned-store entries, shared and foreign stores, calibration.json."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import scanweaver
from scanweaver.api import SELECTIVE
from scanweaver.runtime import get_backend
from scanweaver.tuning import store


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SCANWEAVER_TUNED", raising=False)
    return tmp_path


def good(**kw) -> dict:
    e = store.Entry(backend="numpy", device=get_backend("numpy").availability().device,
                    signature=SELECTIVE.signature("float32"), dtype="float32", lanes=4, L=64,
                    schedule="chunked", config={"chunk": 16}, time_ms=1.0)
    return {**e.to_json(), **kw}


def write(path, entries, version=store.VERSION):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": store.FORMAT, "version": version, "entries": entries}))


def operands():
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, (4, 64)).astype(np.float32)
    return a, *(rng.standard_normal((4, 64)).astype(np.float32) for _ in range(3))


BAD = [good(lanes="8"), good(schedule=7), good(config=["chunk"]), good(time_ms=float("nan")),
       good(lanes=True), good(config={"chunk": {"deep": 1}}), "a string", 12, None, good(L=-4), good(created="now")]


def test_malformed_entries_are_skipped_with_one_warning_and_good_ones_still_serve():
    write(store.store_path(), [*BAD, good()])
    a, b, x, c = operands()
    with pytest.warns(RuntimeWarning, match=f"skipped {len(BAD)} invalid entries"):
        scanweaver.selective_scan(a, b, x, c, backend="numpy")
    assert SELECTIVE.last.source == "tuned" and SELECTIVE.last.config["chunk"] == 16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scanweaver.selective_scan(a, b, x, c, backend="numpy")
    assert len(store.load()) == 1


def test_writers_keep_skipped_entries_and_import_ignores_them(tmp_path):
    write(store.store_path(), [*BAD, good()])
    other = tmp_path / "export.json"
    write(other, ["x", "y", good(lanes=1024)])
    from scanweaver.tuning import exchange

    with pytest.warns(RuntimeWarning, match="invalid entr"):
        counts = exchange.import_file(other)
    assert counts["added"] == 1
    kept = json.loads(store.store_path().read_text())["entries"]
    texts = {json.dumps(k, sort_keys=True) for k in kept}
    assert len(kept) == 2 + len(BAD) and all(json.dumps(b, sort_keys=True) in texts for b in BAD)


@pytest.mark.parametrize("schedule", ["no-such-schedule", "fused:nothing"])
def test_an_entry_whose_schedule_or_config_is_unknown_is_ignored(schedule):
    write(store.store_path(), [good(schedule=schedule), good(config={"chunk": "big"}), good(config={"nope": 1})])
    a, b, x, c = operands()
    scanweaver.selective_scan(a, b, x, c, backend="numpy")
    assert SELECTIVE.last.source == "default"


def test_a_shared_store_of_another_version_is_never_renamed_nor_replaced(cache, tmp_path, monkeypatch):
    shared = tmp_path / "nfs" / "tuned.json"
    write(shared, [good(), {"a field of version 2": 1}], version=2)
    text = shared.read_text()
    monkeypatch.setenv("SCANWEAVER_TUNED", str(shared))
    a, b, x, c = operands()
    with pytest.warns(RuntimeWarning, match="store version 2"):
        scanweaver.selective_scan(a, b, x, c, backend="numpy")
    with pytest.raises(store.StoreFormatError, match="not replacing it"):
        store.record(store.Entry.from_json(good()))
    assert shared.read_text() == text and not list(shared.parent.glob("*.bad-*"))


def test_an_undecodable_shared_store_is_never_renamed(tmp_path, monkeypatch):
    shared = tmp_path / "nfs" / "tuned.json"
    shared.parent.mkdir()
    shared.write_text('{"format": "scanweaver-tuned-configs", "entr')
    monkeypatch.setenv("SCANWEAVER_TUNED", str(shared))
    a, b, x, c = operands()
    with pytest.warns(RuntimeWarning, match="unusable"):
        scanweaver.selective_scan(a, b, x, c, backend="numpy")
    with pytest.raises(store.StoreFormatError, match="shared store"):
        store.record(store.Entry.from_json(good()))
    assert shared.exists() and not list(shared.parent.glob("*.bad-*"))


def test_a_read_error_renames_nothing(cache):
    store.store_path().mkdir()  # reading it fails (IsADirectoryError), as a transient error would
    a, b, x, c = operands()
    with pytest.warns(RuntimeWarning, match="unusable"):
        scanweaver.selective_scan(a, b, x, c, backend="numpy")
    assert store.store_path().is_dir() and not list(cache.glob("tuned.json.bad-*"))


@pytest.mark.parametrize("bad", ["lots", -3, 2.5, None, True, [1], 10 ** 30])
def test_a_bad_threads_cutoff_is_measured_again(bad, monkeypatch):
    from scanweaver.runtime import calibrate, toolchain

    if toolchain.missing_reason():
        pytest.skip(f"no C compiler: {toolchain.missing_reason()}")
    monkeypatch.delenv(calibrate.ENV, raising=False)
    monkeypatch.setattr(calibrate, "_cutoff", {})
    key = calibrate._key()
    path = calibrate._cache_file()
    path.write_text(json.dumps({key: {"threads_cutoff": bad}, "another machine": "garbage"}))
    with pytest.warns(RuntimeWarning, match="invalid threads_cutoff"):
        value = calibrate.threads_cutoff()
    assert isinstance(value, int) and calibrate.LOW <= value <= calibrate.HIGH
    stored = json.loads(path.read_text())[key]["threads_cutoff"]
    assert stored == value
    assert calibrate.one_thread(10) is True


STORE_SCRIPT = r"""
import json, os, resource, sys, warnings
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
import scanweaver
from scanweaver.tuning import store

rng = np.random.default_rng(0)
a = rng.uniform(0.5, 1, (4, 64)).astype(np.float32)
b, x, c = (rng.standard_normal((4, 64)).astype(np.float32) for _ in range(3))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    want = scanweaver.selective_scan(a, b, x, c, backend="numpy", schedule="sequential")
    ok = all(np.allclose(scanweaver.selective_scan(a, b, x, c, backend="numpy"), want) for _ in range(3))
    for _ in range(3):  # what every scan on a tuned backend asks
        ok = ok and store.lookup(backend="cpu", device="any", signature="0", dtype="float32", lanes=4, L=64) is None
print(json.dumps({"ok": ok, "warnings": [str(w.message) for w in caught if "tuned-config" in str(w.message)]}))
"""


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_store_that_is_no_regular_file_or_too_large_is_refused_with_one_warning(tmp_path, kind):
    """SCANWEAVER_TUNED naming a FIFO (which blocked), /dev/zero (read until memory ran out) or a file over the
    size limit: never opened for a blocking or unbounded read; one warning names the reason; scans run."""
    import os
    import subprocess
    import sys

    from scanweaver.tuning import atomic

    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs on this platform")
        path = tmp_path / "tuned.fifo"
        os.mkfifo(path)
        reason = "is a FIFO, not a regular file"
    elif kind == "device":
        path = "/dev/zero"
        if not os.path.exists(path):
            pytest.skip("no /dev/zero on this platform")
        reason = "is a character device, not a regular file"
    else:
        path = tmp_path / "tuned.json"
        with open(path, "wb") as f:  # sparse: no disk used
            f.truncate(atomic.MAX_READ_BYTES + 1)
        reason = "over the 64 MiB limit"
    env = {**os.environ, "SCANWEAVER_TUNED": str(path), "SCANWEAVER_CACHE_DIR": str(tmp_path / "cache")}
    try:
        proc = subprocess.run([sys.executable, "-c", STORE_SCRIPT], capture_output=True, text=True, timeout=60,
                              env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the store {path} hung")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ok"]
    assert len(got["warnings"]) == 1 and reason in got["warnings"][0] and str(path) in got["warnings"][0], got


def test_writers_refuse_a_store_that_is_no_regular_file(tmp_path):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    import threading

    path = tmp_path / "tuned.fifo"
    os.mkfifo(path)
    result: list = []

    def write_side():
        try:
            store._load_for_write(path)
            result.append(None)
        except Exception as exc:  # noqa: BLE001  (the test inspects it)
            result.append(exc)

    reader = threading.Thread(target=write_side, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # release the blocked open with a writer that closes at once, then fail
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail("a writer blocked opening a FIFO named as the store")
    assert isinstance(result[0], store.StoreFormatError) and "is a FIFO, not a regular file" in str(result[0])
