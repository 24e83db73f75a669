"""The Mamba-1 selective scan (S6): the fused kernel by default, the scan lowering as the readable reference.

Gu & Dao (2023), "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", Algorithm 2.  Per batch element, channel ``d`` and state index ``n``:

    h_t[d, n] = exp(delta_t[d] * A[d, n]) * h_{t-1}[d, n] + delta_t[d] * B_t[n] * u_t[d]
    y_t[d]    = sum_n C_t[n] * h_t[d, n] + D[d] * u_t[d]        (then * silu(z_t[d]))

The layouts are those of the ``mamba_ssm`` reference (``selective_scan_ref``).

Two paths compute it:

* ``fused`` (the default wherever a backend renders it: ``cpu``, ``numpy``, and
  the GPU backends): the fused operation :mod:`scanweaver.fused.mamba1`, one
  kernel that keeps the N states of a channel in registers and reads each
  input once; memory is the inputs plus ``y``.  :func:`forward` and
  :func:`backward` are its NumPy-level entry points (the PyTorch and JAX
  wrappers call them).
* ``scan`` (``fused=False``, or any ``schedule=``): the step
  ``exp(delta*A) * h + delta*B*u`` traced as one ScanWeaver recurrence over
  ``batch * D * N`` lanes, which materialises the broadcast operands and the
  states (about ``5 * batch*D*N*L`` elements): the readable definition, and
  the path for complex A/B/C and ``log_space``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .api import pick_backend, recurrence
from .arrays import as_array, compute_dtype, seqlens_reset
from .errors import BackendUnavailable, ScanInputError, api_boundary
from .fused import REGISTRY as FUSED
from .fused.mamba1 import Mamba1Features
from .ir.functions import NUMPY
from .runtime import Backend

API = "mamba_selective_scan"
#: The fused operation this module runs.
OP = "mamba1"


@recurrence(name="mamba_selective_scan")
def _s6_step(h, delta, A, B, u):
    return np.exp(delta * A) * h + delta * B * u


def _shape_error(name: str, arr: np.ndarray, need: str, api: str = API) -> ScanInputError:
    return ScanInputError(f"{api}: {name} has shape {arr.shape}; it needs {need}")


def _groups(name: str, M: np.ndarray, batch: int, Dm: int, N: int, L: int, api: str) -> int:
    """Checks B or C; returns its group count (0 for a fixed ``(D, N)`` operand)."""
    if M.ndim == 2:
        if M.shape != (Dm, N):
            raise _shape_error(name, M, f"(D, N) = {(Dm, N)} when fixed over time", api)
        return 0
    if M.ndim == 3:
        if M.shape != (batch, N, L):
            raise _shape_error(name, M, f"(batch, N, L) = {(batch, N, L)} when it varies per time step", api)
        return 1
    if M.ndim == 4:
        if M.shape[0] != batch or M.shape[2:] != (N, L):
            raise _shape_error(name, M, f"(batch, G, N, L) = {(batch, 'G', N, L)} with groups G dividing D = {Dm}",
                               api)
        if M.shape[1] < 1 or Dm % M.shape[1]:
            raise ScanInputError(f"{api}: {name} has G = {M.shape[1]} groups (shape {M.shape}); "
                                 f"G must divide D = {Dm}")
        return M.shape[1]
    raise _shape_error(name, M, f"(D, N), (batch, N, L) or (batch, G, N, L) with batch={batch}, D={Dm}, "
                                f"N={N}, L={L}", api)


@dataclass
class MambaOperands:
    """Checked operands in the accumulation dtype and the kernels' layouts (C-contiguous, no copies
    where the input already was).

    B and C are ``(D, N)`` (fixed, ``groups_* == 0``) or ``(batch, G, N, L)``; ``reset`` is the
    ``(L,)`` uint8 mask of packed-sequence starts (from ``cu_seqlens``) or ``None``.
    """

    u: np.ndarray
    delta: np.ndarray
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    D: np.ndarray | None
    z: np.ndarray | None
    delta_bias: np.ndarray | None
    h0: np.ndarray | None
    reset: np.ndarray | None
    groups_b: int
    groups_c: int
    softplus: bool
    out_dtype: np.dtype

    @property
    def dtype(self) -> np.dtype:
        """The accumulation dtype."""
        return self.u.dtype

    @property
    def sizes(self) -> dict[str, int]:
        """The kernels' ``int`` parameters."""
        batch, dim, L = self.u.shape
        return {"batch": batch, "dim": dim, "L": L, "groups_b": self.groups_b, "groups_c": self.groups_c}

    def features(self, has_dhlast: bool = False) -> Mamba1Features:
        """The compile-time features of a kernel for these operands."""
        return Mamba1Features(self.dtype.name, self.A.shape[1], self.groups_b == 0, self.groups_c == 0,
                              self.D is not None, self.z is not None, self.delta_bias is not None, self.softplus,
                              self.h0 is not None, self.reset is not None, has_dhlast)

    def arrays(self) -> dict[str, np.ndarray | None]:
        """The input arrays by kernel parameter name."""
        return {"u": self.u, "delta": self.delta, "A": self.A, "B": self.B, "C": self.C, "D": self.D, "z": self.z,
                "delta_bias": self.delta_bias, "h0": self.h0, "reset": self.reset}


def prepare(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False, h0=None,
            cu_seqlens=None, api: str = API) -> MambaOperands:
    """Checks shapes and dtypes (errors name the argument) and returns :class:`MambaOperands`.

    float16/bfloat16 widen to float32; mixed dtypes promote; complex A/B/C give a complex dtype
    (which only the scan path runs).
    """
    u = as_array(api, "u", u)
    if u.ndim != 3:
        raise _shape_error("u", u, "(batch, D, L)", api)
    batch, Dm, L = u.shape
    A = as_array(api, "A", A)
    if A.ndim != 2 or A.shape[0] != Dm or A.shape[1] < 1:
        raise _shape_error("A", A, f"(D, N) with D = {Dm} and N >= 1", api)
    N = A.shape[1]
    B, C = as_array(api, "B", B), as_array(api, "C", C)
    gb, gc = _groups("B", B, batch, Dm, N, L, api), _groups("C", C, batch, Dm, N, L, api)
    named = {"delta": (delta, u.shape, "u's shape (batch, D, L)"), "D": (D, (Dm,), "(D,)"),
             "z": (z, u.shape, "u's shape (batch, D, L)"), "delta_bias": (delta_bias, (Dm,), "(D,)"),
             "h0": (h0, (batch, Dm, N), "(batch, D, N)")}
    got = {}
    for k, (v, shape, need) in named.items():
        if v is None:
            if k == "delta":
                raise ScanInputError(f"{api}: delta is required, shape {u.shape}")
            continue
        arr = as_array(api, k, v)
        if arr.shape != shape:
            raise _shape_error(k, arr, f"{need} = {shape}", api)
        got[k] = arr
    wide = compute_dtype([u.dtype, A.dtype, B.dtype, C.dtype, *(v.dtype for v in got.values())])
    out_dtype = u.dtype if wide.kind != "c" else wide

    def conv(x):
        return None if x is None else np.ascontiguousarray(x, dtype=wide)

    reset = None
    if cu_seqlens is not None:
        mask = seqlens_reset(api, cu_seqlens, L)
        reset = mask.astype(np.uint8) if mask.any() else None
    Bk = B if gb == 0 else B.reshape(batch, gb, N, L)
    Ck = C if gc == 0 else C.reshape(batch, gc, N, L)
    return MambaOperands(conv(u), conv(got["delta"]), conv(A), conv(Bk), conv(Ck), conv(got.get("D")),
                         conv(got.get("z")), conv(got.get("delta_bias")), conv(got.get("h0")), reset, gb, gc,
                         bool(delta_softplus), out_dtype)


@dataclass(frozen=True)
class FusedInfo:
    """What the last fused call ran: backend, part, the tunables and where they came from."""

    backend: str
    part: str
    config: dict
    source: str


#: :class:`FusedInfo` of the most recent fused call in this process (``None`` before).
last: FusedInfo | None = None


def fused_backend(backend: str, dtype: np.dtype, part: str = "forward") -> Backend | None:
    """The backend that runs ``part`` of the fused kernel for ``backend=`` (``auto``: the best
    available), or ``None`` when that backend has no fused rendering (the scan path runs)."""
    if dtype.kind == "c":
        return None
    be = pick_backend(backend, dtype.name)
    return be if FUSED.get(OP).runs_on(be.target, part) else None


def _config(be: Backend, features: Mamba1Features, sizes: dict, tunables: dict, api: str) -> tuple[dict, str]:
    op = FUSED.get(OP)
    from .targets.fused import family_of

    family = family_of(be.target)
    source = "explicit" if tunables else "default"
    defaults = be.fused_defaults(OP, features, sizes)
    if not tunables:
        hit = _tuned(be, features, sizes)
        if hit is not None:
            defaults, source = {**defaults, **hit}, "tuned"
    return op.resolve(family, tunables, defaults, api), source


def _tuned(be: Backend, features: Mamba1Features, sizes: dict) -> dict | None:
    from .tuning import store

    hit = store.lookup(backend=be.name, device=be.availability().device, signature=FUSED.get(OP).signature(features),
                       dtype=features.dtype, lanes=sizes["batch"] * sizes["dim"], L=sizes["L"])
    return dict(hit[1]) if hit is not None and hit[0] == store.FUSED_PREFIX + OP else None


def forward(ops: MambaOperands, *, backend: str = "auto", return_state: bool = True, api: str = API,
            **tunables) -> tuple[np.ndarray, np.ndarray | None]:
    """The fused forward on prepared operands: ``(y, h_last)`` in the accumulation dtype.

    Raises:
        BackendUnavailable: the backend has no fused rendering (use the scan path).
    """
    global last
    be = _require(backend, ops.dtype, "forward", api)
    feats = ops.features()
    cfg, source = _config(be, feats, ops.sizes, tunables, api)
    y = np.empty(ops.u.shape, ops.dtype)
    hlast = np.empty((*ops.u.shape[:2], ops.A.shape[1]), ops.dtype) if return_state else None
    if ops.u.shape[2] == 0 and hlast is not None:  # no step: the state is h0
        hlast[...] = 0 if ops.h0 is None else ops.h0
    be.run_fused(FUSED.get(OP).call("forward", feats, cfg), {**ops.arrays(), "y": y, "hlast": hlast}, ops.sizes)
    last = FusedInfo(be.name, "forward", cfg, source)
    return y, hlast


def backward(ops: MambaOperands, dout: np.ndarray, dhlast: np.ndarray | None = None, *, backend: str = "auto",
             api: str = API, **tunables) -> dict[str, np.ndarray | None]:
    """The fused backward: gradients of ``sum(y * dout) + sum(h_last * dhlast)`` for every input.

    Returns ``du, ddelta, dA, dB, dC`` (B/C in the prepared layout) and ``dD, dz, ddelta_bias, dh0``
    (``None`` for inputs that were not given).
    """
    global last
    be = _require(backend, ops.dtype, "backward", api)
    feats = ops.features(has_dhlast=dhlast is not None)
    cfg, source = _config(be, feats, ops.sizes, tunables, api)
    dout = np.ascontiguousarray(dout, dtype=ops.dtype)
    dh = None if dhlast is None else np.ascontiguousarray(dhlast, dtype=ops.dtype)
    out = {"du": np.empty_like(ops.u), "ddelta": np.empty_like(ops.u), "dA": np.empty_like(ops.A),
           "dB": np.empty_like(ops.B), "dC": np.empty_like(ops.C),
           "dD": None if ops.D is None else np.empty_like(ops.D),
           "dz": None if ops.z is None else np.empty_like(ops.u),
           "ddelta_bias": None if ops.delta_bias is None else np.empty_like(ops.delta_bias),
           "dh0": None if ops.h0 is None else np.empty_like(ops.h0)}
    be.run_fused(FUSED.get(OP).call("backward", feats, cfg), {**ops.arrays(), "dout": dout, "dhlast": dh, **out},
                 ops.sizes)
    if ops.u.shape[2] == 0:  # no step: only the state's gradient passes through
        for k, v in out.items():
            if v is not None:
                v[...] = dh if k == "dh0" and dh is not None else 0
    last = FusedInfo(be.name, "backward", cfg, source)
    return out


def _require(backend: str, dtype: np.dtype, part: str, api: str) -> Backend:
    be = fused_backend(backend, dtype, part)
    if be is None:
        name = backend if backend != "auto" else pick_backend("auto").name
        runs = [n for n, c in _backends() if FUSED.get(OP).runs_on(c.target, part)]
        raise BackendUnavailable(f"{api}: backend {name!r} has no fused Mamba-1 {part} kernel for dtype {dtype}; "
                                 f"backends with one: {', '.join(runs)}")
    return be


def _backends():
    from .runtime import REGISTRY

    return REGISTRY.items()


@api_boundary
def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                         h0=None, return_state: bool = False, *, cu_seqlens=None, log_space: bool = False,
                         backend: str = "auto", schedule: str = "auto", fused: bool | None = None, **tunables):
    """The Mamba-1 selective scan with the semantics of ``mamba_ssm``'s ``selective_scan_ref``.

    By default the fused kernel runs (see the module docstring): no array of
    size ``batch*D*N*L`` is ever allocated, so real layer sizes such as
    ``(8, 1536, 16, 2048)`` run in the memory of their inputs and output.
    Tunables of the fused kernel: ``chunk``, ``width``, ``threads`` on ``cpu``;
    ``workgroup_size``, ``items_per_thread`` on GPUs (``scanweaver tune --op mamba1``
    stores the best per problem size; :data:`last` says what ran).

    Dtypes: float16/bfloat16 inputs accumulate in float32 and ``y`` comes back in
    ``u``'s dtype; the state stays in the accumulation dtype.  Complex ``A``/``B``/``C``
    run on the scan path and give a complex ``y`` (``mamba_ssm`` instead returns
    ``2 * y.real`` for its conjugate-pair convention).

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
        log_space: scan path with the exact log gate ``delta*A`` (:mod:`scanweaver.logspace`):
            more accurate for gates near 1, NumPy only.
        backend: ``auto`` or a backend name (see :func:`scanweaver.selective_scan`).
        schedule: a schedule name runs the scan path with that schedule.
        fused: ``None`` (fused wherever the backend has it), ``True`` (fused, or an error
            naming the backends that have it), ``False`` (the scan path).
        **tunables: tunables of the path that runs (``chunk=`` is the log-space chunk with ``log_space``).

    Returns:
        ``y`` of shape ``(batch, D, L)``, or ``(y, state)`` with ``return_state``.

    Example:
        >>> import numpy as np, scanweaver
        >>> rng = np.random.default_rng(0)
        >>> u, delta = rng.normal(size=(1, 2, 5)), rng.uniform(0.1, 1, (1, 2, 5))
        >>> A, B, C = -rng.uniform(0.5, 1, (2, 3)), rng.normal(size=(1, 3, 5)), rng.normal(size=(1, 3, 5))
        >>> y = scanweaver.mamba_selective_scan(u, delta, A, B, C, backend="numpy")
        >>> y.shape, scanweaver.mamba.last.part
        ((1, 2, 5), 'forward')
    """
    ops = prepare(u, delta, A, B, C, D, z, delta_bias, delta_softplus, h0, cu_seqlens)
    if fused and (log_space or schedule != "auto"):
        raise ScanInputError(f"{API}: fused=True has no schedules and no log_space; got schedule={schedule!r}, "
                             f"log_space={log_space}")
    use_fused = fused is not False and not log_space and schedule == "auto" and \
        (fused or fused_backend(backend, ops.dtype) is not None)
    if use_fused:
        y, h = forward(ops, backend=backend, return_state=return_state, **tunables)
    else:
        y, h = _scan_path(ops, cu_seqlens, log_space, backend, schedule, tunables)
    y = y.astype(ops.out_dtype, copy=False)
    return (y, h) if return_state else y


def _scan_path(ops: MambaOperands, cu_seqlens, log_space: bool, backend: str, schedule: str, tunables: dict):
    """The materialising lowering: one diagonal scan over ``batch*D*N`` lanes, then the contraction."""
    batch, Dm, L = ops.u.shape
    N = ops.A.shape[1]
    delta = ops.delta if ops.delta_bias is None else ops.delta + ops.delta_bias[:, None]
    if ops.softplus:
        delta = NUMPY["softplus"](delta)
    G = max(ops.groups_b, 1)
    H = Dm // G
    state0 = ops.h0.reshape(batch, G, H, N) if ops.h0 is not None else None
    if log_space:
        h, h_last = _log_space_states(ops, delta, state0, cu_seqlens, backend, tunables)
    else:
        h, h_last = _s6_step(delta.reshape(batch, G, H, 1, L), ops.A.reshape(1, G, H, N, 1),
                             _as_groups(ops.B, ops.groups_b, batch, Dm, N, L), ops.u.reshape(batch, G, H, 1, L),
                             h0=state0, return_state=True, cu_seqlens=cu_seqlens, backend=backend,
                             schedule=schedule, **tunables)
    y = _contract(h.reshape(batch, Dm, N, L), ops.C, ops.groups_c)
    if ops.D is not None:
        y = y + ops.D[:, None] * ops.u
    if ops.z is not None:
        y = y * NUMPY["silu"](ops.z)
    return y, h_last.reshape(batch, Dm, N)


def _as_groups(M: np.ndarray, groups: int, batch: int, Dm: int, N: int, L: int) -> np.ndarray:
    """B or C as a view of shape ``(batch|1, G, D/G, N, L|1)``."""
    if groups == 0:
        return M.reshape(1, 1, Dm, N, 1)
    return M.reshape(batch, groups, 1, N, L)


def _contract(h: np.ndarray, C: np.ndarray, groups: int) -> np.ndarray:
    """y[b, d, t] = sum_n C[..n..] * h[b, d, n, t] for fixed, per-step or grouped C."""
    if groups == 0:
        return np.einsum("bdnl,dn->bdl", h, C)
    batch, Dm, N, L = h.shape
    y = np.einsum("bghnl,bgnl->bghl", h.reshape(batch, groups, Dm // groups, N, L),
                  C.reshape(batch, groups, N, L))
    return y.reshape(batch, Dm, L)


def _log_space_states(ops: MambaOperands, delta, state0, cu_seqlens, backend, tunables):
    """The states through :func:`scanweaver.logspace.log_scan` with the exact log gate delta*A."""
    from .logspace import log_scan

    if backend not in ("auto", "numpy"):
        raise ScanInputError(f"{API}: log_space=True runs as a NumPy front end; got backend={backend!r}, "
                             "use backend='auto' or 'numpy'")
    if np.iscomplexobj(ops.A):
        raise ScanInputError(f"{API}: log_space=True needs a real A (positive gates exp(delta*A)); "
                             f"got A of dtype {ops.A.dtype}")
    batch, Dm, L = ops.u.shape
    N = ops.A.shape[1]
    G = max(ops.groups_b, 1)
    H = Dm // G
    log_a = delta.reshape(batch, G, H, 1, L) * ops.A.reshape(1, G, H, N, 1)
    x = delta.reshape(batch, G, H, 1, L) * _as_groups(ops.B, ops.groups_b, batch, Dm, N, L) * \
        ops.u.reshape(batch, G, H, 1, L)
    reset = None if cu_seqlens is None else seqlens_reset(API, cu_seqlens, L)
    return log_scan(log_a, x, h0=state0, reset=reset, return_state=True, **tunables)


__all__ = ["FusedInfo", "MambaOperands", "backward", "forward", "mamba_selective_scan", "prepare"]
