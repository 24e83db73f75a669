"""Every C kernel of the ``cpu`` backend, built by another compiler for another machine, against the oracle.

``python -m scanweaver.tools.crosscheck --cc "aarch64-linux-gnu-gcc -O3 -static -fopenmp" --run qemu-aarch64``
renders the kernels the ``cpu`` backend runs (every schedule, dtype, feature, output form, math function
and dense state size; see :func:`jobs`), compiles all of them with a small C driver into one executable,
runs it (under an emulator such as ``qemu-aarch64`` when ``--run`` is given), and compares every result
with the float64 oracle: on the golden vectors of ``test/golden`` and on grid inputs for the rest.

The driver reads jobs from stdin and writes results to stdout, so one process runs them all:
``int64 njobs``, then per job ``int64 kernel, lanes, L, nslots`` and per slot (the kernel's ABI order:
operands, ``y``, ``h0``, ``hlast``, ``reset``) ``int64 nbytes, mode`` (mode 0: NULL, 1: input whose
bytes follow, 2: output); it answers per job ``int64 status`` and the bytes of each output slot.
Both sides are little-endian with 8-byte ``long`` (x86-64, AArch64).

Example:
    >>> from scanweaver.tools.crosscheck import jobs
    >>> js = jobs()
    >>> len({j.source for j in js}) > 50, {j.stages.schedule.schedule for j in js} == {"chunked", "sequential"}
    (True, True)
"""

from __future__ import annotations

import argparse
import os
import shlex
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..arrays import compute_dtype
from ..ir import Stages
from ..ir.stages import Features
from ..targets.c_target import MAX_DENSE_STATE
from ..targets.reference import oracle
from . import golden

#: Relative tolerance by compute dtype (of max(1, max|y|) for the absolute part).
RTOL = {"float32": 2e-4, "float64": 1e-10}
#: Seconds the compiler, and the driver with every job, may take.
TIMEOUT_S = 300

DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
@DECLS@
typedef int (*sw_call)(void** p, long nl, long len);
static const sw_call calls[] = {@CALLS@};

static void rd(void* p, size_t n) {
  if (n && fread(p, 1, n, stdin) != n) { fprintf(stderr, "driver: short read\n"); exit(2); }
}
static void wr(const void* p, size_t n) {
  if (n && fwrite(p, 1, n, stdout) != n) { fprintf(stderr, "driver: short write\n"); exit(3); }
}

int main(void) {
  int64_t njobs;
  rd(&njobs, 8);
  for (int64_t j = 0; j < njobs; ++j) {
    int64_t hdr[4], slot[128][2];
    void* p[128];
    rd(hdr, sizeof hdr);
    if (hdr[0] < 0 || hdr[0] >= (int64_t)(sizeof calls / sizeof calls[0]) || hdr[3] > 128) return 4;
    for (int64_t s = 0; s < hdr[3]; ++s) {
      rd(slot[s], 16);
      p[s] = NULL;
      if (slot[s][1] == 0) continue;
      p[s] = aligned_alloc(64, (size_t)(slot[s][0] + 64) / 64 * 64);
      if (!p[s]) return 5;
      if (slot[s][1] == 1) rd(p[s], (size_t)slot[s][0]);
      else memset(p[s], 0xff, (size_t)slot[s][0]);  /* NaN: unwritten outputs show */
    }
    const int64_t rc = calls[hdr[0]](p, (long)hdr[1], (long)hdr[2]);
    wr(&rc, 8);
    for (int64_t s = 0; s < hdr[3]; ++s) {
      if (slot[s][1] == 2) wr(p[s], (size_t)slot[s][0]);
      free(p[s]);
    }
  }
  return fflush(stdout) != 0;
}
"""


@dataclass
class Job:
    """One kernel call and its expected answer.

    Attributes:
        name: what it checks (the case, schedule and config).
        stages: the lowered stages; ``stages.kernel`` is the C source.
        inputs: operand name -> ``(lanes, L)`` array in the compute dtype.
        y, h_last: the float64 oracle's answer, ``(lanes, L)`` and ``(lanes,)`` or ``(lanes, k)``.
    """

    name: str
    stages: Stages
    inputs: dict[str, np.ndarray]
    h0: np.ndarray | None
    reset: np.ndarray | None
    y: np.ndarray
    h_last: np.ndarray
    rtol: float = 0.0
    atol: float = field(default=0.0)

    @property
    def source(self) -> str:
        """The kernel's C source."""
        assert self.stages.kernel is not None
        return self.stages.kernel


def _recurrences() -> dict:
    """Diagonal recurrences beyond the selective scan: every math function, and every output term."""
    from .. import api, sigmoid, silu, softplus

    def functions(h, p, q, x):
        s = np.abs(q) + 0.5
        a = 0.45 * sigmoid(p) + 0.2 * np.exp(-s) + 0.1 * np.tanh(s) + 0.05 * np.cos(p) * np.sin(q)
        u = (np.log(s) + np.log1p(s) + np.expm1(-s) + np.sqrt(s) + softplus(q) + silu(p) + s ** p
             + np.maximum(p, q) - np.minimum(p, q) + 0.25 * np.sign(p))
        return a * h + u * x

    def outputs(h, a, b, x, c, d):
        hn = a * h + b * x
        return hn, c * hn + d * h + 0.5 * x

    def biquad(h, b0, b1, b2, a1, a2, x):
        y = b0 * x + h[0]
        return (b1 * x - a1 * y + h[1], b2 * x - a2 * y), y

    def gated(h, p, x):
        g = sigmoid(p)
        return (g * h[0] + 0.1 * h[2] + x, 0.5 * h[0] + np.exp(-np.abs(p)) * h[1], 0.3 * h[1] - 0.2 * h[2]), h[1]

    return {"selective": api.SELECTIVE, "selective_h": api.SELECTIVE_NO_C,
            "functions": api.Recurrence(functions), "outputs": api.Recurrence(outputs),
            "biquad": api.Recurrence(biquad, state_size=2), "gated": api.Recurrence(gated, state_size=3)}


def _lower(rec, schedule: str, dtype: str, features: Features, config: dict) -> Stages:
    return rec.lower(backend="cpu", schedule=schedule, dtype=dtype, features=features, **config)


def _job(name, rec, schedule, config, features, dtype, inputs, h0, reset, want=None, tol=None) -> Job:
    stages = _lower(rec, schedule, dtype, features, config)
    if want is None:
        ir = rec.lower(backend="numpy", schedule="sequential", dtype="float64", features=features).affine
        want = oracle(ir, inputs, h0, reset)
    y, h_last = want
    rtol, atol = tol or (RTOL[dtype], None)
    atol = rtol * max(1.0, float(np.abs(y).max(initial=0.0))) if atol is None else atol
    cast = lambda v: None if v is None else np.ascontiguousarray(v, dtype=dtype)  # noqa: E731
    return Job(name, stages, {n: cast(v) for n, v in inputs.items()}, cast(h0),
               None if reset is None else np.ascontiguousarray(reset, np.uint8), y, h_last, rtol, atol)


#: Configurations of each schedule: (label, tunables).  Tiles of 13 end inside vector blocks;
#: two threads on 3 lanes take the chunked schedule's split layout (one lane's tiles over threads).
CONFIGS = {
    "sequential": (("", {"threads": 1}), ("t2", {"threads": 2})),
    "chunked": (("c13", {"chunk": 13, "threads": 2, "interleave": 1}),
                ("c64i2", {"chunk": 64, "threads": 1, "interleave": 2}),
                ("c8192i4", {"chunk": 8192, "threads": 2, "interleave": 4})),
}


def _golden_jobs() -> list[Job]:
    out = []
    for case in golden.CASES:
        g = golden.load(golden.DEFAULT_DIR / f"{case.name}.toml")
        B, D, L = g["shape"]
        k, lanes = g["state_size"], B * D
        dtype = compute_dtype([np.dtype(g["dtype"])]).name
        if k > 1:
            rec, operands = golden.dense_recurrence(k), golden.dense_operands(g)
        else:
            rec = _recurrences()["selective" if "c" in g else "selective_h"]
            operands = {n: g[n] for n in rec.inputs}
        inputs = {n: v.reshape(lanes, L) for n, v in operands.items()}
        h0 = g["h0"].reshape((lanes,) if k == 1 else (lanes, k)) if "h0" in g else None
        reset = g["reset"].reshape(lanes, L) if "reset" in g else None
        features = Features(reverse=g["reverse"], has_h0=h0 is not None, has_reset=reset is not None,
                            return_state=True)
        want = (g["y"].reshape(lanes, L), g["h_last"].reshape((lanes,) if k == 1 else (lanes, k)))
        rtol = g.get("rtol", RTOL[dtype])
        tol = (rtol, g.get("atol", rtol * max(1.0, float(np.abs(g["y"]).max()))))
        for schedule, configs in CONFIGS.items():
            for label, config in configs[:2]:
                out.append(_job(f"golden {case.name} {schedule} {label}", rec, schedule, config, features,
                                dtype, inputs, h0, reset, want, tol))
    return out


def _generated_jobs() -> list[Job]:
    """Kernels the golden files do not reach: math functions, output terms, dense states up to the maximum."""
    out = []
    rng = np.random.default_rng([golden.SEED, 99])
    recs = _recurrences()
    lanes, L = 3, 77
    every = Features(reverse=True, has_h0=True, has_reset=True)
    variants = [(r, f) for r in ("functions", "outputs") for f in (Features(), every)]
    variants += [("functions", Features(reverse=True, operands=(("p", "scalar"),))),
                 ("outputs", Features(has_h0=True, operands=(("a", "lane"), ("d", "scalar"))))]
    for i, (rec_name, feats) in enumerate(variants):
        rec = recs[rec_name]
        dtype = ("float32", "float64")[i % 2]
        inputs = {n: golden.grid(rng, -1.0, 1.0, (lanes, L)) for n in rec.inputs}
        if "a" in inputs:
            inputs["a"] = golden.grid(rng, 0.5, 0.99, (lanes, L))
        inputs = _laid_out(inputs, feats)
        h0 = golden.grid(rng, -2.0, 2.0, lanes) if feats.has_h0 else None
        reset = (rng.integers(0, 8, (lanes, L)) == 0) if feats.has_reset else None
        for schedule, configs in CONFIGS.items():
            for label, config in configs:
                out.append(_job(f"{rec_name} {dtype} {feats} {schedule} {label}", rec, schedule, config, feats,
                                dtype, inputs, h0, reset))
    for k in range(2, MAX_DENSE_STATE + 1):
        dtype = ("float32", "float64")[k % 2]
        case = golden.Case(f"dense{k}", (1, lanes, 45), dtype=dtype, with_h0=k % 2 == 0, reverse=k % 3 == 0,
                           reset="random" if k % 2 else "", state_size=k)
        g = golden.make_inputs(case, rng)
        rec, operands = golden.dense_recurrence(k), golden.dense_operands(g)
        inputs = {n: v.reshape(lanes, -1).astype(np.float64) for n, v in operands.items()}
        h0 = g["h0"].reshape(lanes, k).astype(np.float64) if "h0" in g else None
        reset = g["reset"].reshape(lanes, -1) if "reset" in g else None
        feats = Features(reverse=case.reverse, has_h0=h0 is not None, has_reset=reset is not None)
        for schedule, configs in CONFIGS.items():
            label, config = configs[-1]
            out.append(_job(f"dense{k} {dtype} {schedule} {label}", rec, schedule, config, feats, dtype, inputs,
                            h0, reset))
        if k <= 3:  # a filter: the matrix entries one value for all (scalars), the input gain one per lane
            feats = Features(reverse=case.reverse, has_h0=h0 is not None, has_reset=reset is not None,
                             operands=(*((n, "scalar") for n in rec.inputs if n.startswith("a")), ("b0", "lane")))
            laid = _laid_out(inputs, feats)
            for schedule, configs in CONFIGS.items():
                label, config = configs[0]
                out.append(_job(f"dense{k} filter {dtype} {schedule} {label}", rec, schedule, config, feats, dtype,
                                laid, h0, reset))
    out += _long_dense_jobs(rng, recs)
    return out


def _long_dense_jobs(rng: np.random.Generator, recs: dict) -> list[Job]:
    """Dense lanes long enough for many tiles of stripes: a filter (coefficients per lane, A the same at
    every step) on one lane, its tiles over two threads; a gated 3-state recurrence (functions: the
    element-by-element path) with resets on three lanes."""
    out = []
    cases = (("biquad", 1, 2000, Features(reverse=True, has_h0=True, operands=tuple(
        (n, "lane") for n in ("a1", "a2", "b0", "b1", "b2"))), "float64"),
             ("gated", 3, 700, Features(has_reset=True), "float32"))
    for name, lanes, L, feats, dtype in cases:
        rec = recs[name]
        inputs = {n: golden.grid(rng, -1.0, 1.0, (lanes, L)) for n in rec.inputs}
        if name == "biquad":
            inputs["a1"], inputs["a2"] = golden.grid(rng, -0.9, 0.9, (lanes, L)), golden.grid(rng, 0.1, 0.5, (lanes, L))
        inputs = _laid_out(inputs, feats)
        h0 = golden.grid(rng, -2.0, 2.0, (lanes, rec.state_size)) if feats.has_h0 else None
        reset = (rng.integers(0, 50, (lanes, L)) == 0) if feats.has_reset else None
        config = {"chunk": 13, "threads": 2, "interleave": 1}
        out.append(_job(f"{name} long {dtype} chunked", rec, "chunked", config, feats, dtype, inputs, h0, reset))
    return out


def _laid_out(inputs: dict[str, np.ndarray], feats: Features) -> dict[str, np.ndarray]:
    """``inputs`` with the operands of ``feats.operands`` made constant: one value, or one per lane."""
    out = dict(inputs)
    for name, layout in feats.operands:
        v = inputs[name]
        out[name] = np.broadcast_to(v[:1, :1] if layout == "scalar" else v[:, :1], v.shape).copy()
    return out


def jobs() -> list[Job]:
    """Every check: the golden vectors on each schedule, then the generated cases."""
    return _golden_jobs() + _generated_jobs()


def kernels(js: list[Job]) -> list[str]:
    """The distinct kernel sources of ``js``, in first-use order."""
    return list(dict.fromkeys(j.source for j in js))


def driver_source(sources: list[str]) -> tuple[list[str], str]:
    """Renamed kernel units (``sw_scan`` becomes ``sw_scan_<i>``) and the driver that calls them by index."""
    units, decls, calls = [], [], []
    for i, src in enumerate(sources):
        assert src.count("int sw_scan(") == 1
        units.append(src.replace("int sw_scan(", f"int sw_scan_{i}("))
        header = src[src.index("int sw_scan("):].split(")", 1)[0][len("int sw_scan("):]
        nptr = header.count("*")
        decls.append(f"int sw_scan_{i}({header});")
        args = ", ".join(f"p[{s}]" for s in range(nptr))
        decls.append(f"static int call_{i}(void** p, long nl, long len) {{ return sw_scan_{i}({args}, nl, len); }}")
        calls.append(f"call_{i}")
    drv = DRIVER.replace("@DECLS@", "\n".join(decls)).replace("@CALLS@", ", ".join(calls))
    return units, drv


def build(sources: list[str], compiler: list[str], directory: Path, jobs: int = 0) -> Path:
    """Compiles the kernels (``jobs`` compilers at a time; 0: one per core) and links them with the driver.

    Raises:
        RuntimeError: with the compiler's log when it fails.
    """
    units, drv = driver_source(sources)
    files = [directory / "driver.c"]
    files[0].write_text(drv)
    for i, unit in enumerate(units):
        files.append(directory / f"k{i}.c")
        files[-1].write_text(unit)
    flags = [*compiler, "-fno-math-errno"]
    with ThreadPoolExecutor(jobs or min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda f: _run([*flags, "-c", str(f), "-o", str(f.with_suffix(".o"))]), files))
    exe = directory / "driver"
    _run([*flags, "-o", str(exe), *(str(f.with_suffix(".o")) for f in files), "-lm"])
    return exe


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"crosscheck: {shlex.join(cmd)} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-4000:]}")


def _slots(job: Job, lanes: int, L: int) -> list[tuple[int, int, bytes]]:
    """(nbytes, mode, data) per ABI slot of ``job``."""
    item = np.dtype(job.stages.affine.dtype).itemsize
    k = job.stages.affine.state_size
    state = lanes * k * item
    feats = job.stages.affine.features
    small = {"scalar": lambda v: v[:1, 0], "lane": lambda v: v[:, 0], "full": lambda v: v}
    ops = [np.ascontiguousarray(small[feats.layout(n)](job.inputs[n])) for n in job.stages.affine.inputs]
    slots = [(v.nbytes, 1, v.tobytes()) for v in ops]
    slots.append((lanes * L * item, 2, b""))
    slots.append((state, 1, job.h0.tobytes()) if job.h0 is not None else (0, 0, b""))
    slots.append((state, 2, b""))
    slots.append((lanes * L, 1, job.reset.tobytes()) if job.reset is not None else (0, 0, b""))
    return slots


def execute(exe: Path, js: list[Job], runner: list[str] = ()) -> list[tuple[np.ndarray, np.ndarray] | int]:
    """Runs every job in one process of ``exe`` (under ``runner``); ``(y, h_last)`` per job, or its status."""
    index = {src: i for i, src in enumerate(kernels(js))}
    stdin = [struct.pack("<q", len(js))]
    for j in js:
        lanes, L = j.y.shape
        slots = _slots(j, lanes, L)
        stdin.append(struct.pack("<4q", index[j.source], lanes, L, len(slots)))
        for nbytes, mode, data in slots:
            stdin.append(struct.pack("<2q", nbytes, mode) + data)
    proc = subprocess.run([*runner, str(exe)], input=b"".join(stdin), capture_output=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"crosscheck: the driver failed (exit {proc.returncode}): {proc.stderr.decode()[-2000:]}")
    out, pos, results = proc.stdout, 0, []
    for j in js:
        dt = np.dtype(j.stages.affine.dtype)
        (rc,) = struct.unpack_from("<q", out, pos)
        pos += 8
        y = np.frombuffer(out, dt, count=j.y.size, offset=pos).reshape(j.y.shape)
        pos += y.nbytes
        h = np.frombuffer(out, dt, count=j.h_last.size, offset=pos).reshape(j.h_last.shape)
        pos += h.nbytes
        results.append((y, h) if rc == 0 else int(rc))
    return results


def failures(js: list[Job], results) -> list[str]:
    """What is wrong, one line per failing job (empty when every result matches the oracle)."""
    bad = []
    for j, res in zip(js, results, strict=True):
        if isinstance(res, int):
            bad.append(f"{j.name}: status {res}")
            continue
        for what, got, want in (("y", res[0], j.y), ("h_last", res[1], j.h_last)):
            err = np.abs(got.astype(np.float64) - want) - (j.atol + j.rtol * np.abs(want))
            if not (err <= 0).all():
                bad.append(f"{j.name}: {what} off by up to {float(np.nanmax(np.abs(got - want))):.3g} "
                           f"(atol {j.atol:.3g}, rtol {j.rtol:g})")
    return bad


def check(compiler: list[str], runner: list[str] = (), js: list[Job] | None = None) -> tuple[int, list[str]]:
    """Builds every kernel with ``compiler``, runs them under ``runner``: ``(jobs run, failures)``."""
    js = jobs() if js is None else js
    with tempfile.TemporaryDirectory(prefix="sw_crosscheck_") as tmp:
        exe = build(kernels(js), compiler, Path(tmp))
        return len(js), failures(js, execute(exe, js, runner))


def main(argv: list[str] | None = None) -> int:
    """Command line: build with ``--cc``, run under ``--run``, report failures."""
    parser = argparse.ArgumentParser(prog="python -m scanweaver.tools.crosscheck", description=__doc__.splitlines()[0])
    parser.add_argument("--cc", required=True, help="compiler command and flags, e.g. 'aarch64-linux-gnu-gcc -O3 "
                        "-static -fopenmp'")
    parser.add_argument("--run", default="", help="runner for the executable, e.g. 'qemu-aarch64'")
    args = parser.parse_args(argv)
    js = jobs()
    n, bad = check(shlex.split(args.cc), shlex.split(args.run), js)
    for line in bad:
        print(line, file=sys.stderr)
    where = f"{args.cc} under {args.run}" if args.run else args.cc
    print(f"{n} jobs, {len(kernels(js))} kernels, {len(bad)} failures ({where})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
