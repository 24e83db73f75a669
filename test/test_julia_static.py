"""Every Julia file is clean under ``fatou lint`` and ``fatou format --check`` (no Julia needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", "build", "dist", "node_modules"}


def julia_files() -> list[Path]:
    """Every .jl file of the repository once (the wheel's symbolic links lead to the same files)."""
    seen, files = set(), []
    for path in sorted(ROOT.rglob("*.jl")):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts):
            continue
        real = path.resolve()
        if real not in seen:
            seen.add(real)
            files.append(real)
    return files


@pytest.fixture(scope="module")
def fatou() -> str:
    exe = shutil.which("fatou")
    if exe is None:
        pytest.skip("fatou is not installed (pip install fatou)")
    return exe


def test_there_are_julia_files():
    names = {p.relative_to(ROOT).as_posix() for p in julia_files()}
    assert {"src/ScanWeaver.jl", "test/runtests.jl", "ext/ScanWeaverCUDAExt.jl"} <= names


@pytest.mark.parametrize("command", [["lint"], ["format", "--check"]], ids=["lint", "format"])
def test_fatou_is_clean(fatou, command):
    files = [str(p) for p in julia_files()]
    proc = subprocess.run([fatou, *command, "--color", "never", *files], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning" not in proc.stdout + proc.stderr
