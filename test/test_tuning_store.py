"""The tuned-configuration store: keys, nearest bucket, corruption, concurrent writers, use by scans."""

import json
import multiprocessing as mp
import subprocess
import sys
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
    return tmp_path


def entry(**kw):
    base = dict(backend="numpy", device=get_backend("numpy").availability().device,
                signature=SELECTIVE.signature("float32"), dtype="float32", lanes=64, L=1024,
                schedule="chunked", config={"chunk": 512}, time_ms=1.0)
    return store.Entry(**{**base, **kw})


def operands(lanes, L, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.6, 0.99, (lanes, L)).astype(np.float32)
    return a, *(rng.standard_normal((lanes, L)).astype(np.float32) for _ in range(3))


def test_store_path_follows_env(cache):
    assert store.store_path() == cache / "tuned.json"
    assert store.lookup(backend="numpy", device="x", signature="y", dtype="float32", lanes=8, L=8) is None


def test_lookup_picks_nearest_bucket_for_this_device_only():
    store.record(entry(lanes=64, L=1024, config={"chunk": 256}))
    store.record(entry(lanes=64, L=65536, config={"chunk": 4096}))
    store.record(entry(device="another GPU", lanes=64, L=1000, config={"chunk": 8192}))
    e = entry()
    key = dict(backend="numpy", device=e.device, signature=e.signature, dtype="float32")
    assert store.lookup(**key, lanes=50, L=900) == ("chunked", {"chunk": 256})
    assert store.lookup(**key, lanes=32, L=40000) == ("chunked", {"chunk": 4096})
    # far from every tuned size (one lane instead of 64): the defaults apply, not a distant tune
    assert store.lookup(**key, lanes=1, L=40000) is None
    assert store.lookup(**{**key, "dtype": "float64"}, lanes=64, L=1024) is None
    assert store.lookup(**{**key, "signature": "0" * 16}, lanes=64, L=1024) is None
    assert store.lookup(**{**key, "device": "another GPU"}, lanes=64, L=1024) == ("chunked", {"chunk": 8192})


def test_same_key_is_replaced_and_unknown_tunables_are_ignored():
    store.record(entry(config={"chunk": 256}))
    store.record(entry(config={"chunk": 1024}, L=1100))  # same L bucket: replaces
    assert len(store.load()) == 1
    e = entry()
    key = dict(backend="numpy", device=e.device, signature=e.signature, dtype="float32", lanes=64, L=1024)
    assert store.lookup(**key) == ("chunked", {"chunk": 1024})
    store.record(entry(config={"no_such_tunable": 3}))
    assert store.lookup(**key) is None  # a stale entry never breaks a scan


def test_stored_config_is_used_by_the_next_scan():
    store.record(entry(lanes=6, L=333, config={"chunk": 64}))
    a, b, x, c = operands(6, 333)
    y = scanweaver.selective_scan(a, b, x, c, backend="numpy")
    assert SELECTIVE.last.source == "tuned"
    assert SELECTIVE.last.schedule == "chunked" and SELECTIVE.last.config["chunk"] == 64
    ref = scanweaver.selective_scan(a, b, x, c, backend="numpy", config="default")
    assert SELECTIVE.last.source == "default"
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    scanweaver.selective_scan(a, b, x, c, backend="numpy", schedule="chunked", chunk=128)
    assert SELECTIVE.last.source == "explicit" and SELECTIVE.last.config["chunk"] == 128


@pytest.mark.parametrize("text", ["{not json", json.dumps({"entries": []}), json.dumps([1, 2]),
                                  json.dumps({"format": store.FORMAT, "version": 99, "entries": []})])
def test_corrupt_or_foreign_store_is_ignored_once_and_scans_still_work(cache, text):
    """Readers warn once and use defaults, renaming nothing; a writer sets aside only undecodable JSON."""
    store.store_path().write_text(text)
    a, b, x, c = operands(3, 17)
    with pytest.warns(RuntimeWarning, match="unusable"):
        y = scanweaver.selective_scan(a, b, x, c, backend="numpy")
    assert SELECTIVE.last.source == "default" and y.shape == (3, 17)
    assert store.store_path().read_text() == text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scanweaver.selective_scan(a, b, x, c, backend="numpy")  # warned once per file version
    if text.startswith("{not"):
        with pytest.warns(RuntimeWarning, match="moved it to"):
            store.record(entry())
        aside = list(cache.glob("tuned.json.bad-*"))
        assert len(aside) == 1 and aside[0].read_text() == text
        assert len(store.load()) == 1
    else:  # another version's or format's file: never replaced
        with pytest.raises(store.StoreFormatError, match="not replacing it"):
            store.record(entry())
        assert store.store_path().read_text() == text and not list(cache.glob("tuned.json.bad-*"))


def _writer(cache_dir, worker, n):
    import os

    os.environ["SCANWEAVER_CACHE_DIR"] = cache_dir
    from scanweaver.tuning import store as st

    for i in range(n):
        st.record(st.Entry(backend="numpy", device=f"dev{worker}", signature="s", dtype="float32",
                           lanes=2 ** i, L=1024, schedule="sequential", config={}, time_ms=float(i)))


def test_two_processes_writing_at_once_lose_nothing(cache):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(cache), w, 25)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    entries = store.load()
    assert sorted((e.device, e.lanes) for e in entries) == sorted((f"dev{w}", 2 ** i) for w in range(2)
                                                                   for i in range(25))


def test_import_scanweaver_loads_no_tuning_dependency():
    code = ("import sys, scanweaver; scanweaver.tune; "
            "bad = [m for m in ('kernel_tuner', 'tqdm', 'matplotlib', 'pyopencl', 'cupy', 'juliacall') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
