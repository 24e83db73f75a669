"""``scanweaver tune``: tune the selective scan on a backend with Kernel Tuner and store the best configuration.

``--op NAME`` tunes a fused operation's forward kernel instead: ``mamba1`` (shape B,D,N,L), ``matrix_state``
(shape B,T,H,K,V: GLA's features, a log decay per key) or ``delta_rule`` (shape B,T,H,K,V: Gated DeltaNet's
features, a log decay per head, q and k L2-normalised in the kernel); on ``cpu`` the search of the last two
covers ``algorithm`` (recurrent, chunked), ``chunk``, ``block_v``, ``width``, ``threads``.  The stored entry
is used by later calls of the same features on that device and size bucket, forward and backward (the backward
keeps the rule's algorithm: the tune measured the forward), over the algorithm rule and ``chunk_size`` (their
``last.source == "tuned"``); a call's own tunables still win.

``--show`` lists what every store this process reads holds instead (the shared stores of
``$SCANWEAVER_TUNED``, then the per-user one); ``--export FILE`` writes them to one file and
``--import FILE`` merges such a file into the store tunes write to.  Examples::

    scanweaver tune --backend cpu --shape 8,512,4096
    scanweaver tune --backend opencl --shape 4,1024 --strategy random_sample --max-fevals 20 --json
    scanweaver tune --op mamba1 --backend cpu --shape 2,768,16,2048    # the fused Mamba-1 kernel
    scanweaver tune --op matrix_state --shape 1,2048,8,64,64 --values algorithm=recurrent,chunked
    scanweaver tune --op delta_rule --shape 1,4096,16,128,128 --values algorithm=recurrent,chunked
    scanweaver tune --backend julia --device cpu --shape 8,4096 --strategy random_sample --max-fevals 4
    scanweaver tune --backend cuda --parallel 8 --ray-address auto   # one shard per GPU of a Ray cluster
    scanweaver tune --show
    scanweaver tune --export tuned-gpu-nodes.json
    SCANWEAVER_TUNED=/shared/scanweaver/ scanweaver tune --import tuned-gpu-nodes.json
"""

from __future__ import annotations

import argparse
import json
import time

from ..errors import ScanInputError
from . import command, parse_shape


def _value(text: str) -> int | str:
    """One candidate value: an int where it reads as one, else the word (``chunked``)."""
    try:
        return int(text)
    except ValueError:
        return text


def _values(text: str) -> tuple[str, tuple[int | str, ...]]:
    """``name=v1,v2`` -> (name, (v1, v2)): ints, or words such as ``algorithm=recurrent,chunked``."""
    name, _, vals = text.partition("=")
    parsed = tuple(_value(v.strip()) for v in vals.split(",") if v.strip())
    if not name.strip() or not parsed:
        raise argparse.ArgumentTypeError(f"--values must look like chunk=512,1024 or algorithm=recurrent,chunked, "
                                         f"got {text!r}")
    return name.strip(), parsed


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def show(as_json: bool) -> int:
    """Prints every tuned configuration of every source, with who measured it, where and when."""
    from ..tuning import store

    sources = store.load_sources()
    shared = set(store.shared_paths())
    if as_json:
        print(json.dumps({"store_path": str(store.store_path()),
                          "sources": [{"path": str(p), "shared": p in shared, "exists": p.exists(),
                                       "entries": [e.to_json() for e in es]} for p, es in sources],
                          "entries": [{**e.to_json(), "source": str(p)} for p, es in sources for e in es]},
                         indent=1))
        return 0
    for path, entries in sources:
        kind = f"shared, ${store.SHARED_ENV}" if path in shared else "per-user"
        mark = ", tunes write here" if path == store.store_path() else ""
        print(f"tuned configurations in {path} ({kind}{mark}): {len(entries)}")
        for e in sorted(entries, key=lambda e: (e.backend, e.device, e.signature, e.dtype, e.lanes, e.L)):
            cfg = ", ".join(f"{k}={v}" for k, v in sorted(e.config.items()))
            speed = f", {e.default_ms / e.time_ms:.2f}x vs default" if e.default_ms and e.time_ms else ""
            who = f"{e.user}@{e.host}, " if e.host else ""
            ver = e.versions.get("scanweaver")
            print(f"  {e.backend:<7} {e.device}  {e.signature} {e.dtype} lanes={e.lanes} L={e.L}: "
                  f"{e.schedule}({cfg}) {e.time_ms:.4g} ms{speed} [{e.strategy}, {who}{_when(e.created)}"
                  f"{f', scanweaver {ver}' if ver else ''}]")
    return 0


def export(path: str, as_json: bool) -> int:
    """``--export``: every visible entry into one file."""
    from ..tuning import exchange

    n = exchange.export(path)
    print(json.dumps({"exported": n, "path": path}) if as_json else f"exported {n} tuned configurations to {path}")
    return 0


def import_(path: str, as_json: bool) -> int:
    """``--import``: merge a file into the store tunes write to."""
    from ..tuning import exchange, store

    counts = exchange.import_file(path)
    dest = str(store.store_path())
    if as_json:
        print(json.dumps({**counts, "path": path, "store_path": dest}))
    else:
        print(f"imported {path} into {dest}: {counts['added']} added, {counts['replaced']} replaced, "
              f"{counts['kept']} kept (the stored measurement was newer)")
    return 0


@command("tune", help="auto-tune the selective scan, or a fused kernel (--op), with Kernel Tuner and store the best "
                         "configuration")
class Tune:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--backend", default="cpu", help="cpu, opencl, cuda, julia or iree (default: cpu)")
        p.add_argument("--device", help="the julia backend's KernelAbstractions device: cpu, cuda, amdgpu, oneapi "
                                        "or metal (default: $SCANWEAVER_JULIA_DEVICE, else cuda)")
        p.add_argument("--shape", type=parse_shape, default=(8, 512, 4096),
                       help="operand shape B,D,L (any leading sizes; last is L), default 8,512,4096; with --op "
                            "the operation's shape (mamba1: B,D,N,L; matrix_state, delta_rule: B,T,H,K,V)")
        p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
        p.add_argument("--schedule", action="append", help="tune only this schedule family (repeatable)")
        p.add_argument("--recurrence", default="selective_scan", choices=("selective_scan", "selective_scan_h"),
                       help="selective_scan (with c) or selective_scan_h (y = h)")
        p.add_argument("--op", help="tune a fused operation's forward kernel instead (mamba1: shape B,D,N,L; "
                                    "matrix_state (GLA) and delta_rule (Gated DeltaNet): shape B,T,H,K,V, their "
                                    "algorithm and chunk among the tunables); later calls of its features and "
                                    "size use the stored entry")
        p.add_argument("--strategy", default="brute_force",
                       help="Kernel Tuner strategy: brute_force, random_sample, bayes_opt, genetic_algorithm, ...")
        p.add_argument("--max-fevals", type=int,
                       help="the most configurations to measure, the default's included, with any strategy "
                            "(brute_force then measures a random sample of that many)")
        p.add_argument("--time-limit", type=float, help="seconds for the whole tune")
        p.add_argument("--values", type=_values, action="append", metavar="NAME=V1,V2",
                       help="candidate values of one tunable instead of the declared ones (repeatable), e.g. "
                            "chunk=32,64 or algorithm=recurrent,chunked")
        p.add_argument("--confirm", type=int, default=0, metavar="N",
                       help="re-measure best and default alternately N times after the search; the table's "
                            "best/default speedup and what is stored then follow those medians")
        p.add_argument("--parallel", type=int, metavar="N",
                       help="spread the search space over N Ray workers, one device each (scanweaver[cluster])")
        p.add_argument("--ray-address", metavar="ADDR",
                       help="the Ray cluster (default: $RAY_ADDRESS, else a new local Ray instance)")
        p.add_argument("--fresh", action="store_true",
                       help="re-measure instead of reusing Kernel Tuner's cache (a reuse is reported in the notes)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar (--json implies it)")
        p.add_argument("--no-store", action="store_true", help="do not record the result in the store")
        p.add_argument("--out", help="directory for tune.json, tune.txt and tune.png")
        p.add_argument("--json", action="store_true", help="print the summary as JSON")
        act = p.add_mutually_exclusive_group()
        act.add_argument("--show", action="store_true",
                         help="list the tuned configurations of every store this process reads and exit")
        act.add_argument("--export", metavar="FILE",
                         help="write every visible tuned configuration to FILE (versioned JSON) and exit")
        act.add_argument("--import", dest="import_file", metavar="FILE",
                         help="merge FILE into the store tunes write to ($SCANWEAVER_TUNED or per-user) and exit")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        if args.show:
            return show(args.json)
        if args.export:
            return export(args.export, args.json)
        if args.import_file:
            return import_(args.import_file, args.json)
        from ..tuning import tune

        common = dict(backend=args.backend, shape=args.shape, dtype=args.dtype, strategy=args.strategy,
                      max_fevals=args.max_fevals, time_limit=args.time_limit, values=dict(args.values or []),
                      fresh=args.fresh, record=not args.no_store, progress=not (args.json or args.no_progress),
                      out=args.out,
                      device=args.device)
        if args.op:
            from ..tuning.fused import tune_fused

            if args.parallel:
                raise ScanInputError("--parallel tunes recurrences; a fused operation (--op) is tuned on one device")
            report = tune_fused(args.op, **common)
        else:
            schedule = tuple(args.schedule) if args.schedule else None
            report = tune(args.recurrence, schedule=schedule, confirm=args.confirm, parallel=args.parallel,
                          ray_address=args.ray_address, **common)
        print(json.dumps(report.to_json(), indent=1) if args.json else report.table())
        return 0 if report.best is not None else 1
