"""Julia on first use: with juliacall installed and no Julia, juliapkg is let to install one unless it cannot.

Each case runs in a fresh interpreter with no Julia on PATH and juliapkg's environment in a temporary
folder. juliapkg's install step (``juliapkg.resolve``) is replaced there by a stand-in that records that it
was asked and downloads nothing; the network check is the real one, pointed (through juliapkg's own
setting of where it downloads Julia from) at a port on this machine that listens, or at one that does not.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("juliacall") is None,
    reason="juliacall is not installed; Julia on first use needs it (pip install 'scanweaver[julia]')")

CODE = """
import json, sys, time
import juliapkg
from juliapkg import install_julia
asked = []
def stand_in(*args, **kwargs):
    asked.append(time.time())
    raise RuntimeError("stand-in for juliapkg's install step: nothing downloaded")
juliapkg.resolve = stand_in
install_julia._julia_versions_url = sys.argv[1]
from scanweaver.julia import session
from scanweaver.errors import BackendUnavailable
ok, detail = session.probe()
t = time.perf_counter()
try:
    session.main()
    error = None
except BackendUnavailable as exc:
    error = str(exc)
print(json.dumps({"probe": [ok, detail], "asked": len(asked), "error": error, "s": time.perf_counter() - t}))
"""


def _first_use(tmp_path, url: str, **env: str) -> tuple[dict, str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTHON_JULIACALL_", "PYTHON_JULIAPKG_", "JULIA_"))}
    base.update(PATH="/usr/bin:/bin", PYTHON_JULIAPKG_PROJECT=str(tmp_path / "env"),
                JULIA_DEPOT_PATH=str(tmp_path / "depot"), **env)
    proc = subprocess.run([sys.executable, "-c", CODE, url], capture_output=True, text=True, timeout=120, env=base)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _no_julia_here() -> None:
    from scanweaver.julia.session import NOTHING_FOUND

    code = "from scanweaver.julia.session import find_julia; print(find_julia()[1])"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON_JULIACALL_", "PYTHON_JULIAPKG_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**env, "PATH": "/usr/bin:/bin"}).stdout.strip()
    if out != NOTHING_FOUND:
        pytest.skip(f"a Julia is found on this machine even without PATH ({out}); the case needs none")


def test_no_julia_lets_juliapkg_install_it_once_and_says_what(tmp_path):
    _no_julia_here()
    with socket.socket() as listener:  # the download host stands in as a port on this machine that answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        res, stderr = _first_use(tmp_path, f"http://127.0.0.1:{listener.getsockname()[1]}/bin/versions.json")
    assert res["probe"][0] is True and "juliapkg installs Julia ^1.10" in res["probe"][1]
    assert res["asked"] == 1  # the install step was asked, once
    assert "no Julia found; juliapkg now installs Julia ^1.10" in stderr and "This happens once" in stderr
    for name in ("KernelAbstractions", "ScanWeaver", "PythonCall"):
        assert name in stderr
    assert "stand-in for juliapkg's install step" in res["error"]  # its failure is the backend's clear error


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offline_keeps_the_clear_error_and_installs_nothing(tmp_path):
    _no_julia_here()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/bin/versions.json"
        res, stderr = _first_use(tmp_path, url, PYTHON_JULIAPKG_OFFLINE="yes")
    assert res["asked"] == 0 and res["probe"][0] is False
    assert "PYTHON_JULIAPKG_OFFLINE=yes" in res["error"] and "install Julia >= 1.10" in res["error"]
    assert "juliapkg now installs" not in stderr and res["s"] < 1


def test_no_network_keeps_the_clear_error_and_installs_nothing(tmp_path):
    _no_julia_here()
    res, stderr = _first_use(tmp_path, f"http://127.0.0.1:{_closed_port()}/bin/versions.json")
    assert res["asked"] == 0 and res["probe"][0] is False
    assert "no network for juliapkg to download Julia" in res["error"] and "install Julia >= 1.10" in res["error"]
    assert "juliapkg now installs" not in stderr and res["s"] < 1
