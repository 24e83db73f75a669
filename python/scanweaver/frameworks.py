"""Framework arrays at the API boundary: every public call accepts PyTorch, JAX and CuPy arrays.

:func:`framework` recognises PyTorch tensors and JAX arrays (and tracers) by
the module of their type, without importing either library; a call with
such operands is handed to :mod:`scanweaver.torch` or :mod:`scanweaver.jax`,
which return the caller's array type and are differentiable (autograd,
``jax.grad``), under ``torch.compile`` and ``jax.jit`` too.  CUDA tensors
that need no gradient, CuPy arrays and other device arrays stay with
:mod:`scanweaver.runtime.device_arrays` (the ``cuda`` backend, asynchronous
on the caller's stream, ``out=`` allowed), and NumPy arrays with the NumPy
path.

Example:
    >>> import numpy as np
    >>> from scanweaver.frameworks import framework
    >>> framework([np.ones(3), None]) is None
    True
"""

from __future__ import annotations

from .errors import ScanInputError

#: Top-level module of an array's type -> the front end that takes it.
FRONT_ENDS = {"torch": "torch", "jax": "jax", "jaxlib": "jax"}


def framework(values) -> str | None:
    """``"torch"`` or ``"jax"`` when any of ``values`` is that framework's array, else ``None``.

    Raises:
        ScanInputError: when PyTorch and JAX arrays are mixed.
    """
    values = [v for v in values if v is not None]
    found = {FRONT_ENDS[m] for v in values if (m := type(v).__module__.split(".")[0]) in FRONT_ENDS}
    if len(found) > 1:
        raise ScanInputError("scanweaver: operands mix PyTorch tensors and JAX arrays; pass one framework's arrays")
    if found == {"torch"} and not _torch_front_end(values):
        return None  # CUDA tensors without gradients: the cuda backend takes them as they are (out= too)
    return found.pop() if found else None


def _torch_front_end(values) -> bool:
    """True when PyTorch tensors need :mod:`scanweaver.torch`: some live on the CPU, or some need gradients."""
    import sys

    torch = sys.modules["torch"]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    return any(not t.is_cuda for t in tensors) or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def run(name: str, rec, operands: dict, tunables: dict, *, out=None, **options):
    """Runs ``rec`` through the front end ``name`` (``torch`` or ``jax``); returns its result.

    Args:
        name: from :func:`framework`.
        rec: the recurrence.
        operands: operand name -> array (all given).
        tunables: the call's tunables.
        out: must be ``None`` (framework results are fresh arrays of their own).
        **options: ``h0``, ``reset``, ``reverse``, ``return_state``, ``backend``, ``schedule``,
            ``config``, ``cu_seqlens``.

    Raises:
        ScanInputError: for ``out=`` with framework arrays.
    """
    if out is not None:
        raise ScanInputError(f"{rec.name}: out= takes NumPy arrays; with {name} operands the result is a new "
                             f"{name} array (drop out=)")
    if name == "torch":
        from . import torch as front
    else:
        from . import jax as front  # type: ignore[no-redef]
    return front.apply(rec, *(operands[n] for n in rec.inputs), **options, **tunables)
