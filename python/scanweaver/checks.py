"""Argument rules that every layer shares, written once: from the public calls down to the kernels' ABI.

Example:
    >>> from scanweaver.checks import check_seqlens
    >>> check_seqlens("demo", [0, 3, 3, 8], 8).tolist()
    [0, 3, 3, 8]
"""

from __future__ import annotations

import numpy as np

from .errors import ScanInputError


def check_seqlens(api: str, cu_seqlens: object, T: int | None, batch: int | None = None,
                  name: str = "cu_seqlens") -> np.ndarray:
    """``cu_seqlens`` checked, as a C-contiguous int64 array: the one rule of every operation.

    The offsets of sequences packed along the time axis: integers (not floats, not booleans),
    1-D, starting at 0 (``[0]`` alone: no sequence, with ``T = 0``), never decreasing (a repeated offset
    is an empty sequence) and ending at ``T``.  With ``batch``, the operands must have batch 1 (the sequences
    are packed into one row).  ``T=None`` checks all but the end (where the length is not known
    yet: a call's options, built before its arrays are looked at).

    Raises:
        ScanInputError: naming ``cu_seqlens``, what it got and the rule.
    """
    length = "T: the length of the packed axis" if T is None else f"T = {T}"
    rule = f"1-D integers [0, ..., T] ({length}): starting at 0, never decreasing, ending at T"
    try:
        cu = np.asarray(cu_seqlens)
    except Exception:  # e.g. a device tensor, or a traced value: say what is needed
        raise ScanInputError(f"{api}: {name} must be {rule}, known when the call is made; got "
                             f"{type(cu_seqlens).__name__}") from None
    if cu.ndim != 1 or cu.size < 1 or cu.dtype.kind not in "iu":
        raise ScanInputError(f"{api}: {name} must be {rule}; got shape {cu.shape}, dtype {cu.dtype}")
    cu = np.ascontiguousarray(cu, dtype=np.int64)
    if cu[0] != 0:
        raise ScanInputError(f"{api}: {name} must be {rule}; got {name}[0] = {cu[0]}")
    bad = np.flatnonzero(np.diff(cu) < 0)
    if bad.size:
        i = int(bad[0])
        raise ScanInputError(f"{api}: {name} must be {rule}; got {name}[{i}] = {cu[i]} followed by "
                             f"{name}[{i + 1}] = {cu[i + 1]}")
    if T is not None and cu[-1] != T:
        raise ScanInputError(f"{api}: {name} must be {rule}; got {name}[-1] = {cu[-1]}: the offsets must end at "
                             f"T = {T}")
    if batch is not None and batch != 1:
        raise ScanInputError(f"{api}: {name} packs sequences along T of one batch row; the inputs have batch "
                             f"{batch}, it needs batch 1")
    return cu


def seqlens_option(api: str, cu_seqlens: object, name: str = "cu_seqlens") -> list[int] | None:
    """``cu_seqlens`` as a list of ints for a kernel pair's options (Python literals), checked by
    :func:`check_seqlens` but for its end (the arrays' length is checked when they are); ``None`` stays.

    Raises:
        ScanInputError: a float, 2-D, negative or decreasing ``cu_seqlens``, naming it.
    """
    return None if cu_seqlens is None else check_seqlens(api, cu_seqlens, None, name=name).tolist()


def boolean(api: str, name: str, value) -> bool:
    """``value`` when it is a boolean (Python or NumPy), else :class:`ScanInputError` naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ScanInputError(f"{api}: {name} must be True or False, got {value!r}")
