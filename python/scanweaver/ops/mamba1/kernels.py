"""The fused Mamba-1 kernels at the NumPy level: :func:`forward` and :func:`backward` on prepared operands.

They run the fused operation :mod:`scanweaver.fused.mamba1` on the backend's
rendering (``cpu``: C; ``opencl``/``cuda``: the GPU kernels; ``numpy``: its
NumPy definition) through the one runner (:mod:`scanweaver.calls.runner`):
the tunables from the call, else the tuned store, else the backend's
defaults; what ran is :data:`scanweaver.mamba.last`.  :class:`ForwardPlan`
keeps a resolved forward per call signature, for repeated calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...arrays import device_module, output_array, output_like
from ...calls import runner
from ...calls.runner import FusedInfo
from ...core.dispatch import pick_backend
from ...errors import BackendUnavailable
from ...fused import REGISTRY as FUSED
from ...fused.base import FusedCall
from ...fused.mamba1 import Mamba1Features
from ...runtime import Backend
from .operands import API, MambaOperands

#: The fused operation this module runs.
OP = "mamba1"


def fused_backend(backend: str, dtype: np.dtype, part: str = "forward",
                  features: Mamba1Features | None = None) -> Backend | None:
    """The backend that runs ``part`` of the fused kernel for ``backend=`` (``auto``: the best
    available), or ``None`` when that backend has no fused rendering, or none that fits ``features``
    (the scan path runs)."""
    if dtype.kind == "c":
        return None
    be = pick_backend(backend, dtype.name)
    if not FUSED.get(OP).runs_on(be.target, part):
        return None
    return None if features is not None and runner.misfit(be, OP, part, features) else be


@dataclass
class ForwardPlan:
    """The fused forward resolved for one call signature: backend, compiled variant, tunables.

    :meth:`run` takes arrays already in the kernel's layout and dtype; on the ``cpu``
    backend it calls the kernel through the checked trampoline of
    :mod:`scanweaver.runtime.fastcall` (every buffer checked in C), elsewhere through
    the backend's ``run_fused``.
    """

    backend: Backend
    call: FusedCall
    info: FusedInfo
    sizes: dict
    y_shape: tuple[int, ...]
    h_shape: tuple[int, ...]
    dtype: np.dtype
    from_store: bool
    stamp: object
    invoke: Callable | None
    names: tuple[str, ...] = ()

    def fresh(self) -> bool:
        """False when the tunables came from the tuned store and a store has changed since."""
        if not self.from_store:
            return True
        from ...tuning import store

        return self.stamp == store.stamp()

    def run(self, arrays: dict, return_state: bool, xp=None) -> tuple[np.ndarray, np.ndarray | None]:
        """``(y, h_last)`` for input ``arrays`` (parameter name -> array or ``None``) of this signature; with
        ``xp`` (CuPy) the arrays are device arrays and so are the results (nothing leaves the device)."""
        mod = np if xp is None else xp
        y = output_array(mod, self.y_shape, self.dtype, near=arrays.get("u"))
        hlast = output_array(mod, self.h_shape, self.dtype) if return_state else None
        if self.y_shape[2] == 0 and hlast is not None:  # no step: the state is h0
            h0 = arrays.get("h0")
            hlast[...] = 0 if h0 is None else h0
        if self.invoke is not None and self.y_shape[2] > 0 and xp is None:
            outs = {"y": y, "hlast": hlast}
            buffers = tuple(outs[n] if n in outs else arrays.get(n) for n in self.names)
            rc = self.invoke(buffers, *self.sizes.values())
            if rc != 0:
                raise MemoryError(f"{API}: the fused kernel could not allocate its scratch memory (status {rc})")
        else:
            self.backend.run_fused(self.call, {**arrays, "y": y, "hlast": hlast}, self.sizes)
        runner.record(self.info)
        return y, hlast


def plan_forward(ops: MambaOperands, *, backend: str = "auto", api: str = API, **tunables) -> ForwardPlan:
    """Resolves the fused forward for these operands' signature (see :class:`ForwardPlan`).

    Raises:
        BackendUnavailable: the backend has no fused rendering (use the scan path).
    """
    from ...tuning import store

    be = _require(backend, ops.dtype, "forward", api)
    feats = ops.features()
    cfg, source = runner.resolve(be, OP, "forward", feats, ops.sizes, tunables, api=api)
    call = FUSED.get(OP).call("forward", feats, cfg)
    params = FUSED.get(OP).params("forward")
    sizes = {p.name: ops.sizes[p.name] for p in params if p.kind == "int"}
    make = getattr(be, "fused_invoker", None)
    return ForwardPlan(be, call, FusedInfo(be.name, "forward", cfg, source, OP), sizes, tuple(ops.u.shape),
                       (*ops.u.shape[:2], ops.A.shape[1]), ops.dtype, from_store=not tunables,
                       stamp=store.stamp() if not tunables else None,
                       invoke=make(call, ops.sizes) if make is not None else None,
                       names=tuple(p.name for p in params if p.kind != "int"))


def forward(ops: MambaOperands, *, backend: str = "auto", return_state: bool = True, api: str = API,
            **tunables) -> tuple[np.ndarray, np.ndarray | None]:
    """The fused forward on prepared operands: ``(y, h_last)`` in the accumulation dtype.

    Raises:
        BackendUnavailable: the backend has no fused rendering (use the scan path).
    """
    return plan_forward(ops, backend=backend, api=api, **tunables).run(ops.arrays(), return_state, _xp(ops.u))


def _xp(u):
    """The array module of a device array (CuPy for a CuPy array: the device path), else ``None``."""
    return device_module([u])


def backward(ops: MambaOperands, dout: np.ndarray, dhlast: np.ndarray | None = None, *, backend: str = "auto",
             api: str = API, **tunables) -> dict[str, np.ndarray | None]:
    """The fused backward: gradients of ``sum(y * dout) + sum(h_last * dhlast)`` for every input.

    Returns ``du, ddelta, dA, dB, dC`` (B/C in the prepared layout) and ``dD, dz, ddelta_bias, dh0``
    (``None`` for inputs that were not given).
    """
    be = _require(backend, ops.dtype, "backward", api)
    feats = ops.features(has_dhlast=dhlast is not None)
    cfg, source = runner.resolve(be, OP, "backward", feats, ops.sizes, tunables, api=api)
    mod = _xp(ops.u) or np  # device operands: gradients made and written on the device
    dout = mod.ascontiguousarray(dout, dtype=ops.dtype)
    dh = None if dhlast is None else mod.ascontiguousarray(dhlast, dtype=ops.dtype)
    like = {"du": ops.u, "ddelta": ops.u, "dA": ops.A, "dB": ops.B, "dC": ops.C, "dD": ops.D,
            "dz": None if ops.z is None else ops.u, "ddelta_bias": ops.delta_bias, "dh0": ops.h0}
    out = {n: output_like(mod, x) for n, x in like.items()}  # every element written by the kernel
    be.run_fused(FUSED.get(OP).call("backward", feats, cfg), {**ops.arrays(), "dout": dout, "dhlast": dh, **out},
                 ops.sizes)
    if ops.u.shape[2] == 0:  # no step: only the state's gradient passes through
        for k, v in out.items():
            if v is not None:
                v[...] = dh if k == "dh0" and dh is not None else 0
    runner.record(FusedInfo(be.name, "backward", cfg, source, OP))
    return out


def backward_backend(backend: str, dtype: np.dtype) -> str:
    """``backend`` when it renders the fused backward, else the best available backend that does
    (by ``auto`` priority: ``cuda``, ``cpu``, ``opencl``, ``numpy``)."""
    if fused_backend(backend, dtype, "backward") is not None:
        return backend
    be = runner.best(OP, "backward", dtype)
    return be.name if be is not None else backend


def _require(backend: str, dtype: np.dtype, part: str, api: str) -> Backend:
    be = fused_backend(backend, dtype, part)
    if be is None:
        name = backend if backend != "auto" else pick_backend("auto").name
        raise BackendUnavailable(f"{api}: backend {name!r} has no fused {OP} {part} kernel for dtype {dtype}; "
                                 f"backends with one: {', '.join(runner.renders(OP, part))} (or backend='auto')")
    return be
