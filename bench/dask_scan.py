"""A selective scan over Dask arrays on a two-worker LocalCluster against the single-process ``cpu`` backend.

(lanes, L) = (16, 2^24) float32 (1 GiB per operand) in blocks of (16, 2^21).  The same data (every
block generated from its own seed) is scanned:

1. in one process: ``scanweaver.selective_scan(a, b, x, c)`` on NumPy arrays (the ``cpu`` backend,
   every core), median of ``--repeats`` calls after a warm-up;
2. on a ``LocalCluster`` of ``--workers`` single-threaded worker processes, the inputs generated on
   the workers and persisted there first (not timed), then ``scanweaver.dask.selective_scan(...)
   .persist()`` timed until every block is done (the output stays on the workers), for each method:
   ``auto`` and, to compare, ``chain``, ``rescan`` and ``correct`` (rescan with the carry as ``h0``
   against correct in place, ``y_t += c_t * prod(a) * carry``).

Each Dask result is checked against the single-process one (per-lane sums of every block, float64).
Reports the time, the overhead ratio (Dask / single process; target <= 1.5 on a 2-core machine), the
bytes that moved between workers for the carries (aggregates, tree nodes and carries; target:
proportional to lanes x blocks, not to L) and every byte that moved in all.

Usage::

    python bench/dask_scan.py [--json] [--quick] [--repeats N] [--methods auto,chain,rescan,correct]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
import warnings

import numpy as np

import scanweaver

CARRY_LAYERS = ("sw-aggregate", "sw-combine", "sw-carry", "sw-state")


def block(op: int, k: int, lanes: int, n: int) -> np.ndarray:
    """Block ``k`` of operand ``op`` (a, b, x, c): bounded gates for ``a``, standard normal otherwise."""
    rng = np.random.default_rng([op, k])
    if op == 0:
        return rng.uniform(0.5, 1.0, (lanes, n)).astype(np.float32)
    return rng.standard_normal((lanes, n), dtype=np.float32)


def checksums(y: np.ndarray, n: int) -> np.ndarray:
    """Per-lane float64 sums of every block: ``(lanes, blocks)``."""
    lanes, L = y.shape
    return y.reshape(lanes, L // n, n).sum(axis=-1, dtype=np.float64)


def single_process(lanes: int, L: int, n: int, repeats: int) -> dict:
    ops = [np.concatenate([block(op, k, lanes, n) for k in range(L // n)], axis=1) for op in range(4)]
    scanweaver.selective_scan(*ops)  # warm-up: compile, load
    times, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        y = scanweaver.selective_scan(*ops)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        sums = checksums(y, n)
        del y
        gc.collect()
    info = scanweaver.api.SELECTIVE.last
    return {"time_s": statistics.median(times), "times_s": times, "cpu_s": statistics.median(cpu),
            "backend": info.backend,
            "schedule": info.schedule, "config": info.config, "sums": sums}


def _make(block_info=None, op=0, lanes=1, n=1):
    return block(op, block_info[None]["chunk-location"][1], lanes, n)


def _cpu_seconds() -> float:
    """CPU seconds this process has used (a worker's, when run there)."""
    return time.process_time()


def on_cluster(lanes: int, L: int, n: int, workers: int, repeats: int, methods: list[str], want: np.ndarray) -> dict:
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import scanweaver.dask as swd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                               silence_logs=logging.CRITICAL)
    client = Client(cluster, timeout=120)
    try:
        shape, chunks = (lanes, L), ((lanes,), (n,) * (L // n))
        # block k of every operand is made and kept on worker k % workers, as a loader reading one file per block
        # would place it: neighbouring blocks along L sit on different workers
        names = sorted(client.scheduler_info()["workers"])
        ops = []
        for op in range(4):
            arr = da.map_blocks(_make, dtype=np.float32, chunks=chunks, op=op, lanes=lanes, n=n,
                                meta=np.empty((0, 0), np.float32))
            parts = [client.persist(arr.blocks[:, k], workers=[names[k % len(names)]]) for k in range(L // n)]
            ops.append(da.concatenate(parts, axis=1))
        wait(ops, timeout=600)
        assert ops[0].shape == shape and ops[0].chunks == chunks
        out = {"workers": workers, "threads_per_worker": 1, "blocks": L // n, "methods": {}}
        for method in methods:
            times, moved, carry_bytes, cpu, chosen = [], [], [], [], None
            for rep in range(repeats + 1):  # the first round compiles and loads on every worker
                client.run(lambda dask_worker: dask_worker.transfer_incoming_log.clear())
                y = swd.selective_scan(*ops, method=method)
                chosen = next(str(k[0]).split("-")[-2] for k in y.dask.to_dict() if isinstance(k, tuple)
                              and str(k[0]).startswith(("sw-scan", "sw-aggregate", "sw-local")))
                c0 = sum(client.run(_cpu_seconds).values())
                t0 = time.perf_counter()
                yp = client.persist(y)
                wait(yp, timeout=600)
                elapsed = time.perf_counter() - t0
                used = sum(client.run(_cpu_seconds).values()) - c0
                logs = client.run(lambda dask_worker: list(dask_worker.transfer_incoming_log))
                keys = {k: b for log in logs.values() for e in log for k, b in e["keys"].items()}
                got = yp.map_blocks(lambda b: b.sum(axis=-1, dtype=np.float64)[:, None], dtype=np.float64,
                                    chunks=(lanes, 1)).compute()
                err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
                del yp
                if rep == 0:
                    continue
                times.append(elapsed)
                cpu.append(used)
                moved.append(sum(keys.values()))
                carry_bytes.append(sum(b for k, b in keys.items() if str(k[0]).startswith(CARRY_LAYERS)))
            out["methods"][method] = {"method_run": chosen, "time_s": statistics.median(times), "times_s": times,
                                      "worker_cpu_s": statistics.median(cpu),
                                      "bytes_moved_carries": int(statistics.median(carry_bytes)),
                                      "bytes_moved_total": int(statistics.median(moved)), "checksum_rel_err": err}
        return out
    finally:
        client.close(timeout=30)
        cluster.close(timeout=30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--quick", action="store_true", help="(16, 2^20) in blocks of 2^17: seconds, for a smoke test")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--methods", default="auto,chain,rescan,correct")
    args = ap.parse_args(argv)
    lanes, L, n = (16, 1 << 20, 1 << 17) if args.quick else (16, 1 << 24, 1 << 21)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    single = single_process(lanes, L, n, args.repeats)
    gc.collect()
    dask_run = on_cluster(lanes, L, n, args.workers, args.repeats, methods, single.pop("sums"))
    itemsize = 4
    report = {"shape": [lanes, L], "block": [lanes, n], "dtype": "float32", "single_process": single,
              "dask": dask_run, "carry_pair_bytes_per_lane_block": 2 * itemsize}
    for r in dask_run["methods"].values():
        r["overhead_ratio"] = r["time_s"] / single["time_s"]
        r["cpu_ratio"] = r["worker_cpu_s"] / single["cpu_s"]
        r["carry_bytes_per_lane_block"] = r["bytes_moved_carries"] / (lanes * dask_run["blocks"])
    auto = dask_run["methods"].get("auto")
    report["targets"] = {"overhead_at_most_1_5x": auto is not None and auto["overhead_ratio"] <= 1.5,
                         "carry_bytes_independent_of_L": all(r["bytes_moved_carries"] < lanes * dask_run["blocks"] * 64
                                                             for r in dask_run["methods"].values())}
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0
    print(f"selective scan, (lanes, L) = ({lanes}, {L}) float32 in blocks of ({lanes}, {n}); "
          f"{args.workers} worker processes x 1 thread")
    print(f"single process ({single['backend']}/{single['schedule']}): {single['time_s'] * 1e3:.0f} ms, "
          f"{single['cpu_s'] * 1e3:.0f} ms CPU")
    print(f"{'method':>8} {'ran':>8} {'time ms':>9} {'ratio':>6} {'CPU ratio':>9} {'carry bytes':>12} "
          f"{'all bytes':>12} {'err':>9}")
    for m, r in dask_run["methods"].items():
        print(f"{m:>8} {r['method_run']:>8} {r['time_s'] * 1e3:9.0f} {r['overhead_ratio']:6.2f} {r['cpu_ratio']:9.2f} "
              f"{r['bytes_moved_carries']:12d} {r['bytes_moved_total']:12d} {r['checksum_rel_err']:9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
