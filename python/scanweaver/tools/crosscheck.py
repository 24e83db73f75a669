"""Every C kernel of the ``cpu`` backend, built by another compiler for another machine, against the oracle.

``python -m scanweaver.tools.crosscheck --cc "aarch64-linux-gnu-gcc -O3 -static -fopenmp" --run qemu-aarch64``
renders the kernels the ``cpu`` backend runs (:mod:`.crosscheck_jobs`: every scan schedule, dtype,
feature, operand layout, output form, math function and dense state size; the fused backward of
gradients; every fused operation's parts), compiles all of them with a small C driver into one
executable, runs it (under an emulator such as ``qemu-aarch64`` when ``--run`` is given), and compares
every output with the float64 oracle: on the golden vectors of ``test/golden`` and on grid inputs for
the rest.

The driver reads jobs from stdin and writes results to stdout, so one process runs them all:
``int64 njobs``, then per job ``int64 kernel, nargs`` and per argument ``int64 a, mode``: mode 0 NULL,
1 an input of ``a`` bytes (which follow), 2 an output of ``a`` bytes, 3 a C ``long`` of value ``a``; it
answers per job ``int64 status`` and the bytes of each output.  Each kernel unit is compiled on its own
with its entry point renamed (``-D<entry>=sw_k<i>``), so units may share static helper names.  The
driver declares every pointer parameter ``void*`` (the same in the ABIs of x86-64 and AArch64).  Both
sides are little-endian with 8-byte ``long``.

Example:
    >>> from scanweaver.tools.crosscheck import Arg, Job
    >>> job = Job("one", "int f(const double* x, double* y, long n) { y[0] = 2 * x[0]; return 0; }", "f",
    ...           [Arg.input([1.5]), Arg.output(1), Arg.long(1)], {1: [3.0]})
    >>> job.kinds()
    'ppl'
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ir import Stages

#: Seconds the compiler, and the driver with every job, may take.
TIMEOUT_S = 300
#: Most arguments of one kernel (a dense state of 8 has 64 + 8 + 1 + 8 operands, then 6 more).
MAX_ARGS = 128

DRIVER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
@DECLS@
typedef int (*sw_call)(void** p, const long* v);
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
    int64_t hdr[2], slot[@MAX@][2];
    void* p[@MAX@];
    long v[@MAX@];
    rd(hdr, sizeof hdr);
    if (hdr[0] < 0 || hdr[0] >= (int64_t)(sizeof calls / sizeof calls[0]) || hdr[1] > @MAX@) return 4;
    for (int64_t s = 0; s < hdr[1]; ++s) {
      rd(slot[s], 16);
      p[s] = NULL;
      v[s] = (long)slot[s][0];
      if (slot[s][1] == 0 || slot[s][1] == 3) continue;
      p[s] = aligned_alloc(64, (size_t)(slot[s][0] + 64) / 64 * 64);
      if (!p[s]) return 5;
      if (slot[s][1] == 1) rd(p[s], (size_t)slot[s][0]);
      else memset(p[s], 0xff, (size_t)slot[s][0]);  /* NaN: unwritten outputs show */
    }
    const int64_t rc = calls[hdr[0]](p, v);
    wr(&rc, 8);
    for (int64_t s = 0; s < hdr[1]; ++s) {
      if (slot[s][1] == 2) wr(p[s], (size_t)slot[s][0]);
      free(p[s]);
    }
  }
  return fflush(stdout) != 0;
}
"""


@dataclass(frozen=True)
class Arg:
    """One argument of a kernel call: an ``input`` array, an ``output`` buffer, ``NULL`` or a ``long``."""

    mode: int
    data: np.ndarray | None = None
    value: int = 0

    @staticmethod
    def input(values, dtype=None) -> Arg:
        """An array the kernel reads (sent as its bytes)."""
        return Arg(1, np.ascontiguousarray(values, dtype=dtype))

    @staticmethod
    def output(shape, dtype="float64") -> Arg:
        """A buffer of ``shape`` and ``dtype`` the kernel writes (starts as NaN bytes)."""
        return Arg(2, np.empty(shape, dtype))

    @staticmethod
    def null() -> Arg:
        """A NULL pointer."""
        return Arg(0)

    @staticmethod
    def long(value: int) -> Arg:
        """A C ``long``."""
        return Arg(3, value=int(value))

    def slot(self) -> bytes:
        if self.mode == 3:
            return struct.pack("<2q", self.value, 3)
        if self.mode == 0 or self.data is None:
            return struct.pack("<2q", 0, 0)
        head = struct.pack("<2q", self.data.nbytes, self.mode)
        return head + (self.data.tobytes() if self.mode == 1 else b"")


@dataclass
class Job:
    """One kernel call and its expected outputs.

    Attributes:
        name: what it checks.
        source: the kernel's C translation unit.
        entry: the function called in it.
        args: its arguments in ABI order.
        expected: argument index -> the float64 answer for that output.
        rtol: relative tolerance; the absolute one is ``rtol * max(1, max|answer|)`` per output.
        stages: the lowered stages of a scan kernel (``None`` for other kernels).
    """

    name: str
    source: str
    entry: str
    args: list[Arg]
    expected: dict[int, object]
    rtol: float = 1e-10
    stages: Stages | None = field(default=None, repr=False)

    def kinds(self) -> str:
        """``p`` (pointer) or ``l`` (long) per parameter of the entry point, from its C prototype."""
        m = re.search(rf"\bint\s+{re.escape(self.entry)}\s*\(([^)]*)\)", self.source)
        if m is None:
            raise ValueError(f"crosscheck: no prototype of {self.entry} in the kernel of {self.name}")
        return "".join("p" if "*" in p else "l" for p in m.group(1).split(","))


def kernels(js: list[Job]) -> list[tuple[str, str, str]]:
    """The distinct ``(source, entry, kinds)`` of ``js``, in first-use order."""
    return list(dict.fromkeys((j.source, j.entry, j.kinds()) for j in js))


def driver_source(units: list[tuple[str, str, str]]) -> str:
    """The driver calling kernel ``i`` (entry renamed ``sw_k<i>``) by index."""
    decls, calls = [], []
    for i, (_, _, kinds) in enumerate(units):
        params = ", ".join("void*" if k == "p" else "long" for k in kinds)
        args = ", ".join(f"p[{s}]" if k == "p" else f"v[{s}]" for s, k in enumerate(kinds))
        decls.append(f"int sw_k{i}({params});")
        decls.append(f"static int call_{i}(void** p, const long* v) {{ (void)v; return sw_k{i}({args}); }}")
        calls.append(f"call_{i}")
    return (DRIVER.replace("@DECLS@", "\n".join(decls)).replace("@CALLS@", ", ".join(calls))
            .replace("@MAX@", str(MAX_ARGS)))


def build(units: list[tuple[str, str, str]], compiler: list[str], directory: Path, jobs: int = 0) -> Path:
    """Compiles the kernels (``jobs`` compilers at a time; 0: one per core) and links them with the driver.

    Raises:
        RuntimeError: with the compiler's log when it fails.
    """
    (directory / "driver.c").write_text(driver_source(units))
    flags = [*compiler, "-fno-math-errno"]
    cmds = [[*flags, "-c", str(directory / "driver.c"), "-o", str(directory / "driver.o")]]
    for i, (source, entry, _) in enumerate(units):
        (directory / f"k{i}.c").write_text(source)
        cmds.append([*flags, f"-D{entry}=sw_k{i}", "-c", str(directory / f"k{i}.c"), "-o", str(directory / f"k{i}.o")])
    with ThreadPoolExecutor(jobs or min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(_run, cmds))
    exe = directory / "driver"
    _run([*flags, "-o", str(exe), str(directory / "driver.o"),
          *(str(directory / f"k{i}.o") for i in range(len(units))), "-lm"])
    return exe


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"crosscheck: {shlex.join(cmd)} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-4000:]}")


def execute(exe: Path, js: list[Job], runner: list[str] = ()) -> list[dict[int, np.ndarray] | int]:
    """Runs every job in one process of ``exe`` (under ``runner``): its outputs by argument index, or its status."""
    index = {unit: i for i, unit in enumerate(kernels(js))}
    stdin = [struct.pack("<q", len(js))]
    for j in js:
        stdin.append(struct.pack("<2q", index[(j.source, j.entry, j.kinds())], len(j.args)))
        stdin += [a.slot() for a in j.args]
    proc = subprocess.run([*runner, str(exe)], input=b"".join(stdin), capture_output=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"crosscheck: the driver failed (exit {proc.returncode}): {proc.stderr.decode()[-2000:]}")
    out, pos, results = proc.stdout, 0, []
    for j in js:
        (rc,) = struct.unpack_from("<q", out, pos)
        pos += 8
        got = {}
        for i, a in enumerate(j.args):
            if a.mode == 2 and a.data is not None:
                got[i] = np.frombuffer(out, a.data.dtype, count=a.data.size, offset=pos).reshape(a.data.shape)
                pos += a.data.nbytes
        results.append(got if rc == 0 else int(rc))
    return results


def failures(js: list[Job], results) -> list[str]:
    """What is wrong, one line per failing output (empty when every output matches its answer)."""
    bad = []
    for j, res in zip(js, results, strict=True):
        if isinstance(res, int):
            bad.append(f"{j.name}: status {res}")
            continue
        for i, want in j.expected.items():
            want = np.asarray(want, np.float64)
            got = res[i].astype(np.float64).reshape(want.shape)
            atol = j.rtol * max(1.0, float(np.abs(want).max(initial=0.0)))
            if not (np.abs(got - want) <= atol + j.rtol * np.abs(want)).all():
                bad.append(f"{j.name}: output {i} off by up to {float(np.nanmax(np.abs(got - want))):.3g} "
                           f"(atol {atol:.3g}, rtol {j.rtol:g})")
    return bad


def check(compiler: list[str], runner: list[str] = (), js: list[Job] | None = None) -> tuple[int, list[str]]:
    """Builds every kernel with ``compiler``, runs them under ``runner``: ``(jobs run, failures)``."""
    if js is None:
        from .crosscheck_jobs import jobs

        js = jobs()
    with tempfile.TemporaryDirectory(prefix="sw_crosscheck_") as tmp:
        exe = build(kernels(js), compiler, Path(tmp))
        return len(js), failures(js, execute(exe, js, runner))


def main(argv: list[str] | None = None) -> int:
    """Command line: build with ``--cc``, run under ``--run``, report failures."""
    from .crosscheck_jobs import jobs

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
