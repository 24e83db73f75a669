"""What the benchmarks time: one small class per peer, found through a registry.

A :class:`Peer` says whether it can run here (and why not), what it computes,
roughly what one call costs (so slow peers are capped before they are run),
and how to turn the shared NumPy operands into a call to time.  Peers from
other libraries import them inside :meth:`Peer.prepare`, never at import.

Example:
    >>> from scanweaver.benchmarks import peers
    >>> "numpy-loop" in {p.name for p in peers.entries()}
    True
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

import numpy as np

from ..cases import Case, Settings

#: Modules whose peers register themselves on import (none imports its library at import).
PEER_MODULES = (
    "scanweaver.benchmarks.peers.numpy_peers",
    "scanweaver.benchmarks.peers.torch_peers",
    "scanweaver.benchmarks.peers.jax_peers",
    "scanweaver.benchmarks.peers.gpu_peers",
    "scanweaver.benchmarks.peers.scanweaver_peers",
)


class Peer(ABC):
    """One timed entry of a benchmark table.

    Attributes:
        name: registry key, e.g. ``torch-loop``.
        label: the row's title in tables and plots.
        kind: ``peer`` (another library), ``ours`` (ScanWeaver) or ``bound``
            (a memory-speed yardstick that does not compute the scan).
        recurrence: what it computes: ``time-varying`` (the selective scan) or a
            named special case.
        variant: operands it needs: ``default`` or ``constant_a`` (a fixed over t per lane).
        paper: part of the paper suite (figure 4's entries).
        checked: its result is compared with the float64 oracle before timing.
        note: a caveat printed under the table.
        ns_per_element, us_per_step: cost model of one call, for the cap.
        gpu: it takes CUDA device operands (CuPy arrays, in the ``gpu`` suite) as well as NumPy ones,
            and its call waits for the device, so host timers measure it.
    """

    name: str = ""
    label: str = ""
    kind: str = "peer"
    recurrence: str = "time-varying"
    variant: str = "default"
    paper: bool = False
    checked: bool = True
    note: str = ""
    ns_per_element: float = 5.0
    us_per_step: float = 0.0
    gpu: bool = False

    def availability(self) -> str | None:
        """``None`` when it can run here, else the reason (with the install command)."""
        return None

    def device(self) -> str:
        """Where it runs, e.g. ``CPU (2 threads)``."""
        return "host CPU"

    def estimate(self, case: Case) -> float:
        """Rough seconds of one call (the cost model; warm-up and compile excluded)."""
        return case.elements * self.ns_per_element * 1e-9 + case.L * self.us_per_step * 1e-6

    def skip_reason(self, case: Case, settings: Settings) -> str | None:
        """Why this case is not run for this peer (``None``: run it)."""
        est = self.estimate(case)
        if est > settings.max_call_s:
            return (f"capped: one call estimated at {est:.3g} s, over the {settings.max_call_s:g} s "
                    "limit per call")
        return None

    @abstractmethod
    def prepare(self, ops: dict[str, np.ndarray]) -> Callable[[], object]:
        """Returns the call to time; converting operands to the library's arrays happens here, untimed."""

    def to_numpy(self, out: object) -> np.ndarray:
        """The call's result as a NumPy array (for the correctness check only)."""
        return np.asarray(out)

    def details(self) -> dict:
        """Facts learnt from the warm-up call (e.g. the schedule and config that ran)."""
        return {}


PEERS: dict[str, Peer] = {}
PROVIDERS: list[Callable[[str | None], Iterable[Peer]]] = []


def register(cls: type[Peer]) -> type[Peer]:
    """Class decorator: adds an instance of ``cls`` to :data:`PEERS`."""
    PEERS[cls.name] = cls()
    return cls


def add(peer: Peer) -> None:
    """Adds ``peer`` (an instance) to :data:`PEERS`, replacing one of the same name."""
    PEERS[peer.name] = peer


def remove(name: str) -> None:
    """Removes the peer ``name`` if present."""
    PEERS.pop(name, None)


def provider(fn: Callable[[str | None], Iterable[Peer]]) -> Callable[[str | None], Iterable[Peer]]:
    """Registers a function making entries on demand (one per backend and schedule)."""
    PROVIDERS.append(fn)
    return fn


def load_all() -> None:
    """Imports every peer module (each registers its peers)."""
    for mod in PEER_MODULES:
        importlib.import_module(mod)


def entries(backend: str | None = None) -> list[Peer]:
    """Every registered peer and every provided ScanWeaver entry.

    Args:
        backend: restrict ScanWeaver entries to this backend (``None``: all).
    """
    load_all()
    out = list(PEERS.values())
    for make in PROVIDERS:
        out.extend(make(backend))
    return out


def installed(module: str, pip_name: str) -> str | None:
    """``None`` when ``module`` imports, else a reason naming the pip package."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # any failure to import means the peer cannot run
        return (f"{module} is not importable ({type(exc).__name__}); install it with pip install {pip_name} "
                "(the peers: pip install 'scanweaver[bench]')")
    return None
