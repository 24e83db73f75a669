"""Checked operands of the delta-rule family (:class:`DeltaOperands`), shared by every named operation.

Each named operation (``delta_rule``, ``gated_delta_rule``, ``kda``, ``rwkv7``)
maps its arguments onto the operands of the fused operation
:mod:`scanweaver.fused.delta_rule` and checks them here first, so that every
bad input is reported with the caller's name for it, its shape or dtype and
what it needs.  Shapes are named as flash-linear-attention names them: ``H``
the heads of q and k, ``HV`` those of v and of the state (``HV`` a multiple of
``H``: value head i reads q/k head ``i // (HV // H)``).

Dtypes: float32 and float64 are stored and accumulated as given; float16 and
bfloat16 operands (all of one of them) are stored as such and accumulated in
float32, with float32 states; any other mixture computes in the widest float
type (integer operands are refused before, naming their conversion).  ``o``
comes back in v's dtype.

Example:
    >>> import numpy as np
    >>> from scanweaver.ops.delta_rule.operands import operands
    >>> q = np.ones((1, 3, 1, 4), np.float16)
    >>> ops = operands("demo", "gated_delta_rule", q, q, np.ones((1, 3, 2, 5), np.float16),
    ...                g=-np.ones((1, 3, 2), np.float16), beta=np.ones((1, 3, 2), np.float16))
    >>> ops.dtype.name, ops.state_dtype.name, ops.state_shape
    ('float16', 'float32', (1, 2, 4, 5))
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...arrays import contiguous, is_half, is_real_operand, module_array, real_compute_dtype, returned_dtype
from ...checks import check_seqlens, check_state_axes, state_layout
from ...errors import ScanInputError
from ...fused.delta_rule import DeltaRuleFeatures

#: Named operation -> (gate, form) of the fused operation.
FAMILIES = {"delta_rule": ("none", "delta"), "gated_delta_rule": ("scalar", "delta"), "kda": ("key", "delta"),
            "rwkv7": ("key", "dplr")}
#: The dtypes stored as given (float16 and bfloat16 with float32 accumulation).
STORED = ("float16", "bfloat16", "float32", "float64")


def array(api: str, name: str, value, ndim: int, need: str, xp=None) -> np.ndarray:
    """``value`` as a real array of ``ndim`` dimensions, else :class:`ScanInputError` naming ``name``: a NumPy
    array, or with ``xp`` (a device array module) one of its arrays, left where it is."""
    if value is None:
        raise ScanInputError(f"{api}: {name} is required, shaped {need}")
    arr = module_array(api, name, value, xp)
    if arr.ndim != ndim:
        raise ScanInputError(f"{api}: {name} has shape {tuple(arr.shape)}; it needs {need}")
    if not is_real_operand(arr.dtype):
        raise ScanInputError(f"{api}: {name} has dtype {arr.dtype}; it needs a real floating-point dtype "
                             "(float16, bfloat16, float32 or float64)")
    return arr


def _check_value_heads(api: str, nm: dict[str, str], per_head: dict, qshape: tuple, vshape: tuple,
                       gate: str) -> None:
    """Raises when v has more heads than q/k and every operand taken per value head (g, beta; a, b) has q/k's
    heads: v is then the one that disagrees (a grouped v needs those operands per value head), and the message
    names it, with both ways to agree."""
    B, T, H, K = qshape
    HV = vshape[2]
    given = {n: x for n, x in per_head.items() if x is not None}
    if HV == H or not given:
        return
    shapes = {n: tuple(getattr(x, "shape", np.shape(x))) for n, x in given.items()}
    if not all(s[:3] == (B, T, H) for s in shapes.values()):
        return
    def listing(names: list[str]) -> str:
        return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)

    wide = [n for n in given if n in ("a", "b") or (n == "g" and gate == "key")]
    groups = [(wide, "(B, T, HV, K)", (B, T, HV, K)), ([n for n in given if n not in wide], "(B, T, HV)", (B, T, HV))]
    needs = " and ".join(f"{listing([nm[n] for n in ns])} {layout} = {shape}" for ns, layout, shape in groups if ns)
    qk = f"{nm['q']}/{nm['k']}"
    raise ScanInputError(f"{api}: {nm['v']} has {HV} heads and {qk} {H} (shapes {tuple(vshape)}, {tuple(qshape)}), "
                         f"and {listing([nm[n] for n in given])} {'have' if len(given) > 1 else 'has'} the heads of "
                         f"{qk}; pass {nm['v']} with the heads of {qk} (H = {H}), or for grouped value heads (HV a "
                         f"multiple of H: value head i reads {qk} head i // (HV // H)) {needs}")


def check_shape(api: str, name: str, arr: np.ndarray, shape: tuple, need: str) -> None:
    """Raises when ``arr`` is not of ``shape`` (``need`` names the layout, e.g. ``(B, T, HV)``)."""
    if tuple(arr.shape) != tuple(shape):
        raise ScanInputError(f"{api}: {name} has shape {tuple(arr.shape)}; it needs {need} = {tuple(shape)}")


@functools.lru_cache(maxsize=64)
def _stored(dtype: np.dtype) -> bool:
    return dtype.name in STORED


def storage_dtype(dtypes) -> np.dtype:
    """The dtype the operands are stored in: their common dtype when it is one of :data:`STORED`, else the widest
    float type of the (floating) operands."""
    dtypes = [np.dtype(d) for d in dtypes]
    if all(d == dtypes[0] for d in dtypes) and _stored(dtypes[0]):
        return dtypes[0]
    return real_compute_dtype(dtypes)


@functools.lru_cache(maxsize=64)
def accumulation(dtype: np.dtype) -> np.dtype:
    """The accumulation (and state) dtype of operands stored in ``dtype``."""
    return np.dtype(np.float32) if is_half(dtype) else np.dtype(dtype)


@dataclass
class DeltaOperands:
    """The fused operation's operands: checked, C-contiguous, in the storage dtype (states in the accumulation's).

    ``g`` is ``(B, T, HV)`` (gate ``scalar``), ``(B, T, HV, K)`` (``key``) or None; ``beta`` (form ``delta``)
    ``(B, T, HV)``; ``a``, ``b`` (form ``dplr``) ``(B, T, HV, K)``; ``h0`` ``(nseq, HV, K, V)`` or None.
    ``xp`` is the arrays' module: NumPy, or a device module (CuPy) whose arrays stay on the device
    (``cu_seqlens`` then is the device copy of ``offsets``, the checked host offsets).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray | None
    beta: np.ndarray | None
    a: np.ndarray | None
    b: np.ndarray | None
    h0: np.ndarray | None
    cu_seqlens: np.ndarray | None
    gate: str
    form: str
    l2norm: bool
    out_dtype: np.dtype
    xp: Any = np
    offsets: np.ndarray | None = None

    @property
    def dtype(self) -> np.dtype:
        """The storage dtype."""
        return self.v.dtype

    @property
    def state_dtype(self) -> np.dtype:
        """The accumulation dtype (of the states and their gradients)."""
        return accumulation(self.dtype)

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
        """``(nseq, HV, K, V)``."""
        return (self.nseq, self.v.shape[2], self.q.shape[3], self.v.shape[3])

    def features(self, has_dhlast: bool = False) -> DeltaRuleFeatures:
        """The compile-time features of a kernel for these operands."""
        return DeltaRuleFeatures(self.dtype.name, self.q.shape[3], self.v.shape[3], self.h0 is not None,
                                 self.cu_seqlens is not None, has_dhlast, self.gate, self.form, self.l2norm)

    def arrays(self) -> dict[str, np.ndarray | None]:
        """The input arrays by kernel parameter name."""
        return {"q": self.q, "k": self.k, "v": self.v, "g": self.g, "beta": self.beta, "a": self.a, "b": self.b,
                "h0": self.h0, "cu_seqlens": self.cu_seqlens}


def operands(api: str, family: str, q, k, v, *, g=None, beta=None, a=None, b=None, h0=None, cu_seqlens=None,
             l2norm: bool = False, state_v_first: bool = False, names: dict[str, str] | None = None,
             xp=None) -> DeltaOperands:
    """Checks the operands of one call of ``family`` (a key of :data:`FAMILIES`) and returns :class:`DeltaOperands`.

    Args:
        api: the public call's name (errors start with it).
        q, k: ``(B, T, H, K)``.  v: ``(B, T, HV, V)`` with ``HV % H == 0``.
        g: log decays ``(B, T, HV)`` (gated_delta_rule) or ``(B, T, HV, K)`` (kda, rwkv7).
        beta: ``(B, T, HV)`` (delta form).  a, b: ``(B, T, HV, K)`` (rwkv7).
        h0: ``(N, HV, K, V)``, N = B or the sequences of ``cu_seqlens``; ``(N, HV, V, K)`` with
            ``state_v_first`` (checked in that layout, then taken as its transpose).
        cu_seqlens: ``[0, ..., T]`` offsets of sequences packed along T (B = 1).
        names: the caller's names of q, g, h0, cu_seqlens for the messages (``{"q": "r", "g": "w"}``).
        xp: ``None`` for NumPy arrays (anything ``numpy.asarray`` reads); a device array module (CuPy) for its
            arrays, checked and converted on the device (``cu_seqlens``, host offsets, is checked on the host
            and its checked copy uploaded).
    """
    gate, form = FAMILIES[family]
    nm = {"q": "q", "k": "k", "v": "v", "g": "g", "beta": "beta", "a": "a", "b": "b", "h0": "initial_state",
          "cu_seqlens": "cu_seqlens", **(names or {})}
    q = array(api, nm["q"], q, 4, "(B, T, H, K)", xp=xp)
    B, T, H, K = q.shape
    k = array(api, nm["k"], k, 4, f"(B, T, H, K) = {q.shape}", xp=xp)
    check_shape(api, nm["k"], k, q.shape, f"{nm['q']}'s shape (B, T, H, K)")
    v = array(api, nm["v"], v, 4, f"(B, T, HV, V) with (B, T) = {(B, T)}", xp=xp)
    if v.shape[:2] != (B, T):
        raise ScanInputError(f"{api}: {nm['v']} has shape {v.shape}; it needs (B, T, HV, V) with (B, T) = {(B, T)} "
                             f"as {nm['q']}")
    HV, V = v.shape[2:]
    check_state_axes(api, (nm["q"], q), (nm["v"], v))
    if H < 1 or HV % H:
        raise ScanInputError(f"{api}: {nm['v']} has {HV} heads and {nm['q']}/{nm['k']} {H} (shapes {v.shape}, "
                             f"{q.shape}); HV must be a multiple of H (grouped value heads), H at least 1")
    per_head = {"g": g} if gate != "none" else {}
    per_head.update({"beta": beta} if form == "delta" else {"a": a, "b": b})
    _check_value_heads(api, nm, per_head, q.shape, v.shape, gate)
    cu = None if cu_seqlens is None else check_seqlens(api, cu_seqlens, T, B, nm["cu_seqlens"])
    nseq = B if cu is None else len(cu) - 1
    data = {"q": q, "k": k, "v": v}
    if gate != "none":
        shape, need = ((B, T, HV), "(B, T, HV)") if gate == "scalar" else ((B, T, HV, K), "(B, T, HV, K)")
        data["g"] = array(api, nm["g"], g, len(shape), f"{need} = {shape}", xp=xp)
        check_shape(api, nm["g"], data["g"], shape, need)
    if form == "delta":
        data["beta"] = array(api, nm["beta"], beta, 3, f"(B, T, HV) = {(B, T, HV)}", xp=xp)
        check_shape(api, nm["beta"], data["beta"], (B, T, HV), "(B, T, HV)")
    else:
        for n, x in (("a", a), ("b", b)):
            data[n] = array(api, nm[n], x, 4, f"(B, T, HV, K) = {(B, T, HV, K)}", xp=xp)
            check_shape(api, nm[n], data[n], (B, T, HV, K), "(B, T, HV, K)")
    store = storage_dtype([x.dtype for x in data.values()])
    conv = {n: contiguous(x, store, xp) for n, x in data.items()}
    if h0 is not None:
        need, layout = ((nseq, HV, V, K) if state_v_first else (nseq, HV, K, V)), state_layout(state_v_first, "HV")
        h0 = array(api, nm["h0"], h0, 4, f"{layout} = {need}", xp=xp)
        check_shape(api, nm["h0"], h0, need, f"{layout} (N: B, or the sequences of cu_seqlens)")
        if state_v_first:
            h0 = (xp or np).swapaxes(h0, -1, -2)
        h0 = contiguous(h0, accumulation(store), xp)
    out = returned_dtype(v.dtype, store)
    dev_cu = cu if cu is None or xp is None else xp.asarray(cu)
    return DeltaOperands(conv["q"], conv["k"], conv["v"], conv.get("g"), conv.get("beta"), conv.get("a"),
                         conv.get("b"), h0, dev_cu, gate, form, bool(l2norm), np.dtype(out), np if xp is None else xp,
                         cu)
