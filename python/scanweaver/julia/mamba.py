"""ScanWeaver.jl's fused Mamba-1 forward, the ``julia`` rendering of :mod:`scanweaver.fused.mamba1`.

``scanweaver.mamba_selective_scan(..., backend="julia", device="cuda")`` reaches
:func:`run_forward` through :meth:`scanweaver.julia.backend.JuliaBackend.run_fused`,
after :meth:`scanweaver.fused.FusedOp.arguments` has checked every buffer against
the operation's ABI.  The buffers' addresses go to ``ScanWeaver.host_mamba_scan!``:
on ``cpu`` the Julia kernels read and write them in place; on a GPU device they are
copied over and back.  Importing this module imports neither juliacall nor Julia.
"""

from __future__ import annotations

import numpy as np

from ..errors import ScanInputError
from . import devices, kernels, session

API = "julia backend"

#: Forward ABI inputs, in the order ``ScanWeaver.host_mamba_scan!`` takes them after ``y, hlast``.
INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")


def _address(arr: np.ndarray | None) -> int:
    return 0 if arr is None else int(arr.ctypes.data)


def run_forward(device: str, arrays: dict, sizes: dict[str, int], softplus: bool = False,
                **tunables: int) -> None:
    """Runs the fused Mamba-1 forward of ScanWeaver.jl on ``device``, writing ``arrays["y"]`` (and ``hlast``).

    Args:
        device: ``cpu``, ``cuda``, ``amdgpu``, ``oneapi`` or ``metal``.
        arrays: the forward ABI's buffers by name, already checked (C-contiguous, the ABI's
            shapes and dtypes; ``B``/``C`` ``(dim, N)`` when ``groups_* == 0``, else
            ``(batch, G, N, L)``; ``reset`` uint8 ``(L,)``); absent ones ``None``.
        sizes: ``batch``, ``dim``, ``L``, ``groups_b``, ``groups_c``.
        softplus: ``delta_softplus``.
        **tunables: ``workgroup_size`` and ``chunk`` (time steps per work-item) of the Julia kernels.

    Raises:
        ScanInputError: a dtype the device does not run.
        BackendUnavailable: Julia, ScanWeaver.jl or the device's package cannot start.
    """
    dtype = np.dtype(arrays["u"].dtype).name
    devices.activate(device)
    if dtype not in devices.runtime_dtypes(device):
        raise ScanInputError(f"{API}: device={device!r} runs {', '.join(devices.runtime_dtypes(device))}, "
                             f"not {dtype}")
    N = arrays["A"].shape[1]
    host = session.function("ScanWeaver.host_mamba_scan!")
    host(device, dtype, sizes["L"], sizes["dim"], sizes["batch"], N, sizes["groups_b"], sizes["groups_c"],
         _address(arrays["y"]), _address(arrays.get("hlast")), *(_address(arrays.get(n)) for n in INPUTS),
         _address(arrays.get("reset")), delta_softplus=bool(softplus),
         **{kernels.JULIA_KEYWORDS[k]: int(v) for k, v in tunables.items()})
