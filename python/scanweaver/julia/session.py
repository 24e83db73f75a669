"""The Julia session: the one place ScanWeaver imports ``juliacall``.

Starting Julia is expensive and can fail in many ways (no ``juliacall``, no
Julia executable, no network for juliapkg to fetch one, a Pkg resolve error,
a missing GPU package).  This module:

* sets the ``PYTHON_JULIACALL_*`` defaults before the import (signal handling
  that lets Julia's threads and GC coexist with Python, one Julia thread per
  core), leaving any value the user set alone;
* answers :func:`probe` quickly without starting Julia or downloading anything:
  it only looks for ``juliacall`` and a Julia executable, where juliacall itself
  would take it from (:func:`find_julia`);
* starts Julia once, in :func:`main`, and turns every failure into one
  :class:`~scanweaver.errors.BackendUnavailable` that says what is missing and
  the command that fixes it; a failure is remembered, so later calls fail fast
  instead of retrying a half-finished start.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import threading
from typing import Any

from ..errors import BackendUnavailable

#: ``PYTHON_JULIACALL_*`` settings applied before ``import juliacall`` unless already set.
JULIACALL_DEFAULTS = {
    "PYTHON_JULIACALL_HANDLE_SIGNALS": "yes",
    "PYTHON_JULIACALL_THREADS": "auto",
    "PYTHON_JULIACALL_AUTOLOAD_IPYTHON_EXTENSION": "no",
}

#: Oldest Julia the package supports (``[compat] julia`` in Project.toml).
MIN_JULIA = (1, 10)

#: Seconds ``julia --version`` may take before the executable counts as broken.
VERSION_TIMEOUT_S = 20.0

INSTALL_JULIACALL = "pip install 'scanweaver[julia]'"
INSTALL_JULIA = ("install Julia >= 1.10 (https://julialang.org/install: "
                 "`curl -fsSL https://install.julialang.org | sh`) or point PYTHON_JULIAPKG_EXE at one "
                 "(or PYTHON_JULIACALL_EXE and PYTHON_JULIACALL_PROJECT at a Julia and an environment "
                 "that holds PythonCall and ScanWeaver)")

#: juliacall's own variables: set together, juliacall uses that Julia and environment as they are
#: (no juliapkg resolve, nothing downloaded).
JULIACALL_ENV = ("PYTHON_JULIACALL_EXE", "PYTHON_JULIACALL_PROJECT")

_lock = threading.Lock()
_main: Any = None
_failure: BackendUnavailable | None = None
_functions: dict[str, Any] = {}


def find_julia() -> tuple[str | None, str]:
    """A Julia executable juliacall would use, found without downloading, and where it came from.

    In juliacall's order: ``PYTHON_JULIACALL_EXE`` with ``PYTHON_JULIACALL_PROJECT`` (juliacall then
    skips juliapkg; one without the other is an error of juliacall's, reported here instead), then
    juliapkg's ``PYTHON_JULIAPKG_EXE``, ``julia`` or ``juliaup`` on ``PATH``, and a Julia that juliapkg
    installed before.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from scanweaver.julia.session import find_julia
        >>> with mock.patch.dict(os.environ, {"PYTHON_JULIACALL_EXE": "/nonexistent/julia"}):
        ...     _ = os.environ.pop("PYTHON_JULIACALL_PROJECT", None)
        ...     print(find_julia()[1])
        PYTHON_JULIACALL_EXE=/nonexistent/julia without PYTHON_JULIACALL_PROJECT (juliacall needs both)
    """
    exe, project = (os.environ.get(k) for k in JULIACALL_ENV)
    if exe is not None or project is not None:
        if exe is None or project is None:
            given, missing = ("PYTHON_JULIACALL_EXE", "PYTHON_JULIACALL_PROJECT")[:: 1 if exe is not None else -1]
            return None, f"{given}={exe if exe is not None else project} without {missing} (juliacall needs both)"
        if not os.path.exists(project):
            return None, f"PYTHON_JULIACALL_PROJECT={project} does not exist"
        return shutil.which(exe), f"PYTHON_JULIACALL_EXE={exe}, PYTHON_JULIACALL_PROJECT={project}"
    exe = os.environ.get("PYTHON_JULIAPKG_EXE")
    if exe:
        return (exe if shutil.which(exe) else None), f"PYTHON_JULIAPKG_EXE={exe}"
    for name in ("julia", "juliaup"):
        found = shutil.which(name)
        if found:
            return found, f"{name} on PATH"
    if importlib.util.find_spec("juliapkg") is not None:
        from juliapkg.state import STATE

        ext = ".exe" if os.name == "nt" else ""
        installed = shutil.which(os.path.join(STATE["install"], "bin", "julia" + ext))
        if installed:
            return installed, "installed by juliapkg"
    return None, "no julia on PATH, no PYTHON_JULIAPKG_EXE, nothing installed by juliapkg"


def julia_version(exe: str) -> tuple[int, ...] | None:
    """``(major, minor, patch)`` of ``exe``, or ``None`` when it does not run."""
    if os.path.basename(exe).startswith("juliaup"):
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                             check=True).stdout.split()
        return tuple(int(p) for p in out[2].split("-")[0].split(".")[:3])
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def probe() -> tuple[bool, str]:
    """Whether Julia can start here, and why not; never starts Julia or downloads anything.

    Returns:
        ``(ok, detail)``: ``detail`` is the Julia found, or what is missing and
        the command that fixes it.

    Example:
        >>> from scanweaver.julia import session
        >>> ok, detail = session.probe()
        >>> isinstance(ok, bool) and bool(detail)
        True
    """
    if _failure is not None:
        return False, str(_failure)
    if _main is not None:
        return True, "Julia session running"
    if importlib.util.find_spec("juliacall") is None:
        return False, f"juliacall is not installed; run `{INSTALL_JULIACALL}`"
    exe, origin = find_julia()
    if exe is None:
        return False, f"no Julia executable found ({origin}); {INSTALL_JULIA}"
    version = julia_version(exe)
    if version is not None and version[:2] < MIN_JULIA:
        return False, f"{exe} is Julia {'.'.join(map(str, version))}; ScanWeaver needs >= 1.10: {INSTALL_JULIA}"
    shown = ".".join(map(str, version)) if version else "version unknown"
    return True, f"Julia {shown} ({exe}, {origin})"


def _start_advice() -> str:
    """What to check when Julia did not start, for the way juliacall was pointed at it."""
    project = os.environ.get("PYTHON_JULIACALL_PROJECT")
    if project and os.environ.get("PYTHON_JULIACALL_EXE"):
        return (f"juliacall used PYTHON_JULIACALL_PROJECT={project} as it is: that environment must hold "
                "PythonCall (the version of juliacall), KernelAbstractions and ScanWeaver "
                f"(`julia --project={project} -e 'import Pkg; Pkg.develop(path=\"<scanweaver checkout>\")'`)")
    return ("Check that Julia >= 1.10 and the packages in scanweaver/juliapkg.json can be installed: "
            "`python -c \"import juliapkg; juliapkg.resolve()\"` shows the full log "
            "(needs network access the first time, or PYTHON_JULIAPKG_OFFLINE=yes with PYTHON_JULIAPKG_PROJECT "
            "naming an environment that holds them)")


def _start() -> Any:
    for key, value in JULIACALL_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from juliacall import Main as jl

    jl.seval("import KernelAbstractions, ScanWeaver")
    return jl


def main(check: bool = True) -> Any:
    """The ``juliacall`` Main module with ScanWeaver loaded, starting Julia on first use.

    Args:
        check: run :func:`probe` first, so a machine without Julia fails in
            milliseconds instead of letting juliapkg try to download one.

    Raises:
        BackendUnavailable: saying what is missing and how to fix it; raised
            again, at once, on every later call.
    """
    global _main, _failure
    with _lock:
        if _main is not None:
            return _main
        if _failure is not None:
            raise _failure
        if check:
            ok, detail = probe()
            if not ok:
                _failure = BackendUnavailable(f"julia backend: {detail}")
                raise _failure
        try:
            _main = _start()
        except BaseException as exc:  # noqa: BLE001  juliacall raises URLError, bare Exception, JuliaError ...
            if isinstance(exc, KeyboardInterrupt):
                raise
            _failure = BackendUnavailable(
                f"julia backend: starting Julia with ScanWeaver failed ({type(exc).__name__}: {exc}). "
                f"{_start_advice()}; without Julia: {INSTALL_JULIA}"
            )
            raise _failure from exc
        return _main


def function(name: str) -> Any:
    """The Julia function ``name`` (e.g. ``"ScanWeaver.host_scan!"``), looked up once per process.

    ``seval`` parses and evaluates its text on every call (about 20 us); a scan that
    costs tens of microseconds in Julia should not pay that each time.
    """
    fn = _functions.get(name)
    if fn is None:
        fn = main().seval(name)
        with _lock:
            _functions.setdefault(name, fn)
    return fn


def running() -> bool:
    """True once Julia has started in this process."""
    return _main is not None
