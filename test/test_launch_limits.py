"""Every CUDA configuration of the search spaces either launches or is excluded with its reason.

Without a GPU, the exclusion logic (:mod:`scanweaver.targets.launch_limits`) is
checked against ptxas's reports recorded with nvcc for sm_90 in
``test/data/ptxas_sm90.json`` (``python -m scanweaver.tools.ptxas`` writes it):
its shared-memory formula must equal ptxas's figure for every kernel, a
configuration ptxas rejects must be excluded, and every other one must fit
its registers in the block it launches with.  Where nvcc is present and
matches the recorded version, a sample is recompiled to catch a stale file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scanweaver.targets.launch_limits import (SM90, KernelResources, block_size, max_threads, shared_bytes,
                                              why_not_launchable)
from scanweaver.tools.ptxas import compile_report, configurations, nvcc_version
from scanweaver.tuning.space import Limits, build_space

DATA = Path(__file__).parent / "data" / "ptxas_sm90.json"
RECORD = json.loads(DATA.read_text())
ENTRIES = RECORD["entries"]


def _key(schedule, config, dtype):
    return schedule, dtype, config.get("workgroup_size"), config.get("items_per_thread")


def _id(e):
    return "-".join(str(v) for v in _key(e["schedule"], e["config"], e["dtype"]))


def test_the_record_covers_every_cuda_configuration():
    recorded = {_key(e["schedule"], e["config"], e["dtype"]) for e in ENTRIES}
    assert recorded == {_key(*c) for c in configurations()}, \
        "the search spaces changed: regenerate with python -m scanweaver.tools.ptxas"


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_exclusion_agrees_with_ptxas(entry):
    schedule, cfg, dtype = entry["schedule"], entry["config"], entry["dtype"]
    why = why_not_launchable(schedule, cfg, dtype)
    kernels = entry["kernels"]
    errors = [k["error"] for k in kernels.values() if "error" in k]
    if errors:
        assert all("too much shared data" in e for e in errors), errors
        assert why is not None and "shared memory" in why, f"ptxas rejects it ({errors[0]}) but it is not excluded"
        return
    assert why is None, why
    for name, k in kernels.items():
        assert k["shared"] == shared_bytes(schedule, cfg, dtype), f"{name}: the shared-memory formula is off"
        res = KernelResources(registers=k["registers"], shared=k["shared"], local=k["stack"])
        assert max_threads(res) >= block_size(schedule, cfg), \
            f"{name}: {k['registers']} registers do not fit a block of {block_size(schedule, cfg)}"
        assert why_not_launchable(schedule, cfg, dtype, res) is None


def test_the_space_excludes_exactly_what_cannot_launch():
    rejected = {_key(e["schedule"], e["config"], e["dtype"]) for e in ENTRIES
                if any("error" in k for k in e["kernels"].values())}
    assert rejected, "the record should hold configurations over the 48 KiB of static shared memory"
    for dtype in ("float32", "float64"):
        lim = Limits(lanes=4096, L=1 << 20, dtype=dtype, max_workgroup=SM90.threads_per_block,
                     local_mem=SM90.shared_per_block)
        space = build_space("cuda", lanes=4096, L=1 << 20, dtype=dtype, limits=lim)
        kept = {_key(*space.split(p), dtype) for p in space.configs()}
        assert not kept & rejected
        assert {k for k in (_key(s, c, d) for s, c, d in configurations() if d == dtype) if k not in rejected} == kept


def test_registers_over_the_block_are_refused_with_the_count():
    res = KernelResources(registers=128, shared=0)
    why = why_not_launchable("hybrid", {"workgroup_size": 1024, "items_per_thread": 32}, "float32", res)
    assert why is not None and "128 registers" in why and "512" in why


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (CUDA toolkit not installed)")
@pytest.mark.parametrize("schedule, cfg, dtype", [
    ("hybrid", {"workgroup_size": 256, "items_per_thread": 8, "lanes_per_group": 1}, "float32"),
    ("lookback", {"workgroup_size": 128, "items_per_thread": 4}, "float64"),
])
def test_the_record_is_current(schedule, cfg, dtype):
    if nvcc_version(NVCC) != RECORD["nvcc"]:
        pytest.skip(f"recorded with nvcc {RECORD['nvcc']}, this is {nvcc_version(NVCC)}")
    recorded = next(e["kernels"] for e in ENTRIES if _key(e["schedule"], e["config"], e["dtype"])
                    == _key(schedule, cfg, dtype))
    assert compile_report(schedule, cfg, dtype, RECORD["arch"], NVCC) == recorded, \
        "kernels changed since the record: regenerate with python -m scanweaver.tools.ptxas"
