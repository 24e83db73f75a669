"""The suites: ``paper`` (latency against L, figure 4), ``peers`` (side by side), ``all``, ``gpu``.

A suite is a list of cases and a rule choosing which entries run on each.

Example:
    >>> from scanweaver.benchmarks import suites
    >>> [c.L for c in suites.get("paper").cases][:3]
    [64, 128, 256]
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from ..errors import ScanInputError
from .cases import Case
from .peers import Peer

#: (B, D) of the L sweep.  The paper does not state its batch and width; 16 lanes keep L = 2^20 at 64 MiB per operand.
SWEEP_BD = (1, 16)
#: The paper's figure 4 range: L from 2^6 to 2^20.
PAPER_LOG2_L = tuple(range(6, 21))
#: The peers suite samples the same range more sparsely.
PEERS_LOG2_L = tuple(range(6, 21, 2))
#: The issue's peer shapes; (8, 512, 4096) is the headline the targets are stated for.
PEER_SHAPES = ((1, 1, 2**24), (8, 512, 4096), (8, 1536, 4096))
HEADLINE = (8, 512, 4096)
#: Tiny stand-ins for --quick (seconds in all).
QUICK_SWEEP_BD = (1, 4)
QUICK_LOG2_L = (6, 8, 10)
QUICK_SHAPES = ((1, 1, 2**11), (2, 8, 256), (2, 16, 256))
QUICK_HEADLINE = (2, 8, 256)

Selector = Callable[[Case, Peer], bool]


@dataclass(frozen=True)
class Suite:
    """Cases and, per case, which entries run."""

    name: str
    cases: tuple[Case, ...]
    rules: tuple[tuple[str, Selector], ...]

    def selects(self, case: Case, peer: Peer) -> bool:
        """Whether ``peer`` runs on ``case`` (any rule for the case's name that accepts it)."""
        return any(name == case.name and rule(case, peer) for name, rule in self.rules)


def _paper_entry(case: Case, peer: Peer) -> bool:
    return peer.paper or peer.name == "roofline"


def _any_entry(case: Case, peer: Peer) -> bool:
    return True


def _sweep_entry(case: Case, peer: Peer) -> bool:
    """Peers and figure 4's ScanWeaver entries (every schedule of every backend runs on the fixed shapes)."""
    return peer.kind != "ours" or peer.paper


def _sweep(bd: tuple[int, int], log2s: tuple[int, ...], dtype: str) -> list[Case]:
    return [Case(f"L=2^{k}", (bd[0], bd[1], 2**k), dtype, group="sweep") for k in log2s]


def _shapes(shapes, headline, dtype: str) -> list[Case]:
    return [Case(f"{B}x{D}x{L}", (B, D, L), dtype, group="shape", headline=headline == (B, D, L))
            for B, D, L in shapes]


def paper(quick: bool = False, dtype: str = "float32") -> Suite:
    """Latency against L for figure 4's entries: PyTorch loop, naive sequential, Blelloch, tuned best."""
    cases = _sweep(QUICK_SWEEP_BD if quick else SWEEP_BD, QUICK_LOG2_L if quick else PAPER_LOG2_L, dtype)
    return Suite("paper", tuple(cases), tuple((c.name, _paper_entry) for c in cases))


def peers(quick: bool = False, dtype: str = "float32") -> Suite:
    """Every entry on the issue's shapes; the peers and figure 4's entries on a sparser L sweep."""
    shapes = _shapes(QUICK_SHAPES if quick else PEER_SHAPES, QUICK_HEADLINE if quick else HEADLINE, dtype)
    sweep = _sweep(QUICK_SWEEP_BD if quick else SWEEP_BD, QUICK_LOG2_L[::2] if quick else PEERS_LOG2_L, dtype)
    rules = [(c.name, _any_entry) for c in shapes] + [(c.name, _sweep_entry) for c in sweep]
    return Suite("peers", tuple(shapes + sweep), tuple(rules))


def combine(name: str, *parts: Suite) -> Suite:
    """One suite running the union of ``parts`` (a case shared by two parts runs once)."""
    cases: dict[str, Case] = {}
    for part in parts:
        for c in part.cases:
            cases.setdefault(c.name, c)
    ordered = sorted(cases.values(), key=lambda c: (c.group != "shape", c.L, c.lanes))
    return Suite(name, tuple(ordered), tuple(r for part in parts for r in part.rules))


def all_suites(quick: bool = False, dtype: str = "float32") -> Suite:
    """``paper`` and ``peers`` together."""
    return combine("all", peers(quick, dtype), paper(quick, dtype))


#: The GPU scoreboard's shapes (issue 17): the paper's latency case, accelerated-scan's shape at two L.
GPU_SHAPES = ((1, 256, 1024), (8, 1536, 4096), (8, 1536, 65536))
GPU_HEADLINE = (8, 1536, 4096)
QUICK_GPU_SHAPES = ((1, 256, 1024), (2, 64, 4096))


def gpu(quick: bool = False, dtype: str = "float32") -> Suite:
    """The GPU scoreboard: operands made on the GPU, checked there against a float64 oracle, every entry."""
    shapes = QUICK_GPU_SHAPES if quick else GPU_SHAPES
    cases = [Case(f"{B}x{D}x{L}", (B, D, L), dtype, group="shape", headline=(B, D, L) == GPU_HEADLINE,
                  device="cuda") for B, D, L in shapes]
    return Suite("gpu", tuple(cases), tuple((c.name, _gpu_entry) for c in cases))


def _gpu_entry(case: Case, peer: Peer) -> bool:
    """Entries that take device operands (``gpu = True``) and ScanWeaver's cuda and default entries."""
    return bool(getattr(peer, "gpu", False))


#: Suite name -> factory(quick, dtype).
SUITES: dict[str, Callable[..., Suite]] = {"paper": paper, "peers": peers, "all": all_suites, "gpu": gpu}


def get(name: str, quick: bool = False, dtype: str = "float32") -> Suite:
    """The suite ``name`` (``paper``, ``peers``, ``all`` or ``gpu``)."""
    try:
        make = SUITES[name]
    except KeyError:
        raise ScanInputError(f"bench: unknown suite {name!r}; choose one of {', '.join(SUITES)}") from None
    return make(quick, dtype)
