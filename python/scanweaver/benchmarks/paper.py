"""The first paper's figure 4 numbers at L = 1024, and our matching rows.

The paper (section 6.3) reports, at L = 1024: ScanWeaver Blelloch 0.032 ms,
naive CUDA sequential 0.469 ms, PyTorch sequential loop 51.7 ms.  They were
measured on an NVIDIA GPU through CUDA; the paper names neither the GPU model
nor the batch and width used, so only the order of magnitude compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .harness import Run

PAPER_HARDWARE = "NVIDIA GPU via CUDA (model, B and D not stated in the paper)"
PAPER_L = 1024


@dataclass(frozen=True)
class PaperFigure:
    """One of the paper's L = 1024 latencies and which of our entries it is set beside."""

    entry: str
    paper_ms: float | None
    matches: tuple[str, ...]


#: Paper rows; ``matches`` are entry-name patterns (``*`` any backend).
FIGURES = (
    PaperFigure("PyTorch sequential loop", 51.7, ("torch-loop",)),
    PaperFigure("naive sequential kernel", 0.469, ("scanweaver:*:sequential",)),
    PaperFigure("Blelloch kernel", 0.032, ("scanweaver:*:blelloch",)),
    PaperFigure("tuned best (default path)", None, ("scanweaver:*:auto",)),
)


def _match(pattern: str, name: str) -> bool:
    pre, star, post = pattern.partition("*")
    if not star:
        return name == pattern
    return name.startswith(pre) and name.endswith(post)


def paper_rows(run: Run) -> list[dict]:
    """Rows of the L = 1024 comparison (empty when the run has no L = 1024 sweep case)."""
    case = next((c for c in run.cases if c.group == "sweep" and c.L == PAPER_L), None)
    if case is None:
        return []
    rows = []
    for fig in FIGURES:
        for r in run.results:
            if r.case == case.name and any(_match(p, r.entry) for p in fig.matches):
                rows.append({"entry": f"{fig.entry}: {r.label}", "paper_ms": fig.paper_ms,
                             "paper_hardware": PAPER_HARDWARE, "here_s": r.median_s if r.status == "ok" else None,
                             "here_status": r.status, "here_device": r.device or r.reason,
                             "shape": list(case.shape)})
    return rows
