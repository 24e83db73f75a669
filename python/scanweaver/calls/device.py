"""Where a kernel pair's call computes: on the caller's device, or on host copies.

Every kernel pair built on a fused operation (:mod:`scanweaver.calls.pairs`:
``mamba1``, ``linear_attention``, ``rwkv6``, ``mamba2``, ``delta_rule``,
``gated_delta_rule``, ``kda``, ``rwkv7``) asks :func:`place` once per part with
its inputs (and, where a rendering fits only some calls, the call's features).
Device arrays (CuPy arrays, and so PyTorch CUDA tensors, which the PyTorch
front end hands over as CuPy views) stay on the device when the backend that
runs the part (``backend=``; ``auto``: the best available) takes them in place
(``cuda``): the pair then computes with the device arrays' own array module
(:attr:`Placement.xp`, CuPy): operand checks and conversions, the gates and
their gradients around the kernels, the outputs allocated on the current
stream, the kernels queued there; nothing is copied to the host and nothing
waits.  Otherwise (NumPy inputs, or a backend that takes host arrays only) the
pair computes with NumPy, and device inputs are copied to the host once and the
results copied back (:meth:`Placement.host`, :meth:`Placement.results`).  Where
device inputs go to the host because the backend that takes them in place has
no rendering of the part that fits the call (float16 delta-rule operands on ``cuda``),
the copy is the fallback's, and the runner's report of the call says so
(:attr:`FusedInfo.fallback <scanweaver.calls.runner.FusedInfo>`).

Example:
    >>> import numpy as np
    >>> from scanweaver.calls.device import place
    >>> where = place([np.ones(3)], "mamba1", "forward", "auto", api="demo")
    >>> where.xp is np, where.on_device, where.backend
    (True, False, 'auto')
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..arrays import compute_dtype, device_module
from ..errors import BackendUnavailable, ScanInputError
from . import runner


@dataclass(frozen=True)
class Placement:
    """Where one part of a kernel-pair call computes.

    Attributes:
        xp: the array module the pair computes with: NumPy, or the device arrays' module (CuPy).
        backend: the backend the pair asks for: the caller's ``backend=``, or on the device the one that
            takes the device arrays (``auto`` resolved, so that the part runs where its arrays are).
        back: for a host computation on device inputs, the device module the results go back to.
        device: on the device, the arrays' device as a context manager (CuPy's ``Device``), else ``None``.
        op: the fused operation.
        copied: why device inputs went to the host although a backend takes them in place (``""`` when not).
    """

    xp: Any
    backend: str
    back: Any = None
    device: Any = None
    op: str = ""
    copied: str = ""

    def context(self) -> contextlib.AbstractContextManager:
        """Makes the arrays' device current while the pair computes (CuPy allocates and launches on the current
        device: a tensor on ``cuda:1`` must not get outputs on ``cuda:0``)."""
        return self.device if self.device is not None else contextlib.nullcontext()

    @property
    def on_device(self) -> bool:
        """True when the call computes on the caller's device (no host copy)."""
        return self.xp is not np

    def host(self, values: list) -> list:
        """``values`` as the computation takes them: as they are, or host copies of device arrays."""
        if self.back is None:
            return list(values)
        return [self.back.asnumpy(v) if isinstance(v, self.back.ndarray) else v for v in values]

    def results(self, values: list) -> list:
        """The computation's results as the caller gets them: as they are, or back on the device (and when the
        copies were a fallback's, the runner's report of the call says why)."""
        if self.back is None:
            return list(values)
        if self.copied and self.op in runner.last:
            info = runner.last[self.op]
            runner.record(replace(info, fallback="; ".join(w for w in (info.fallback, self.copied) if w)))
        return [None if v is None else self.back.asarray(v) for v in values]


def place(values: list, op: str, part: str, backend: str, *, api: str, features: Any = None) -> Placement:
    """Where ``part`` of fused operation ``op`` computes for a call with array arguments ``values``.

    On the device when some value is a device array with an array module (:func:`~scanweaver.arrays.
    device_module`) and the backend that runs the part (``backend``; ``auto``: the best available one that
    renders it, for the inputs' accumulation dtype; a backward falls back as the runner does) takes those
    arrays in place; else on the host.

    Args:
        values: the call's arrays (``None`` for absent ones; cotangents included for a backward).
        op: the fused operation (``matrix_state``, ``mamba1``).
        part: ``forward`` or ``backward``.
        backend: the caller's ``backend=``.
        api: the public call's name.
        features: the fused operation's features of the call, where a rendering fits only some calls (the GPU
            delta-rule kernels store no float16): the part then runs where a rendering fits them, as the runner
            picks (``None``: any rendering of the part).
    """
    xp = device_module(values)
    if xp is None:
        return Placement(np, backend)
    first = next(v for v in values if v is not None and isinstance(v, xp.ndarray))
    dtypes = [np.dtype(v.dtype) for v in values if isinstance(v, xp.ndarray)]
    dtype = np.dtype(getattr(features, "state_dtype", compute_dtype(dtypes)))
    try:
        be = runner.backend_for(op, part, backend, dtype, api=api, features=features, fallback=part == "backward")
    except (BackendUnavailable, ScanInputError):
        be = None  # the host path raises the error that names what is missing
    if be is not None and _takes(be, first):
        device = getattr(first, "device", None)
        return Placement(xp, be.name, device=device if hasattr(device, "__enter__") else None, op=op)
    return Placement(np, backend, back=xp, op=op, copied=_why_copied(op, part, backend, dtype, features, be, first))


def _takes(be, value) -> bool:
    """True when backend ``be`` takes device array ``value`` in place."""
    takes = getattr(be, "is_device_array", None)
    return takes is not None and bool(takes(value))


def _why_copied(op: str, part: str, backend: str, dtype: np.dtype, features: Any, be, first) -> str:
    """Why device inputs go to the host for ``be`` although the backend asked for (``auto``: the best one for the
    part, any call) takes them in place: its rendering does not fit ``features``; ``""`` otherwise."""
    if be is None or features is None:
        return ""
    try:
        dev = runner.backend_for(op, part, backend, dtype, api=op)
    except (BackendUnavailable, ScanInputError):
        return ""
    reason = runner.misfit(dev, op, part, features) if dev.name != be.name and _takes(dev, first) else None
    if not reason:
        return ""
    return (f"backend {dev.name!r}: {reason}; {be.name!r} ran the {part} on host copies of the device arrays "
            "(copied there and the results back)")
