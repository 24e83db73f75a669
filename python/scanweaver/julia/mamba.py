"""ScanWeaver.jl's fused Mamba-1 kernels, the ``julia`` rendering of :mod:`scanweaver.fused.mamba1`.

``scanweaver.mamba_selective_scan(..., backend="julia", device="cuda")`` reaches
:func:`run` through :meth:`scanweaver.julia.backend.JuliaBackend.run_fused`, after
:meth:`scanweaver.fused.FusedOp.arguments` has checked every buffer against the
operation's ABI.  The buffers' addresses go to ``ScanWeaver.host_mamba_scan!``
(forward) or ``ScanWeaver.host_mamba_backward!`` (backward): on ``cpu`` the Julia
kernels read and write them in place; on a GPU device they are copied over and back.
Importing this module imports neither juliacall nor Julia.

Example:
    >>> from scanweaver.julia.mamba import BUFFERS
    >>> BUFFERS["forward"][:2], BUFFERS["backward"][-1]
    (('y', 'hlast'), 'dh0')
"""

from __future__ import annotations

from ..fused.base import FusedCall
from . import fusedcall, kernels

#: Forward ABI inputs, in the order ``ScanWeaver.host_mamba_scan!`` takes them after ``y, hlast``.
INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0", "reset")

#: The ABI buffers in the order each entry point takes them, after the sizes.
BUFFERS = {
    "forward": ("y", "hlast", *INPUTS),
    "backward": (*INPUTS, "dout", "dhlast", "du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dh0"),
}


def run(call: FusedCall, arrays: dict, sizes: dict[str, int]) -> None:
    """Runs ``call.part`` of the fused Mamba-1 operation in ScanWeaver.jl, writing its ``out`` buffers.

    Args:
        call: the operation, part, :class:`~scanweaver.fused.mamba1.Mamba1Features` and the resolved
            ``julia`` tunables: ``workgroup_size``, ``chunk`` (forward: time steps per work-item;
            backward: steps between checkpoints; 0 picks from the shape) and ``device``.
        arrays: the part's ABI buffers by name, already checked (``B``/``C`` ``(dim, N)`` when
            ``groups_* == 0``, else ``(batch, G, N, L)``; ``reset`` uint8 ``(L,)``); absent ones ``None``.
        sizes: ``batch``, ``dim``, ``L``, ``groups_b``, ``groups_c``.

    Raises:
        ScanInputError: a dtype the device does not run.
        BackendUnavailable: Julia, ScanWeaver.jl or the device's package cannot start.
    """
    f, params = call.features, call.params
    host = fusedcall.entry(call, f.dtype)
    tunables = {"workgroup_size": params["workgroup_size"]}
    if params["chunk"]:
        tunables["chunk"] = params["chunk"]
    head = (params["device"], f.dtype, sizes["L"], sizes["dim"], sizes["batch"], f.N, sizes["groups_b"],
            sizes["groups_c"])
    host(*head, *fusedcall.addresses(arrays, BUFFERS[call.part]), delta_softplus=bool(f.softplus),
         **{kernels.JULIA_KEYWORDS[k]: int(v) for k, v in tunables.items()})
