"""The one router: which array framework's adapter takes a call.

Every public entry point (every operation's NumPy entry and every
``@scanweaver.recurrence``) asks :func:`framework` where its operands come
from, with one rule:

* a PyTorch tensor (any device)            -> ``"torch"`` (:mod:`scanweaver.torch`)
* a JAX array or tracer                    -> ``"jax"``   (:mod:`scanweaver.jax`)
* a Dask array                             -> ``"dask"``  (:mod:`scanweaver.dask`: lazy, chunked)
* NumPy arrays, Python scalars, CuPy arrays and other ``__cuda_array_interface__``
  device arrays                            -> ``None``: the core takes them as they are
  (device arrays run on the ``cuda`` backend, on the caller's stream, with no host copy).

Arrays of two frameworks in one call, or a framework's arrays beside NumPy
arrays, are refused with a message that names both.  The adapters are not
imported by anything below them: each registers itself in :data:`ADAPTERS`
when its module is imported, and the router imports ``scanweaver.<name>``
the first time a call needs it (the way JAX's primitives register their
rules into tables that the machinery never imports).  An adapter is the
module object itself; it exposes one entry point per operation it carries,
under the operation's name, with the operation's declared signature.

Example:
    >>> import numpy as np
    >>> from scanweaver.calls.route import framework
    >>> framework("demo", [np.ones(3), None, 2.0]) is None
    True
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType

from ..errors import BackendUnavailable, ScanInputError

#: Top-level module of an array's type -> the framework (and adapter module) that takes it.
FRAMEWORKS = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "dask": "dask"}
#: Frameworks whose arrays may stand beside NumPy arrays in one call (Dask takes NumPy blocks as they are).
MIXES_WITH_NUMPY = ("dask",)
#: What ``pip install`` brings each adapter's framework.
EXTRAS = {"torch": "scanweaver[torch]", "jax": "scanweaver[jax]", "dask": "scanweaver[dask]"}

#: Adapter name -> its module, filled by the adapters themselves (:func:`register`).
ADAPTERS: dict[str, ModuleType] = {}
_lock = threading.RLock()


def framework(api: str, values) -> str | None:
    """``"torch"``, ``"jax"`` or ``"dask"`` when some value is that framework's array, else ``None`` (the core's).

    Args:
        api: the calling operation's name (messages start with it).
        values: the call's array arguments (``None`` and Python scalars allowed).

    Raises:
        ScanInputError: arrays of two frameworks, or a framework's arrays beside NumPy arrays.
    """
    found: set[str] = set()
    numpy_arg = False
    for v in values:
        if v is None:
            continue
        name = FRAMEWORKS.get(type(v).__module__.partition(".")[0])
        if name is not None:
            found.add(name)
        elif type(v).__module__ == "numpy" and getattr(v, "ndim", 0) > 0:
            numpy_arg = True
    if not found:
        return None
    if len(found) > 1:
        names = {"torch": "PyTorch tensors", "jax": "JAX arrays", "dask": "Dask arrays"}
        raise ScanInputError(f"{api}: operands mix {' and '.join(names[n] for n in names if n in found)}; pass one "
                             "framework's arrays")
    name = found.pop()
    if numpy_arg and name not in MIXES_WITH_NUMPY:
        kind = "PyTorch tensors" if name == "torch" else "JAX arrays"
        convert = "torch.as_tensor(x)" if name == "torch" else "jax.numpy.asarray(x)"
        raise ScanInputError(f"{api}: operands mix {kind} and NumPy arrays; pass {kind} throughout "
                             f"(convert the NumPy ones with {convert}) or NumPy arrays throughout")
    return name


def register(name: str, module: ModuleType) -> None:
    """Called by an adapter module when it is imported: ``register("torch", sys.modules[__name__])``."""
    with _lock:
        ADAPTERS[name] = module


def adapter(name: str) -> ModuleType:
    """The adapter module ``name`` (imported on first use).

    Raises:
        BackendUnavailable: its framework is not installed (the message says what to install).
    """
    mod = ADAPTERS.get(name)
    if mod is not None:
        return mod
    with _lock:
        try:
            importlib.import_module(f"scanweaver.{name}")
        except ImportError as exc:
            raise BackendUnavailable(f"scanweaver.{name}: {exc}; install it with pip install "
                                     f"'{EXTRAS.get(name, name)}'") from None
    return ADAPTERS[name]


def entry(name: str, op: str):
    """Adapter ``name``'s entry point for operation ``op``.

    Raises:
        ScanInputError: the adapter does not carry ``op``.
    """
    fn = getattr(adapter(name), op, None)
    if fn is None:
        raise ScanInputError(f"{op}: takes no {name} arrays (scanweaver.{name} has no {op}); pass NumPy arrays")
    return fn
