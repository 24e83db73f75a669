"""Tuned configurations shared: ``$SCANWEAVER_TUNED`` stores, provenance, export/import, many writers at once."""

import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

import pytest

from scanweaver.api import SELECTIVE
from scanweaver.runtime import get_backend
from scanweaver.tuning import atomic, exchange, store


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.delenv(store.SHARED_ENV, raising=False)
    return tmp_path


def entry(**kw):
    base = dict(backend="numpy", device=get_backend("numpy").availability().device,
                signature=SELECTIVE.signature("float32"), dtype="float32", lanes=64, L=1024,
                schedule="chunked", config={"chunk": 512}, time_ms=1.0)
    return store.Entry(**{**base, **kw})


def key(e):
    return dict(backend=e.backend, device=e.device, signature=e.signature, dtype=e.dtype, lanes=e.lanes, L=e.L)


def test_shared_store_is_written_and_every_source_is_read(cache, monkeypatch):
    store.record(entry(config={"chunk": 256}))  # per-user, before any shared store is named
    shared = cache / "nfs" / "team"
    shared.mkdir(parents=True)
    monkeypatch.setenv(store.SHARED_ENV, f"{shared}/")
    assert store.store_path() == shared / "tuned.json"
    assert store.sources() == [shared / "tuned.json", store.user_store_path()]
    e = entry(L=65536, config={"chunk": 4096})
    store.record(e)
    assert [len(es) for _, es in store.load_sources()] == [1, 1]
    assert store.lookup(**key(e)) == ("chunked", {"chunk": 4096})              # from the shared store
    assert store.lookup(**key(entry())) == ("chunked", {"chunk": 256})         # from the per-user store
    store.record(entry(config={"chunk": 1024}))                                # same key, newer, shared
    assert store.lookup(**key(entry())) == ("chunked", {"chunk": 1024})


def test_provenance_says_who_where_and_with_which_versions():
    p = exchange.provenance()
    assert p["host"] and "python" in p["versions"] and "numpy" in p["versions"] and "scanweaver" in p["versions"]
    e = entry(**p)
    store.record(e)
    (back,) = store.load(fresh=True)
    assert (back.host, back.user, back.versions) == (p["host"], p["user"], p["versions"])
    old = store.Entry.from_json({k: v for k, v in e.to_json().items() if k not in ("host", "user", "versions")})
    assert (old.host, old.user, old.versions) == ("", "", {})  # older files: unknown, not the reader's


def test_export_import_round_trip_keeps_the_newer_measurement(cache):
    a = entry(config={"chunk": 256}, created=100.0, host="node-a")
    b = entry(L=65536, config={"chunk": 4096}, created=200.0, host="node-b")
    store.record(a)
    store.record(b)
    out = cache / "export" / "tuned.json"
    assert exchange.export(out) == 2
    body = json.loads(out.read_text())
    assert body["format"] == store.FORMAT and body["version"] == store.VERSION and body["exported"]["host"]
    other = cache / "other" / "tuned.json"
    assert exchange.import_file(out, into=other) == {"added": 2, "replaced": 0, "kept": 0}
    assert sorted(json.dumps(e.to_json(), sort_keys=True) for e in store.load(other)) == \
        sorted(json.dumps(e.to_json(), sort_keys=True) for e in (a, b))
    store.record(entry(config={"chunk": 128}, created=300.0), path=other)    # newer than a
    assert exchange.import_file(out, into=other) == {"added": 0, "replaced": 1, "kept": 1}
    assert store.lookup(**key(a), path=other) == ("chunked", {"chunk": 128})
    (cache / "junk.json").write_text('{"entries": []}')
    with pytest.raises(Exception, match="not a tuned-configuration file"):
        exchange.import_file(cache / "junk.json")


def test_cli_export_import_and_show_every_source(cache, tmp_path):
    env = {"SCANWEAVER_CACHE_DIR": str(cache / "user")}
    store.record(entry(host="node-a", user="alice"))
    out = tmp_path / "x.json"

    def run(*args, **extra):
        return subprocess.run([sys.executable, "-m", "scanweaver", "tune", *args], capture_output=True, text=True,
                              timeout=120, env={**os.environ, **env, **extra})

    r = run("--export", str(out))
    assert r.returncode == 0, r.stderr
    assert "exported 1" in r.stdout
    shared = tmp_path / "shared.json"
    r = run("--import", str(out), "--json", SCANWEAVER_TUNED=str(shared))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["added"] == 1 and store.load(shared)[0].host == "node-a"
    r = run("--show", SCANWEAVER_TUNED=str(shared))
    assert r.returncode == 0, r.stderr
    assert f"{shared} (shared" in r.stdout and "alice@node-a" in r.stdout and r.stdout.count(": 1\n") == 2
    r = run("--show", "--json", SCANWEAVER_TUNED=str(shared))
    rows = json.loads(r.stdout)
    assert [s["shared"] for s in rows["sources"]] == [True, False] and len(rows["entries"]) == 2
    r = run("--import", str(tmp_path / "missing.json"))
    assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr


def _writer(path, worker, n):
    os.environ["SCANWEAVER_TUNED"] = path
    from scanweaver.tuning import store as st

    for i in range(n):
        st.record(st.Entry(backend="numpy", device=f"node{worker}", signature="s", dtype="float32",
                           lanes=2 ** i, L=1024, schedule="sequential", config={}, time_ms=float(i)))


def _reader(path, seconds, q):
    from pathlib import Path

    from scanweaver.tuning import store as st

    seen, bad, t0 = 0, 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        try:
            seen = max(seen, len(st.parse(Path(path).read_text())))
        except FileNotFoundError:
            continue
        except st.StoreFormatError:
            bad += 1
    q.put((seen, bad))


def test_many_writers_and_readers_at_once_lose_nothing_and_see_no_half_file(cache):
    path = str(cache / "shared" / "tuned.json")
    (cache / "shared").mkdir()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(path, w, 12)) for w in range(4)]
    readers = [ctx.Process(target=_reader, args=(path, 4.0, q)) for _ in range(2)]
    for p in readers + writers:
        p.start()
    for p in writers + readers:
        p.join(120)
        assert p.exitcode == 0
    results = [q.get(timeout=10) for _ in readers]
    assert all(bad == 0 for _, bad in results), results
    entries = store.load(path, fresh=True)
    assert sorted((e.device, e.lanes) for e in entries) == sorted((f"node{w}", 2 ** i) for w in range(4)
                                                                   for i in range(12))
    assert not list((cache / "shared").glob("*.tmp")) and not list((cache / "shared").glob("*.bad-*"))


def _hold(lockpath, ready, seconds):
    from scanweaver.tuning import atomic as at

    with at.locked(lockpath):
        ready.set()
        time.sleep(seconds)


def test_a_held_lock_times_out_with_a_clear_error_instead_of_hanging(cache):
    path = cache / "held" / "tuned.json"
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold, args=(path, ready, 20))
    p.start()
    try:
        assert ready.wait(60)
        t0 = time.monotonic()
        with pytest.raises(atomic.LockError, match="could not lock"), atomic.locked(path, timeout=0.3):
            pass
        assert time.monotonic() - t0 < 5
    finally:
        p.kill()
        p.join(10)
    with atomic.locked(path, timeout=10):  # the holder died: the lock is free again
        pass
