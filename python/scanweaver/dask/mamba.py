"""``scanweaver.dask.mamba_selective_scan``: the Mamba-1 selective scan over Dask arrays.

Each block of ``(batch, D, L)`` runs the in-memory
:func:`scanweaver.mamba_selective_scan` (so it gains whatever kernel that
function uses) entered with its carry, the ``(batch, D, N)`` state.  A
block's transition product is ``exp(A * sum_t delta_t)`` per ``(b, d, n)``
(the sum in double precision), zero where a packed sequence starts inside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..arrays import aligned, compute_dtype, seqlens_positions
from ..errors import ScanInputError
from ..ir.functions import NUMPY
from ..ops.mamba1 import _groups
from ..ops.mamba1 import mamba_selective_scan as mamba_in_memory
from .blocks import BlockContext, BlockKernel
from .graph import Layout, build, choose, parallelism
from .scan import as_dask

API = "mamba_selective_scan (dask)"


@dataclass
class MambaBlocks(BlockKernel):
    """Blocks of a Mamba scan.

    Attributes:
        groups_b, groups_c: ``B``'s and ``C``'s group counts (0: fixed ``(D, N)``).
        channels: D, the channels in all (groups map channel ``d`` to ``d // (D / G)``).
        optional: which of ``D``, ``z``, ``delta_bias`` follow ``u, delta, A, B, C`` in the blocks.
        delta_softplus: apply softplus to ``delta``.
        call: ``backend``, ``schedule`` and tunables of every block's call.
    """

    groups_b: int
    groups_c: int
    channels: int
    optional: tuple[str, ...] = ()
    delta_softplus: bool = False
    call: dict = field(default_factory=dict)

    def _unpack(self, ctx: BlockContext, blocks: tuple) -> dict:
        # blocks received from other workers can sit at unaligned addresses; the fused kernel needs aligned ones
        blocks = tuple(aligned(np.asarray(b)) for b in blocks)
        u, delta, A, B, C = blocks[:5]
        ops = dict(zip(self.optional, blocks[5:], strict=True))
        d0, dn = ctx.origin[1], u.shape[1]
        return {"u": u, "delta": delta, "A": A, "B": self._group_slice(B, self.groups_b, d0, dn),
                "C": self._group_slice(C, self.groups_c, d0, dn), **ops}

    def _group_slice(self, M: np.ndarray, groups: int, d0: int, dn: int) -> np.ndarray:
        """``B`` or ``C`` for channels ``d0 .. d0+dn``: their groups, or one group per channel."""
        if groups <= 1:
            return M
        per = self.channels // groups
        if d0 % per == 0 and dn % per == 0:
            return M[:, d0 // per:(d0 + dn) // per]
        return M[:, np.arange(d0, d0 + dn) // per]

    def _local_seqlens(self, ctx: BlockContext) -> tuple[list[int] | None, bool]:
        """The block's own ``cu_seqlens``, and whether a sequence starts exactly at its first element."""
        local = sorted(p - ctx.offset for p in ctx.resets)
        at_start = bool(local) and local[0] == 0
        inner = [p for p in local if p > 0]
        return ([0, *inner, ctx.length] if inner else None), at_start

    def scan(self, ctx, h0, *blocks, threads=None):
        # ``threads`` is not applied: the fused call's tunables would replace its tuned configuration
        ops = self._unpack(ctx, blocks)
        cu, at_start = self._local_seqlens(ctx)
        return mamba_in_memory(ops.pop("u"), ops.pop("delta"), ops.pop("A"), ops.pop("B"), ops.pop("C"), **ops,
                               delta_softplus=self.delta_softplus,
                               h0=None if at_start or h0 is None else aligned(np.asarray(h0)), return_state=True,
                               cu_seqlens=cu, **self.call)

    def product(self, ctx, *blocks):
        ops = self._unpack(ctx, blocks)
        delta, A = ops["delta"], ops["A"]
        wide = np.complex128 if np.iscomplexobj(A) else np.float64
        delta = delta.astype(np.float64)
        if "delta_bias" in ops:
            delta = delta + ops["delta_bias"].astype(np.float64)[:, None]
        if self.delta_softplus:
            delta = NUMPY["softplus"](delta)
        with np.errstate(all="ignore"):
            p = np.exp(A.astype(wide)[None] * delta.sum(axis=-1)[..., None])
        if ctx.resets:
            p[...] = 0
        return p.astype(compute_dtype([np.asarray(b).dtype for b in blocks]))


def mamba_selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus: bool = False,
                         return_last_state: bool = False, *, h0=None, return_state: bool = False, cu_seqlens=None,
                         log_space: bool = False, backend: str = "auto", schedule: str = "auto",
                         fused: bool | None = None, method: str = "auto", **tunables):
    """:func:`scanweaver.mamba_selective_scan` over Dask arrays, chunked along batch, D and L.

    ``u``, ``delta``, ``z`` are ``(batch, D, L)`` and give the output's
    chunking; ``B``/``C`` follow along batch and L (one chunk along N and
    groups), ``A``, ``D``, ``delta_bias`` and ``h0`` along D.  NumPy arrays are
    accepted beside Dask ones.  ``method`` as in :func:`scanweaver.dask.apply`
    (``chain`` or ``rescan``).

    Example:
        >>> import dask.array as da, numpy as np, scanweaver.dask
        >>> rng = np.random.default_rng(0)
        >>> u = da.from_array(rng.normal(size=(1, 2, 9)), chunks=(1, 1, 4))
        >>> delta = da.from_array(rng.uniform(0.1, 1, (1, 2, 9)), chunks=(1, 1, 4))
        >>> A, B, C = -rng.uniform(0.5, 1, (2, 3)), rng.normal(size=(1, 3, 9)), rng.normal(size=(1, 3, 9))
        >>> y = scanweaver.dask.mamba_selective_scan(u, delta, A, B, C, backend="numpy")
        >>> y.chunks
        ((1,), (1, 1), (4, 4, 1))
    """
    return_state = return_state or return_last_state
    if fused is False:
        raise ScanInputError(f"{API}: fused=False is not available over Dask; each block runs the fused kernel "
                             "wherever the backend has it")
    if log_space:
        raise ScanInputError(f"{API}: log_space=True is not available over Dask; compute blocks in memory with "
                             "scanweaver.mamba_selective_scan(..., log_space=True)")
    u = as_dask(API, "u", u)
    if u.ndim != 3:
        raise ScanInputError(f"{API}: u has shape {tuple(u.shape)}; it needs (batch, D, L)")
    batch, Dm, L = (int(s) for s in u.shape)
    bc, dc, lc = u.chunks
    arrs = {"delta": as_dask(API, "delta", delta), "A": as_dask(API, "A", A)}
    if tuple(arrs["delta"].shape) != tuple(u.shape):
        raise ScanInputError(f"{API}: delta has shape {tuple(arrs['delta'].shape)}; it needs u's shape {u.shape}")
    if arrs["A"].ndim != 2 or arrs["A"].shape[0] != Dm:
        raise ScanInputError(f"{API}: A has shape {tuple(arrs['A'].shape)}; it needs (D, N) with D = {Dm}")
    N = int(arrs["A"].shape[1])
    arrs["B"], arrs["C"] = as_dask(API, "B", B), as_dask(API, "C", C)
    gb, gc = (_groups(n, arrs[n], batch, Dm, N, L, API) for n in ("B", "C"))
    extra = {"D": (D, (Dm,)), "z": (z, (batch, Dm, L)), "delta_bias": (delta_bias, (Dm,))}
    optional = tuple(n for n, (v, _) in extra.items() if v is not None)
    for n in optional:
        arrs[n] = as_dask(API, n, extra[n][0])
        if tuple(arrs[n].shape) != extra[n][1]:
            raise ScanInputError(f"{API}: {n} has shape {tuple(arrs[n].shape)}; it needs {extra[n][1]}")
    chunks_of = {"delta": (bc, dc, lc), "z": (bc, dc, lc), "A": (dc, (N,)), "D": (dc,), "delta_bias": (dc,)}
    axes_of = {"delta": (0, 1, 2), "z": (0, 1, 2), "A": (1, None), "D": (1,), "delta_bias": (1,)}
    for n, g in (("B", gb), ("C", gc)):
        M = arrs[n]
        chunks_of[n] = {0: (dc, (N,)), 1: (bc, (N,), lc)}.get(g, (bc, (M.shape[1],), (N,), lc))
        axes_of[n] = {0: (1, None), 1: (0, None, 2)}.get(g, (0, None, None, 2))
    operands = [(u, (0, 1, 2))] + [(arrs[n].rechunk(chunks_of[n]), axes_of[n])
                                   for n in ("delta", "A", "B", "C", *optional)]
    wide = compute_dtype([u.dtype, *(a.dtype for a in arrs.values())])
    out_dtype = u.dtype if wide.kind != "c" else wide
    h0a = None
    if h0 is not None:
        h0a = as_dask(API, "h0", h0)
        if tuple(h0a.shape) != (batch, Dm, N):
            raise ScanInputError(f"{API}: h0 has shape {tuple(h0a.shape)}; it needs (batch, D, N) = {(batch, Dm, N)}")
        h0a = h0a.rechunk((bc, dc, (N,)))
    positions = seqlens_positions(API, cu_seqlens, L) if cu_seqlens is not None else None
    kernel = MambaBlocks(gb, gc, Dm, optional, bool(delta_softplus), {"backend": backend, "schedule": schedule,
                                                                        **tunables})
    chosen = choose(method, math.prod(len(c) for c in (bc, dc)), len(lc), parallelism(), False)
    state_axes = (0, 1, None)
    layout = Layout(operands, (bc, dc, lc), out_dtype, (h0a, state_axes) if h0a is not None else None,
                    (bc, dc, (N,)), state_axes, wide)
    from dask.base import tokenize

    token = tokenize([a.name for a, _ in operands], h0a.name if h0a is not None else None, positions, chosen,
                     gb, gc, optional, bool(delta_softplus), sorted(kernel.call.items(), key=str))
    return build(kernel, layout, name="mamba-selective-scan", token=token, method=chosen, reverse=False,
                 resets=positions, return_state=return_state)
