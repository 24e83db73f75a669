"""NumPy and SciPy peers: the Python loop over L, and ``lfilter`` for constant gates."""

from __future__ import annotations

import numpy as np

from ..machine import host_cpu
from . import Peer, installed, register


def time_major(ops: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    """``a, b*x, c`` as contiguous ``(L, lanes)`` arrays, so each step reads whole rows."""
    L = ops["a"].shape[-1]
    a, b, x, c = (ops[k].reshape(-1, L).T for k in ("a", "b", "x", "c"))
    return np.ascontiguousarray(a), np.ascontiguousarray(b * x), np.ascontiguousarray(c)


@register
class NumpyLoop(Peer):
    """h = a_t*h + b_t*x_t in a Python loop over L, vectorised over lanes (time-major)."""

    name = "numpy-loop"
    label = "NumPy loop over L"
    note = "NumPy loop: operands transposed to time-major inside the timed call, so each step is contiguous."
    ns_per_element = 12.0
    us_per_step = 4.0

    def device(self) -> str:
        return f"NumPy {np.__version__}, {host_cpu()}"

    def prepare(self, ops):
        shape = ops["a"].shape

        def run():
            a, u, c = time_major(ops)
            h = np.zeros(a.shape[1], a.dtype)
            out = np.empty_like(u)
            for t in range(a.shape[0]):
                np.multiply(a[t], h, out=h)
                h += u[t]
                np.multiply(c[t], h, out=out[t])
            return out.T.reshape(shape)

        return run


@register
class ScipyLfilter(Peer):
    """``scipy.signal.lfilter`` per lane: exact only when the gate is constant over time."""

    name = "scipy-lfilter"
    label = "SciPy lfilter (constant a: special case)"
    recurrence = "constant a over t (special case)"
    variant = "constant_a"
    note = ("SciPy lfilter solves only the constant-coefficient special case (a fixed over t per lane); "
            "it runs on its own operands with a constant gate and is not comparable as a selective scan.")
    ns_per_element = 4.0
    us_per_step = 0.0

    def availability(self):
        return installed("scipy.signal", "scipy")

    def device(self) -> str:
        import scipy

        return f"SciPy {scipy.__version__}, 1 thread of {host_cpu()}"

    def estimate(self, case):
        return super().estimate(case) + case.lanes * 20e-6

    def prepare(self, ops):
        from scipy.signal import lfilter

        shape = ops["a"].shape
        L = shape[-1]
        a, b, x, c = (ops[k].reshape(-1, L) for k in ("a", "b", "x", "c"))
        gates = a[:, 0].copy()

        def run():
            u = b * x
            h = np.empty_like(u)
            one = np.ones(1, u.dtype)
            for lane in range(u.shape[0]):
                h[lane] = lfilter(one, np.array([1.0, -gates[lane]], u.dtype), u[lane])
            return (c * h).reshape(shape)

        return run
