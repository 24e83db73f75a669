"""The ``julia`` family of fused operations: ScanWeaver.jl's fused kernels.

The kernels live in the Julia package (``src/mamba/``, ``src/matrix/``); each part's entry
point takes the ABI's buffers by address and is called by
:class:`scanweaver.julia.backend.JuliaBackend` (its ``RUNNERS``).  There is no source to
render here: a rendering is its entry points.  The delta rule's run on float32 and float64
storage, its backward on ``device="cpu"`` (elsewhere a backward runs on the best backend
that has one, and says so).

Example:
    >>> from scanweaver.targets.fused import kernel_for
    >>> kernel_for("julia", "matrix_state").entry("backward")
    'ScanWeaver.host_matrix_backward!'
"""

from __future__ import annotations

from ..fused.base import PARTS
from .fused import KERNELS, FusedKernel


def _entries(forward: str, backward: str):
    names = {"forward": forward, "backward": backward}
    return lambda part: f"ScanWeaver.{names[part]}"


def _delta_fits(part: str, features, config: dict | None = None) -> str | None:
    """Why ScanWeaver.jl cannot run the delta rule's ``part`` with ``features`` (and ``config``), else ``None``:
    half storage, and a backward on a device other than the CPU."""
    if features.dtype not in ("float32", "float64"):
        return f"ScanWeaver.jl's delta rule stores float32 or float64, not {features.dtype}"
    if part == "backward" and config is not None and config.get("device", "cpu") != "cpu":
        return f"ScanWeaver.jl's delta-rule backward runs on device 'cpu', not {config['device']!r}"
    return None


KERNELS.register(FusedKernel("mamba1", "julia", PARTS, entry=_entries("host_mamba_scan!", "host_mamba_backward!")))
KERNELS.register(FusedKernel("matrix_state", "julia", PARTS,
                             entry=_entries("host_matrix_state!", "host_matrix_backward!")))
KERNELS.register(FusedKernel("delta_rule", "julia", PARTS,
                             entry=_entries("host_delta_rule!", "host_delta_backward!"), fits=_delta_fits))
