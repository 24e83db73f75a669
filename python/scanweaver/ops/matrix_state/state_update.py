"""``mamba2_state_update``: mamba-ssm's ``selective_state_update``, the decode step that updates a state cache.

One token of Mamba-2 (or Mamba-1) decoding, in place: per batch element, head h
(group ``h // (H // G)`` of B and C), head dim p and state index n::

    dt  = softplus(dt + dt_bias)                     (softplus with dt_softplus)
    S[p, n] = exp(dt[p] * A[p, n]) * S[p, n] + dt[p] * x[p] * B[n]
    out[p]  = sum_n S[p, n] * C[n] + D[p] * x[p],   then out * silu(z)

``state`` is written in place (the cache of a server: with ``state_batch_indices``
element i of the batch reads and writes ``state[state_batch_indices[i]]``, continuous
batching); the result is ``out``.  :func:`scanweaver.mamba2_step` is the same step
returning the new state instead.

The arrays come as mamba-ssm takes them: with heads (``state (nb, H, P, N)``,
``A (H, P, N)``, ``dt (batch, H, P)``: A and dt tiled over the head dim, as
Mamba-2's module passes them) or without (``state (nb, P, N)``, ``A (P, N)``:
Mamba-1's step), and in Mamba-2's untiled forms too (``A (H,)``, ``dt (batch, H)``,
``D`` and ``dt_bias (H,)``).  It is a few array expressions in the caller's array
library (NumPy or PyTorch), differentiable by PyTorch itself; JAX arrays cannot
be changed in place, so JAX calls are refused in favour of ``mamba2_step``.
"""

from __future__ import annotations

import numpy as np

from ...arrays import is_real, returned_dtype
from ...calls.declare import operation
from ...errors import ScanInputError
from .mamba2 import SOFTPLUS_THRESHOLD
from .step import _heads, _xp, check_dtypes

API = "mamba2_state_update"


def _shape(x) -> tuple:
    return tuple(getattr(x, "shape", np.shape(x)))


def _form(name: str, x, forms: dict[tuple, str]):
    """Which of ``forms`` (shape -> its name) ``x`` has; ``None`` stays None."""
    if x is None:
        return None
    shape = _shape(x)
    if shape not in forms:
        want = " or ".join(f"{w} = {s}" for s, w in forms.items())
        raise ScanInputError(f"{API}: {name} has shape {shape}; it needs {want}")
    return forms[shape]


def _indices(idx, batch: int, slots: int):
    """``state_batch_indices`` checked: ``batch`` distinct ints in ``[0, slots)``, as the index to use."""
    host = idx.detach().cpu().numpy() if hasattr(idx, "detach") else np.asarray(idx)
    if host.shape != (batch,) or host.dtype.kind not in "iu":
        raise ScanInputError(f"{API}: state_batch_indices must be (batch,) = ({batch},) integers, one state row per "
                             f"batch element; got shape {host.shape}, dtype {host.dtype}")
    if batch and (host.min() < 0 or host.max() >= slots):
        raise ScanInputError(f"{API}: state_batch_indices must lie in [0, {slots}) (the rows of state); got "
                             f"{int(host.min())} .. {int(host.max())}")
    if len(np.unique(host)) != batch:
        raise ScanInputError(f"{API}: state_batch_indices repeats a row; each batch element needs a state row "
                             "of its own (they are updated in place, at once)")
    return idx.long() if hasattr(idx, "detach") else host  # PyTorch indexes with int64 (not int16, uint8: masks)


@operation(arrays=("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "state_batch_indices"), writes=("state",))
def mamba2_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus: bool = False,
                        state_batch_indices=None):
    """One decode step of Mamba-2 on a state cache, in place (mamba-ssm's ``selective_state_update``).

    The same positional order, shapes and result as ``selective_state_update(state, x, dt, A, B, C, D, z,
    dt_bias, dt_softplus, state_batch_indices)``; see the module docstring for the step.

    Args:
        state: ``(nb, H, P, N)`` or ``(nb, P, N)`` (no heads), NumPy or PyTorch; updated in place.
        x: ``(batch, H, P)`` (or ``(batch, P)``).
        dt: ``(batch, H, P)`` or ``(batch, H)`` (or ``(batch, P)``).
        A: ``(H, P, N)`` or ``(H,)`` (or ``(P, N)``).
        B, C: ``(batch, G, N)`` with G dividing H, or ``(batch, N)``.
        D: ``(H, P)`` or ``(H,)`` (or ``(P,)``), or None.
        z: like x, or None: ``out * silu(z)``.
        dt_bias: like D, or None.
        dt_softplus: apply softplus to ``dt + dt_bias`` (PyTorch's: linear above 20).
        state_batch_indices: ``(batch,)`` distinct rows of ``state`` that the batch reads and writes
            (continuous batching), or None (``nb == batch``, row i for element i).

    Returns:
        ``out``, shaped and typed like ``x``.

    Example:
        >>> import numpy as np, scanweaver
        >>> state = np.zeros((3, 2, 4, 5))                      # a cache of 3 rows; H = 2, P = 4, N = 5
        >>> x, dt = np.ones((2, 2, 4)), np.full((2, 2), 0.5)
        >>> B = C = np.ones((2, 1, 5))
        >>> out = scanweaver.mamba2_state_update(state, x, dt, -np.ones(2), B, C, state_batch_indices=np.array([2, 0]))
        >>> out.shape, float(out[0, 0, 0]), bool(state[1].any())
        ((2, 2, 4), 2.5, False)
    """
    xp = _xp((state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices))
    if xp is not np and not xp.__name__.startswith("torch"):
        raise ScanInputError(f"{API}: updates state in place, and JAX arrays cannot be changed; use "
                             "scanweaver.jax.mamba2_step (the same step, returning the new state)")
    if state is None or len(_shape(state)) not in (3, 4):
        raise ScanInputError(f"{API}: state has shape {None if state is None else _shape(state)}; it needs "
                             "(batch, H, P, N), or (batch, P, N) without heads")
    if xp is np and not (isinstance(state, np.ndarray) and state.flags.writeable and is_real(state.dtype)):
        flags = getattr(state, "flags", None)
        got = f"{'a read-only ' if flags is not None and not flags.writeable else ''}{type(state).__name__} of " \
            f"{getattr(state, 'dtype', type(state).__name__)}"
        raise ScanInputError(f"{API}: state must be a writeable floating-point array (it is updated in place); "
                             f"got {got}")
    if getattr(state, "requires_grad", False) and state.is_leaf and xp.is_grad_enabled():
        raise ScanInputError(f"{API}: state is a leaf tensor that requires grad, which PyTorch cannot change in "
                             "place; pass a state that needs no gradient (a cache), or use mamba2_step, which "
                             "returns the new state")
    heads = len(_shape(state)) == 4
    if not heads:
        _check_unheaded(_shape(state), x, A, B)
    S = state if heads else state[:, None]
    nb, H, P, N = _shape(S)
    x = _check_x("x", x, H, P, heads)
    batch = _shape(x)[0]
    dt = _check_x("dt", dt, H, P, heads, untiled=True, batch=batch)
    A = _per_head("A", A, H, P, N, heads)
    _check_bc("B", B, batch, H, N)
    B = B if len(_shape(B)) == 3 else B[:, None]
    _check_bc("C", C, batch, H, N, _shape(B))
    C = C if len(_shape(C)) == 3 else C[:, None]
    D = None if D is None else _per_head("D", D, H, P, None, heads)
    dt_bias = None if dt_bias is None else _per_head("dt_bias", dt_bias, H, P, None, heads)
    z = None if z is None else _check_x("z", z, H, P, heads, batch=batch)
    check_dtypes(API, {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias})
    idx = None
    if state_batch_indices is not None:
        idx = _indices(state_batch_indices, batch, nb)
    elif nb != batch:
        raise ScanInputError(f"{API}: state has {nb} rows and x a batch of {batch}; they must match, or pass "
                             "state_batch_indices (the row of each batch element)")
    if dt_bias is not None:
        dt = dt + dt_bias
    if dt_softplus:
        dt = xp.where(dt > SOFTPLUS_THRESHOLD, dt, xp.log1p(xp.exp(xp.minimum(dt, 0 * dt + SOFTPLUS_THRESHOLD))))
    old = S if idx is None else S[idx]
    Bh, Ch = _heads(B, H), _heads(C, H)
    new = old * xp.exp(dt[..., None] * A) + (dt * x)[..., None] * Bh[:, :, None, :]
    if idx is None:
        S[...] = new
    else:
        S[idx] = new
    stored = S if idx is None else S[idx]
    out = (stored * Ch[:, :, None, :]).sum(-1)
    if D is not None:
        out = out + x * D
    if z is not None:
        out = out * z / (1 + xp.exp(-z))
    if xp is np:  # x's dtype when it is a floating-point one; integers computed in float64 stay there
        out = out.astype(returned_dtype(x.dtype, out.dtype), copy=False)
    elif x.dtype.is_floating_point:
        out = out.to(x.dtype)
    return out if heads else out[:, 0]


def _sizes(*sizes) -> str:
    return f"({', '.join(str(n) for n in sizes)})"


def _check_unheaded(shape: tuple, x, A, B) -> None:
    """A 3-D ``state`` is Mamba-1's ``(nb, P, N)``, taken with ``x (batch, P)``; with a 3-D ``x`` (Mamba-2's
    ``(batch, H, P)``) it fits neither layout: raises naming ``state``, with both layouts and the sizes ``x``
    and ``B`` (else ``A``) give."""
    xs = _shape(x) if x is not None else ()
    if len(xs) != 3:
        return  # x (batch, P) fits a 3-D state, or x is wrong itself: checked against the state next
    H, P = xs[1:]
    N: object = "N"
    source = f"x {xs}"
    for name, arr in (("B", B), ("A", A)):
        given = _shape(arr) if arr is not None else ()
        if (name == "B" and len(given) in (2, 3)) or (name == "A" and len(given) == 3):
            N, source = given[-1], f"{source} and {name} {given}"
            break
    raise ScanInputError(f"{API}: state has shape {shape}; it needs (nb, H, P, N) = {_sizes(shape[0], H, P, N)} "
                         f"(Mamba-2's, with heads; sizes from {source}), or (nb, P, N) without heads (Mamba-1's "
                         f"step, which takes x as (batch, P), not {xs})")


def _check_x(name: str, x, H: int, P: int, heads: bool, untiled: bool = False, batch: int | None = None):
    """``x``, ``z`` or ``dt`` as ``(batch, H, P)`` (``dt`` untiled ``(batch, H)`` as ``(batch, H, 1)``); ``batch``
    x's, which dt and z must have (``None``: x itself, whose batch it is)."""
    if x is None:
        raise ScanInputError(f"{API}: {name} is required")
    shape = _shape(x)
    if batch is None:
        batch = shape[0] if shape else 0
    forms = {(batch, H, P): "(batch, H, P)"} if heads else {(batch, P): "(batch, P)"}
    if untiled and heads:
        forms[(batch, H)] = "(batch, H)"
    form = _form(name, x, forms)
    if not heads:
        return x[:, None]
    return x[..., None] if form == "(batch, H)" else x


def _per_head(name: str, a, H: int, P: int, N: int | None, heads: bool):
    """``A`` as ``(H, P, N)`` or ``(H, 1, 1)``; ``D``, ``dt_bias`` as ``(H, P)`` or ``(H, 1)``."""
    tail = (P, N) if N is not None else (P,)
    if heads:
        forms = {(H, *tail): f"({'H, P, N' if N else 'H, P'})", (H,): "(H,)"}
        if H == 1 and N is None:
            forms.setdefault((P,), "(P,)")  # mamba-ssm's (dim,), taken as (1, dim)
    else:
        forms = {tail: f"({'P, N' if N else 'P'})"}
    form = _form(name, a, forms)
    if form == "(H,)":
        return a[:, None, None] if N is not None else a[:, None]
    return a[None] if not heads or form == "(P,)" else a


def _check_bc(name: str, b, batch: int, H: int, N: int, like: tuple | None = None) -> int:
    """Groups of ``B``/``C`` (``(batch, G, N)`` with G dividing H, or ``(batch, N)``: one group)."""
    if b is None:
        raise ScanInputError(f"{API}: {name} is required")
    shape = _shape(b)
    if len(shape) == 2 and shape == (batch, N):
        G = 1
    elif len(shape) == 3 and shape[0] == batch and shape[2] == N and shape[1] >= 1 and H % shape[1] == 0:
        G = shape[1]
    else:
        raise ScanInputError(f"{API}: {name} has shape {shape}; it needs (batch, G, N) = ({batch}, G, {N}) with G "
                             f"dividing H = {H}, or (batch, N)")
    if like is not None and like[1:] != (G, N):
        raise ScanInputError(f"{API}: {name} has shape {shape}; it needs B's groups and N, {like[1:]}")
    return G
