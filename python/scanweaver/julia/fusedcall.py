"""What every ``julia`` rendering of a fused operation shares: the entry point of a part, by address.

Each operation's module here (:mod:`.mamba`, :mod:`.matrix`) has a ``run(call, arrays, sizes)``
and :data:`RUNNERS` (in :mod:`.backend`) maps the operation's name to it; the Julia entry points
are those ``scanweaver.targets.fused_julia`` registers per part.  Importing this module imports
neither juliacall nor Julia.

Example:
    >>> import numpy as np
    >>> from scanweaver.julia.fusedcall import addresses
    >>> a = np.zeros(3)
    >>> addresses({"a": a, "b": None}, ("b", "a")) == [0, a.ctypes.data]
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import ScanInputError
from ..fused.base import FusedCall
from ..targets.fused import kernel_for
from . import devices, session

API = "julia backend"


def address(arr: np.ndarray | None) -> int:
    """The buffer's address, ``0`` for an absent one."""
    return 0 if arr is None else int(arr.ctypes.data)


def addresses(arrays: dict, names: Iterable[str]) -> list[int]:
    """The addresses of ``arrays[name]`` for each name, ``0`` where absent."""
    return [address(arrays.get(n)) for n in names]


def entry(call: FusedCall, dtype: str) -> Callable[..., Any]:
    """The Julia entry point of ``call``'s part, with the device it names started.

    Raises:
        ScanInputError: the device does not run ``dtype``.
        BackendUnavailable: Julia, ScanWeaver.jl or the device's package cannot start.
    """
    device = call.params["device"]
    devices.activate(device)
    runs = devices.runtime_dtypes(device)
    if dtype not in runs:
        raise ScanInputError(f"{API}: device={device!r} runs {', '.join(runs)}, not {dtype}")
    kernel = kernel_for("julia", call.op)
    if kernel is None or kernel.entry is None or call.part not in kernel.parts:
        raise ScanInputError(f"{API}: ScanWeaver.jl has no {call.op} {call.part} kernel")
    return session.function(kernel.entry(call.part))
