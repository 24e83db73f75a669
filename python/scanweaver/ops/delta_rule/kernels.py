"""The fused ``delta_rule`` kernels at the NumPy level: :func:`forward` and :func:`backward` on checked operands.

They run the fused operation :mod:`scanweaver.fused.delta_rule` through the one
runner of :mod:`scanweaver.calls.runner`: the backend named by ``backend=``, or
with ``auto`` the best available backend that renders the part and fits the
call's features; tunables from the call, else the tuned store, else the
backend's defaults; what ran is :data:`scanweaver.matrix.last`
(``runner.last["delta_rule"]``).  A backward asked of a backend whose rendering
does not run it (the GPU kernels store no float16) runs on the best one
that does, and the report says so.  The algorithm is the kernels' tunable
``algorithm``, chosen by the runner (:meth:`scanweaver.fused.FusedOp.algorithm`,
``chunk_size``, the tuned store, the call's ``algorithm=``), as for every fused
operation.  Outputs of NumPy operands come from the host pool
(:func:`scanweaver.arrays.output_array`: arrays of earlier calls reused once nothing
refers to them); operands of a device array module (``ops.xp``, CuPy) get their
outputs allocated by that module, on the current stream: nothing leaves the device.

Example:
    >>> import numpy as np
    >>> from scanweaver.ops.delta_rule.operands import operands
    >>> from scanweaver.ops.delta_rule.kernels import forward
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 1, 4, 2, 3))
    >>> ops = operands("demo", "delta_rule", q, k / 3, v, beta=rng.uniform(0, 1, (1, 4, 2)))
    >>> o, h = forward(ops, backend="numpy")
    >>> o.shape, h.shape
    ((1, 4, 2, 3), (1, 2, 3, 3))
"""

from __future__ import annotations

import numpy as np

from ...arrays import contiguous, output_array, output_like
from ...calls import runner
from ...calls.runner import FusedInfo
from .operands import DeltaOperands

#: The fused operation this module runs.
OP = "delta_rule"


def chunk_hints(chunk_size: int | None) -> dict:
    """fla's ``chunk_size=`` as the runner's hint ``{"chunk": n}``: where the backend that runs the part has a
    chunked form whose ``chunk`` rule takes n, that form runs with chunks of n, unless the tuned store or the
    call's own tunables say otherwise (:func:`scanweaver.calls.runner.resolve`); elsewhere it is dropped: the
    result does not depend on it, only the speed."""
    return {} if chunk_size is None else {"chunk": int(chunk_size)}


def _record_empty(ops: DeltaOperands, part: str, backend: str, api: str, features) -> None:
    """What a call with T = 0 ran: nothing, on the backend that would have run it."""
    be = runner.backend_for(OP, part, backend, ops.state_dtype, api=api, features=features,
                            fallback=part == "backward")
    cfg, source = runner.resolve(be, OP, part, features, ops.sizes, {}, api=api)
    runner.record(FusedInfo(be.name, part, cfg, source, OP))


def forward(ops: DeltaOperands, *, backend: str = "auto", api: str = OP, chunk_size: int | None = None,
            **tunables) -> tuple[np.ndarray, np.ndarray]:
    """``(o, hlast)``: o ``(B, T, HV, V)`` in the storage dtype, unscaled; hlast ``(nseq, HV, K, V)`` in the
    accumulation dtype (h0 where a sequence is empty)."""
    o, hlast, _ = reported_forward(ops, backend=backend, api=api, chunk_size=chunk_size, **tunables)
    return o, hlast


def reported_forward(ops: DeltaOperands, *, backend: str = "auto", api: str = OP, chunk_size: int | None = None,
                     **tunables) -> tuple[np.ndarray, np.ndarray, FusedInfo | None]:
    """:func:`forward`'s ``(o, hlast)`` and the runner's report of the kernel that ran (``None`` for T = 0, where
    none ran)."""
    feats = ops.features()
    o = output_array(ops.xp, ops.v.shape, ops.dtype, near=ops.v)
    hlast = output_array(ops.xp, ops.state_shape, ops.state_dtype)
    if ops.v.shape[1] == 0:
        hlast[...] = 0 if ops.h0 is None else ops.h0
        _record_empty(ops, "forward", backend, api, feats)
        return o, hlast, None
    info = runner.run(OP, "forward", feats, {**ops.arrays(), "o": o, "hlast": hlast}, ops.sizes, backend=backend,
                      tunables=tunables, api=api, hints=chunk_hints(chunk_size))
    return o, hlast, info


def backward(ops: DeltaOperands, do: np.ndarray | None, dhlast: np.ndarray | None = None, *, backend: str = "auto",
             api: str = OP, chunk_size: int | None = None, **tunables) -> dict[str, np.ndarray | None]:
    """Gradients of ``sum(o * do) + sum(hlast * dhlast)`` (o unscaled): ``dq, dk, dv, dg, dbeta, da, db`` in the
    storage dtype (None where the operand is absent) and ``dh0`` in the accumulation dtype (None without h0)."""
    feats = ops.features(has_dhlast=dhlast is not None)
    xp = ops.xp
    do = xp.zeros(ops.v.shape, ops.dtype) if do is None else contiguous(do, ops.dtype, xp)
    dh = None if dhlast is None else contiguous(dhlast, ops.state_dtype, xp)
    out: dict[str, np.ndarray | None] = {
        "d" + n: output_like(xp, x, zero=True)
        for n, x in (("q", ops.q), ("k", ops.k), ("v", ops.v), ("g", ops.g), ("beta", ops.beta), ("a", ops.a),
                     ("b", ops.b))}
    out["dh0"] = None if ops.h0 is None else output_array(xp, ops.state_shape, ops.state_dtype, zero=True)
    if ops.v.shape[1] == 0:
        if out["dh0"] is not None and dh is not None:
            out["dh0"][...] = dh
        _record_empty(ops, "backward", backend, api, feats)
        return out
    runner.run(OP, "backward", feats, {**ops.arrays(), "do": do, "dhlast": dh, **out}, ops.sizes, backend=backend,
               tunables=tunables, api=api, fallback=True, hints=chunk_hints(chunk_size))
    return out
