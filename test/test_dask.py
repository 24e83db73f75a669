"""Scans over Dask arrays on a LocalCluster of two worker processes: every feature, the graph, a killed worker."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="Dask is not installed (pip install scanweaver[dask])")
distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip install scanweaver[dask])")

import scanweaver  # noqa: E402
import scanweaver.dask as swd  # noqa: E402
from scanweaver.dask.carry import plan  # noqa: E402

TIMEOUT = 180
L_CHUNKS = (100, 37, 64, 100)  # uneven, one block shorter than the others, boundaries inside segments
SHAPE = (3, 5, sum(L_CHUNKS))
CHUNKS = (2, (3, 2), L_CHUNKS)


@pytest.fixture(scope="module")
def client():
    """One LocalCluster with two single-threaded worker processes for the whole module."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "port in use" when another cluster runs on this machine
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", silence_logs=logging.CRITICAL)
    cl = distributed.Client(cluster, timeout=TIMEOUT)
    cl.wait_for_workers(2, timeout=TIMEOUT)
    yield cl
    cl.close(timeout=30)
    cluster.close(timeout=30)


def compute(client, *arrays):
    """Computes on the cluster, never waiting forever."""
    return client.compute(list(arrays), sync=False)[0].result(timeout=TIMEOUT) if len(arrays) == 1 else \
        [f.result(timeout=TIMEOUT) for f in client.compute(list(arrays))]


def data(seed=0, dtype=np.float32, shape=SHAPE):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 1.0, shape).astype(dtype)
    return [a, *(rng.standard_normal(shape).astype(dtype) for _ in range(3))]


def dask_of(v, chunks=CHUNKS):
    return da.from_array(v, chunks=chunks)


def close(got, want, dtype=np.float32, what=""):
    tol = 2e-5 if np.dtype(dtype) == np.float32 else 1e-12
    scale = max(1.0, float(np.max(np.abs(want))))
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol * scale,
                               err_msg=what)


@pytest.fixture(scope="module")
def recurrences():
    """Recurrences defined here (not at module level) so that workers receive them by value."""

    @scanweaver.recurrence(state_size=2)
    def biquad(h, a1, a2, b0, x):
        return (a1 * h[0] + a2 * h[1] + b0 * x, h[0])

    @scanweaver.recurrence
    def gated(h, delta, A, x):
        g = np.exp(delta * A)
        return g * h + (1 - g) * x

    return {"biquad": biquad, "gated": gated}


def _features(rng):
    reset = rng.random(SHAPE) < 0.02
    reset[..., [100, 137, 201]] = True  # resets exactly at block starts, too
    return {
        "plain": {},
        "h0": {"h0": rng.standard_normal(SHAPE[:-1]).astype(np.float32)},
        "reset": {"reset": reset},
        "cu_seqlens": {"cu_seqlens": [0, 60, 137, 250, SHAPE[-1]], "h0": rng.standard_normal(SHAPE[:-1])},
    }


@pytest.mark.parametrize("method", ["chain", "rescan", "correct"])
@pytest.mark.parametrize("reverse", [False, True])
def test_selective_scan_over_l_and_lanes_equals_the_single_process_result(client, method, reverse):
    a, b, x, c = data(1)
    lazy, wanted = [], []
    for feature, kw in _features(np.random.default_rng(2)).items():
        want, h_want = scanweaver.selective_scan(a, b, x, c, reverse=reverse, return_state=True, **kw)
        dkw = {k: (dask_of(v, CHUNKS[:-1]) if k == "h0" else dask_of(v) if k == "reset" else v) for k, v in kw.items()}
        y, h = swd.selective_scan(*map(dask_of, (a, b, x, c)), reverse=reverse, return_state=True, method=method,
                                  **dkw)
        assert y.chunks == dask_of(a).chunks and h.chunks == dask_of(a).chunks[:-1] and y.dtype == np.float32
        lazy += [y, h]
        wanted += [(feature, want), (feature, h_want)]
    for got, (feature, want) in zip(compute(client, *lazy), wanted, strict=True):  # one round trip for all
        close(got, want, what=feature)


def test_without_c_and_only_the_final_state(client):
    a, b, x, _ = data(3)
    want, h_want = scanweaver.selective_scan(a, b, x, return_state=True)
    y, h = swd.selective_scan(*map(dask_of, (a, b, x)), return_state=True, method="rescan")
    close(compute(client, h), h_want)  # the final state alone needs no last pass over the blocks
    needed = h.__dask_optimize__(h.dask, h.__dask_keys__())
    assert not any(isinstance(k, tuple) and k[0] == y.name for k in needed)
    close(compute(client, y), want)


@pytest.mark.parametrize("method", ["chain", "rescan"])
def test_dense_and_expression_recurrences(client, recurrences, method):
    rng = np.random.default_rng(4)
    ops = [rng.uniform(-0.4, 0.4, SHAPE) for _ in range(3)] + [rng.standard_normal(SHAPE)]
    h0, reset = rng.standard_normal((*SHAPE[:-1], 2)), rng.random(SHAPE) < 0.03
    bq = recurrences["biquad"]
    for reverse in (False, True):
        want, h_want = bq(*ops, h0=h0, reset=reset, reverse=reverse, return_state=True)
        y, h = swd.apply(bq, *map(dask_of, ops), h0=h0, reset=dask_of(reset), reverse=reverse, return_state=True,
                         method=method)
        assert h.shape == (*SHAPE[:-1], 2)
        got, h_got = compute(client, y, h)
        close(got, want, np.float64)
        close(h_got, h_want, np.float64)
    gated = recurrences["gated"]
    delta, x = rng.uniform(0.1, 1, SHAPE).astype(np.float32), rng.standard_normal(SHAPE).astype(np.float32)
    A = np.full((1, 1, 1), -0.7, np.float32)  # broadcast along every axis
    close(compute(client, gated.dask(dask_of(delta), A, dask_of(x), method=method)), gated(delta, A, x))


@pytest.mark.parametrize("method", ["chain", "rescan"])
def test_mamba_over_batch_channels_and_l(client, method):
    rng = np.random.default_rng(5)
    Bt, Dm, N, L = 2, 8, 4, 203
    u, z = (rng.standard_normal((Bt, Dm, L)).astype(np.float32) for _ in range(2))
    delta = rng.uniform(0.01, 0.3, (Bt, Dm, L)).astype(np.float32)
    A = -rng.uniform(0.5, 2, (Dm, N)).astype(np.float32)
    Bg, Cg = (rng.standard_normal((Bt, 2, N, L)).astype(np.float32) for _ in range(2))
    D, bias = rng.standard_normal(Dm).astype(np.float32), rng.standard_normal(Dm).astype(np.float32)
    h0 = rng.standard_normal((Bt, Dm, N)).astype(np.float32)
    kw = dict(D=D, delta_bias=bias, delta_softplus=True, h0=h0, cu_seqlens=[0, 50, 120, L])
    want, h_want = scanweaver.mamba_selective_scan(u, delta, A, Bg, Cg, z=z, return_state=True, **kw)
    ch = (1, (3, 5), (50, 77, 76))  # channel blocks that split the groups of 4
    Bd = da.from_array(Bg, (1, 2, 4, ch[2]))
    y, h = swd.mamba_selective_scan(da.from_array(u, ch), da.from_array(delta, ch), A, Bd, Cg, z=da.from_array(z, ch),
                                    return_state=True, method=method, **kw)
    assert y.chunks == da.from_array(u, ch).chunks
    got, h_got = compute(client, y, h)
    close(got, want)
    close(h_got, h_want)


def _layer_tasks(y):
    return {k: v for k, v in y.dask.to_dict().items() if not str(k[0] if isinstance(k, tuple) else k).startswith(
        "array-")}


@pytest.mark.parametrize("method", ["chain", "rescan", "correct"])
def test_the_task_graph_grows_linearly_with_the_blocks(method):
    counts = {}
    for n in (4, 8, 16, 32, 64):
        a = da.ones((6, 64 * n), chunks=(3, 64), dtype=np.float32)
        y, _ = swd.selective_scan(a, a, a, a, return_state=True, method=method)
        counts[n] = len(_layer_tasks(y))
    rows = 2
    for n, count in counts.items():
        assert count <= 6 * rows * n, (method, counts)  # passes, pairs, tree nodes (< n), carries
    assert counts[64] - counts[32] == pytest.approx(2 * (counts[32] - counts[16]), rel=0.1), counts


def test_plan_is_an_exclusive_scan_with_logarithmic_depth():
    for n in (1, 2, 3, 7, 8, 13, 64, 100):
        nodes, carries = plan(n)
        assert len(nodes) < 2 * n and len(carries) == n
        ranges = {(lo, 1): {lo} for lo in range(n)}
        for r in sorted(nodes, key=lambda r: r[1]):
            later, earlier = nodes[r]
            ranges[r] = ranges[later] | ranges[earlier]
            assert ranges[r] == set(range(r[0], r[0] + r[1]))
        covered, depth = {0: set()}, {0: 0}
        for j in range(1, n + 1):
            rng, prev = carries[j]
            covered[j] = covered[prev] | ranges[rng]
            depth[j] = depth[prev] + 1
            assert covered[j] == set(range(j))  # the carry into block j sees exactly blocks 0 .. j-1
        assert max(depth.values()) <= max(1, int(np.ceil(np.log2(n + 1))))


def test_only_aggregates_move_between_workers_for_the_carry(client):
    a, b, x, c = data(6, shape=(3, sum(L_CHUNKS)))
    workers = sorted(client.scheduler_info()["workers"])
    parts = []
    for op in (a, b, x, c):  # block k of every operand on worker k % 2: neighbours along L sit apart
        arr = dask_of(op, (3, L_CHUNKS))
        blocks = [client.persist(arr.blocks[:, k], workers=[workers[k % 2]]) for k in range(len(L_CHUNKS))]
        parts.append(da.concatenate(blocks, axis=1))
    distributed.wait([p for p in parts], timeout=TIMEOUT)
    client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
    y = swd.selective_scan(*parts, method="rescan")
    deps = y.dask.to_dict()
    for key, task in deps.items():  # the carries' inputs are aggregates and carries, never blocks
        if isinstance(key, tuple) and str(key[0]).startswith(("sw-carry", "sw-combine")):
            assert all(str(d[0]).startswith(("sw-aggregate", "sw-combine", "sw-carry")) for d in task.dependencies)
    close(compute(client, y), scanweaver.selective_scan(a, b, x, c))
    logs = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log))
    moved = {k: n for log in logs.values() for entry in log for k, n in entry["keys"].items()}
    carry = {k: n for k, n in moved.items() if str(k[0]).startswith(("sw-aggregate", "sw-combine", "sw-carry"))}
    assert carry, "the blocks sit on both workers, so some aggregate or carry must have moved"
    block_bytes = 3 * max(L_CHUNKS) * 4
    assert all(n < block_bytes / 4 for n in carry.values()), carry       # pairs of 3 lanes, not blocks
    assert sum(carry.values()) < 64 * 3 * 2 * len(L_CHUNKS) * 8 * 4, carry  # proportional to lanes x blocks


def test_a_killed_worker_is_recovered_by_dask_and_the_result_is_right(client):
    a, b, x, c = data(7, shape=(3, sum(L_CHUNKS)))
    want = scanweaver.selective_scan(a, b, x, c)

    def slow(block):  # a loading step that takes a while, so that the kill lands mid-computation
        time.sleep(0.25)
        return block.copy()

    ops = [dask_of(v, (3, L_CHUNKS)).map_blocks(slow, dtype=np.float32) for v in (a, b, x, c)]
    y = swd.selective_scan(*ops, method="rescan")
    future = client.compute(y)
    pids = client.run(os.getpid)
    time.sleep(1.0)
    assert not future.done(), "the computation finished before the kill; make the loading slower"
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    close(future.result(timeout=TIMEOUT), want)
    client.wait_for_workers(2, timeout=TIMEOUT)  # the nanny started a fresh worker process
    assert pids[victim] not in client.run(os.getpid).values()


def test_threaded_scheduler_gives_the_same_result():
    import dask

    @scanweaver.recurrence
    def mixed(h, a, x, c, d):  # y reads h_{t-1} as well as h_t: the correction carries both terms
        hn = a * h + x
        return hn, c * h + d * hn + 0.5 * x

    a, b, x, c = data(8, np.float64)
    reset = np.random.default_rng(3).random(SHAPE) < 0.03
    for reverse in (False, True):
        want, h_want = scanweaver.selective_scan(a, b, x, c, reverse=reverse, return_state=True)
        m_want, mh_want = mixed(a, x, c, b, reset=reset, reverse=reverse, return_state=True)
        for method in ("chain", "rescan", "correct"):
            y, h = swd.selective_scan(*map(dask_of, (a, b, x, c)), reverse=reverse, return_state=True, method=method)
            m, mh = mixed.dask(*map(dask_of, (a, x, c, b)), reset=dask_of(reset), reverse=reverse, return_state=True,
                               method=method)
            for got, want_ in zip(dask.compute(y, h, m, mh, scheduler="threads"), (want, h_want, m_want, mh_want),
                                  strict=True):
                close(got, want_, np.float64, what=f"{method} reverse={reverse}")


def test_auto_picks_one_pass_unless_two_passes_over_every_block_finish_sooner():
    from scanweaver.dask.graph import choose

    assert choose("auto", rows=1, blocks=8, workers=2, correctable=True) == "chain"   # 2 passes / 2 = 1 pass / 1
    assert choose("auto", rows=1, blocks=8, workers=8, correctable=True) == "rescan"
    assert choose("auto", rows=16, blocks=8, workers=8, correctable=True) == "chain"
    assert choose("auto", rows=1, blocks=1, workers=8, correctable=True) == "chain"


def test_bad_input_is_reported_before_anything_runs(recurrences):
    a = dask_of(data(9)[0])
    with pytest.raises(scanweaver.ScanInputError, match="operands must all have the same shape"):
        swd.selective_scan(a, a, a[:, :, :10])
    with pytest.raises(scanweaver.ScanInputError, match="method must be one of"):
        swd.selective_scan(a, a, a, method="fast")
    with pytest.raises(scanweaver.ScanInputError, match="method='correct' is implemented for recurrences with scalar"):
        swd.apply(recurrences["biquad"], a, a, a, a, method="correct")
    with pytest.raises(scanweaver.ScanInputError, match=r"h0 has shape \(3, 4\)"):
        swd.selective_scan(a, a, a, h0=np.zeros((3, 4)))
    with pytest.raises(scanweaver.ScanInputError, match="has dtype int64"):
        swd.selective_scan(a, a, da.ones(SHAPE, dtype=np.int64))
    with pytest.raises(scanweaver.ScanInputError, match="unknown chunk sizes"):
        swd.selective_scan(a[a[:, 0, 0] > 0.7], a, a)
    with pytest.raises(scanweaver.ScanInputError, match="cu_seqlens must be 1-D integers .*ending at T"):
        swd.selective_scan(a, a, a, cu_seqlens=[0, 5])
    with pytest.raises(scanweaver.ScanInputError, match="log_space=True is not available over Dask"):
        swd.mamba_selective_scan(a, a, np.ones((5, 2)), np.ones((3, 2, SHAPE[-1])), np.ones((5, 2)), log_space=True)


def test_import_loads_no_cluster_library():
    code = ("import sys, scanweaver, scanweaver.dask; "
            "print([m for m in ('dask', 'distributed', 'ray') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_every_block_runs_the_workers_best_backend_with_their_tuned_configuration(client):
    from scanweaver.api import SELECTIVE
    from scanweaver.runtime import get_backend
    from scanweaver.tuning import store

    shape, chunks = (2, 3, 500), (2, 3, (250, 250))  # a block size no other test uses: no cached call plan
    cpu = get_backend("cpu")
    entry = store.Entry(backend="cpu", device=cpu.availability().device, signature=SELECTIVE.signature("float32"),
                        dtype="float32", lanes=6, L=250, schedule="chunked",
                        config={"chunk": 128, "interleave": 1, "threads": 1}, time_ms=1.0)
    path = store.record(entry)  # the store the workers read (they share this process's cache directory)
    try:
        for i, worker in enumerate(sorted(client.scheduler_info()["workers"])):  # every block on this worker
            a, b, x, c = data(10 + i, shape=shape)  # new data, new keys: nothing is served from memory
            y = swd.selective_scan(*(dask_of(v, chunks) for v in (a, b, x, c)), method="rescan")
            close(client.compute(y, workers=[worker]).result(timeout=TIMEOUT), scanweaver.selective_scan(a, b, x, c))
            ran = client.run(lambda: (SELECTIVE.last.backend, SELECTIVE.last.source,
                                      SELECTIVE.last.config.get("chunk")), workers=[worker])
            assert list(ran.values()) == [("cpu", "tuned", 128)], ran
    finally:
        store.remove(backend="cpu", signature=SELECTIVE.signature("float32"), path=path)


@pytest.mark.parametrize("module", ["scanweaver.dask", "scanweaver.dask.scan", "scanweaver.dask.mamba",
                                    "scanweaver.dask.carry", "scanweaver.dask.blocks", "scanweaver.tuning.atomic",
                                    "scanweaver.tuning.exchange", "scanweaver.tuning.store"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), report=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {module} failed (python -m doctest shows them)"


def test_a_single_row_chain_runs_each_block_on_every_core_of_its_host(client):
    """One row of blocks runs one block at a time: its tasks take the host's cores (workers default to one)."""
    from scanweaver.api import SELECTIVE
    from scanweaver.dask.blocks import host_cores

    shape, chunks = (4, 600), (4, (300, 300))  # one row, two blocks; a shape no other test uses
    a, b, x, c = data(21, shape=shape)
    y = swd.selective_scan(*(dask_of(v, chunks) for v in (a, b, x, c)), method="chain")
    close(compute(client, y), scanweaver.selective_scan(a, b, x, c))
    ran = client.run(lambda: (SELECTIVE.last.backend, SELECTIVE.last.config.get("threads")))
    cores = client.run(host_cores)
    assert any(last == ("cpu", cores[w]) for w, last in ran.items()), (ran, cores)
    # blocks above the one-thread cut-off too (their default configuration names no thread count)
    from scanweaver.dask.blocks import RecurrenceBlocks

    big = tuple(np.broadcast_to(np.float32(0.5), (16, 1 << 21)) for _ in range(4))
    auto = {"backend": "auto", "schedule": "auto", "config": "auto"}
    kernel = RecurrenceBlocks(SELECTIVE, dtype="float32", call=auto)
    assert kernel._with_threads(big, 3)["config"]["threads"] == 3
    assert RecurrenceBlocks(SELECTIVE, dtype="float32", call={"backend": "numpy"})._with_threads(big, 3) == {
        "backend": "numpy"}
    assert RecurrenceBlocks(SELECTIVE, dtype="float32", call={"threads": 1})._with_threads(big, 3) == {"threads": 1}
    # several rows run at once: their blocks keep the workers' one thread per task
    from scanweaver.dask.graph import _scan, _scan_all_cores

    def chain_funcs(arr):
        return {t.func for k, t in dict(arr.dask).items() if str(k[0]).startswith("sw-scan-")}

    assert chain_funcs(y) == {_scan_all_cores}
    rows = swd.selective_scan(*(dask_of(v, (2, (300, 300))) for v in (a, b, x, c)), method="chain")
    assert chain_funcs(rows) == {_scan}
    close(compute(client, rows), scanweaver.selective_scan(a, b, x, c))


def test_threaded_scheduler_tasks_share_the_host_cores(monkeypatch):
    """Each task of the threaded scheduler takes the cores its worker thread owns, not every core of the host
    (tasks x cores threads otherwise)."""
    import dask

    from scanweaver.api import SELECTIVE
    from scanweaver.dask.blocks import host_cores
    from scanweaver.runtime import calibrate

    monkeypatch.setattr(calibrate, "one_thread", lambda n: False)  # a default call would take every core
    shape, chunks = (4, 800), (2, (400, 400))  # two rows of two blocks: four tasks at once in each pass
    a, b, x, c = data(22, shape=shape)
    with dask.config.set(scheduler="threads", num_workers=2):
        y = swd.selective_scan(*(dask_of(v, chunks) for v in (a, b, x, c)), method="rescan")
        got = y.compute()
    last = SELECTIVE.last
    close(got, scanweaver.selective_scan(a, b, x, c))
    assert last.backend == "cpu" and last.config.get("threads") == max(1, host_cores() // 2), last
