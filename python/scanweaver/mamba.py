"""The Mamba-1 selective scan (S6), lowered onto one diagonal ScanWeaver scan.

Gu & Dao (2023), "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Algorithm 2.  Per batch element, channel ``d`` and state index ``n``:

    h_t[d, n] = exp(delta_t[d] * A[d, n]) * h_{t-1}[d, n] + delta_t[d] * B_t[n] * u_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n] + D[d] * u_t[d]        (then * silu(z_t[d]))

The layouts are those of the ``mamba_ssm`` reference (``selective_scan_ref``).
"""

from __future__ import annotations

import numpy as np

from .api import recurrence
from .arrays import as_array, compute_dtype, seqlens_reset
from .errors import api_boundary, ScanInputError
from .ir.functions import NUMPY

API = "mamba_selective_scan"


@recurrence(name="mamba_selective_scan")
def _s6_step(h, delta, A, B, u):
    return np.exp(delta * A) * h + delta * B * u


def _shape_error(name: str, arr: np.ndarray, need: str) -> ScanInputError:
    return ScanInputError(f"{API}: {name} has shape {arr.shape}; it needs {need}")


def _groups(name: str, M: np.ndarray, batch: int, Dm: int, N: int, L: int) -> int:
    """Checks B or C; returns its group count (0 for a fixed ``(D, N)`` operand)."""
    if M.ndim == 2:
        if M.shape != (Dm, N):
            raise _shape_error(name, M, f"(D, N) = {(Dm, N)} when fixed over time")
        return 0
    if M.ndim == 3:
        if M.shape != (batch, N, L):
            raise _shape_error(name, M, f"(batch, N, L) = {(batch, N, L)} when it varies per time step")
        return 1
    if M.ndim == 4:
        if M.shape[0] != batch or M.shape[2:] != (N, L):
            raise _shape_error(name, M, f"(batch, G, N, L) = {(batch, 'G', N, L)} with groups G dividing D = {Dm}")
        if M.shape[1] < 1 or Dm % M.shape[1]:
            raise ScanInputError(f"{API}: {name} has G = {M.shape[1]} groups (shape {M.shape}); "
                                 f"G must divide D = {Dm}")
        return M.shape[1]
    raise _shape_error(name, M, f"(D, N), (batch, N, L) or (batch, G, N, L) with batch={batch}, D={Dm}, "
                                f"N={N}, L={L}")


def _as_groups(M: np.ndarray, groups: int, batch: int, Dm: int, N: int, L: int) -> np.ndarray:
    """B or C as a view of shape ``(batch|1, G, D/G, N, L|1)``."""
    if groups == 0:
        return M.reshape(1, 1, Dm, N, 1)
    return M.reshape(batch, groups, 1, N, L)


def _checked(name: str, value, shape: tuple, need: str) -> np.ndarray:
    arr = as_array(API, name, value)
    if arr.shape != shape:
        raise _shape_error(name, arr, f"{need} = {shape}")
    return arr


@api_boundary
def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                         h0=None, return_state: bool = False, *, cu_seqlens=None, log_space: bool = False,
                         backend: str = "auto", schedule: str = "auto", **tunables):
    """The Mamba-1 selective scan with the semantics of ``mamba_ssm``'s ``selective_scan_ref``.

    Lowered onto ONE diagonal scan over ``batch * D * N`` lanes: the step
    ``exp(delta*A) * h + delta*B*u`` is traced once, so the gate is computed
    inside the kernel on every backend.  The contraction with ``C``, the
    ``D`` skip and the ``silu(z)`` gate run in NumPy afterwards.

    Memory: the scan's operands are broadcast over the state axis, so
    ``delta``, ``A``, ``B`` and ``u`` are each materialised as a
    ``(batch*D*N, L)`` array in the accumulation dtype, and the states
    ``h`` as one more: about ``5 * batch*D*N*L * itemsize`` bytes
    (batch=8, D=512, N=16, L=4096 in float32: 5 GiB).  The fused CUDA kernel
    of ``mamba_ssm`` keeps h in registers instead; split large problems over
    batch or channels.

    Dtypes: float16/bfloat16 inputs accumulate in float32 (everything,
    including the softplus, runs in float32) and ``y`` comes back in ``u``'s
    dtype; the state stays in the accumulation dtype.  Complex ``A``/``B``/
    ``C`` give a complex ``y`` (``mamba_ssm`` instead returns ``2 * y.real``
    for its conjugate-pair convention) on backends that list complex dtypes.
    Measured error against a float64 transcription (relative to max|y|):
    float64 ~1e-15, float32 ~1e-6, float16 ~5e-4 (its rounding, 2^-11),
    bfloat16 ~4e-3 (2^-8).

    Args:
        u: input ``(batch, D, L)``.
        delta: step sizes ``(batch, D, L)``.
        A: ``(D, N)`` transition parameters (negative real parts decay).
        B: ``(batch, N, L)``, ``(batch, G, N, L)`` with G dividing D, or fixed ``(D, N)``.
        C: like ``B`` (its own G).
        D: skip ``(D,)`` or None.
        z: gate ``(batch, D, L)`` or None; y is multiplied by ``silu(z)``.
        delta_bias: ``(D,)`` added to ``delta`` before the softplus.
        delta_softplus: apply ``softplus`` to ``delta``.
        h0: initial state ``(batch, D, N)`` or None (zeros).
        return_state: also return the final state ``(batch, D, N)``.
        cu_seqlens: offsets ``[0, ..., L]`` of sequences packed along L; each one
            after the first starts from a zero state.
        log_space: run the gate in log space (:mod:`scanweaver.logspace`): the
            log gate ``delta*A`` is used exactly instead of a rounded
            ``exp(delta*A)``; more accurate for gates near 1, NumPy only.
        backend: ``auto`` or a backend name (see :func:`scanweaver.selective_scan`).
        schedule: ``auto`` or a schedule name.
        **tunables: schedule tunables (``chunk=`` is the log-space chunk with ``log_space``).

    Returns:
        ``y`` of shape ``(batch, D, L)``, or ``(y, state)`` with ``return_state``.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> u, delta = rng.normal(size=(1, 2, 5)), rng.uniform(0.1, 1, (1, 2, 5))
        >>> A, B, C = -rng.uniform(0.5, 1, (2, 3)), rng.normal(size=(1, 3, 5)), rng.normal(size=(1, 3, 5))
        >>> scanweaver.mamba_selective_scan(u, delta, A, B, C, backend="numpy").shape
        (1, 2, 5)
    """
    u = as_array(API, "u", u)
    if u.ndim != 3:
        raise _shape_error("u", u, "(batch, D, L)")
    batch, Dm, L = u.shape
    delta = _checked("delta", delta, u.shape, "u's shape (batch, D, L)")
    A = as_array(API, "A", A)
    if A.ndim != 2 or A.shape[0] != Dm:
        raise _shape_error("A", A, f"(D, N) with D = {Dm}")
    N = A.shape[1]
    B, C = as_array(API, "B", B), as_array(API, "C", C)
    gb, gc = _groups("B", B, batch, Dm, N, L), _groups("C", C, batch, Dm, N, L)
    opt = {"D": (D, (Dm,), "(D,)"), "z": (z, u.shape, "u's shape (batch, D, L)"),
           "delta_bias": (delta_bias, (Dm,), "(D,)"), "h0": (h0, (batch, Dm, N), "(batch, D, N)")}
    extra = {k: _checked(k, v, shape, need) for k, (v, shape, need) in opt.items() if v is not None}
    wide = compute_dtype([u.dtype, delta.dtype, A.dtype, B.dtype, C.dtype, *(v.dtype for v in extra.values())])
    out_dtype = u.dtype if wide.kind != "c" else wide
    u, delta, A, B, C = (x.astype(wide, copy=False) for x in (u, delta, A, B, C))
    extra = {k: v.astype(wide, copy=False) for k, v in extra.items()}
    if "delta_bias" in extra:
        delta = delta + extra["delta_bias"][:, None]
    if delta_softplus:
        delta = NUMPY["softplus"](delta)
    G = max(gb, 1)
    H = Dm // G
    state0 = extra["h0"].reshape(batch, G, H, N) if "h0" in extra else None
    if log_space:
        h, h_last = _log_space_states(u, delta, A, B, gb, state0, cu_seqlens, backend, tunables)
    else:
        h, h_last = _s6_step(delta.reshape(batch, G, H, 1, L), A.reshape(1, G, H, N, 1),
                             _as_groups(B, gb, batch, Dm, N, L), u.reshape(batch, G, H, 1, L),
                             h0=state0, return_state=True, cu_seqlens=cu_seqlens, backend=backend,
                             schedule=schedule, **tunables)
    y = _contract(h.reshape(batch, Dm, N, L), C, gc)
    if "D" in extra:
        y = y + extra["D"][:, None] * u
    if "z" in extra:
        y = y * NUMPY["silu"](extra["z"])
    y = y.astype(out_dtype, copy=False)
    return (y, h_last.reshape(batch, Dm, N)) if return_state else y


def _contract(h: np.ndarray, C: np.ndarray, groups: int) -> np.ndarray:
    """y[b, d, t] = sum_n C[..n..] * h[b, d, n, t] for fixed, per-step or grouped C."""
    if groups == 0:
        return np.einsum("bdnl,dn->bdl", h, C)
    batch, Dm, N, L = h.shape
    y = np.einsum("bghnl,bgnl->bghl", h.reshape(batch, groups, Dm // groups, N, L),
                  C.reshape(batch, groups, N, L))
    return y.reshape(batch, Dm, L)


def _log_space_states(u, delta, A, B, gb, state0, cu_seqlens, backend, tunables):
    """The states through :func:`scanweaver.logspace.log_scan` with the exact log gate delta*A."""
    from .logspace import log_scan

    if backend not in ("auto", "numpy"):
        raise ScanInputError(f"{API}: log_space=True runs as a NumPy front end; got backend={backend!r}, "
                             "use backend='auto' or 'numpy'")
    if np.iscomplexobj(A):
        raise ScanInputError(f"{API}: log_space=True needs a real A (positive gates exp(delta*A)); "
                             f"got A of dtype {A.dtype}")
    batch, Dm, L = u.shape
    N = A.shape[1]
    G = max(gb, 1)
    H = Dm // G
    log_a = delta.reshape(batch, G, H, 1, L) * A.reshape(1, G, H, N, 1)
    x = delta.reshape(batch, G, H, 1, L) * _as_groups(B, gb, batch, Dm, N, L) * u.reshape(batch, G, H, 1, L)
    reset = None if cu_seqlens is None else seqlens_reset(API, cu_seqlens, L)
    return log_scan(log_a, x, h0=state0, reset=reset, return_state=True, **tunables)
