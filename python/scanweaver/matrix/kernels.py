"""The fused ``matrix_state`` kernels at the NumPy level: :func:`forward` and :func:`backward` on checked operands.

They run the fused operation :mod:`scanweaver.fused.matrix_state` through the
backend interface (:meth:`scanweaver.runtime.base.Backend.run_fused`), as
:mod:`scanweaver.mamba.kernels` does for Mamba-1: the backend is the one named
by ``backend=``, or with ``auto`` the best available backend that renders the
operation (today ``numpy``, the operation's own NumPy definition; a backend
that adds a rendering to ``MatrixState.implementations`` is picked up here
with no change).  Tunables come from the call, else the tuned store, else the
backend's defaults; :data:`last` says what ran.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import BackendUnavailable
from ..fused import REGISTRY as FUSED
from ..runtime import REGISTRY as BACKENDS
from ..runtime import Backend, get_backend
from .operands import MatrixOperands

#: The fused operation this module runs.
OP = "matrix_state"


@dataclass(frozen=True)
class FusedInfo:
    """What the last matrix-state call ran: backend, part, the tunables and where they came from."""

    backend: str
    part: str
    config: dict
    source: str


#: :class:`FusedInfo` of the most recent matrix-state kernel call in this process (``None`` before).
last: FusedInfo | None = None


def runs_matrix_state(name: str, part: str = "forward") -> bool:
    """True when backend ``name`` renders ``part`` of the fused ``matrix_state`` operation."""
    cls = BACKENDS.get(name, None)
    return cls is not None and FUSED.get(OP).runs_on(cls.target, part)


def backend_for(backend: str, dtype: np.dtype, part: str, api: str) -> Backend:
    """The backend that runs ``part`` for ``backend=`` (``auto``: the best available one that renders it).

    Raises:
        BackendUnavailable: the named backend has no rendering of ``part`` (the message lists those that do),
            or it is not available on this machine.
    """
    op = FUSED.get(OP)
    if backend == "auto":
        ranked = sorted((c for _, c in BACKENDS.items() if c.auto_priority >= 0 and op.runs_on(c.target, part)
                         and dtype.name in c.dtypes and c.availability().ok), key=lambda c: -c.auto_priority)
        if not ranked:
            raise BackendUnavailable(f"{api}: no available backend renders the fused {OP} {part} kernel")
        return get_backend(ranked[0].name)
    be = get_backend(backend)
    if not op.runs_on(be.target, part):
        have = [n for n, c in BACKENDS.items() if op.runs_on(c.target, part)]
        raise BackendUnavailable(f"{api}: backend {backend!r} has no fused {OP} {part} kernel yet; backends with "
                                 f"one: {', '.join(have)} (or backend='auto')")
    return be


def _config(be: Backend, ops: MatrixOperands, features, tunables: dict, api: str) -> tuple[dict, str]:
    from ..targets.fused import family_of
    from ..tuning import store

    op = FUSED.get(OP)
    family = family_of(be.target)
    sizes = ops.sizes
    defaults = be.fused_defaults(OP, features, sizes)
    source = "explicit" if tunables else "default"
    if not tunables and op.tunables_for(family):
        hit = store.lookup(backend=be.name, device=be.availability().device, signature=op.signature(features),
                           dtype=features.dtype, lanes=ops.nseq * sizes["H"], L=sizes["T"])
        if hit is not None and hit[0] == store.FUSED_PREFIX + OP:
            defaults, source = {**defaults, **dict(hit[1])}, "tuned"
    return op.resolve(family, tunables, defaults, api), source


def chunk_tunables(be: Backend, chunk_size: int | None) -> dict:
    """``chunk_size=`` as the backend's chunk-length tunable (``chunk``) where its rendering has one, else none:
    the result does not depend on it, only the speed."""
    from ..targets.fused import family_of

    if chunk_size is None:
        return {}
    names = {t.name for t in FUSED.get(OP).tunables_for(family_of(be.target))}
    return {"chunk": int(chunk_size)} if "chunk" in names else {}


def forward(ops: MatrixOperands, *, backend: str = "auto", return_state: bool = True, api: str = OP,
            chunk_size: int | None = None, **tunables) -> tuple[np.ndarray, np.ndarray | None]:
    """``(o, hlast)`` of the fused forward in the accumulation dtype (``hlast`` None unless ``return_state``)."""
    global last
    be = backend_for(backend, ops.dtype, "forward", api)
    feats = ops.features()
    cfg, source = _config(be, ops, feats, {**chunk_tunables(be, chunk_size), **tunables}, api)
    o = np.empty(ops.v.shape, ops.dtype)
    hlast = np.empty(ops.state_shape, ops.dtype) if return_state else None
    if ops.v.shape[1] == 0:
        if hlast is not None:
            hlast[...] = 0 if ops.h0 is None else ops.h0
    else:
        be.run_fused(FUSED.get(OP).call("forward", feats, cfg), {**ops.arrays(), "o": o, "hlast": hlast}, ops.sizes)
    last = FusedInfo(be.name, "forward", cfg, source)
    return o, hlast


def backward(ops: MatrixOperands, do: np.ndarray, dhlast: np.ndarray | None = None, *, backend: str = "auto",
             api: str = OP, chunk_size: int | None = None, **tunables) -> dict[str, np.ndarray | None]:
    """Gradients of ``sum(o * do) + sum(hlast * dhlast)``: ``dq, dk, dv, dg, du, dh0`` (None where absent).

    A backend without the backward rendering is replaced by the best available one that has it.
    """
    global last
    try:
        be = backend_for(backend, ops.dtype, "backward", api)
    except BackendUnavailable:
        be = backend_for("auto", ops.dtype, "backward", api)
        tunables, chunk_size = {}, None
    feats = ops.features(has_dhlast=dhlast is not None)
    cfg, source = _config(be, ops, feats, {**chunk_tunables(be, chunk_size), **tunables}, api)
    do = np.ascontiguousarray(do, dtype=ops.dtype)
    dh = None if dhlast is None else np.ascontiguousarray(dhlast, dtype=ops.dtype)
    out = {"dq": np.zeros_like(ops.q), "dk": np.zeros_like(ops.k), "dv": np.zeros_like(ops.v),
           "dg": None if ops.g is None else np.zeros_like(ops.g), "du": None if ops.u is None else
           np.zeros_like(ops.u), "dh0": None if ops.h0 is None else np.zeros(ops.state_shape, ops.dtype)}
    if ops.v.shape[1] == 0:
        if out["dh0"] is not None and dh is not None:
            out["dh0"][...] = dh
    else:
        be.run_fused(FUSED.get(OP).call("backward", feats, cfg), {**ops.arrays(), "do": do, "dhlast": dh, **out},
                     ops.sizes)
    last = FusedInfo(be.name, "backward", cfg, source)
    return out
