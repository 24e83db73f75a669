"""Julia on first use: whether juliapkg may install Julia here, and asking it to.

With juliacall installed and no Julia found, juliacall's import would let
juliapkg download Julia and resolve the package environment (ScanWeaver's
``juliapkg.json``: KernelAbstractions and ScanWeaver, with juliacall's
PythonCall), as it does for every juliacall package.  ScanWeaver lets it,
saying first what is installed and that it happens once, except where it
cannot succeed: offline (``PYTHON_JULIAPKG_OFFLINE=yes``) or with no route to
the host juliapkg downloads Julia from; there the backend is unavailable at
once, with the command that installs Julia by hand.

Importing this module imports neither juliapkg nor juliacall.

Example:
    >>> from scanweaver.julia import install
    >>> ok, detail = install.plan()
    >>> isinstance(ok, bool) and bool(detail)
    True
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

#: ScanWeaver's Julia requirements (the Julia version and packages juliapkg resolves).
JULIAPKG_JSON = Path(__file__).resolve().parents[1] / "juliapkg.json"
#: Where juliapkg 0.1 looks up Julia's releases before downloading one (its ``_julia_versions_url``).
VERSIONS_URL = "https://julialang-s3.julialang.org/bin/versions.json"
#: Seconds the download host gets to accept a connection before the network counts as absent.
NETWORK_TIMEOUT_S = 3.0

_network: dict[str, str] = {}


def offline() -> bool:
    """Whether juliapkg is told to stay offline (``PYTHON_JULIAPKG_OFFLINE=yes`` or ``-X juliapkg-offline=yes``,
    read as juliapkg reads it)."""
    from juliapkg.state import get_config_bool

    try:
        return bool(get_config_bool("offline")[0])
    except ValueError:  # a value juliapkg refuses: it would refuse to resolve as well
        return True


def versions_url() -> str:
    """The address juliapkg fetches Julia's release list from (its own setting when it has one)."""
    from juliapkg import install_julia

    return str(getattr(install_julia, "_julia_versions_url", VERSIONS_URL))


def unreachable(url: str, timeout: float = NETWORK_TIMEOUT_S) -> str:
    """``""`` when the host of ``url`` accepts a connection, else why not (asked once per process and address)."""
    if url not in _network:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname or "", port), timeout=timeout).close()
            _network[url] = ""
        except OSError as exc:
            _network[url] = f"{parts.hostname}:{port} cannot be reached ({type(exc).__name__}: {exc})"
    return _network[url]


def what() -> str:
    """What juliapkg installs for ScanWeaver, and where."""
    from juliapkg.state import STATE

    spec = json.loads(JULIAPKG_JSON.read_text())
    packages = ", ".join(sorted(spec.get("packages", {}))) + " and juliacall's PythonCall"
    return (f"Julia {spec.get('julia', '')} (into {STATE['install']}) and the Julia packages {packages} "
            f"(into {STATE['project']})")


def plan() -> tuple[bool, str]:
    """Whether juliapkg would install Julia here on first use: ``(True, what it installs)`` or ``(False, why
    not)``; downloads nothing (at most one connection to the download host, to see that it answers)."""
    if importlib.util.find_spec("juliapkg") is None:
        return False, "juliapkg is not installed (it comes with juliacall)"
    if offline():
        return False, "PYTHON_JULIAPKG_OFFLINE=yes: juliapkg installs nothing"
    why = unreachable(versions_url())
    if why:
        return False, f"no network for juliapkg to download Julia: {why}"
    return True, what()


def install() -> None:
    """Lets juliapkg install Julia and the package environment now, saying what and that it happens once.

    Raises:
        Exception: whatever juliapkg raises (the caller turns it into
            :class:`~scanweaver.errors.BackendUnavailable`).
    """
    import juliapkg

    print(f"scanweaver: no Julia found; juliapkg now installs {what()}. This happens once: later sessions reuse "
          "them. It takes minutes (PYTHON_JULIAPKG_OFFLINE=yes prevents it).", file=sys.stderr, flush=True)
    juliapkg.resolve()
