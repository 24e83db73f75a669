"""The documentation site builds with ``mkdocs build --strict`` (no broken link, anchor or snippet)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="mkdocs-material is not installed (pip install mkdocs-material, or the test extra)")
def test_site_builds_strictly(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert (tmp_path / "site" / "index.html").is_file()
    for page in ("operations", "training", "results", "architecture", "porting"):
        assert (tmp_path / "site" / page / "index.html").is_file(), f"the site has no page {page}"
