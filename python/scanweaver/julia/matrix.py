"""ScanWeaver.jl's matrix-state kernels, the ``julia`` rendering of :mod:`scanweaver.fused.matrix_state`.

``scanweaver.linear_attention``, ``rwkv6`` and ``mamba2_scan`` with ``backend="julia"``
reach :func:`run` through :meth:`scanweaver.julia.backend.JuliaBackend.run_fused`, after
:meth:`scanweaver.fused.FusedOp.arguments` has checked every buffer against the
operation's ABI.  The buffers' addresses go to ``ScanWeaver.host_matrix_state!``
(forward) or ``ScanWeaver.host_matrix_backward!`` (backward): on ``cpu`` the Julia
code reads and writes them in place; on a GPU device they are copied over and back.
Importing this module imports neither juliacall nor Julia.

Example:
    >>> from scanweaver.julia.matrix import BUFFERS
    >>> BUFFERS["forward"][-2:]
    ('o', 'hlast')
"""

from __future__ import annotations

from ..fused.base import FusedCall
from . import fusedcall

#: The ABI buffers in the order each entry point takes them, after the sizes and ``decay``.
BUFFERS = {
    "forward": ("q", "k", "v", "g", "u", "h0", "cu_seqlens", "o", "hlast"),
    "backward": ("q", "k", "v", "g", "u", "h0", "cu_seqlens", "do", "dhlast", "dq", "dk", "dv", "dg", "du", "dh0"),
}


def run(call: FusedCall, arrays: dict, sizes: dict[str, int]) -> None:
    """Runs ``call.part`` of the matrix-state operation in ScanWeaver.jl, writing its ``out`` buffers.

    Args:
        call: the operation, part, :class:`~scanweaver.fused.matrix_state.MatrixStateFeatures` and
            the resolved ``julia`` tunables (``workgroup_size``, ``device``, ``algorithm`` and ``chunk``:
            ``chunked`` runs ScanWeaver.jl's chunked form of the part).
        arrays: the part's ABI buffers by name, already checked (absent or disabled ones ``None``).
        sizes: ``batch``, ``T``, ``H``, ``Hq``, ``nseq``.

    Raises:
        ScanInputError: a dtype the device does not run.
        BackendUnavailable: Julia, ScanWeaver.jl or the device's package cannot start.
    """
    f, params = call.features, call.params
    host = fusedcall.entry(call, f.dtype)
    head = (params["device"], f.dtype, *(sizes[n] for n in ("batch", "T", "H", "Hq", "nseq")), f.K, f.V, f.decay)
    host(*head, *fusedcall.addresses(arrays, BUFFERS[call.part]), reverse=bool(f.reverse),
         workgroupsize=int(params["workgroup_size"]), algorithm=str(params["algorithm"]), chunk=int(params["chunk"]))
