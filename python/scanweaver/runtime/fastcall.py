"""Calling compiled kernels with little per-call overhead: a checked trampoline.

Through :mod:`ctypes`, reading the addresses of six NumPy arrays and making the
call takes several microseconds, more than the whole scan on small problems.
This module compiles (once per interpreter and compiler, cached on disk like
the kernels) a tiny CPython extension, ``_sw_fastcall``, whose
``invoke(fn, buffers, spec, sizes)`` takes the kernel's address, a tuple of
buffers (NumPy arrays, or ``None`` for absent optional ones) and a tuple of
sizes, and in C:

* asks each buffer for a C-contiguous view (writable where the kernel writes),
* checks it holds at least the bytes the kernel will touch and is aligned for
  its element type, and that no written buffer overlaps another buffer,
* releases the GIL and calls the kernel with the buffers' addresses, then the
  sizes as C ``long`` values (the ABI of every compiled kernel here: the scan's
  ``nlanes, L`` of :mod:`scanweaver.targets.cstyle`, a fused operation's sizes).

Pointers and ``long`` sizes are passed alike (one integer register or stack
slot each on x86-64 and AArch64, System V and Windows), so one call per
argument count serves every kernel.

A bad buffer raises ``ValueError``/``BufferError`` instead of crashing the
interpreter.  Where the extension cannot be built (no ``Python.h``, no
compiler, Windows), :func:`invoker` falls back to ``ctypes`` with the same
checks done in Python, so behaviour is identical and only slower.

Example:
    >>> import ctypes, numpy as np
    >>> from scanweaver.runtime.fastcall import Slot, invoker
    >>> libc = ctypes.CDLL(None)
    >>> call = invoker(ctypes.cast(libc.memset, ctypes.c_void_p).value, (Slot(8, 1, written=True),), n_sizes=2)
    >>> buf = np.ones(8, np.uint8)
    >>> _ = call((buf,), 0, 8)       # memset(buf, 0, 8)
    >>> buf.tolist()
    [0, 0, 0, 0, 0, 0, 0, 0]
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import logging
import struct
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("scanweaver")

#: Most arguments (buffers and sizes) one kernel takes.
MAX_ARGS = 48
MODULE = "_sw_fastcall"


@dataclass(frozen=True)
class Slot:
    """What the kernel does with one buffer argument.

    Attributes:
        need: bytes the kernel reads or writes (the buffer must hold at least these).
        align: required alignment of the address (the element size).
        written: the kernel writes it (it must be writable and overlap no other buffer).
        optional: ``None`` may be passed (a NULL pointer; the kernel does not touch it).
    """

    need: int
    align: int
    written: bool = False
    optional: bool = False

    def pack(self) -> bytes:
        return struct.pack("=qii", self.need, self.align, int(self.written) | (2 * int(self.optional)))


def _source() -> str:
    cases = []
    for n in range(1, MAX_ARGS + 1):
        params = ", ".join(["intptr_t"] * n)
        args = ", ".join(f"p[{i}]" for i in range(n))
        cases.append(f"    case {n}: return ((int (*)({params}))fn)({args});")
    return _TEMPLATE.replace("@MAX@", str(MAX_ARGS)).replace("@CASES@", "\n".join(cases))


_TEMPLATE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define SW_MAX @MAX@
typedef struct { long long need; int align; int flags; } sw_slot; /* flags: 1 written, 2 optional */

static int sw_dispatch(void* fn, Py_ssize_t n, const intptr_t* p) {
  switch (n) {
@CASES@
    default: return -1;
  }
}

/* Parses spec (n_sizes, then one sw_slot per buffer) against bufs and n_sizes; fills slot. */
static int sw_spec(PyObject* bufs, PyObject* spec, Py_ssize_t k, sw_slot* slot, const char* api) {
  if (!PyTuple_Check(bufs) || !PyBytes_Check(spec)) {
    PyErr_Format(PyExc_TypeError, "%s: buffers must be a tuple and spec bytes", api);
    return -1;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(bufs);
  long long want_k = -1;
  if (PyBytes_GET_SIZE(spec) >= (Py_ssize_t)sizeof(long long))
    memcpy(&want_k, PyBytes_AS_STRING(spec), sizeof(long long));
  if (n < 1 || n + k > SW_MAX || k != want_k ||
      PyBytes_GET_SIZE(spec) != (Py_ssize_t)sizeof(long long) + n * (Py_ssize_t)sizeof(sw_slot)) {
    PyErr_Format(PyExc_ValueError, "%s: %zd buffers and %zd sizes do not match the kernel's spec "
                 "(%lld sizes)", api, n, k, want_k);
    return -1;
  }
  memcpy(slot, PyBytes_AS_STRING(spec) + sizeof(long long), (size_t)n * sizeof(sw_slot));
  return 0;
}

/* Views of the n buffers, checked against their slots: present unless optional, C-contiguous,
   writable where written, large enough, aligned; no written buffer overlapping another. Sets
   p[i] (NULL for None or a zero-byte slot) and *held (views to release, also on failure). */
static int sw_views(PyObject* bufs, const sw_slot* slot, Py_buffer* view, void** p, Py_ssize_t* held) {
  const Py_ssize_t n = PyTuple_GET_SIZE(bufs);
  *held = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PyTuple_GET_ITEM(bufs, i);
    p[i] = NULL;
    view[i].obj = NULL;
    *held = i + 1;
    if (o == Py_None) {
      if (!(slot[i].flags & 2)) {
        PyErr_Format(PyExc_ValueError, "invoke: buffer %zd is required, got None", i);
        return -1;
      }
      continue;
    }
    const int want = (slot[i].flags & 1) ? (PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) : PyBUF_C_CONTIGUOUS;
    if (PyObject_GetBuffer(o, &view[i], want) < 0) {
      view[i].obj = NULL;
      return -1;
    }
    if (view[i].len < slot[i].need) {
      PyErr_Format(PyExc_ValueError, "invoke: buffer %zd holds %zd bytes; the kernel needs %lld", i,
                   view[i].len, slot[i].need);
      return -1;
    }
    if (slot[i].align > 1 && ((uintptr_t)view[i].buf % (uintptr_t)slot[i].align) != 0) {
      PyErr_Format(PyExc_ValueError, "invoke: buffer %zd is not aligned to %d bytes", i, slot[i].align);
      return -1;
    }
    p[i] = slot[i].need > 0 ? view[i].buf : NULL;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!(slot[i].flags & 1) || p[i] == NULL) continue;
    const char* lo = (const char*)p[i];
    const char* hi = lo + slot[i].need;
    for (Py_ssize_t j = 0; j < n; ++j) {
      if (j == i || p[j] == NULL) continue;
      const char* lo2 = (const char*)p[j];
      const char* hi2 = lo2 + slot[j].need;
      if (lo < hi2 && lo2 < hi) {
        PyErr_Format(PyExc_ValueError, "invoke: written buffer %zd overlaps buffer %zd", i, j);
        return -1;
      }
    }
  }
  return 0;
}

static void sw_release(Py_buffer* view, Py_ssize_t held) {
  for (Py_ssize_t i = 0; i < held; ++i)
    if (view[i].obj != NULL) PyBuffer_Release(&view[i]);
}

static PyObject* sw_invoke(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "invoke(fn, buffers, spec, sizes) takes 4 arguments");
    return NULL;
  }
  void* fn = PyLong_AsVoidPtr(args[0]);
  if (fn == NULL) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "invoke: the kernel address is NULL");
    return NULL;
  }
  PyObject* bufs = args[1];
  PyObject* sizes = args[3];
  if (!PyTuple_Check(sizes)) {
    PyErr_SetString(PyExc_TypeError, "invoke: sizes must be a tuple");
    return NULL;
  }
  const Py_ssize_t k = PyTuple_GET_SIZE(sizes);
  sw_slot slot[SW_MAX];
  if (sw_spec(bufs, args[2], k, slot, "invoke") < 0) return NULL;
  const Py_ssize_t n = PyTuple_GET_SIZE(bufs);
  intptr_t arg[SW_MAX];
  for (Py_ssize_t j = 0; j < k; ++j) {
    const long v = PyLong_AsLong(PyTuple_GET_ITEM(sizes, j));
    if (v == -1 && PyErr_Occurred()) return NULL;
    arg[n + j] = (intptr_t)v;
  }
  Py_buffer view[SW_MAX];
  void* p[SW_MAX];
  Py_ssize_t held = 0;
  PyObject* result = NULL;
  if (sw_views(bufs, slot, view, p, &held) == 0) {
    for (Py_ssize_t i = 0; i < n; ++i) arg[i] = (intptr_t)p[i];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sw_dispatch(fn, n + k, arg);
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(rc);
  }
  sw_release(view, held);
  return result;
}

/* addresses(buffers, spec) -> the buffers' addresses (0 for None), after invoke's checks. */
static PyObject* sw_addresses(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "addresses(buffers, spec) takes 2 arguments");
    return NULL;
  }
  sw_slot slot[SW_MAX];
  if (sw_spec(args[0], args[1], 0, slot, "addresses") < 0) return NULL;
  const Py_ssize_t n = PyTuple_GET_SIZE(args[0]);
  Py_buffer view[SW_MAX];
  void* p[SW_MAX];
  Py_ssize_t held = 0;
  PyObject* result = NULL;
  if (sw_views(args[0], slot, view, p, &held) == 0) {
    result = PyTuple_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; ++i) {
      PyObject* v = PyLong_FromVoidPtr(p[i]);
      if (v == NULL) {
        Py_CLEAR(result);
        break;
      }
      PyTuple_SET_ITEM(result, i, v);
    }
  }
  sw_release(view, held);
  return result;
}

static PyMethodDef sw_methods[] = {
  {"invoke", (PyCFunction)(void (*)(void))sw_invoke, METH_FASTCALL,
   "invoke(fn, buffers, spec, sizes) -> the kernel's return code"},
  {"addresses", (PyCFunction)(void (*)(void))sw_addresses, METH_FASTCALL,
   "addresses(buffers, spec) -> the buffers' addresses (0 for None), checked as invoke checks them"},
  {NULL, NULL, 0, NULL}
};

static struct PyModuleDef sw_module = {PyModuleDef_HEAD_INIT, "_sw_fastcall", NULL, -1, sw_methods};

PyMODINIT_FUNC PyInit__sw_fastcall(void) { return PyModule_Create(&sw_module); }
"""

_lock = threading.Lock()
_module: object = None
_tried = False


def _extra_flags() -> tuple[str, ...] | None:
    """Flags to build an extension module for this interpreter, or ``None`` when it cannot be."""
    include = sysconfig.get_paths().get("include")
    if not include or not (Path(include) / "Python.h").exists() or sys.platform == "win32":
        return None
    flags = (f"-I{include}",)
    if sys.platform == "darwin":
        flags += ("-undefined", "dynamic_lookup")
    return flags


def extension():
    """The compiled ``_sw_fastcall`` module, or ``None`` (then :func:`invoker` uses ctypes)."""
    global _module, _tried
    if _tried:
        return _module
    with _lock:
        if _tried:
            return _module
        _tried = True
        flags = _extra_flags()
        if flags is None:
            log.info("scanweaver: no Python.h for %s; kernels are called through ctypes", sys.version.split()[0])
            return None
        try:
            from . import toolchain

            path = toolchain.find_toolchain().build(_source(), extra_flags=flags,
                                                    identity=f"{sys.version} {sysconfig.get_config_var('EXT_SUFFIX')}")
            loader = importlib.machinery.ExtensionFileLoader(MODULE, str(path))
            spec = importlib.util.spec_from_file_location(MODULE, str(path), loader=loader)
            assert spec is not None
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            _module = mod
        except Exception as exc:  # the ctypes path still works; say why once
            log.info("scanweaver: the fast-call extension could not be built (%s: %s); using ctypes",
                     type(exc).__name__, exc)
        return _module


def invoker(fn_address: int, slots: Sequence[Slot], n_sizes: int = 2) -> Callable[..., int]:
    """A function ``call(buffers, *sizes) -> return code`` for the kernel at ``fn_address``.

    Args:
        fn_address: the kernel's address (``ctypes.cast(fn, c_void_p).value``); its C
            signature is one pointer per slot, then ``n_sizes`` C ``long`` values.
        slots: what the kernel does with each buffer, in argument order.
        n_sizes: how many sizes follow the pointers (2 for the scan: ``nlanes``, ``L``).

    Raises (from ``call``):
        ValueError, BufferError: a buffer that is missing, too small, misaligned, read-only
            where written, not C-contiguous, or overlapping a written one.
    """
    if n_sizes < 0 or not slots or len(slots) + n_sizes > MAX_ARGS:
        raise ValueError(f"invoker: {len(slots)} buffers and {n_sizes} sizes are not supported "
                         f"(at most {MAX_ARGS} arguments)")
    spec = struct.pack("=q", n_sizes) + b"".join(s.pack() for s in slots)
    mod = extension()
    if mod is not None:
        invoke = mod.invoke  # type: ignore[attr-defined]
        return lambda buffers, *sizes: invoke(fn_address, buffers, spec, sizes)
    proto = ctypes.CFUNCTYPE(ctypes.c_int, *([ctypes.c_void_p] * len(slots)), *([ctypes.c_long] * n_sizes))
    fn = proto(fn_address)
    slots = tuple(slots)

    def call(buffers: tuple, *sizes: int) -> int:
        if len(sizes) != n_sizes:
            raise ValueError(f"invoke: {len(sizes)} sizes given; the kernel takes {n_sizes}")
        return fn(*_checked_addresses(buffers, slots), *sizes)

    return call


def addresser(slots: Sequence[Slot]) -> Callable[[tuple], tuple[int, ...]]:
    """A function ``addresses(buffers) -> ints``: the buffers' addresses (0 for ``None`` or a zero-byte
    slot), after the checks :func:`invoker` makes, for a kernel called some other way (ScanWeaver.jl's
    host closure, through juliacall). Reading them in C costs a fraction of a microsecond; ``ndarray.ctypes``
    costs about 3 us an array.

    Raises (from ``addresses``): as :func:`invoker`'s ``call``.

    Example:
        >>> import numpy as np
        >>> from scanweaver.runtime.fastcall import Slot, addresser
        >>> addresses = addresser((Slot(8, 4, written=True), Slot(0, 4, optional=True)))
        >>> y = np.zeros(2, np.float32)
        >>> addresses((y, None)) == (y.ctypes.data, 0)
        True
    """
    if not slots or len(slots) > MAX_ARGS:
        raise ValueError(f"addresser: {len(slots)} buffers are not supported (1 to {MAX_ARGS})")
    spec = struct.pack("=q", 0) + b"".join(s.pack() for s in slots)
    mod = extension()
    if mod is not None:
        addresses = mod.addresses  # type: ignore[attr-defined]
        return lambda buffers: addresses(buffers, spec)
    slots = tuple(slots)
    return lambda buffers: tuple(0 if a is None else a for a in _checked_addresses(buffers, slots))


def _checked_addresses(buffers: tuple, slots: tuple[Slot, ...]) -> list[int | None]:
    """The ctypes path's version of the extension's checks."""
    import numpy as np

    if len(buffers) != len(slots):
        raise ValueError(f"invoke: {len(buffers)} buffers do not match the spec ({len(slots)})")
    out: list[int | None] = []
    spans = []
    for i, (buf, slot) in enumerate(zip(buffers, slots, strict=True)):
        if buf is None:
            if not slot.optional:
                raise ValueError(f"invoke: buffer {i} is required, got None")
            out.append(None)
            continue
        arr = np.asarray(buf)
        if not arr.flags.c_contiguous:
            raise BufferError(f"invoke: buffer {i} is not C-contiguous")
        if slot.written and not arr.flags.writeable:
            raise BufferError(f"invoke: buffer {i} is read-only")
        if arr.nbytes < slot.need:
            raise ValueError(f"invoke: buffer {i} holds {arr.nbytes} bytes; the kernel needs {slot.need}")
        addr = arr.ctypes.data
        if slot.align > 1 and addr % slot.align:
            raise ValueError(f"invoke: buffer {i} is not aligned to {slot.align} bytes")
        out.append(addr if slot.need > 0 else None)
        spans.append((i, addr, addr + slot.need, slot.written))
    for i, lo, hi, written in spans:
        if written and lo != hi:
            for j, lo2, hi2, _ in spans:
                if j != i and lo2 != hi2 and lo < hi2 and lo2 < hi:
                    raise ValueError(f"invoke: written buffer {i} overlaps buffer {j}")
    return out
