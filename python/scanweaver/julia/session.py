"""The Julia session: the one place ScanWeaver imports ``juliacall``.

Starting Julia is expensive and can fail in many ways (no ``juliacall``, no
Julia executable, no network for juliapkg to fetch one, a Pkg resolve error,
a missing GPU package).  This module:

* sets the ``PYTHON_JULIACALL_*`` defaults before the import (signal handling
  that lets Julia's threads and GC coexist with Python, one Julia thread per
  core), leaving any value the user set alone;
* answers :func:`probe` quickly without starting Julia or downloading anything:
  it only looks for ``juliacall`` and a Julia executable, where juliacall itself
  would take it from (:func:`find_julia`), and, when there is none, whether
  juliapkg may install one on first use (:mod:`.install`: not offline, and its
  download host answers);
* on first use with no Julia found, lets juliapkg install Julia and the
  package environment, saying what and that it happens once (:func:`main`);
* starts Julia once, in :func:`main`, and turns every failure into one
  :class:`~scanweaver.errors.BackendUnavailable` that says what is missing and
  the command that fixes it; a failure is remembered, so later calls fail fast
  instead of retrying a half-finished start;
* lets any Python thread call Julia without hanging the process (see
  :func:`exclusive`).

Threads. Julia's garbage collector stops every Julia thread at a safepoint
first. The thread that starts Julia is a Julia thread for good, and while it
runs Python code it reaches none, so a collection begun on any other Python
thread would wait for it forever (the process hangs; juliacall 0.9.34 does
this for ``threading.Thread(target=jl.GC.gc)``). So Julia is started on a
thread of its own, which then waits inside Julia's scheduler, where the
collector never waits for it; every Python thread, the main one included,
calls Julia as an adopted thread, which is outside the collector's count
whenever it is back in Python. And one Python thread at a time is inside
Julia (:func:`exclusive`): a thread inside Julia can hand the GIL over while
PythonCall runs Python code for it (an ``isinstance`` check on an argument),
and a collection on the thread that took the GIL would then wait for it
while it waits for the GIL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import BackendUnavailable
from . import install

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

#: :func:`find_julia`'s answer when nothing names or holds a Julia (juliapkg may then install one).
NOTHING_FOUND = "no julia on PATH, no PYTHON_JULIAPKG_EXE, nothing installed by juliapkg"

_lock = threading.Lock()
_main: Any = None
_failure: BackendUnavailable | None = None
_functions: dict[str, Any] = {}
#: Held by the one Python thread inside Julia at a time (see the module's "Threads").
_calls = threading.RLock()
#: Seconds :func:`main` waits for the Julia thread to start Julia and load ScanWeaver (a first start through
#: juliapkg may download and precompile for many minutes).
START_TIMEOUT_S = 1800.0


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
    return None, NOTHING_FOUND


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
    if exe is None and origin == NOTHING_FOUND:
        ok, detail = install.plan()
        if ok:
            return True, f"no Julia found yet: on first use juliapkg installs {detail}, once"
        return False, f"no Julia executable found ({origin}) and juliapkg will not install one ({detail}); " \
                      f"{INSTALL_JULIA}"
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


#: Slots reserved in PythonCall's tables of Julia values wrapped for Python (see :func:`_load`).
WRAPPER_RESERVE = 2**20

#: PythonCall 0.9.34 (and earlier) grows these two vectors where a collection can run Python finalizers that
#: write the same vectors while they grow (a Julia value's wrapper freed inside the growth); the vector is
#: then corrupted, which crashes later. Fixed upstream after 0.9.34 (JuliaPy/PythonCall.jl#758); until a
#: release has it, room reserved once keeps the growth, and so the collection inside it, from happening.
_RESERVE = f"""let w = isdefined(PythonCall, :JlWrap) ? PythonCall.JlWrap : nothing,
        m = w !== nothing && isdefined(w, :Cjl) ? w.Cjl : nothing
    m === nothing || !isdefined(m, :PYJLVALUES) || !isdefined(m, :PYJLFREEVALUES) ? false :
        (sizehint!(m.PYJLVALUES, {WRAPPER_RESERVE}); sizehint!(m.PYJLFREEVALUES, {WRAPPER_RESERVE}); true)
end"""


def _load(jl: Any) -> Any:
    jl.seval("import KernelAbstractions, ScanWeaver")
    jl.seval(_RESERVE)
    return jl


#: The Julia thread's start, once begun: ``(started, box)``; ``box`` receives ``"main"`` or ``"error"``. Kept so
#: that a caller interrupted while waiting (Ctrl-C) waits again for the same start instead of beginning another.
_host: tuple[threading.Event, dict[str, Any]] | None = None


def _start() -> Any:
    """Starts Julia on a thread of its own (see the module's "Threads") and returns juliacall's ``Main``.

    That thread imports juliacall (which starts Julia there), loads ScanWeaver, then waits inside
    Julia, the GIL released, for as long as the process lives. Where juliacall was imported before
    ScanWeaver's first use (Julia already running), it is used as it is. Called under ``_lock``.
    """
    global _host
    for key, value in JULIACALL_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if _host is None and "juliacall" in sys.modules:
        from juliacall import Main as jl

        return _load(jl)
    if _host is None:
        started, box = threading.Event(), {}

        def host() -> None:
            try:
                from juliacall import Main as jl

                box["main"] = _load(jl)
                park = jl.seval("let forever = Base.Event(); () -> wait(forever) end")
            except BaseException as exc:  # noqa: BLE001  reported by the waiting thread
                box["error"] = exc
                started.set()
                return
            started.set()
            park._jl_call_nogil()

        _host = (started, box)
        threading.Thread(target=host, name="scanweaver-julia", daemon=True).start()
    started, box = _host
    if not started.wait(START_TIMEOUT_S):
        raise TimeoutError(f"Julia did not start within {START_TIMEOUT_S:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["main"]


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Held while a Python thread runs Julia code: one thread at a time (see the module's "Threads").

    Every call into Julia here goes through it (:func:`function`, :func:`locked`), and so does a Kernel
    Tuner tune of the julia backend, which calls Julia itself. Reentrant: Julia code may call back into
    Python that calls Julia again. In a child forked after Julia started, raises
    :class:`~scanweaver.errors.BackendUnavailable` instead.
    """
    refuse_if_forked()
    with _calls:
        yield


def refuse_if_forked() -> None:
    """:class:`~scanweaver.errors.BackendUnavailable` in a process forked after Julia started (see
    :func:`_after_fork_in_child`); nothing elsewhere."""
    if _forked is not None:
        raise _forked


def locked(fn: Any) -> Callable[..., Any]:
    """``fn`` (a Julia function) called under :func:`exclusive`; in a process forked after Julia started,
    :class:`~scanweaver.errors.BackendUnavailable` instead (see :func:`_after_fork_in_child`)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if _forked is not None:
            raise _forked
        with _calls:
            return fn(*args, **kwargs)

    return call


#: Set in a child forked after Julia started in its parent: why Julia cannot run there.
_forked: BackendUnavailable | None = None


def _after_fork_in_child() -> None:
    """Julia does not survive ``fork``: its threads are gone in the child, and a call into it there fails
    inside Julia or corrupts it. So the child refuses every Julia call with one clear error (the parent is
    unaffected); the locks are made anew, since a thread of the parent may have held them."""
    global _calls, _lock, _forked, _failure
    _calls, _lock = threading.RLock(), threading.Lock()
    if _main is not None or _host is not None or "juliacall" in sys.modules:  # started, or starting
        _forked = _failure = BackendUnavailable(
            f"julia backend: process {os.getpid()} was forked after Julia started in its parent, and Julia "
            "does not survive fork; start worker processes with the 'spawn' or 'forkserver' method "
            "(multiprocessing.set_start_method('spawn')), or use another backend in forked workers")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def main(check: bool = True) -> Any:
    """The ``juliacall`` Main module with ScanWeaver loaded, starting Julia on first use.

    Args:
        check: run :func:`probe` first, so a machine where Julia cannot be had fails in
            milliseconds; where none is found but juliapkg may install one (:mod:`.install`),
            it is asked to first, and says what it installs.

    Raises:
        BackendUnavailable: saying what is missing and how to fix it; raised
            again, at once, on every later call.
    """
    global _main, _failure
    if _forked is not None:
        raise _forked
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
            if check and find_julia()[0] is None:
                install.install()
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


def function(name: str) -> Callable[..., Any]:
    """The Julia function ``name`` (e.g. ``"ScanWeaver.host_scan!"``), looked up once per process, called
    under :func:`exclusive`.

    ``seval`` parses and evaluates its text on every call (about 20 us); a scan that
    costs tens of microseconds in Julia should not pay that each time.
    """
    fn = _functions.get(name)
    if fn is None:
        jl = main()
        with _calls:
            found = locked(jl.seval(name))
        with _lock:
            fn = _functions.setdefault(name, found)
    return fn


def seval(code: str) -> Any:
    """``Main.seval(code)`` under :func:`exclusive`, starting Julia on first use."""
    jl = main()
    with _calls:
        return jl.seval(code)


def running() -> bool:
    """True once Julia has started in this process."""
    return _main is not None
