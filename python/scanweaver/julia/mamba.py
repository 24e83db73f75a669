"""ScanWeaver.jl's fused Mamba-1 scan from Python: the ``julia`` rendering of ``mamba1``'s forward.

:func:`run_forward` takes the arrays of the fused operation's forward ABI
(``u, delta, A, B, C`` and the optional ``D, z, delta_bias, h0, reset``, outputs
``y`` and ``hlast``; sizes ``batch, dim, L, groups_b, groups_c``) as NumPy
buffers and hands their addresses to ``ScanWeaver.host_mamba_scan!``: on
``cpu`` the Julia kernels read and write them in place; on a GPU device they
are copied over and back.  :func:`mamba_selective_scan` is the same with the
``scanweaver.mamba_selective_scan`` signature, for calling the Julia kernel
directly.  Importing this module imports neither juliacall nor Julia.
"""

from __future__ import annotations

import numpy as np

from ..arrays import seqlens_reset
from ..errors import ScanInputError
from . import devices, kernels, session

API = "julia mamba_selective_scan"

#: Forward ABI inputs, in the order of ``ScanWeaver.host_mamba_scan!`` after ``y, hlast``.
INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")


def _shapes(sizes: dict[str, int], N: int) -> dict[str, tuple[int, ...]]:
    b, d, L = sizes["batch"], sizes["dim"], sizes["L"]
    seq, state = (b, d, L), (b, d, N)

    def bc(groups: int) -> tuple[int, ...]:
        return (d, N) if groups == 0 else (b, groups, N, L)

    return {"u": seq, "delta": seq, "A": (d, N), "B": bc(sizes["groups_b"]), "C": bc(sizes["groups_c"]),
            "D": (d,), "z": seq, "delta_bias": (d,), "h0": state, "reset": (L,), "y": seq, "hlast": state}


def _checked(arrays: dict, sizes: dict[str, int]) -> tuple[str, int]:
    """``(dtype, N)`` after checking every buffer's shape, dtype and layout (before Julia starts)."""
    A = arrays.get("A")
    if A is None or A.ndim != 2:
        raise ScanInputError(f"{API}: A must be a (dim, N) array, got {None if A is None else A.shape}")
    N = A.shape[1]
    dtype = np.dtype(arrays["u"].dtype)
    if dtype.name not in ("float32", "float64"):
        raise ScanInputError(f"{API}: u has dtype {dtype}; the Julia kernel runs float32 or float64")
    for name, shape in _shapes(sizes, N).items():
        arr = arrays.get(name)
        if arr is None:
            if name in ("u", "delta", "A", "B", "C", "y"):
                raise ScanInputError(f"{API}: {name} is required")
            continue
        want = np.uint8 if name == "reset" else dtype
        if arr.shape != shape or arr.dtype != want or not arr.flags.c_contiguous:
            raise ScanInputError(f"{API}: {name} is {arr.dtype} of shape {arr.shape} "
                                 f"(C-contiguous: {arr.flags.c_contiguous}); it needs a C-contiguous "
                                 f"{np.dtype(want)} array of shape {shape}")
    return dtype.name, N


def _address(arr: np.ndarray | None) -> int:
    return 0 if arr is None else int(arr.ctypes.data)


def run_forward(device: str, arrays: dict, sizes: dict[str, int], softplus: bool = False,
                **tunables: int) -> None:
    """Runs the fused Mamba-1 forward of ScanWeaver.jl on ``device``, writing ``arrays["y"]`` (and ``hlast``).

    Args:
        device: ``cpu``, ``cuda``, ``amdgpu``, ``oneapi`` or ``metal``.
        arrays: the forward ABI's buffers by name (``B``/``C`` as ``(dim, N)`` when
            ``groups_* == 0``, else ``(batch, G, N, L)``; ``reset`` uint8 ``(L,)``); absent ones ``None``.
        sizes: ``batch``, ``dim``, ``L``, ``groups_b``, ``groups_c``.
        softplus: ``delta_softplus``.
        **tunables: ``workgroup_size`` and ``chunk`` (time steps per work-item) of the Julia kernels.

    Raises:
        ScanInputError: a buffer of the wrong shape, dtype or layout, or a dtype the device lacks.
        BackendUnavailable: Julia, ScanWeaver.jl or the device's package cannot start.
    """
    dtype, N = _checked(arrays, sizes)
    unknown = sorted(set(tunables) - {"workgroup_size", "chunk"})
    if unknown:
        raise ScanInputError(f"{API}: unknown tunable(s) {', '.join(unknown)}; the Julia kernel takes "
                             "workgroup_size and chunk")
    devices.activate(device)
    if dtype not in devices.runtime_dtypes(device):
        raise ScanInputError(f"{API}: device={device!r} runs {', '.join(devices.runtime_dtypes(device))}, not {dtype}")
    host = session.main().seval("ScanWeaver.host_mamba_scan!")
    host(device, dtype, sizes["L"], sizes["dim"], sizes["batch"], N, sizes["groups_b"], sizes["groups_c"],
         _address(arrays["y"]), _address(arrays.get("hlast")), *(_address(arrays.get(n)) for n in INPUTS),
         _address(arrays.get("reset")), delta_softplus=bool(softplus),
         **{kernels.JULIA_KEYWORDS[k]: int(v) for k, v in tunables.items()})


def _groups(M: np.ndarray, batch: int, N: int, L: int) -> tuple[np.ndarray, int]:
    """B or C in the ABI layout and its group count (0 for fixed)."""
    if M.ndim == 2:
        return M, 0
    if M.ndim == 3:
        return M.reshape(batch, 1, N, L), 1
    return M, M.shape[1]


def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                         h0=None, return_state: bool = False, *, cu_seqlens=None, device: str = "cpu",
                         **tunables: int):
    """The fused Mamba-1 scan of ScanWeaver.jl, with ``scanweaver.mamba_selective_scan``'s signature and layouts.

    Operands are cast to the wider of float32 and ``u``'s dtype; B and C may be fixed ``(D, N)``,
    per step ``(batch, N, L)`` or grouped ``(batch, G, N, L)``.

    Returns:
        ``y (batch, D, L)``, or ``(y, state (batch, D, N))`` with ``return_state``.

    Example:
        >>> import numpy as np
        >>> from scanweaver.julia.mamba import mamba_selective_scan
        >>> u = np.ones((1, 2, 3))
        >>> try:
        ...     mamba_selective_scan(u, u, -np.ones((2, 4)), np.ones((1, 4, 3)), np.ones((1, 4, 3)))
        ... except Exception as exc:   # without Julia: BackendUnavailable, within a second
        ...     print(type(exc).__name__)
        BackendUnavailable
    """
    u = np.asarray(u)
    if u.ndim != 3:
        raise ScanInputError(f"{API}: u has shape {u.shape}; it needs (batch, D, L)")
    dtype = np.float64 if u.dtype == np.float64 else np.float32
    batch, dim, L = u.shape
    A = np.ascontiguousarray(A, dtype)
    if A.ndim != 2:
        raise ScanInputError(f"{API}: A has shape {A.shape}; it needs (D, N)")
    N = A.shape[1]

    def dense(x):
        return None if x is None else np.ascontiguousarray(x, dtype)

    Bm, gb = _groups(dense(B), batch, N, L)
    Cm, gc = _groups(dense(C), batch, N, L)
    reset = None if cu_seqlens is None else seqlens_reset(API, cu_seqlens, L).astype(np.uint8)
    arrays = {"u": dense(u), "delta": dense(delta), "A": A, "B": Bm, "C": Cm, "D": dense(D), "z": dense(z),
              "delta_bias": dense(delta_bias), "h0": dense(h0), "reset": reset,
              "y": np.empty((batch, dim, L), dtype), "hlast": np.empty((batch, dim, N), dtype)}
    run_forward(device, arrays, {"batch": batch, "dim": dim, "L": L, "groups_b": gb, "groups_c": gc},
                delta_softplus, **tunables)
    return (arrays["y"], arrays["hlast"]) if return_state else arrays["y"]
