"""ScanWeaver.jl's delta-rule kernels, the ``julia`` rendering of :mod:`scanweaver.fused.delta_rule`.

``scanweaver.delta_rule``, ``gated_delta_rule``, ``kda`` and ``rwkv7`` with ``backend="julia"``
reach :func:`run` through :meth:`scanweaver.julia.backend.JuliaBackend.run_fused`, after
:meth:`scanweaver.fused.FusedOp.arguments` has checked every buffer against the
operation's ABI.  The buffers' addresses go to ``ScanWeaver.host_delta_rule!`` (forward)
or ``ScanWeaver.host_delta_backward!`` (backward, on ``cpu`` only): on ``cpu`` the Julia
code reads and writes them in place; on a GPU device they are copied over and back.
Importing this module imports neither juliacall nor Julia.

Example:
    >>> from scanweaver.julia.delta import BUFFERS
    >>> BUFFERS["forward"][-2:]
    ('o', 'hlast')
"""

from __future__ import annotations

from typing import cast

from ..errors import ScanInputError
from ..fused.base import FusedCall
from ..targets.fused import kernel_for
from . import fusedcall

#: The ABI buffers in the order each entry point takes them, after the sizes and ``gate``.
BUFFERS = {
    "forward": ("q", "k", "v", "g", "beta", "a", "b", "h0", "cu_seqlens", "o", "hlast"),
    "backward": ("q", "k", "v", "g", "beta", "a", "b", "h0", "cu_seqlens", "do", "dhlast",
                 "dq", "dk", "dv", "dg", "dbeta", "da", "db", "dh0"),
}


def run(call: FusedCall, arrays: dict, sizes: dict[str, int]) -> None:
    """Runs ``call.part`` of the delta rule in ScanWeaver.jl, writing its ``out`` buffers.

    Args:
        call: the operation, part, :class:`~scanweaver.fused.delta_rule.DeltaRuleFeatures` and the resolved
            ``julia`` tunables (``workgroup_size``, ``device``, ``algorithm`` and ``chunk``: ``chunked`` runs
            ScanWeaver.jl's chunked WY form of either part, either form).
        arrays: the part's ABI buffers by name, already checked (absent or disabled ones ``None``: ``beta``
            (``dbeta``) for the ``dplr`` form, ``a`` and ``b`` (``da``, ``db``) for ``delta``).
        sizes: ``batch``, ``T``, ``H``, ``Hq``, ``nseq``.

    Raises:
        ScanInputError: a dtype the device does not run (half storage among them), or a backward on a GPU
            device.
        BackendUnavailable: Julia, ScanWeaver.jl or the device's package cannot start.
    """
    f, params = call.features, call.params
    kernel = kernel_for("julia", call.op)
    why = None if kernel is None else kernel.misfit(call.part, f, params)
    if why is not None:
        raise ScanInputError(f"{fusedcall.API}: {why}; use the cpu or numpy backend")
    host = fusedcall.entry(call, f.dtype)
    head = (params["device"], f.dtype, *(sizes[n] for n in ("batch", "T", "H", "Hq", "nseq")), f.K, f.V, f.gate)
    tunables = {"workgroupsize": cast(int, params["workgroup_size"]),
                "algorithm": str(params.get("algorithm", "recurrent")), "chunk": int(params.get("chunk", 32))}
    host(*head, *fusedcall.addresses(arrays, BUFFERS[call.part]), l2norm=bool(f.l2norm), **tunables)
