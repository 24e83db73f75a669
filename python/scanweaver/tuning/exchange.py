"""Sharing tuned configurations: who measured an entry, and export/import between stores.

``scanweaver tune --export FILE`` writes every entry this process sees (all
:func:`~.store.sources`, one per key: the newest) as a store file of the same
versioned format (:data:`~.store.FORMAT`, :data:`~.store.VERSION`) with an
``exported`` header; ``scanweaver tune --import FILE`` merges such a file
into :func:`~.store.store_path`, keeping the newer measurement of any key both
hold.  Entries keep their provenance (host, user, time, versions) through
both, so a colleague's or a cluster's measurements say where they came from.

Example:
    >>> import tempfile, pathlib
    >>> from scanweaver.tuning import exchange, store
    >>> e = store.Entry(backend="cpu", device="CPU", signature="0123", dtype="float32", lanes=64, L=4096,
    ...                 schedule="chunked", config={"chunk": 8192}, time_ms=1.0, **exchange.provenance())
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "tuned-export.json"
    >>> exchange.export(f, [e])
    1
    >>> [x.config for x in exchange.read(f)]
    [{'chunk': 8192}]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import ScanInputError
from . import atomic, store

#: packages whose versions an entry records when they are installed
VERSIONED = ("scanweaver", "numpy", "kernel_tuner", "pyopencl", "cupy-cuda12x", "juliacall", "ray", "dask")


def provenance() -> dict:
    """Who measures here: ``{"host", "user", "versions"}``, the provenance fields of a new :class:`~.store.Entry`."""
    import getpass
    import socket
    from importlib import metadata

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    versions = {"python": sys.version.split()[0]}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"host": socket.gethostname(), "user": user, "versions": versions}


def visible() -> list[store.Entry]:
    """Every entry of every source, one per key (the newest measurement)."""
    newest: dict[tuple, store.Entry] = {}
    for _, entries in store.load_sources():
        for e in entries:
            if e.key() not in newest or e.created > newest[e.key()].created:
                newest[e.key()] = e
    return list(newest.values())


def export(path: str | Path, entries: list[store.Entry] | None = None) -> int:
    """Writes ``entries`` (default :func:`visible`) to ``path`` atomically; returns how many.

    Raises:
        ScanInputError: ``path`` is a directory or cannot be written.
    """
    path = Path(path)
    entries = visible() if entries is None else list(entries)
    if path.is_dir():
        raise ScanInputError(f"tune --export: {path} is a directory; give a file name such as {path / 'tuned.json'}")
    body = json.loads(store.dump(entries))
    body["exported"] = {"created": time.time(), **provenance()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.replace_text(path, json.dumps(body, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise ScanInputError(f"tune --export: cannot write {path}: {exc}") from None
    return len(entries)


def read(path: str | Path) -> list[store.Entry]:
    """The entries of an exported (or store) file.

    Raises:
        ScanInputError: the file is missing, unreadable, or not a ScanWeaver store of this version.
    """
    path = Path(path)
    try:
        text = atomic.read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise ScanInputError(f"tune --import: cannot read {path}: {exc}") from None
    try:
        entries, skipped = store.parse_checked(text)
    except store.StoreFormatError as exc:
        raise ScanInputError(f"tune --import: {path} is not a tuned-configuration file: {exc}") from None
    if skipped:
        import warnings

        warnings.warn(f"tune --import: skipped {len(skipped)} invalid entr{'y' if len(skipped) == 1 else 'ies'} of "
                      f"{path} (first: {skipped[0][1]})", RuntimeWarning, stacklevel=2)
    return entries


def import_file(path: str | Path, into: str | Path | None = None) -> dict[str, int]:
    """Merges the entries of ``path`` into the store ``into`` (default :func:`~.store.store_path`).

    A key both hold keeps the newer measurement.  Returns the counts
    ``{"added", "replaced", "kept"}``.
    """
    return store.merge(read(path), Path(into) if into else None, keep_newer=True)
