"""The fused ``matrix_state`` kernels at the NumPy level: :func:`forward` and :func:`backward` on checked operands.

They run the fused operation :mod:`scanweaver.fused.matrix_state` through the
one runner of :mod:`scanweaver.calls.runner`: the backend named by ``backend=``,
or with ``auto`` the best available backend that renders the part; tunables
from the call, else the tuned store, else the backend's defaults; what ran is
:data:`scanweaver.matrix.last` (``runner.last["matrix_state"]``).  A backward
asked of a backend without the backward rendering runs on the best one with it
(the report says so).  Outputs of NumPy operands come from the host pool
(:func:`scanweaver.arrays.output_array`: arrays of earlier calls reused once
nothing refers to them); operands of a device array module (``ops.xp``, CuPy)
get their outputs allocated by that module, on the current stream: nothing
leaves the device.
"""

from __future__ import annotations

import numpy as np

from ...arrays import contiguous, output_array, output_like
from ...calls import runner
from ...calls.runner import FusedInfo
from ...errors import ScanInputError
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


def chunk_hints(api: str, chunk_size) -> dict:
    """``chunk_size=`` (checked by :func:`check_chunk_size`) as the runner's hint ``{"chunk": n}``: where the
    backend that runs the part has a chunked form whose ``chunk`` rule takes n, that form runs with chunks of n,
    unless the tuned store or the call's own tunables say otherwise (:func:`scanweaver.calls.runner.resolve`);
    elsewhere the hint is dropped.  The result does not depend on it, only the speed;
    :data:`scanweaver.matrix.last` says what ran (``source == "hint"`` where the hint decided)."""
    chunk_size = check_chunk_size(api, chunk_size)
    return {} if chunk_size is None else {"chunk": chunk_size}


def forward(ops: MatrixOperands, *, backend: str = "auto", return_state: bool = True, api: str = OP,
            chunk_size: int | None = None, **tunables) -> tuple[np.ndarray, np.ndarray | None]:
    """``(o, hlast)`` of the fused forward in the accumulation dtype (``hlast`` None unless ``return_state``)."""
    feats = ops.features()
    o = output_array(ops.xp, ops.v.shape, ops.dtype, near=ops.v)
    hlast = output_array(ops.xp, ops.state_shape, ops.dtype) if return_state else None
    hints = chunk_hints(api, chunk_size)
    if ops.v.shape[1] == 0:
        if hlast is not None:
            hlast[...] = 0 if ops.h0 is None else ops.h0
        be = runner.backend_for(OP, "forward", backend, ops.dtype, api=api, features=feats)
        cfg, source = runner.resolve(be, OP, "forward", feats, ops.sizes, tunables, api=api, hints=hints)
        runner.record(FusedInfo(be.name, "forward", cfg, source, OP))
    else:
        runner.run(OP, "forward", feats, {**ops.arrays(), "o": o, "hlast": hlast}, ops.sizes, backend=backend,
                   tunables=tunables, api=api, hints=hints)
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
    out = {"d" + n: output_like(xp, x, zero=True) for n, x in (("q", ops.q), ("k", ops.k), ("v", ops.v),
                                                                ("g", ops.g), ("u", ops.u))}
    out["dh0"] = None if ops.h0 is None else output_array(xp, ops.state_shape, ops.dtype, zero=True)
    hints = chunk_hints(api, chunk_size)
    if ops.v.shape[1] == 0:
        if out["dh0"] is not None and dh is not None:
            out["dh0"][...] = dh
        be = runner.backend_for(OP, "backward", backend, ops.dtype, api=api, fallback=True)
        cfg, source = runner.resolve(be, OP, "backward", feats, ops.sizes, {}, api=api, hints=hints)
        runner.record(FusedInfo(be.name, "backward", cfg, source, OP))
    else:
        runner.run(OP, "backward", feats, {**ops.arrays(), "do": do, "dhlast": dh, **out}, ops.sizes,
                   backend=backend, tunables=tunables, api=api, fallback=True, hints=hints)
    return out
