"""Every integer tunable has an upper bound; huge values and ``threads`` typos are refused, never compiled.

A tunable becomes a C ``#define`` (or a Julia ``Val``): ``chunk=2**64`` used to reach GCC, which truncated it
to 0 and compiled a constant division by zero (SIGILL), and ``2**64 + 1`` silently became 1.  The crash
checks run in a subprocess with a timeout.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.runtime import REGISTRY as BACKENDS
from scanweaver.runtime import cflags, toolchain
from scanweaver.schedules import REGISTRY as SCHEDULES


def _integer_tunables():
    for name, sched in SCHEDULES.items():
        yield from ((f"schedule {name}", t) for t in sched.tunables)
    for name, cls in BACKENDS.items():
        yield from ((f"backend {name}", t) for t in cls.extra_tunables)
    for name, op in FUSED.items():
        for family, tunables in op.tunables.items():
            yield from ((f"fused {name} ({family})", t) for t in tunables)


INTEGER = [(owner, t) for owner, t in _integer_tunables() if type(t.default) is int]


def test_every_integer_tunable_is_found():
    names = {t.name for _, t in INTEGER}
    assert {"chunk", "threads", "workgroup_size", "items_per_thread", "tiles_per_block", "lanes_per_group",
            "interleave", "width"} <= names


@pytest.mark.parametrize("owner, tunable", INTEGER, ids=[f"{o}:{t.name}" for o, t in INTEGER])
def test_every_integer_tunable_has_an_upper_bound(owner, tunable):
    assert tunable.check(tunable.default, "t") == tunable.default
    for v in tunable.values:
        tunable.check(v, "t")
    for huge in (2**31, 2**63, 2**64, 2**64 + 1):
        with pytest.raises(ScanInputError, match=tunable.name):
            tunable.check(huge, "t")


SCRIPT = r"""
import json, os, sys
import numpy as np
import scanweaver
from scanweaver.errors import ScanInputError
how, value = sys.argv[1], int(sys.argv[2])
a = np.full((4096, 50), 0.5, np.float32); b = np.ones_like(a); x = np.ones_like(a); c = np.ones_like(a)
want = scanweaver.selective_scan(a, b, x, c, backend="numpy")
if how == "store":
    from scanweaver.api import SELECTIVE
    from scanweaver.runtime import get_backend
    from scanweaver.tuning import store
    store.record(store.Entry(backend="cpu", device=get_backend("cpu").availability().device,
                             signature=SELECTIVE.signature("float32"), dtype="float32", lanes=4096, L=50,
                             schedule="chunked", config={"chunk": value, "threads": 1}, time_ms=1.0))
    got = scanweaver.selective_scan(a, b, x, c, backend="cpu")
    print(json.dumps({"ok": bool(np.allclose(got, want)), "config": SELECTIVE.last.config}))
else:
    try:
        got = scanweaver.selective_scan(a, b, x, c, backend="cpu",
                                          schedule="sequential" if how == "threads" else "chunked", **{how: value})
        print(json.dumps({"ok": bool(np.allclose(got, want)), "error": ""}))
    except ScanInputError as e:
        print(json.dumps({"ok": True, "error": str(e)}))
"""


def _run(tmp_path, how: str, value: int, address_space: int = 0) -> dict:
    if toolchain.missing_reason():
        pytest.skip(f"no C toolchain: {toolchain.missing_reason()}")
    env = {**os.environ, "SCANWEAVER_CACHE_DIR": str(tmp_path)}

    def limit() -> None:  # a memory limit, under which the OpenMP runtime cannot create 1024 thread stacks
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    proc = subprocess.run([sys.executable, "-c", SCRIPT, how, str(value)], capture_output=True, text=True,
                          timeout=180, env=env, preexec_fn=limit)
    assert proc.returncode == 0, f"{how}={value}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", [2**64, 2**64 + 1])
def test_a_huge_chunk_is_a_clear_error(tmp_path, value):
    res = _run(tmp_path, "chunk", value)
    assert "chunk" in res["error"] and "between" in res["error"], res


def test_a_huge_threads_is_a_clear_error(tmp_path):
    res = _run(tmp_path, "threads", 100000)
    assert "threads" in res["error"] and "1024" in res["error"], res


def test_a_well_formed_store_entry_with_a_huge_chunk_is_ignored(tmp_path):
    res = _run(tmp_path, "store", 2**64)
    assert res["ok"] and res["config"].get("chunk") != 2**64, res


def test_threads_are_clamped_in_c_to_a_multiple_of_the_processors(tmp_path):
    """``threads`` within the rule but far past the processors runs (clamped), with the right answer, under
    a memory limit where 1024 thread stacks (8 MiB each by default) cannot exist."""
    res = _run(tmp_path, "threads", 1024, address_space=3 * 2**30)
    assert res == {"ok": True, "error": ""}, res


def test_constant_overflow_is_a_compile_error():
    """The probed flags turn constant overflow and constant division by zero into errors (gcc and clang)."""
    tc = toolchain.find_toolchain() if not toolchain.missing_reason() else None
    if tc is None:
        pytest.skip("no C toolchain")
    assert set(cflags.DIAGNOSTIC_FLAGS) <= set(tc.flags)
    bad = "#define SW_CHUNK 0\nlong f(long x) { return x / SW_CHUNK; }\nint g(void) { return 2147483647 * 4; }\n"
    ok, log = cflags.accepts(tc.command, tc.flags, bad)
    assert not ok and ("overflow" in log or "division by zero" in log), log
