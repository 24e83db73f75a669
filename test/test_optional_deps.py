"""Tests of optional features skip, with their reason, where the optional dependency is missing.

The tuning and OpenCL test modules are run in a subprocess in which Kernel
Tuner and PyOpenCL cannot be imported (as on a machine without the extras):
they must pass or skip with a reason, never fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BLOCK = ("import sys\n"
         "for name in ('kernel_tuner', 'pyopencl'):\n"
         "    sys.modules[name] = None  # import now raises ImportError, as when not installed\n"
         "import pytest\n"
         "sys.exit(pytest.main(sys.argv[1:]))\n")


def test_tuning_and_opencl_tests_skip_with_reasons_without_their_extras(tmp_path):
    files = [str(HERE / f) for f in ("test_tuning_space.py", "test_tuning_kt.py", "test_tuning_store.py",
                                     "test_opencl_backend.py")]
    env = {**os.environ, "SCANWEAVER_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", BLOCK, "-q", "-rs", "-p", "no:cacheprovider", *files],
                          capture_output=True, text=True, timeout=600, env=env, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "failed" not in proc.stdout.splitlines()[-1]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert any("Kernel Tuner" in line or "kernel_tuner" in line for line in skipped), proc.stdout[-2000:]
    assert any("pyopencl" in line.lower() for line in skipped), proc.stdout[-2000:]
