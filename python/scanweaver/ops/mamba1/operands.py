"""Checked Mamba-1 operands in the kernels' layouts (:func:`prepare`), shared by every path."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...arrays import compute_dtype, contiguous, module_array, seqlens_reset
from ...errors import ScanInputError
from ...fused.mamba1 import Mamba1Features

API = "mamba_selective_scan"


def _shape_error(name: str, arr: np.ndarray, need: str, api: str = API) -> ScanInputError:
    return ScanInputError(f"{api}: {name} has shape {arr.shape}; it needs {need}")


def _groups(name: str, M: np.ndarray, batch: int, Dm: int, N: int, L: int, api: str) -> int:
    """Checks B or C; returns its group count (0 for a fixed ``(D, N)`` operand)."""
    if M.ndim == 2:
        if M.shape != (Dm, N):
            raise _shape_error(name, M, f"(D, N) = {(Dm, N)} when fixed over time", api)
        return 0
    if M.ndim == 3:
        if M.shape != (batch, N, L):
            raise _shape_error(name, M, f"(batch, N, L) = {(batch, N, L)} when it varies per time step", api)
        return 1
    if M.ndim == 4:
        if M.shape[0] != batch or M.shape[2:] != (N, L):
            raise _shape_error(name, M, f"(batch, G, N, L) = {(batch, 'G', N, L)} with groups G dividing D = {Dm}",
                               api)
        if M.shape[1] < 1 or Dm % M.shape[1]:
            raise ScanInputError(f"{api}: {name} has G = {M.shape[1]} groups (shape {M.shape}); "
                                 f"G must divide D = {Dm}")
        return M.shape[1]
    raise _shape_error(name, M, f"(D, N), (batch, N, L) or (batch, G, N, L) with batch={batch}, D={Dm}, "
                                f"N={N}, L={L}", api)


@dataclass
class MambaOperands:
    """Checked operands in the accumulation dtype and the kernels' layouts (C-contiguous, no copies
    where the input already was).

    B and C are ``(D, N)`` (fixed, ``groups_* == 0``) or ``(batch, G, N, L)``; ``reset`` is the
    ``(L,)`` uint8 mask of packed-sequence starts (from ``cu_seqlens``) or ``None``.
    """

    u: np.ndarray
    delta: np.ndarray
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    D: np.ndarray | None
    z: np.ndarray | None
    delta_bias: np.ndarray | None
    h0: np.ndarray | None
    reset: np.ndarray | None
    groups_b: int
    groups_c: int
    softplus: bool
    out_dtype: np.dtype

    @property
    def dtype(self) -> np.dtype:
        """The accumulation dtype."""
        return self.u.dtype

    @property
    def sizes(self) -> dict[str, int]:
        """The kernels' ``int`` parameters."""
        batch, dim, L = self.u.shape
        return {"batch": batch, "dim": dim, "L": L, "groups_b": self.groups_b, "groups_c": self.groups_c}

    def features(self, has_dhlast: bool = False) -> Mamba1Features:
        """The compile-time features of a kernel for these operands."""
        return Mamba1Features(self.dtype.name, self.A.shape[1], self.groups_b == 0, self.groups_c == 0,
                              self.D is not None, self.z is not None, self.delta_bias is not None, self.softplus,
                              self.h0 is not None, self.reset is not None, has_dhlast)

    def arrays(self) -> dict[str, np.ndarray | None]:
        """The input arrays by kernel parameter name."""
        return {"u": self.u, "delta": self.delta, "A": self.A, "B": self.B, "C": self.C, "D": self.D, "z": self.z,
                "delta_bias": self.delta_bias, "h0": self.h0, "reset": self.reset}


def prepare(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False, h0=None,
            cu_seqlens=None, api: str = API, xp=None) -> MambaOperands:
    """Checks shapes and dtypes (errors name the argument) and returns :class:`MambaOperands`.

    float16/bfloat16 widen to float32; mixed dtypes promote; complex A/B/C give a complex dtype
    (which only the scan path runs).  With ``xp`` (CuPy) every array is a device array of it and
    stays on the device (conversions and contiguous copies happen there).
    """
    def as_array_(api_, name, value):
        return module_array(api_, name, value, xp)

    u = as_array_(api, "u", u)
    if u.ndim != 3:
        raise _shape_error("u", u, "(batch, D, L)", api)
    batch, Dm, L = u.shape
    A = as_array_(api, "A", A)
    if A.ndim != 2 or A.shape[0] != Dm or A.shape[1] < 1:
        raise _shape_error("A", A, f"(D, N) with D = {Dm} and N >= 1", api)
    N = A.shape[1]
    B, C = as_array_(api, "B", B), as_array_(api, "C", C)
    gb, gc = _groups("B", B, batch, Dm, N, L, api), _groups("C", C, batch, Dm, N, L, api)
    named = {"delta": (delta, u.shape, "u's shape (batch, D, L)"), "D": (D, (Dm,), "(D,)"),
             "z": (z, u.shape, "u's shape (batch, D, L)"), "delta_bias": (delta_bias, (Dm,), "(D,)"),
             "h0": (h0, (batch, Dm, N), "(batch, D, N)")}
    got = {}
    for k, (v, shape, need) in named.items():
        if v is None:
            if k == "delta":
                raise ScanInputError(f"{api}: delta is required, shape {u.shape}")
            continue
        arr = as_array_(api, k, v)
        if arr.shape != shape:
            raise _shape_error(k, arr, f"{need} = {shape}", api)
        got[k] = arr
    wide = compute_dtype([u.dtype, A.dtype, B.dtype, C.dtype, *(v.dtype for v in got.values())])
    out_dtype = u.dtype if wide.kind != "c" else wide

    def conv(x):
        return None if x is None else contiguous(x, wide, xp)

    reset = None
    if cu_seqlens is not None:
        mask = seqlens_reset(api, cu_seqlens, L)
        reset = (mask.astype(np.uint8) if xp is None else xp.asarray(mask.astype(np.uint8))) if mask.any() else None
    Bk = B if gb == 0 else B.reshape(batch, gb, N, L)
    Ck = C if gc == 0 else C.reshape(batch, gc, N, L)
    return MambaOperands(conv(u), conv(got["delta"]), conv(A), conv(Bk), conv(Ck), conv(got.get("D")),
                         conv(got.get("z")), conv(got.get("delta_bias")), conv(got.get("h0")), reset, gb, gc,
                         bool(delta_softplus), out_dtype)
