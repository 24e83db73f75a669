"""Validation of user arrays into :class:`~scanweaver.runtime.ScanArrays`.

Dtype policy (one place, used by every entry point):

* ``float32`` and ``float64`` are stored and accumulated as given.
* ``float16`` and ``bfloat16`` (the ``ml_dtypes`` extension type, optional)
  are *storage* types: operands are widened to float32 before the scan,
  which accumulates in float32, and ``y`` comes back in the input dtype.
* ``complex64`` and ``complex128`` transitions are passed through; only
  backends that list them in ``Backend.dtypes`` accept them.
* Arrays of these dtypes in non-native byte order (big-endian on x86-64 and
  AArch64) are converted to native order once; Python ints are numbers like
  Python floats.

Mixed operands promote as NumPy does after widening the half types, so
``float16`` with ``float32`` computes and returns float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np

from .checks import check_seqlens
from .errors import ScanInputError
from .runtime.base import ScanArrays
from .runtime.host_pool import host_output

SUPPORTED = (np.dtype(np.float32), np.dtype(np.float64))
COMPLEX = (np.dtype(np.complex64), np.dtype(np.complex128))
#: Storage-only dtypes, widened to float32 for accumulation (by name: bfloat16 comes from ml_dtypes).
HALF = ("float16", "bfloat16")
#: The dtypes operands may have (complex ones only where an operation takes complex operands: the scans).
ACCEPTED = "float16, bfloat16, float32 and float64 (complex64 and complex128 where the operation takes complex " \
    "operands)"


def is_half(dtype: np.dtype) -> bool:
    """True for the storage-only dtypes float16 and bfloat16."""
    return np.dtype(dtype).name in HALF


def is_real(dtype) -> bool:
    """True for the real dtypes the scans take: float16, bfloat16 (storage), float32, float64, in any byte order.

    The one test of "a real floating-point dtype": ``dtype.kind == "f"`` misses bfloat16 (ml_dtypes' kind is
    ``V``) and ``np.issubdtype(dtype, np.inexact)`` does too.

    Example:
        >>> is_real(np.float16), is_real(np.int32), is_real(np.complex64)
        (True, False, False)
    """
    try:
        d = np.dtype(dtype).newbyteorder("=")
    except TypeError:
        return False
    return d in SUPPORTED or is_half(d)


def is_floating(dtype) -> bool:
    """True for every dtype the scans take (:func:`is_real`, or complex64 / complex128)."""
    try:
        return is_real(dtype) or np.dtype(dtype).newbyteorder("=") in COMPLEX
    except TypeError:
        return False


def is_real_operand(dtype) -> bool:
    """True for a dtype a real operand of the named operations may have: :func:`is_real`, or an integer or
    boolean dtype (those compute in float64, see :func:`real_compute_dtype`).

    Example:
        >>> is_real_operand(np.int32), is_real_operand(np.float16), is_real_operand(np.complex64)
        (True, True, False)
    """
    try:
        d = np.dtype(dtype)
    except TypeError:
        return False
    return is_real(d) or d.kind in "iub"


def real_compute_dtype(dtypes) -> np.dtype:
    """The accumulation dtype of real operands of ``dtypes``: :func:`compute_dtype`, float64 when they are all
    integers or booleans.

    Example:
        >>> [real_compute_dtype(d).name for d in ([np.float16, np.float16], [np.int32], [np.float32, np.float64])]
        ['float32', 'float64', 'float64']
    """
    wide = compute_dtype(dtypes)
    return wide if wide.kind == "f" else np.dtype(np.float64)


def returned_dtype(dtype, wide: np.dtype) -> np.dtype:
    """The dtype a named operation returns its output in, from its leading operand's ``dtype``: that dtype when
    it is a real floating-point one (:func:`is_real`, float16 and bfloat16 included), else ``wide``.

    Example:
        >>> returned_dtype(np.float16, np.dtype(np.float32)).name, returned_dtype(np.int64, np.dtype(np.float64)).name
        ('float16', 'float64')
    """
    return np.dtype(dtype) if is_real(dtype) else np.dtype(wide)


def check_state_dtype(api: str, name: str, dtype, compute: np.dtype) -> None:
    """Raises :class:`ScanInputError` unless an initial state ``name`` of ``dtype`` fits operands accumulated in
    ``compute``: a real floating-point (:func:`is_real`, or any other of kind ``f``) or integer dtype, or a complex
    one with complex operands.

    Example:
        >>> check_state_dtype("demo", "h0", np.float16, np.dtype(np.float32))
    """
    d = np.dtype(dtype)
    if is_real(d) or d.kind in "fiu" or (compute.kind == "c" and is_floating(d)):
        return
    need = "a float or complex dtype" if compute.kind == "c" else "a real float dtype"
    raise ScanInputError(f"{api}: {name} has dtype {d}; it needs {need}")


def as_array(api: str, name: str, value: object) -> np.ndarray:
    """``value`` as a NumPy array of a supported dtype, else :class:`ScanInputError`.

    Args:
        api: the public function's name, for error messages.
        name: the argument's name.
        value: anything ``np.asarray`` reads.
    """
    if hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray):
        raise ScanInputError(
            f"{api}: {name} is a device array ({type(value).__name__}); pass NumPy arrays, "
            "or use backend='cuda', which accepts CuPy arrays"
        )
    try:
        # A Python int is a number like a Python float (NumPy would make it int64)
        arr = np.asarray(float(value)) if type(value) is int else np.asarray(value)
    except Exception as exc:
        raise ScanInputError(f"{api}: {name} cannot be read as an array: {exc}") from exc
    if is_floating(arr.dtype):
        native = arr.dtype.newbyteorder("=")
        # non-native byte order (e.g. big-endian data read from a file) converted once
        return arr if arr.dtype.byteorder in ("=", "|") or native == arr.dtype else arr.astype(native)
    raise dtype_refusal(api, name, value, arr.dtype)


#: How each array library converts an array ``{name}`` to float32 (the hint of :func:`dtype_refusal`).
CONVERSIONS = {"numpy": "{name}.astype(np.float32)", "torch": "{name}.to(torch.float32)",
               "jax": "{name}.astype(jnp.float32)", "cupy": "{name}.astype(cp.float32)"}
#: Top-level modules of array types -> their library's name in :data:`CONVERSIONS`.
_LIBRARIES = {"numpy": "numpy", "torch": "torch", "jax": "jax", "jaxlib": "jax", "cupy": "cupy"}
#: The library the operands of the running call came from, set by a front end that hands them on as views of
#: another library's arrays (:func:`operands_from`); None: each array's own.
_ORIGIN: ContextVar[str | None] = ContextVar("scanweaver_operand_library", default=None)


@contextlib.contextmanager
def operands_from(library: str) -> Iterator[None]:
    """Within the block, the operands are the caller's arrays of ``library`` (a key of :data:`CONVERSIONS`) seen
    through another library's views (PyTorch's CPU tensors as NumPy arrays): refusals suggest ``library``'s
    conversion, not the views'.

    Example:
        >>> with operands_from("torch"):
        ...     conversion("q", np.ones(2, np.int64))
        'q.to(torch.float32)'
    """
    token = _ORIGIN.set(library)
    try:
        yield
    finally:
        _ORIGIN.reset(token)


def conversion(name: str, value: object) -> str:
    """How the caller converts ``value`` (argument ``name``) to float32, written in its own array library:
    that of :func:`operands_from` when set, else that of ``value``'s type; ``np.asarray`` for anything else
    (lists, which have no ``astype``).

    Example:
        >>> conversion("q", np.ones(2, np.int64)), conversion("q", [1, 2])
        ('q.astype(np.float32)', 'np.asarray(q, np.float32)')
    """
    library = _ORIGIN.get() or _LIBRARIES.get(type(value).__module__.partition(".")[0])
    if library is None and hasattr(value, "astype"):  # NumPy's subclasses, Dask's arrays: NumPy's dtypes
        library = "numpy"
    how = CONVERSIONS.get(library or "", "np.asarray({name}, np.float32)")
    return how.format(name=name)


def dtype_refusal(api: str, name: str, value: object, dtype: object = None) -> ScanInputError:
    """The error for operand ``name`` whose dtype (``dtype``, else ``value.dtype``) no scan takes: it names the
    argument, its dtype, the dtypes taken and the conversion in the caller's library (:func:`conversion`).

    Example:
        >>> str(dtype_refusal("demo", "x", np.ones(2, np.int32))).split(";")[0]
        'demo: x has dtype int32'
    """
    got = str(getattr(value, "dtype", None) if dtype is None else dtype).removeprefix("torch.")
    return ScanInputError(f"{api}: {name} has dtype {got}; supported dtypes are {ACCEPTED}: convert it with "
                          f"{conversion(name, value)}")


def memory_span(value: object) -> tuple[int, int] | None:
    """``[lo, hi)`` byte addresses of a host or device array (NumPy, or any object with the CUDA array
    interface), or ``None`` for anything else (numbers, empty arrays)."""
    if isinstance(value, np.ndarray):
        if value.size == 0:
            return None
        lo, hi = np.byte_bounds(value) if hasattr(np, "byte_bounds") else np.lib.array_utils.byte_bounds(value)
        return int(lo), int(hi)
    face = getattr(value, "__cuda_array_interface__", None)
    if not isinstance(face, dict) or not face.get("shape") or 0 in face["shape"]:
        return None
    itemsize = np.dtype(face["typestr"]).itemsize
    shape = face["shape"]
    strides = face.get("strides") or tuple(itemsize * int(np.prod(shape[i + 1:], dtype=np.int64))
                                           for i in range(len(shape)))
    lo = hi = int(face["data"][0])
    for n, st in zip(shape, strides, strict=True):
        (lo, hi) = (lo + (n - 1) * st, hi) if st < 0 else (lo, hi + (n - 1) * st)
    return lo, hi + itemsize


def check_overlap(api: str, out: object, others: dict[str, object]) -> None:
    """Raises :class:`ScanInputError` when ``out`` shares memory with any of ``others`` (name -> value):
    the kernel would overwrite an input it still reads."""
    span = memory_span(out)
    if span is None:
        return
    for name, value in others.items():
        other = memory_span(value)
        if other is None or other[1] <= span[0] or span[1] <= other[0]:
            continue
        if isinstance(value, np.ndarray) and isinstance(out, np.ndarray) and not np.shares_memory(out, value):
            continue  # interleaved, not overlapping
        raise ScanInputError(f"{api}: out overlaps {name} (the scan would overwrite an input it still reads); "
                             "pass a separate buffer as out")


def aligned(arr: np.ndarray) -> np.ndarray:
    """``arr`` when it is C-contiguous and aligned, else one aligned C-contiguous copy.

    Buffers from anywhere (``np.frombuffer`` at an odd offset, a memory-mapped file with a
    header, shared memory from another process) may hold elements at addresses that are not
    multiples of their size; ``np.ascontiguousarray`` returns such an array unchanged, and
    compiled kernels need aligned elements.

    Example:
        >>> raw = np.arange(9, dtype=np.uint8).tobytes()
        >>> v = np.frombuffer(raw, np.float32, count=2, offset=1)
        >>> v.flags.aligned, aligned(v).flags.aligned, bool((aligned(v).view(np.uint32) == v.view(np.uint32)).all())
        (False, True, True)
    """
    if arr.flags.c_contiguous and arr.flags.aligned:
        return arr
    return np.require(arr, requirements=("C", "A"))


def compute_dtype(dtypes) -> np.dtype:
    """The accumulation dtype for operands of ``dtypes``: half types widen to float32."""
    wide = [np.dtype(np.float32) if is_half(d) else np.dtype(d) for d in dtypes]
    return np.dtype(np.result_type(*wide))


def result_dtype(dtypes) -> np.dtype:
    """The dtype ``y`` is returned in: the common input dtype, or the accumulation dtype when they differ."""
    dtypes = [np.dtype(d) for d in dtypes]
    if all(d == dtypes[0] for d in dtypes):
        return dtypes[0]
    return compute_dtype(dtypes)


def seqlens_reset(api: str, cu_seqlens: object, L: int, reverse: bool = False) -> np.ndarray:
    """A ``(L,)`` boolean reset mask from ``cu_seqlens`` offsets of packed sequences.

    ``cu_seqlens = [0, l0, l0+l1, ..., L]`` marks where each packed sequence
    starts.  A forward scan resets at every start after the first (the first
    sequence starts from ``h0``); a reverse scan resets at the last element of
    every sequence but the final one (the final one starts from ``h0``).

    Raises:
        ScanInputError: naming ``cu_seqlens`` and its bad values.
    """
    mask = np.zeros(L, dtype=bool)
    mask[seqlens_positions(api, cu_seqlens, L, reverse)] = True
    return mask


def seqlens_positions(api: str, cu_seqlens: object, L: int, reverse: bool = False) -> np.ndarray:
    """The positions :func:`seqlens_reset` marks, as a sorted int64 array (no ``(L,)`` mask is built).

    Raises:
        ScanInputError: naming ``cu_seqlens`` and its bad values.
    """
    cu = check_seqlens(api, cu_seqlens, L)
    return cu[1:-1] - 1 if reverse else cu[1:-1]


def _operand(a: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, keep_broadcast: bool) -> tuple[np.ndarray, str]:
    """``(view or copy of shape (lanes, L), layout)``: a scalar or a per-lane operand stays small when
    ``keep_broadcast`` (a read-only stride-0 view of its values, layout ``scalar`` or ``lane``)."""
    lanes, L = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    if keep_broadcast and a.shape != shape and L > 1:
        if a.size == 1:
            return np.broadcast_to(np.array(a.reshape(1, 1), dtype=dtype), (lanes, L)), "scalar"
        if a.shape[-1] == 1:
            per_lane = aligned(np.ascontiguousarray(np.broadcast_to(a, (*shape[:-1], 1)), dtype=dtype))
            return np.broadcast_to(per_lane.reshape(lanes, 1), (lanes, L)), "lane"
    return aligned(np.ascontiguousarray(np.broadcast_to(a, shape), dtype=dtype)).reshape(lanes, L), "full"


def prepare(api: str, operands: dict[str, object], h0: object = None, reset: object = None,
            broadcast: bool = False, cu_seqlens: object = None, reverse: bool = False,
            state_size: int = 1, keep_broadcast: bool = False) -> ScanArrays:
    """Checks shapes and dtypes and returns 2-D C-contiguous, aligned operands (copied once when not).

    Args:
        api: the public function's name, for error messages.
        operands: name -> array of layout ``(..., L)``.
        h0: initial state of shape ``(...)`` or ``None``.
        reset: boolean mask of layout ``(..., L)`` or ``None``.
        broadcast: broadcast operands to one shape instead of requiring equal shapes.
        cu_seqlens: offsets of packed sequences along L (see :func:`seqlens_reset`),
            merged into the reset mask, or ``None``.
        reverse: the scan runs backwards (decides where ``cu_seqlens`` resets go).
        state_size: k for a vector state; ``h0`` then has shape ``(..., k)``.
        keep_broadcast: with ``broadcast``, scalars (0-d or size 1) and per-lane operands
            (``(..., 1)``) stay small: stride-0 views listed in ``ScanArrays.layouts``, for backends
            whose kernels read them in place (:meth:`ScanArrays.materialised` makes them full).

    Returns:
        :class:`ScanArrays` in the accumulation dtype; ``out_dtype`` is the dtype
        ``y`` is returned in.

    Raises:
        ScanInputError: naming each argument, its shape or dtype, and the rule.
    """
    from .runtime import device_arrays

    if device_arrays.operands_kind(api, operands) and cu_seqlens is None and state_size == 1:
        return device_arrays.prepare(api, operands, h0, reset)
    arrs = {n: as_array(api, n, v) for n, v in operands.items()}
    scalars = [n for n, a in arrs.items() if a.ndim == 0]
    if scalars and (not broadcast or len(scalars) == len(arrs)):
        rule = ("at least one operand needs layout (..., L), scanned over the last axis" if broadcast
                else "operands need layout (..., L), scanned over the last axis")
        raise ScanInputError(f"{api}: {scalars[0]} is a scalar; {rule}")
    shapes = {n: a.shape for n, a in arrs.items()}
    if broadcast:
        try:
            shape = np.broadcast_shapes(*shapes.values())
        except ValueError:
            desc = ", ".join(f"{n}{s}" for n, s in shapes.items())
            raise ScanInputError(f"{api}: operand shapes do not broadcast together: {desc}") from None
    else:
        shape = next(iter(shapes.values()))
        if any(s != shape for s in shapes.values()):
            desc = ", ".join(f"{n}{s}" for n, s in shapes.items())
            raise ScanInputError(f"{api}: operands must all have the same shape (..., L); got {desc}")
    # Python numbers take the arrays' dtype (NumPy's weak scalars): 0.5 with float32 data stays float32
    typed = [a for n, a in arrs.items() if type(operands[n]) not in (int, float)] or list(arrs.values())
    dtype = compute_dtype(a.dtype for a in typed)
    out_dtype = result_dtype(a.dtype for a in typed)
    batch, L = tuple(shape[:-1]), shape[-1]
    lanes = int(np.prod(batch, dtype=np.int64))
    placed = {n: _operand(a, shape, dtype, keep_broadcast and broadcast) for n, a in arrs.items()}
    inputs = {n: v for n, (v, _) in placed.items()}
    layouts = {n: layout for n, (_, layout) in placed.items() if layout != "full"}
    h0v = None
    if h0 is not None:
        h = np.asarray(h0)
        check_state_dtype(api, "h0", h.dtype, dtype)
        want = batch if state_size == 1 else (*batch, state_size)
        if h.shape != want:
            rule = ("the operands' leading shape" if state_size == 1
                    else f"the operands' leading shape plus the state size {state_size}")
            raise ScanInputError(f"{api}: h0 has shape {h.shape}; it needs {rule}: {want}")
        h0v = aligned(np.ascontiguousarray(h, dtype=dtype)).reshape(
            (lanes,) if state_size == 1 else (lanes, state_size))
    rmask = None
    if reset is not None:
        r = np.asarray(reset)
        if r.shape != shape:
            raise ScanInputError(f"{api}: reset has shape {r.shape}; it needs the operands' shape {shape}")
        if r.dtype != np.bool_ and r.dtype.kind not in "iu":
            raise ScanInputError(f"{api}: reset has dtype {r.dtype}; it needs a boolean mask")
        rmask = np.ascontiguousarray(r != 0, dtype=np.uint8).reshape(lanes, L)
    if cu_seqlens is not None:
        seg = np.broadcast_to(seqlens_reset(api, cu_seqlens, L, reverse), (lanes, L))
        rmask = np.ascontiguousarray(seg, dtype=np.uint8) if rmask is None else rmask | seg
    return ScanArrays(inputs=inputs, h0=h0v, reset=rmask, batch_shape=batch, dtype=dtype, out_dtype=out_dtype,
                      layouts=layouts)


def device_module(values) -> Any:
    """The array module of the device arrays among ``values`` (CuPy for CuPy arrays, e.g. views of CUDA
    tensors; any library registered as a :class:`~scanweaver.runtime.device_plan.Family` with a module), else
    ``None`` (host arrays)."""
    from .runtime import REGISTRY
    from .runtime.device_plan import array_module

    REGISTRY.load()  # the backends register their array libraries when imported
    for v in values:
        xp = array_module(v)
        if xp is not None:
            return xp
    return None


def module_array(api: str, name: str, value: object, xp=None):
    """``value`` checked as an array of array module ``xp``: :func:`as_array` for NumPy (``None``); for a
    device module, one of its own float arrays, kept where it is (nothing is copied to the host).

    Raises:
        ScanInputError: naming the argument, what it is and what it needs.
    """
    if xp is None or xp is np:
        return as_array(api, name, value)
    if not isinstance(value, xp.ndarray):
        raise ScanInputError(f"{api}: {name} is a {type(value).__name__}; with device operands every array must be "
                             "on the same device")
    if not is_floating(value.dtype):
        raise dtype_refusal(api, name, value)
    return value


def contiguous(value, dtype: np.dtype, xp=None):
    """``value`` as a C-contiguous, aligned array of ``dtype`` in array module ``xp`` (``None``: NumPy); no copy
    when it already is one."""
    if xp is None or xp is np:
        return aligned(np.ascontiguousarray(value, dtype=dtype))
    return xp.ascontiguousarray(value, dtype=dtype)


def output_array(xp, shape: tuple[int, ...], dtype, near=None, zero: bool = False):
    """An operation's output in the array module ``xp``: NumPy outputs from the host pool
    (:func:`~scanweaver.runtime.host_pool.host_output`, reused once nothing refers to them, placed against the
    input ``near``), a device module's from that module; zeros when ``zero``, else uninitialised."""
    if xp is np:
        return host_output(shape, dtype, near, zero)
    return xp.zeros(shape, dtype) if zero else xp.empty(shape, dtype)


def output_like(xp, x, zero: bool = False):
    """:func:`output_array` of ``x``'s shape and dtype, placed against ``x`` (``None`` for ``None``): a gradient."""
    return None if x is None else output_array(xp, x.shape, x.dtype, near=x, zero=zero)
