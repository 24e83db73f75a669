"""Stand-in device arrays and a stand-in ``cuda`` backend, to check the device call paths without a GPU.

:class:`DeviceArray` keeps its data in host memory but offers only what a
CuPy array offers to code that keeps data on the device: its shape, dtype,
flags, ``__cuda_array_interface__``, methods and operators computed "on the
device" (NumPy behind the curtain), and a module of NumPy-named functions
(:data:`xp`, registered as the library's array module).  Everything that would
move data to the host or wait for the device refuses with
:class:`HostTouched`: ``__array__`` (so ``numpy.asarray`` of it),
``xp.asnumpy``, ``.get()``, ``.item()``, ``.tolist()``, ``float()``, ``int()``,
``bool()``, and mixing it with NumPy arrays in one expression (CuPy refuses
that too).  Uploads (``xp.asarray`` of host data, as of checked offsets) are
allowed.

:class:`ReplayCUDA` is the ``cuda`` backend with its device primitives
replaced: allocations are stand-in arrays (filled with garbage, not zeros),
and each launch is replayed on the ``opencl`` backend (PoCL here) with the
OpenCL rendering of the same fused call, the same plan and the same
arguments, the outputs copied back into the stand-in arrays.  So a call that
would run on a GPU runs its real kernel code here, and the test fails if any
operand reaches the host on the way.
"""

from __future__ import annotations

import types

import numpy as np

from scanweaver.runtime import REGISTRY, base, get_backend
from scanweaver.runtime.base import Availability
from scanweaver.runtime.cuda_backend import CUDABackend
from scanweaver.runtime.device_plan import FAMILIES, Family
from scanweaver.targets import TARGETS
from scanweaver.targets.fused import kernel_for


class HostTouched(AssertionError):
    """Device data was read on the host (or waited for)."""


def _refuse(what: str):
    def method(self, *args, **kwargs):
        raise HostTouched(f"{what} of a device array: its data would go through host memory")
    return method


def _host_operand(value) -> None:
    if isinstance(value, np.ndarray) and value.ndim > 0:
        raise HostTouched("a NumPy array mixed with device arrays in one expression")


def unwrap(value):
    """The host data behind stand-in arrays inside ``value`` (lists, tuples and dicts are walked)."""
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, (list, tuple)):
        return type(value)(unwrap(v) for v in value)
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    return value


def wrap(value):
    """NumPy results as stand-in arrays (NumPy scalars become 0-d arrays, as CuPy's reductions give)."""
    if isinstance(value, np.ndarray):
        return DeviceArray(value)
    if isinstance(value, np.generic):
        return DeviceArray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(wrap(v) for v in value)
    return value


def _binary(name: str):
    def method(self, other):
        _host_operand(other)
        return wrap(getattr(self._a, name)(unwrap(other)))
    return method


def _inplace(name: str):
    def method(self, other):
        _host_operand(other)
        getattr(self._a, name)(unwrap(other))
        return self
    return method


class DeviceArray:
    """A stand-in device array (see the module docstring)."""

    __slots__ = ("_a",)
    __array_ufunc__ = None  # NumPy's operators hand over to ours (which refuse host arrays)

    def __init__(self, host: np.ndarray):
        self._a = host

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self._a
        return {"data": (a.ctypes.data, not a.flags.writeable), "shape": a.shape, "typestr": a.dtype.str,
                "strides": None if a.flags.c_contiguous else a.strides, "version": 3}

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype})"

    def __len__(self) -> int:
        return len(self._a)

    def __getitem__(self, index):
        return wrap(self._a[unwrap(index)])

    def __setitem__(self, index, value) -> None:
        _host_operand(value)
        self._a[unwrap(index)] = unwrap(value)

    def reshape(self, *shape):
        return DeviceArray(self._a.reshape(*shape))

    def transpose(self, *axes):
        return DeviceArray(self._a.transpose(*axes))

    def astype(self, dtype, copy: bool = True):
        return DeviceArray(self._a.astype(dtype, copy=copy))

    def copy(self):
        return DeviceArray(self._a.copy())

    def fill(self, value) -> None:
        self._a.fill(value)

    def sum(self, axis=None, dtype=None, keepdims: bool = False):
        return wrap(self._a.sum(axis=axis, dtype=dtype, keepdims=keepdims))

    def __neg__(self):
        return DeviceArray(-self._a)

    def __invert__(self):
        return DeviceArray(~self._a)

    __array__ = _refuse("__array__")
    __float__ = _refuse("float()")
    __int__ = _refuse("int()")
    __index__ = _refuse("operator.index()")
    __bool__ = _refuse("bool()")
    __iter__ = _refuse("iterating")
    get = _refuse(".get()")
    item = _refuse(".item()")
    tolist = _refuse(".tolist()")
    __hash__ = None  # type: ignore[assignment]


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "pow", "rpow", "lt", "le",
              "gt", "ge", "eq", "ne", "and", "rand", "or", "ror", "matmul", "rmatmul"):
    setattr(DeviceArray, f"__{_name}__", _binary(f"__{_name}__"))
for _name in ("iadd", "isub", "imul", "itruediv"):
    setattr(DeviceArray, f"__{_name}__", _inplace(f"__{_name}__"))


class _Module(types.ModuleType):
    """NumPy's functions on stand-in arrays, as CuPy's are on CuPy arrays."""

    ndarray = DeviceArray

    def __getattr__(self, name: str):
        value = getattr(np, name)
        if isinstance(value, type) or not callable(value):
            return value  # dtypes and constants

        def call(*args, **kwargs):
            for a in args:
                _host_operand(a)
            return wrap(value(*unwrap(args), **unwrap(kwargs)))
        return call

    @staticmethod
    def asarray(value, dtype=None):
        """A device array of ``value``: itself (or converted on the device), or an upload of host data."""
        if isinstance(value, DeviceArray):
            return value if dtype is None or np.dtype(dtype) == value.dtype else value.astype(dtype)
        return DeviceArray(np.array(value, dtype=dtype))

    @staticmethod
    def ascontiguousarray(value, dtype=None):
        if isinstance(value, DeviceArray):
            return DeviceArray(np.ascontiguousarray(value._a, dtype=dtype))
        return DeviceArray(np.array(value, dtype=dtype, order="C"))

    asnumpy = staticmethod(_refuse("asnumpy"))


#: The stand-in arrays' module (what ``cupy`` is to CuPy arrays).
xp = _Module("device_standin.xp")


def device(host: np.ndarray) -> DeviceArray:
    """An upload of ``host`` to the stand-in device."""
    return DeviceArray(np.array(host, copy=True))


class ReplayCUDA(CUDABackend):
    """The ``cuda`` backend on stand-in arrays, its launches replayed on OpenCL (see the module docstring)."""

    @classmethod
    def probe(cls) -> Availability:
        return Availability(True, device="stand-in device (launches replayed on OpenCL)")

    def __init__(self) -> None:
        super().__init__()
        self.launched: list[tuple[str, tuple[str, ...]]] = []
        self._call = None

    def is_device_array(self, value: object) -> bool:
        return isinstance(value, DeviceArray)

    def to_device(self, value):
        if isinstance(value, DeviceArray):
            return value if value.flags.c_contiguous else xp.ascontiguousarray(value)
        return device(np.ascontiguousarray(value))

    def empty(self, n: int, dtype: np.dtype, zero: bool = False):
        garbage = np.full(n, {"i": -7, "u": 7}.get(np.dtype(dtype).kind, 3), dtype)
        return DeviceArray(np.zeros(n, dtype) if zero else garbage)

    to_host = _refuse("to_host")

    def run_fused(self, call, arrays, sizes) -> None:
        self._call = call
        super().run_fused(call, arrays, sizes)

    def launch(self, source: str, plan, args: list, stages=None):
        assert self._call is not None, "only fused calls are replayed"
        ocl = get_backend("opencl")
        text = kernel_for("opencl", self._call.op).render(TARGETS.get("opencl")(), self._call)
        buffers = [ocl.to_device(a._a.reshape(-1)) if isinstance(a, DeviceArray) else a for a in args]
        ocl.launch(text, plan, buffers)
        for a, buf in zip(args, buffers, strict=True):
            if isinstance(a, DeviceArray):
                a._a.reshape(-1)[...] = ocl.to_host(buf)
        self.launched.append((self._call.op, tuple(x.kernel for x in plan.launches)))
        return None


def install(monkeypatch) -> ReplayCUDA:
    """Makes :class:`ReplayCUDA` the ``cuda`` backend and the stand-in arrays a device library (undone by
    ``monkeypatch``); returns the backend."""
    REGISTRY.load()
    be = ReplayCUDA()
    monkeypatch.setitem(REGISTRY._items, "cuda", ReplayCUDA)
    monkeypatch.setitem(base._instances, "cuda", be)
    monkeypatch.setitem(FAMILIES, __name__, Family(device=lambda v: 0, stream=lambda v, d: 0,
                                                   launch_stream=lambda v, d: None,
                                                   empty=lambda shape, dtype, d, s: DeviceArray(np.empty(shape, dtype)),
                                                   module=lambda: xp))
    return be
