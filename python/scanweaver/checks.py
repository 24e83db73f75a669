"""Argument rules that every layer shares, written once: from the public calls down to the kernels' ABI.

Example:
    >>> from scanweaver.checks import check_seqlens
    >>> check_seqlens("demo", [0, 3, 3, 8], 8).tolist()
    [0, 3, 3, 8]
"""

from __future__ import annotations

import numpy as np

from .errors import ScanInputError


def check_state_axes(api: str, keys: tuple[str, object], values: tuple[str, object]) -> None:
    """Raises when the key or the value axis of a matrix state is empty: ``keys`` and ``values`` are (name,
    array) pairs of the operands whose last axes are K and V (q; v).

    Raises:
        ScanInputError: naming the operand, its shape and the axis.
    """
    for (name, arr), axis in ((keys, "K, the state's keys"), (values, "V, the state's values")):
        shape = tuple(getattr(arr, "shape", ()))
        if shape and shape[-1] < 1:
            raise ScanInputError(f"{api}: {name} has shape {shape}: its last axis ({axis}) is empty; it needs at "
                                 "least 1")


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
        cu = _host_values(cu_seqlens)
    except Exception:  # e.g. a traced value: say what is needed
        raise ScanInputError(f"{api}: {name} must be {rule}, known when the call is made; got "
                             f"{type(cu_seqlens).__name__}") from None
    if cu.ndim == 1 and cu.size == 0:
        raise ScanInputError(f"{api}: {name} must be {rule}; got an empty {name} ([0] alone is no sequence)")
    if cu.ndim != 1 or cu.dtype.kind not in "iu":
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


def _host_values(value: object) -> np.ndarray:
    """``value`` as a NumPy array: a device array (a CUDA tensor, a CuPy array) through its values."""
    try:
        return np.asarray(value)
    except Exception:
        tolist = getattr(value, "tolist", None)
        if tolist is None:
            raise
        return np.asarray(tolist())


def seqlens_option(api: str, cu_seqlens: object, name: str = "cu_seqlens") -> list[int] | None:
    """``cu_seqlens`` as a list of ints for a kernel pair's options (Python literals), checked by
    :func:`check_seqlens` but for its end (the arrays' length is checked when they are); ``None`` stays.

    Raises:
        ScanInputError: a float, 2-D, negative or decreasing ``cu_seqlens``, naming it.
    """
    return None if cu_seqlens is None else check_seqlens(api, cu_seqlens, None, name=name).tolist()


def offsets_option(api: str, cu_seqlens: object, cu_seqlens_cpu: object = None) -> list[int] | None:
    """The offsets for a call's options from ``cu_seqlens`` and ``cu_seqlens_cpu`` (flash-linear-attention's host
    copy of the same offsets), each checked by :func:`seqlens_option`: either may be given; given both, they
    must be equal.  :func:`offsets_name` says which one a later check (of the end, of the batch) names.

    Raises:
        ScanInputError: naming the argument that breaks the rule, or both when they differ.
    """
    cu = seqlens_option(api, cu_seqlens)
    cpu = seqlens_option(api, cu_seqlens_cpu, "cu_seqlens_cpu")
    if cu is not None and cpu is not None and cu != cpu:
        i = next((i for i, (a, b) in enumerate(zip(cu, cpu, strict=False)) if a != b), min(len(cu), len(cpu)))
        at = (f"cu_seqlens[{i}] = {cu[i]}, cu_seqlens_cpu[{i}] = {cpu[i]}" if i < min(len(cu), len(cpu))
              else f"{len(cu)} and {len(cpu)} offsets")
        raise ScanInputError(f"{api}: cu_seqlens_cpu must hold the offsets of cu_seqlens (a copy on the host); "
                             f"they differ: {at}")
    return cu if cu is not None else cpu


def offsets_name(cu_seqlens: object, cu_seqlens_cpu: object = None) -> str:
    """The argument the offsets of :func:`offsets_option` came from: ``cu_seqlens_cpu`` when given alone."""
    return "cu_seqlens_cpu" if cu_seqlens is None and cu_seqlens_cpu is not None else "cu_seqlens"


def real_option(api: str, name: str, value: object, need: str = "a real number or None") -> float | None:
    """``value`` checked: None, or a finite real number (a 0-d array or tensor too; not text, not a boolean).

    Raises:
        ScanInputError: naming ``name``, what it got and ``need``.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes, bool, np.bool_)):
        raise ScanInputError(f"{api}: {name} must be {need}, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        # a traced value (jax.jit's tracer): its number is not known when the call is made
        known = ", known when the call is made (not traced: a Python number, or a static argument of jax.jit)" \
            if "Tracer" in type(value).__name__ else ""
        shape = getattr(value, "shape", None)
        got = type(value).__name__ + (f" of shape {tuple(shape)}" if shape is not None and not known else "")
        raise ScanInputError(f"{api}: {name} must be {need}{known}, got {got}") from None
    if not np.isfinite(number):
        raise ScanInputError(f"{api}: {name} must be finite, got {number}")
    return number


def scale_option(api: str, scale: object) -> float | None:
    """The output ``scale`` checked by :func:`real_option`: None (``K**-0.5``) or a finite real number."""
    return real_option(api, "scale", scale)


def scale_of(api: str, scale: object, K: int) -> float:
    """The output scale: ``K**-0.5`` when ``scale`` is None, else ``scale`` checked by :func:`scale_option`."""
    value = scale_option(api, scale)
    return float(K) ** -0.5 if value is None else value


def state_layout(v_first: bool, heads: str = "H") -> str:
    """How a recurrent state ``(N, heads, K, V)`` is named in messages: ``(N, heads, V, K) (state_v_first)``
    in flash-linear-attention's V-first layout."""
    return f"(N, {heads}, V, K) (state_v_first)" if v_first else f"(N, {heads}, K, V)"


def boolean(api: str, name: str, value) -> bool:
    """``value`` when it is a boolean (Python or NumPy), else :class:`ScanInputError` naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ScanInputError(f"{api}: {name} must be True or False, got {value!r}")
