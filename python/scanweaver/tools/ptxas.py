"""ptxas resource reports of every CUDA kernel configuration in the search spaces, recorded as JSON.

``python -m scanweaver.tools.ptxas [--out FILE] [--arch sm_90]`` compiles the
selective scan's CUDA kernels with nvcc for every (schedule, workgroup_size,
items_per_thread, dtype) the ``cuda`` backend's search spaces hold
(``lanes_per_group`` and ``tiles_per_block`` change no declaration, so one
value of each stands for all) and records what ptxas reports per kernel:
registers, static shared memory, stack frame and spills, or the error that
stopped it.  ``test/data/ptxas_sm90.json`` is this file for sm_90; the tests
check :mod:`scanweaver.targets.launch_limits` against it without a GPU, and
re-compile a sample to catch a stale file.  Regenerate it after changing a
kernel.

Example:
    >>> from scanweaver.tools.ptxas import parse
    >>> parse("ptxas info    : Compiling entry function 'sw_hybrid' for 'sm_90'\\n"
    ...       "ptxas info    : Used 40 registers, used 1 barriers, 18944 bytes smem\\n")["sw_hybrid"]["registers"]
    40
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The configurations recorded: every value the tunables declare, at the sizes that admit all of them.
SPACE_LANES, SPACE_L = 4096, 1 << 20
DTYPES = ("float32", "float64")

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_TOO_MUCH = re.compile(r"Entry function '(\w+)' uses too much shared data \((0x[0-9a-f]+) bytes, (0x[0-9a-f]+) max\)")


def parse(report: str) -> dict[str, dict]:
    """Per-kernel resources from ptxas ``-v`` output: registers, shared, stack, spill stores/loads, error."""
    out: dict[str, dict] = {}
    current = None
    for line in report.splitlines():
        if m := _ENTRY.search(line):
            current = out.setdefault(m.group(1), {"registers": 0, "shared": 0, "stack": 0, "spill_stores": 0,
                                                  "spill_loads": 0})
        elif (m := _USED.search(line)) and current is not None:
            smem = _SMEM.search(line)
            current["registers"], current["shared"] = int(m.group(1)), int(smem.group(1)) if smem else 0
        elif (m := _FRAME.search(line)) and current is not None:
            current["stack"], current["spill_stores"], current["spill_loads"] = (int(g) for g in m.groups())
        elif m := _TOO_MUCH.search(line):
            out.setdefault(m.group(1), {})["error"] = f"too much shared data ({int(m.group(2), 16)} bytes, " \
                                                      f"{int(m.group(3), 16)} max)"
    return out


def configurations() -> list[tuple[str, dict, str]]:
    """``(schedule, config, dtype)`` for every kernel-distinct point of the ``cuda`` search spaces."""
    from ..tuning.space import Limits, build_space

    seen, out = set(), []
    for dtype in DTYPES:
        lim = Limits(lanes=SPACE_LANES, L=SPACE_L, dtype=dtype, max_workgroup=None, local_mem=None)
        for schedule in sorted(_cuda_schedules()):
            space = build_space("cuda", schedules=(schedule,), lanes=SPACE_LANES, L=SPACE_L, dtype=dtype, limits=lim)
            for p in space.configs():
                _, cfg = space.split(p)
                key = (schedule, dtype, cfg.get("workgroup_size"), cfg.get("items_per_thread"))
                if key not in seen:
                    seen.add(key)
                    out.append((schedule, cfg, dtype))
    return out


def _cuda_schedules() -> tuple[str, ...]:
    from ..runtime import REGISTRY

    return REGISTRY["cuda"].schedules


def compile_report(schedule: str, config: dict, dtype: str, arch: str = "sm_90", nvcc: str = "nvcc") -> dict:
    """ptxas's report for the selective scan's kernels of one configuration (``{kernel: resources}``)."""
    from ..api import SELECTIVE
    from ..targets.gpu import emit_source

    stages = SELECTIVE.lower(backend="numpy", schedule=schedule, dtype=dtype, **config)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(emit_source(stages, "cuda"))
        proc = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(Path(tmp) / "k.cubin"),
                               str(src)], capture_output=True, text=True, timeout=300)
    kernels = parse(proc.stderr)
    if proc.returncode and not any("error" in k for k in kernels.values()):
        kernels["*"] = {"error": proc.stderr.strip()[-500:]}
    return kernels


def nvcc_version(nvcc: str = "nvcc") -> str:
    """``release X.Y, VX.Y.Z`` of nvcc's ``--version``."""
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release [^\n]*", text)
    return m.group(0) if m else text.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scanweaver.tools.ptxas", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("test/data/ptxas_sm90.json"))
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args(argv)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("scanweaver.tools.ptxas: nvcc is not on PATH", file=sys.stderr)
        return 2
    rows = []
    configs = configurations()
    for n, (schedule, cfg, dtype) in enumerate(configs, 1):
        rows.append({"schedule": schedule, "config": cfg, "dtype": dtype,
                     "kernels": compile_report(schedule, cfg, dtype, args.arch, nvcc)})
        print(f"[{n}/{len(configs)}] {schedule} {cfg} {dtype}", file=sys.stderr, flush=True)
    doc = {"arch": args.arch, "nvcc": nvcc_version(nvcc), "recurrence": "selective_scan", "entries": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(rows)} configurations to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
