"""``@scanweaver.recurrence(state_shape=("K", "V"))``: a step over a matrix state, lowered to ``matrix_state``.

The step is traced by :mod:`scanweaver.frontend.matrix_classify` (proved affine in
the state and classified); a form that maps onto the fused operation runs there,
any other raises an error naming its structure when it is called.

Operands, in the step's order: a scalar per step is ``(batch, T, H)`` (or ``(H,)``,
one per head), a vector ``(batch, T, H, n)`` (or ``(H, n)``); the state's axis sizes
are bound from the vectors that meet them.  The state is ``(batch, H, rows, cols)``
in the step's own orientation.
"""

from __future__ import annotations

import importlib

import numpy as np

from ...calls import route
from ...errors import ScanInputError, api_boundary
from ...frontend.matrix_classify import trace_matrix
from ...frontend.matrix_sign import carry_signs
from ...ir.matrix import MatrixScanIR
from . import kernels
from .operands import operands, seqlens


class MatrixRecurrence:
    """A compiled matrix-state recurrence (see the module docstring); call it on NumPy arrays."""

    def __init__(self, step, state_shape: tuple[str, str], name: str | None = None):
        self.step, self.state_shape = step, tuple(state_shape)
        self.ir, _ = trace_matrix(step, self.state_shape, name)  # proves it affine; shown by .ir and stages()
        self.name, self.inputs = self.ir.name, self.ir.inputs
        self._traced: dict[frozenset, tuple[MatrixScanIR, dict]] = {}

    def __repr__(self) -> str:
        return f"<scanweaver matrix recurrence {self.name}({', '.join(self.inputs)}) state {self.state_shape}>"

    def stages(self) -> dict[str, str]:
        """The printed stages ``matrix_scan`` and ``matrix_state``."""
        return self.ir.text()

    def traced(self, vectors: frozenset) -> tuple[MatrixScanIR, dict]:
        """The IR and evaluators for one pattern of vector operands."""
        if vectors not in self._traced:
            self._traced[vectors] = trace_matrix(self.step, self.state_shape, self.name, vectors)
        return self._traced[vectors]

    @api_boundary
    def __call__(self, *args, h0=None, return_state: bool = False, cu_seqlens=None, reverse: bool = False,
                 backend: str = "auto", **tunables):
        """Runs the recurrence: ``y (batch, T, H, n)``, or ``(y, state (N, H, rows, cols))`` with ``return_state``.

        PyTorch tensors and JAX arrays are differentiable: the step's gates are computed by the framework
        and the scan runs as :func:`scanweaver.torch.linear_attention` / ``rwkv6`` (or the JAX ones).
        """
        api = self.name
        if len(args) != len(self.inputs):
            raise ScanInputError(f"{api}: takes {len(self.inputs)} operands ({', '.join(self.inputs)}), "
                                 f"got {len(args)}")
        name = route.framework(api, (*args, h0))
        front = None if name is None else route.adapter(name)
        xp = None if front is None else importlib.import_module("torch" if name == "torch"
                                                                 else "jax.numpy")
        arrays = {n: (a if xp is not None else np.asarray(a)) for n, a in zip(self.inputs, args, strict=True)}
        for n, a in arrays.items():
            if a.ndim not in (1, 2, 3, 4):
                raise ScanInputError(f"{api}: {n} has shape {tuple(a.shape)}; it needs (batch, T, H) or (H,) for a "
                                     "scalar per step, (batch, T, H, n) or (H, n) for a vector")
        ir, fns = self.traced(frozenset(n for n, a in arrays.items() if a.ndim in (2, 4)))
        if ir.unsupported:
            raise ScanInputError(f"{api}: this recurrence does not map onto the fused matrix_state operation: "
                                 f"{ir.unsupported}")
        env = _env(api, arrays, xp or np)
        env["__xp__"] = xp
        q, k, v = (fns[n](env) for n in ("q", "k", "v"))
        g = None if fns["g"] is None else fns["g"](env)
        lw = ir.lowering
        bonus = None if "bonus" not in fns else tuple(f(env) for f in fns["bonus"])
        if h0 is not None and lw["transpose"]:
            h0 = (xp or np).swapaxes(h0, -1, -2)
        neg = fns["neg"](env) if "neg" in fns else None  # g = log|a|: the gate's signs ride on q, k and the state
        qs, ks, flip = carry_signs(xp or np, neg, q, k, readout=lw["readout"], reverse=reverse, cu_seqlens=cu_seqlens)
        if xp is None:
            o, h = self._numpy(api, qs, ks, v, g, lw, h0, cu_seqlens, reverse, backend, tunables)
        else:
            o, h = _framework(front, xp, qs, ks, v, g, lw, h0, cu_seqlens, reverse, backend, tunables, api)
        h = flip(h)
        if bonus is not None:
            a, b = bonus
            o = o + (q * a).sum(-1, keepdims=True) * b
        if not return_state:
            return o
        return o, ((xp or np).swapaxes(h, -1, -2) if lw["transpose"] else h)

    def _numpy(self, api, q, k, v, g, lw, h0, cu_seqlens, reverse, backend, tunables):
        q, k, v = (np.asarray(a) for a in (q, k, v))
        g = None if g is None else np.asarray(g)
        decay = lw["decay"]
        if decay == "key" and g is not None and g.ndim == 3:
            g = np.broadcast_to(g[..., None], q.shape)
        if decay == "scalar" and g is not None and g.ndim == 4:
            decay = "key"
        batch, T = v.shape[:2]
        cs = seqlens(api, cu_seqlens, batch, T)
        u = None if lw["readout"] == "after" else np.zeros((v.shape[2], q.shape[-1]), np.result_type(q, np.float32))
        ops = operands(api, q, k, v, g, decay=decay, readout=lw["readout"], u=u, h0=h0, cu_seqlens=cs,
                       reverse=reverse, names={"h0": "h0"})
        o, h = kernels.forward(ops, backend=backend, return_state=True, api=api, **tunables)
        return o.astype(ops.out_dtype, copy=False), h


def _env(api: str, arrays: dict, xp) -> dict:
    """The operands broadcast to ``(batch, T, H)`` (scalars) and ``(batch, T, H, n)`` (vectors)."""
    full = [a for a in arrays.values() if a.ndim >= 3]
    if not full:
        raise ScanInputError(f"{api}: at least one operand must vary per step ((batch, T, H[, n]))")
    batch, T, H = full[0].shape[:3]
    env = {}
    for n, a in arrays.items():
        want = (batch, T, H) if a.ndim in (1, 3) else (batch, T, H, a.shape[-1])
        try:
            env[n] = xp.broadcast_to(a if a.ndim >= 3 else a[None, None], want)
        except (ValueError, RuntimeError, TypeError):
            raise ScanInputError(f"{api}: {n} has shape {tuple(a.shape)}; it needs {want} "
                                 f"(or {want[2:]} for one per head)") from None
    return env


def _framework(front, xp, q, k, v, g, lw, h0, cu_seqlens, reverse, backend, tunables, api):
    """The scan on framework arrays through the differentiable named operations (scale 1)."""
    shape = tuple(q.shape)
    if g is not None and lw["decay"] in ("key", "scalar") and g.ndim == 3 and lw["readout"] != "after":
        g = xp.broadcast_to(g[..., None], shape)
    if lw["readout"] == "after":
        kw = {} if g is None else {"g": g} if g.ndim == 4 else {"g_head": g}
        return front.linear_attention(q, k, v, **kw, scale=1.0, initial_state=h0, output_final_state=True,
                                      cu_seqlens=cu_seqlens, reverse=reverse, backend=backend, **tunables)
    if reverse:
        raise ScanInputError(f"{api}: reverse=True with a readout of the state before the update is not supported")
    w = g if g is not None else xp.zeros(shape, dtype=q.dtype)
    u = xp.zeros((shape[2], shape[3]), dtype=q.dtype)
    return front.rwkv6(q, k, v, w, u, scale=1.0, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens,
                       backend=backend, **tunables)
