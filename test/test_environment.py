"""The SCANWEAVER_* environment variables: one reader, and no value breaks an import or hangs a call."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scanweaver import environment

PACKAGE = Path(environment.__file__).resolve().parent


def _run(code: str, timeout: float = 60, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env})


def test_every_variable_the_package_names_goes_through_the_one_reader():
    """Each SCANWEAVER_* name in the package is listed in VARIABLES, and no module but the reader (and the tuned
    store's raw cache key, which only detects a change) reads one from os.environ."""
    named, direct = set(), []
    for path in PACKAGE.rglob("*.py"):
        if "benchmarks" in path.parts or path.name == "environment.py":
            continue
        src = path.read_text()
        named |= set(re.findall(r"SCANWEAVER_[A-Z0-9_]+", src))
        for m in re.finditer(r"(?:os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*[\"'](SCANWEAVER_\w+)", src):
            direct.append(f"{path.relative_to(PACKAGE)}: {m.group(1)}")
    assert named <= set(environment.VARIABLES), named - set(environment.VARIABLES)
    assert direct == ["tuning/store.py: SCANWEAVER_CACHE_DIR"], direct  # _env_key: a change detector


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "lots", "1e999"])
def test_a_bad_pool_size_is_ignored_with_a_warning_naming_it(value):
    proc = _run("import scanweaver; from scanweaver.runtime.host_pool import POOL, DEFAULT_MB; "
                "print(POOL.max_bytes == DEFAULT_MB << 20)", SCANWEAVER_POOL_MB=value)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "True"
    assert proc.stderr.count(f"SCANWEAVER_POOL_MB={value!r} is ignored") == 1, proc.stderr


def test_a_good_pool_size_is_used():
    proc = _run("from scanweaver.runtime.host_pool import POOL; print(POOL.max_bytes)", SCANWEAVER_POOL_MB="0.5")
    assert proc.returncode == 0 and int(proc.stdout.split()[-1]) == 1 << 19, proc.stderr


@pytest.mark.parametrize("value", ["\u00b2", "12x", "-5", "nan"])
def test_a_bad_threads_cutoff_is_measured_instead(value):
    proc = _run("from scanweaver.runtime import calibrate; print(calibrate._from_environment())",
                SCANWEAVER_THREADS_CUTOFF=value)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "None" and "SCANWEAVER_THREADS_CUTOFF" in proc.stderr


def test_an_opencl_device_spec_of_odd_digits_names_the_variable():
    pytest.importorskip("pyopencl")
    proc = _run("from scanweaver.runtime import REGISTRY; print(json.dumps(REGISTRY['opencl'].availability().reason))"
                .replace("from", "import json; from", 1), SCANWEAVER_OPENCL_DEVICE="0:\u00b2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    reason = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "SCANWEAVER_OPENCL_DEVICE" in reason and "ValueError" not in reason, reason


def test_both_cache_readers_agree_on_a_home_relative_directory(monkeypatch):
    from scanweaver.runtime import toolchain
    from scanweaver.tuning import store

    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", "~/sw-cache-test")
    want = Path("~/sw-cache-test").expanduser()
    assert toolchain.cache_dir() == want and store.cache_dir() == want


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_among_the_device_files_does_not_hang(tmp_path):
    os.mkfifo(tmp_path / "gpu.json")
    try:
        proc = _run("from scanweaver.tuning import devices; devices._load(tuple(map(str, devices.directories()))); "
                    "print('read')", SCANWEAVER_DEVICE_CONFIGS=str(tmp_path))
    except subprocess.TimeoutExpired:
        pytest.fail("reading the device files hung on a FIFO")
    assert proc.returncode == 0 and proc.stdout.split()[-1] == "read", proc.stderr[-2000:]
    assert "is a FIFO" in proc.stderr


def test_an_unknown_traceback_setting_is_named_once():
    code = ("import scanweaver, numpy as np\n"
            "for _ in range(2):\n"
            "    try:\n"
            "        scanweaver.selective_scan(np.ones(3), np.ones(3), np.ones(4))\n"
            "    except scanweaver.ScanInputError:\n"
            "        pass\n")
    proc = _run(code, SCANWEAVER_TRACEBACK="verbose")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("SCANWEAVER_TRACEBACK='verbose' is ignored") == 1, proc.stderr
