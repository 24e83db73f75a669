"""Tuning spread over Ray: two logical GPUs on this machine, the cpu and opencl (PoCL) backends, a killed worker."""

from __future__ import annotations

import json
import threading
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install scanweaver[cluster])")
pytest.importorskip("kernel_tuner", reason="Kernel Tuner is not installed (pip install scanweaver[tune])")
psutil = pytest.importorskip("psutil", reason="psutil finds the Ray worker to kill")

import scanweaver  # noqa: E402
from scanweaver.cli import main  # noqa: E402
from scanweaver.tuning import store  # noqa: E402
from scanweaver.tuning.langs import get_target  # noqa: E402

TIMEOUT = 300
#: a small cpu space: chunked (2 chunks x 2 thread counts) and sequential (2 thread counts)
CPU_VALUES = {"chunk": (128, 256), "interleave": (1,)}
SHAPE = (3, 5, 1001)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray instance for the module, declaring two logical GPUs (the tune takes one per shard)."""
    ray.init(num_gpus=2, num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def user_store(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))  # the driver's store (workers keep their cache)
    return tmp_path


def available(backend):
    why = get_target(backend).unavailable()
    if why:
        pytest.skip(f"{backend} cannot be tuned here: {why}")


def test_parallel_cpu_tune_measures_every_configuration_once_and_stores_what_a_sequential_one_would():
    available("cpu")
    par = scanweaver.tune(backend="cpu", shape=SHAPE, values=CPU_VALUES, parallel=2, progress=False,
                          time_limit=TIMEOUT)
    seq = scanweaver.tune(backend="cpu", shape=SHAPE, values=CPU_VALUES, progress=False, record=False)
    assert par.space_size == seq.space_size == 6
    assert sorted(e.label() for e in par.evaluations) == sorted(e.label() for e in seq.evaluations)
    assert not par.skipped and par.best is not None and par.default is not None
    assert any("2 shards as Ray tasks (num_gpus=1 each)" in n and "2 finished" in n for n in par.notes)
    assert par.best.schedule == seq.best.schedule  # chunked beats the serial loop by several times here
    # both shards time on this host's two cores: never side by side (2-thread configurations would share them)
    assert any(n.endswith(": 2 shards timed in turn") for n in par.notes), par.notes
    (entry,) = store.load()
    assert entry.partial == ""
    assert (entry.backend, entry.device, entry.signature, entry.dtype, entry.lanes, entry.L) == \
        (seq.backend, seq.device, seq.signature, seq.dtype, 15, SHAPE[-1])
    assert entry.schedule == par.best.schedule and entry.host and entry.versions.get("ray")
    scanweaver.selective_scan(*(x for x in _operands()), backend="cpu")
    assert scanweaver.api.SELECTIVE.last.source == "tuned"


def _operands():
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.uniform(0.6, 0.99, SHAPE).astype(np.float32)
    return (a, *(rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)))


def test_parallel_opencl_tune_on_pocl():
    available("opencl")
    rep = scanweaver.tune(backend="opencl", shape=(4, 200), schedule="blelloch", values={"workgroup_size": (32, 64)},
                          parallel=2, progress=False, time_limit=TIMEOUT)
    assert rep.backend == "opencl" and "OpenCL" in rep.device and "events" in rep.timing
    assert [e.schedule for e in rep.ok] == ["blelloch", "blelloch"] and not rep.skipped
    assert store.load()[0].config["workgroup_size"] == rep.best.config["workgroup_size"]


def _shard_pids() -> list[int]:
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if cmd.startswith("ray::run_shard"):
            pids.append(proc.info["pid"])
    return pids


def test_a_killed_worker_loses_only_its_shard_and_its_configurations_are_reported_failed():
    available("cpu")
    values = {"chunk": (64, 128, 256, 512, 1024), "interleave": (1,), "threads": (1,)}
    out: dict = {}

    def run():
        try:
            out["report"] = scanweaver.tune(backend="cpu", shape=(3, 5, 2001), values=values, parallel=2,
                                            progress=False, fresh=True, time_limit=TIMEOUT)
        except Exception as exc:  # surfaced by the assertions below
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline, victim = time.monotonic() + 120, None
    while victim is None and time.monotonic() < deadline and thread.is_alive():
        pids = _shard_pids()
        if len(pids) == 2:
            time.sleep(0.5)  # both shards are measuring
            victim = pids[0]
            psutil.Process(victim).kill()
        time.sleep(0.05)
    thread.join(TIMEOUT)
    assert victim is not None, "no shard process was seen running"
    assert not thread.is_alive() and "error" not in out, out.get("error")
    rep = out["report"]
    lost = [e for e in rep.skipped if e.reason and e.reason.startswith("Ray worker lost")]
    assert lost and len(lost) + len(rep.ok) == rep.space_size == 6  # nothing silently missing
    assert any("1 lost" in n for n in rep.notes) and rep.best is not None
    assert all(e.time_ms is not None for e in rep.ok)
    (entry,) = store.load()  # the stored winner says it comes from a partial search
    assert entry.partial == f"{len(rep.ok)} of 6 configurations measured ({len(lost)} lost with their shard)"


def test_cli_parallel_json():
    available("cpu")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["tune", "--backend", "cpu", "--shape", ",".join(map(str, SHAPE)), "--values", "chunk=128,256",
                   "--values", "interleave=1", "--parallel", "2", "--json"])
    assert rc == 0
    rep = json.loads(buf.getvalue())
    assert rep["evaluated"] == 6 and any("shards as Ray tasks" in n for n in rep["notes"])


def test_bad_parallel_values_are_refused_before_ray_starts():
    with pytest.raises(scanweaver.ScanInputError, match="parallel must be a positive number"):
        scanweaver.tune(backend="cpu", shape=SHAPE, parallel=0)
    with pytest.raises(scanweaver.ScanInputError, match="confirm= re-measures on one device"):
        scanweaver.tune(backend="cpu", shape=SHAPE, parallel=2, confirm=3)
