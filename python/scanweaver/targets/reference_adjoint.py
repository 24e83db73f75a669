"""The reference meaning of stage ``adjoint``'s gradient expressions, on whole arrays.

Every backend's backward ends here or in a kernel that must agree with it:
given the states h_t, h_{t-1}, the adjoint g_t and the cotangent dy_t in
time order, each gradient expression of :class:`~scanweaver.ir.adjoint.AdjointIR`
is evaluated elementwise.  Only arithmetic and NumPy ufuncs are used, so the
same code runs on CuPy arrays (which dispatch NumPy ufuncs).

Example:
    >>> import numpy as np
    >>> from scanweaver.api import SELECTIVE
    >>> from scanweaver.passes.adjoint import adjoint
    >>> adj = adjoint(SELECTIVE.lower().affine, wrt=("x",))
    >>> ones = np.ones((1, 3))
    >>> out = {"x": np.empty((1, 3))}
    >>> gradients(adj, {"a": ones, "b": 2 * ones, "x": ones, "c": ones}, ones, None, ones, ones, 3 * ones, out)
    >>> out["x"].tolist()
    [[6.0, 6.0, 6.0]]
"""

from __future__ import annotations

import numpy as np

from ..ir.adjoint import AdjointIR
from ..ir.expr import evaluate
from ..ir.functions import NUMPY


def leaf_values(k: int, h, hprev, g) -> dict[str, object]:
    """The state and adjoint leaves by their printed names (``h``, ``h'``, ``g`` or ``h[j]`` ...)."""
    if k == 1:
        return {"h": hprev, "h'": h, "g": g}
    out = {}
    for j in range(k):
        out |= {f"h[{j}]": hprev[..., j], f"h'[{j}]": h[..., j], f"g[{j}]": g[..., j]}
    return out


def gradients(adj: AdjointIR, inputs: dict, dy, keep, h, hprev, g, out: dict) -> None:
    """Writes dL/d input for every name of ``adj.wrt`` into ``out[name]``.

    Args:
        adj: stage ``adjoint``.
        inputs: forward operand name -> ``(lanes, L)`` array.
        dy: the cotangent of y, ``(lanes, L)``.
        keep: ``1 - reset`` as a float ``(lanes, L)`` array, or ``None`` without resets.
        h, hprev: h_t and h_{t-1} in time order, ``(lanes, L)`` (``(lanes, L, k)`` for a dense state).
        g: dL/dh_t in time order, shaped like ``h``.
        out: name -> a writeable ``(lanes, L)`` array for each gradient.
    """
    values = dict(inputs)
    values[adj.cotangent] = dy
    if adj.keep:
        values[adj.keep] = keep
    values |= leaf_values(adj.state_size, h, hprev, g)
    with np.errstate(all="ignore"):
        for name, e in zip(adj.wrt, adj.grads, strict=True):
            out[name][...] = evaluate(e, values.__getitem__, NUMPY)
