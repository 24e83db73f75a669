"""The fused ``matrix_state`` kernels at the NumPy level: :func:`forward` and :func:`backward` on checked operands.

They run the fused operation :mod:`scanweaver.fused.matrix_state` through the
one runner of :mod:`scanweaver.calls.runner`: the backend named by ``backend=``,
or with ``auto`` the best available backend that renders the part; tunables
from the call, else the tuned store, else the backend's defaults; what ran is
:data:`scanweaver.matrix.last` (``runner.last["matrix_state"]``).  A backward
asked of a backend without the backward rendering runs on the best one with it
(the report says so).  Operands of a device array module (``ops.xp``, CuPy) get
their outputs allocated by that module, on the current stream: nothing leaves
the device.
"""

from __future__ import annotations

import numpy as np

from ...arrays import contiguous
from ...calls import runner
from ...calls.runner import FusedInfo
from ...errors import ScanInputError
from ...fused import REGISTRY as FUSED
from .operands import MatrixOperands

#: The fused operation this module runs.
OP = "matrix_state"


def runs_matrix_state(name: str, part: str = "forward") -> bool:
    """True when backend ``name`` renders ``part`` of the fused ``matrix_state`` operation."""
    return name in runner.renders(OP, part)


def check_chunk_size(api: str, chunk_size) -> int | None:
    """``chunk_size=`` checked: the one rule of every matrix-state call on every backend.

    The results never depend on it (it only says how long the chunks of a chunked kernel are), so
    the rule is the same whatever runs the call: a positive int, or None.  (The chunked kernels
    are the place a tighter rule would come from; it would be written here.)

    Raises:
        ScanInputError: naming ``chunk_size`` and what it got.
    """
    if chunk_size is None:
        return None
    if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ScanInputError(f"{api}: chunk_size must be a positive int or None, got {chunk_size!r}")
    return int(chunk_size)


def chunk_tunables(backend: str, dtype: np.dtype, part: str, chunk_size: int | None, api: str) -> dict:
    """``chunk_size=`` (checked by :func:`check_chunk_size`) as the chunk-length tunable (``chunk``) of the
    backend that runs ``part``, where its rendering has one and takes that length; else nothing, and the
    backend's own chunk runs (tuned or default: :data:`scanweaver.matrix.last` says which): the result does
    not depend on it, only the speed."""
    from ...targets.fused import family_of

    chunk_size = check_chunk_size(api, chunk_size)
    if chunk_size is None:
        return {}
    be = runner.backend_for(OP, part, backend, dtype, api=api, fallback=part == "backward")
    chunk = next((t for t in FUSED.get(OP).tunables_for(family_of(be.target)) if t.name == "chunk"), None)
    if chunk is None or (chunk.rule is not None and chunk.rule(chunk_size)):
        return {}
    return {"chunk": chunk_size}


def forward(ops: MatrixOperands, *, backend: str = "auto", return_state: bool = True, api: str = OP,
            chunk_size: int | None = None, **tunables) -> tuple[np.ndarray, np.ndarray | None]:
    """``(o, hlast)`` of the fused forward in the accumulation dtype (``hlast`` None unless ``return_state``)."""
    feats = ops.features()
    o = ops.xp.empty(ops.v.shape, ops.dtype)
    hlast = ops.xp.empty(ops.state_shape, ops.dtype) if return_state else None
    given = {**chunk_tunables(backend, ops.dtype, "forward", chunk_size, api), **tunables}
    if ops.v.shape[1] == 0:
        if hlast is not None:
            hlast[...] = 0 if ops.h0 is None else ops.h0
        be = runner.backend_for(OP, "forward", backend, ops.dtype, api=api, features=feats)
        cfg, source = runner.resolve(be, OP, "forward", feats, ops.sizes, given, api=api)
        runner.record(FusedInfo(be.name, "forward", cfg, source, OP))
    else:
        runner.run(OP, "forward", feats, {**ops.arrays(), "o": o, "hlast": hlast}, ops.sizes, backend=backend,
                   tunables=given, api=api)
    return o, hlast


def backward(ops: MatrixOperands, do: np.ndarray, dhlast: np.ndarray | None = None, *, backend: str = "auto",
             api: str = OP, chunk_size: int | None = None, **tunables) -> dict[str, np.ndarray | None]:
    """Gradients of ``sum(o * do) + sum(hlast * dhlast)``: ``dq, dk, dv, dg, du, dh0`` (None where absent).

    A backend without the backward rendering is replaced by the best available one that has it.
    """
    feats = ops.features(has_dhlast=dhlast is not None)
    xp = ops.xp
    do = contiguous(do, ops.dtype, xp)
    dh = None if dhlast is None else contiguous(dhlast, ops.dtype, xp)
    out = {"dq": xp.zeros_like(ops.q), "dk": xp.zeros_like(ops.k), "dv": xp.zeros_like(ops.v),
           "dg": None if ops.g is None else xp.zeros_like(ops.g), "du": None if ops.u is None else
           xp.zeros_like(ops.u), "dh0": None if ops.h0 is None else xp.zeros(ops.state_shape, ops.dtype)}
    given = {**chunk_tunables(backend, ops.dtype, "backward", chunk_size, api), **tunables}
    if ops.v.shape[1] == 0:
        if out["dh0"] is not None and dh is not None:
            out["dh0"][...] = dh
        be = runner.backend_for(OP, "backward", backend, ops.dtype, api=api, fallback=True)
        cfg, source = runner.resolve(be, OP, "backward", feats, ops.sizes, {}, api=api)
        runner.record(FusedInfo(be.name, "backward", cfg, source, OP))
    else:
        runner.run(OP, "backward", feats, {**ops.arrays(), "do": do, "dhlast": dh, **out}, ops.sizes,
                   backend=backend, tunables=given, api=api, fallback=True)
    return out
