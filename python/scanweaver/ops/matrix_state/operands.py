"""Checked operands of the matrix-state scan (:class:`MatrixOperands`), shared by every named operation.

Each named operation maps its own arguments onto the operands of the fused
operation :mod:`scanweaver.fused.matrix_state` (q, k, v, g, u, h0, cu_seqlens)
and checks them here first, so that every bad input is reported with the
name the caller used, its shape or dtype and what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...arrays import check_seqlens, contiguous, is_real_operand, module_array, real_compute_dtype, returned_dtype
from ...checks import check_state_axes
from ...errors import ScanInputError
from ...fused.matrix_state import MatrixStateFeatures


def shape_error(api: str, name: str, arr, need: str) -> ScanInputError:
    """The error for argument ``name`` of shape ``arr.shape`` that needs ``need``."""
    return ScanInputError(f"{api}: {name} has shape {tuple(np.shape(arr))}; it needs {need}")


def array(api: str, name: str, value, ndim: int, need: str, real: bool = True, xp=None) -> np.ndarray:
    """``value`` as an array of ``ndim`` dimensions (real floating point with ``real``): a NumPy array, or with
    ``xp`` (a device array module) one of its arrays, left where it is."""
    arr = module_array(api, name, value, xp)
    if arr.ndim != ndim:
        raise shape_error(api, name, arr, need)
    if real and not is_real_operand(arr.dtype):
        raise ScanInputError(f"{api}: {name} has dtype {arr.dtype}; it needs a real floating-point dtype "
                             "(float16, bfloat16, float32 or float64)")
    return arr


def check_shape(api: str, name: str, arr: np.ndarray, shape: tuple, need: str) -> None:
    """Raises when ``arr`` is not of ``shape``."""
    if tuple(arr.shape) != tuple(shape):
        raise shape_error(api, name, arr, f"{need} = {tuple(shape)}")


def seqlens(api: str, cu_seqlens, batch: int, T: int, name: str = "cu_seqlens") -> np.ndarray | None:
    """Checked ``cu_seqlens`` (:func:`scanweaver.arrays.check_seqlens`; batch must be 1), or None."""
    return None if cu_seqlens is None else check_seqlens(api, cu_seqlens, T, batch, name)


@dataclass
class MatrixOperands:
    """The fused operation's operands: checked, C-contiguous, in the accumulation dtype.

    ``g`` is ``(batch, T, H)`` (``decay="scalar"``), ``(batch, T, H, K)`` (``key``) or None;
    ``u`` the RWKV-6 bonus or None; ``h0`` ``(nseq, H, K, V)`` or None; ``cu_seqlens``
    int64 offsets or None.  ``out_dtype`` is the dtype outputs are returned in.  ``xp`` is the
    arrays' module: NumPy, or a device module (CuPy) whose arrays stay on the device (``cu_seqlens``
    then is the device copy of ``offsets``, the checked host offsets).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray | None
    u: np.ndarray | None
    h0: np.ndarray | None
    cu_seqlens: np.ndarray | None
    decay: str
    readout: str
    reverse: bool
    out_dtype: np.dtype
    xp: Any = np
    offsets: np.ndarray | None = None

    @property
    def dtype(self) -> np.dtype:
        """The accumulation dtype."""
        return self.v.dtype

    @property
    def nseq(self) -> int:
        """Rows of the initial and final states."""
        return self.v.shape[0] if self.cu_seqlens is None else self.cu_seqlens.shape[0] - 1

    @property
    def sizes(self) -> dict[str, int]:
        """The kernels' ``int`` parameters."""
        batch, T, H, _ = self.v.shape
        return {"batch": batch, "T": T, "H": H, "Hq": self.q.shape[2], "nseq": self.nseq}

    @property
    def state_shape(self) -> tuple[int, int, int, int]:
        """``(nseq, H, K, V)``."""
        return (self.nseq, self.v.shape[2], self.q.shape[3], self.v.shape[3])

    def features(self, has_dhlast: bool = False) -> MatrixStateFeatures:
        """The compile-time features of a kernel for these operands."""
        return MatrixStateFeatures(self.dtype.name, self.q.shape[3], self.v.shape[3], self.decay, self.readout,
                                   self.reverse, self.h0 is not None, self.cu_seqlens is not None, has_dhlast)

    def arrays(self) -> dict[str, np.ndarray | None]:
        """The input arrays by kernel parameter name."""
        return {"q": self.q, "k": self.k, "v": self.v, "g": self.g, "u": self.u, "h0": self.h0,
                "cu_seqlens": self.cu_seqlens}


def operands(api: str, q, k, v, g=None, *, decay: str, readout: str = "after", u=None, h0=None, cu_seqlens=None,
             reverse: bool = False, names: dict[str, str] | None = None, out_dtype=None, xp=None) -> MatrixOperands:
    """Checks the fused operation's operands and returns :class:`MatrixOperands`.

    Args:
        api: the public call's name (errors start with it).
        q, k: ``(batch, T, Hq, K)``; v: ``(batch, T, H, V)`` with ``H % Hq == 0``.
        g: log decays ``(batch, T, H)`` (``decay="scalar"``) or ``(batch, T, H, K)`` (``key``).
        names: the caller's names of q, k, v, g, u, h0, cu_seqlens for the messages (e.g. ``{"q": "C"}``).
        out_dtype: the dtype of the outputs (default: the inputs' common dtype).
        xp: ``None`` for NumPy arrays (anything ``numpy.asarray`` reads); a device array module (CuPy) for
            its arrays, which are checked and converted on the device (``cu_seqlens``, host offsets, is
            checked on the host and copied to the device).
    """
    nm = {"q": "q", "k": "k", "v": "v", "g": "g", "u": "u", "h0": "initial_state", "cu_seqlens": "cu_seqlens",
          **(names or {})}
    q = array(api, nm["q"], q, 4, "(batch, T, H, K)", xp=xp)
    batch, T, Hq, K = q.shape
    k = array(api, nm["k"], k, 4, f"q's shape {q.shape}", xp=xp)
    check_shape(api, nm["k"], k, q.shape, f"the shape of {nm['q']}")
    v = array(api, nm["v"], v, 4, f"(batch, T, H, V) = ({batch}, {T}, H, V)", xp=xp)
    if v.shape[:2] != (batch, T):
        raise shape_error(api, nm["v"], v, f"(batch, T, H, V) with (batch, T) = {(batch, T)} as {nm['q']}")
    H, V = v.shape[2:]
    check_state_axes(api, (nm["q"], q), (nm["v"], v))
    if Hq < 1 or H % Hq:
        raise ScanInputError(f"{api}: {nm['v']} has {H} heads and {nm['q']}/{nm['k']} {Hq} (shapes {v.shape}, "
                             f"{q.shape}); the heads of {nm['q']}/{nm['k']} must divide those of {nm['v']} "
                             "(and be at least 1)")
    cs = seqlens(api, cu_seqlens, batch, T, nm["cu_seqlens"])
    nseq = batch if cs is None else len(cs) - 1
    got = []
    if decay != "none":
        gshape = (batch, T, H) if decay == "scalar" else (batch, T, H, K)
        g = array(api, nm["g"], g, len(gshape), str(gshape), xp=xp)
        check_shape(api, nm["g"], g, gshape, "(batch, T, H)" if decay == "scalar" else "(batch, T, H, K)")
        got.append(g)
    if readout == "bonus":
        u = array(api, nm["u"], u, 2, f"(H, K) = {(H, K)}", xp=xp)
        check_shape(api, nm["u"], u, (H, K), "(H, K)")
        got.append(u)
    if h0 is not None:
        h0 = array(api, nm["h0"], h0, 4, f"(N, H, K, V) = {(nseq, H, K, V)}", xp=xp)
        check_shape(api, nm["h0"], h0, (nseq, H, K, V), "(N, H, K, V)")
        got.append(h0)
    wide = real_compute_dtype([q.dtype, k.dtype, v.dtype, *(x.dtype for x in got)])

    def conv(x):
        return None if x is None else contiguous(x, wide, xp)

    dev_cs = cs if cs is None or xp is None else xp.asarray(cs)
    out = np.dtype(out_dtype) if out_dtype is not None else returned_dtype(v.dtype, wide)
    return MatrixOperands(conv(q), conv(k), conv(v), conv(g) if decay != "none" else None,
                          conv(u) if readout == "bonus" else None, conv(h0), dev_cs, decay, readout, bool(reverse), out,
                          np if xp is None else xp, cs)
