"""Runs ``bench/fuzz_entry_points.py --quick``: every public entry point against odd inputs and tunables.

In a subprocess with a timeout, so that a crash or a hang of the interpreter fails the test instead of the
run; the script judges each call (right answer, clear error or defect) and must report no defect.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_fuzzing_every_entry_point_finds_no_defect(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "SCANWEAVER_CACHE_DIR": os.environ.get(
        "SCANWEAVER_CACHE_DIR", str(tmp_path))}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_entry_points.py"), "--quick",
                           "--backends", "numpy,cpu", "--json", str(tmp_path / "fuzz.json")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("fuzz:")]
    defects = [line for line in proc.stdout.splitlines() if line.startswith("defect")]
    assert proc.returncode == 0 and summary, (proc.returncode, defects, proc.stderr[-3000:])
    assert " 0 defects" in summary[0], defects
    assert "right" in summary[0] and "clear errors" in summary[0]
