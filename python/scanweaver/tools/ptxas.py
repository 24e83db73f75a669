"""ptxas resource reports of the CUDA kernels, recorded as JSON.

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

``python -m scanweaver.tools.ptxas --matrix-state [--out FILE]`` does the same
for the fused ``matrix_state`` kernels at the model shapes of
:data:`MATRIX_SHAPES` (their default tunables, every feature that adds work
switched on) and prints the table ``docs/gpu.md`` shows
(:func:`matrix_table`); ``test/data/ptxas_matrix_state_sm90.json`` is that
file, checked by ``test/test_cuda_compile.py`` (no spills, the docs' table
current).

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


def cubin_report(source: str, arch: str = "sm_90", nvcc: str = "nvcc") -> tuple[subprocess.CompletedProcess, dict]:
    """CUDA C ``source`` compiled to a cubin for ``arch`` with ptxas's verbose report (``nvcc -cubin -Xptxas -v``):
    the finished process (its ``stderr`` the compiler's text) and :func:`parse` of it."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(source)
        proc = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(Path(tmp) / "k.cubin"),
                               str(src)], capture_output=True, text=True, timeout=300)
    return proc, parse(proc.stderr)


def compile_report(schedule: str, config: dict, dtype: str, arch: str = "sm_90", nvcc: str = "nvcc") -> dict:
    """ptxas's report for the selective scan's kernels of one configuration (``{kernel: resources}``)."""
    from ..api import SELECTIVE
    from ..targets.gpu import emit_source

    stages = SELECTIVE.lower(backend="numpy", schedule=schedule, dtype=dtype, **config)
    proc, kernels = cubin_report(emit_source(stages, "cuda"), arch, nvcc)
    if proc.returncode and not any("error" in k for k in kernels.values()):
        kernels["*"] = {"error": proc.stderr.strip()[-500:]}
    return kernels


#: Model shapes of the matrix-state kernels' record: (label, K, V, decay, readout, (batch, T, H), dtypes).
MATRIX_SHAPES = (
    ("GLA, K = V = 64", 64, 64, "key", "after", (4, 2048, 16), ("float32",)),
    ("GLA, K = V = 128", 128, 128, "key", "after", (4, 2048, 8), ("float32", "float64")),
    ("GLA 1.3B, K = 256, V = 512", 256, 512, "key", "after", (4, 2048, 4), ("float32", "float64")),
    ("simple GLA / RetNet, K = 256, V = 512", 256, 512, "scalar", "after", (4, 2048, 4), ("float32",)),
    ("Mamba-2, N = 128, P = 64", 128, 64, "scalar", "after", (4, 2048, 32), ("float32",)),
    ("RWKV-6, K = V = 64", 64, 64, "key", "bonus", (4, 2048, 32), ("float32",)),
)


def matrix_configurations() -> list[dict]:
    """Every (model shape, dtype) of :data:`MATRIX_SHAPES` with its features, sizes and default tunables."""
    from ..fused import REGISTRY as FUSED
    from ..fused.matrix_state import MatrixStateFeatures
    from ..targets.fused import kernel_for

    op, kernel = FUSED.get("matrix_state"), kernel_for("cuda", "matrix_state")
    out = []
    for label, K, V, decay, readout, (batch, T, H), dtypes in MATRIX_SHAPES:
        for dtype in dtypes:
            f = MatrixStateFeatures(dtype, K, V, decay, readout, has_h0=True, has_dhlast=True)
            sizes = {"batch": batch, "T": T, "H": H, "Hq": H, "nseq": batch}
            cfg = op.resolve("gpu", {}, kernel.defaults(f, sizes), "ptxas")
            out.append({"label": label, "dtype": dtype, "features": f, "sizes": sizes, "config": cfg})
    return out


def matrix_report(entry: dict, arch: str = "sm_90", nvcc: str = "nvcc") -> dict:
    """ptxas's report of both parts' kernels of one :func:`matrix_configurations` entry, and of the chunked
    forward's and backward's (``algorithm="chunked"``, the default ``chunk``) (``{kernel: resources}``; the
    chunk-state kernels both chunked parts share are the backward's)."""
    from ..fused import REGISTRY as FUSED
    from ..targets import TARGETS
    from ..targets.fused import kernel_for

    op, kernel = FUSED.get("matrix_state"), kernel_for("cuda", "matrix_state")
    kernels: dict[str, dict] = {}
    for name, part, cfg in (("forward", "forward", entry["config"]), ("backward", "backward", entry["config"]),
                            ("chunked", "forward", {**entry["config"], "algorithm": "chunked"}),
                            ("chunked_backward", "backward", {**entry["config"], "algorithm": "chunked"})):
        proc, found = cubin_report(kernel.render(TARGETS.get("cuda")(), op.call(part, entry["features"], cfg)), arch,
                                   nvcc)
        if proc.returncode and not any("error" in k for k in found.values()):
            found[f"*{name}"] = {"error": proc.stderr.strip()[-500:]}
        kernels.update(found)
    return kernels


def matrix_table(doc: dict) -> str:
    """The markdown table of a ``--matrix-state`` record: per model shape and dtype, the default tunables and
    each kernel's registers and shared memory (of the chunked forward: its two kernels with local memory; of the
    chunked backward: its keys and values kernels), and the spill bytes of all of them."""
    names = ("forward", "bwd_keys", "bwd_values", "bwd_decay", "chunk_local", "chunk_output", "chunk_bwd_keys",
             "chunk_bwd_values")
    lines = ["| model shape | dtype | workgroup_size, state_per_item, time_tile | forward | backward: keys | values "
             "| decay | chunked forward: local | output | chunked backward: keys | values | spill bytes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in doc["entries"]:
        cfg, ks = e["config"], e["kernels"]
        cells = []
        for n in names:
            r = ks.get(f"sw_matrix_state_{n}")
            cells.append("-" if r is None else f"{r['registers']} regs, {r['shared'] / 1024:.1f} KiB")
        spills = sum(r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in ks.values())
        lines.append(f"| {e['label']} | {e['dtype']} | {cfg['workgroup_size']}, {cfg['state_per_item']}, "
                     f"{cfg['time_tile']} | {' | '.join(cells)} | {spills} |")
    return "\n".join(lines)


def _matrix_main(out: Path, arch: str, nvcc: str) -> int:
    rows = []
    for e in matrix_configurations():
        rows.append({"label": e["label"], "dtype": e["dtype"], "K": e["features"].K, "V": e["features"].V,
                     "decay": e["features"].decay, "readout": e["features"].readout, "sizes": e["sizes"],
                     "config": e["config"], "kernels": matrix_report(e, arch, nvcc)})
        print(f"[{len(rows)}] {e['label']} {e['dtype']}", file=sys.stderr, flush=True)
    doc = {"arch": arch, "nvcc": nvcc_version(nvcc), "op": "matrix_state", "entries": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(matrix_table(doc))
    print(f"wrote {len(rows)} configurations to {out}", file=sys.stderr)
    return 0


def nvcc_version(nvcc: str = "nvcc") -> str:
    """``release X.Y, VX.Y.Z`` of nvcc's ``--version``."""
    text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"release [^\n]*", text)
    return m.group(0) if m else text.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scanweaver.tools.ptxas", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--matrix-state", action="store_true", help="the matrix-state kernels at the model shapes")
    args = ap.parse_args(argv)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("scanweaver.tools.ptxas: nvcc is not on PATH", file=sys.stderr)
        return 2
    if args.matrix_state:
        return _matrix_main(args.out or Path("test/data/ptxas_matrix_state_sm90.json"), args.arch, nvcc)
    args.out = args.out or Path("test/data/ptxas_sm90.json")
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
