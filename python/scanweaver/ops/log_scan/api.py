"""Log-space scans for positive gates: h_t = exp(log_a_t) * h_{t-1} + x_t.

With P_t = sum_{r<=t} log_a_r the closed form is
h_t = exp(P_t) * h_0 + sum_{s<=t} exp(P_t - P_s) * x_s.  Computing exp(P_t)
and exp(-P_s) separately overflows for long sequences, so this front end
lowers the scan to chunks of ``chunk`` steps:

1. inside a chunk, the weights exp(P_t - P_s) come from segment sums
   ``sum_{s<r<=t} log_a_r`` (a masked cumulative sum, never a difference of
   two large prefixes), so every weight is <= 1 for decaying gates and is
   rounded once instead of being a product of t - s rounded gates;
2. the chunk totals (log gate = the chunk's sum of logs, input = the chunk's
   final local state) form a shorter scan of the same kind, solved
   recursively, which gives every chunk its carry-in state;
3. h_t = local_t + exp(P_t - P_start) * carry_in.

When it helps: gates near 1 given by their logarithm (``a = exp(delta*A)``
with small ``|delta*A|``).  A rounded float32 gate 1 - 1e-7 carries a
relative error of up to 30% in 1 - a, and a sequential or tree scan
compounds it over the whole sequence; here the log gate is used as given.
When it does not: gates far from 1 (errors match the ordinary scan), gates
known only as ``a`` (``log(a)`` cannot restore what rounding ``a`` lost),
non-positive gates (not representable), and cost: ``chunk`` times the
arithmetic of a scan plus a ``(lanes, L/chunk, chunk, chunk)`` temporary
per lane block, in NumPy only.
"""

from __future__ import annotations

import numpy as np

from ...arrays import as_array, compute_dtype, result_dtype
from ...calls.declare import operation
from ...errors import ScanInputError

API = "log_scan"
#: Elements of the (lanes, chunks, chunk, chunk) weight temporary per lane block (64 MiB in float32).
BLOCK_ELEMENTS = 1 << 24


def _chunks(la: np.ndarray, x: np.ndarray, K: int):
    """Local states (zero carry-in), decay from chunk start, chunk log totals for ``(lanes, nc, K)``."""
    t = np.arange(K)
    strict = t[:, None] > t[None, :]
    seg = np.cumsum(np.where(strict, la[..., :, None], 0), axis=-2)
    # Terms of later steps (s > t) are dropped, not multiplied by a weight of 0: a NaN or inf x_s stays out of
    # the earlier steps of its chunk (0 * NaN is NaN).
    terms = np.exp(seg) * x[..., None, :]
    terms[..., ~(t[:, None] >= t[None, :])] = 0
    local = terms.sum(axis=-1)
    prefix = np.cumsum(la, axis=-1)
    return local, np.exp(prefix), prefix[..., -1]


def _scan(la: np.ndarray, x: np.ndarray, h0: np.ndarray, K: int) -> np.ndarray:
    """States h_t ``(lanes, L)`` of the forward scan from ``h0``."""
    lanes, L = la.shape
    nc = -(-L // K)
    pad = nc * K - L
    la3 = np.pad(la, ((0, 0), (0, pad))).reshape(lanes, nc, K)
    x3 = np.pad(x, ((0, 0), (0, pad))).reshape(lanes, nc, K)
    local, decay, total = _chunks(la3, x3, K)
    if nc == 1:
        carry = h0[:, None]
    else:
        ends = _scan(total, local[:, :, -1], h0, K)
        carry = np.concatenate([h0[:, None], ends[:, :-1]], axis=1)
    # A zero carry stays zero where the decay overflowed from finite log gates, as the loop multiplies them into
    # a zero state (inf * 0 was NaN); a +inf log gate still gives NaN, as it does in the loop.
    finite = ~np.logical_or.accumulate(np.isposinf(la3), axis=-1)
    h = local + np.where((carry[..., None] == 0) & finite, 0, decay * carry[..., None])
    return h.reshape(lanes, nc * K)[:, :L]


def _loop(la: np.ndarray, x: np.ndarray, h0: np.ndarray) -> np.ndarray:
    """States h_t ``(lanes, L)`` of the recurrence itself, step by step (a gate rounded once per step)."""
    h = np.empty(la.shape, la.dtype)
    state = h0.copy()
    for t in range(la.shape[1]):
        state = np.exp(la[:, t]) * state + x[:, t]
        h[:, t] = state
    return h


def _exact(la: np.ndarray, x: np.ndarray, h0: np.ndarray, K: int) -> np.ndarray:
    """:func:`_scan`, with the loop's states from a lane's first non-finite one on: once a state overflows, the
    closed form adds weights of opposite sign that both overflowed (inf - inf) or an overflowed weight times an
    input of 0 (inf * 0), NaN where the loop carries the overflow as +-inf; and a reset inside a chunk would
    drop an overflowed state that the loop multiplies by a gate of 0 (NaN), as a reset across chunks does.
    Only lanes with such a state run the loop."""
    h = _scan(la, x, h0, K)
    bad = ~np.isfinite(h)
    lanes = np.flatnonzero(bad.any(axis=1))
    if lanes.size:
        after = np.logical_or.accumulate(bad[lanes], axis=1)
        sub = h[lanes]
        sub[after] = _loop(la[lanes], x[lanes], h0[lanes])[after]
        h[lanes] = sub
    return h


@operation(arrays=("log_a", "x", "h0", "reset"), frameworks=())
def log_scan(log_a, x, *, h0=None, reset=None, reverse: bool = False, return_state: bool = False,
             chunk: int = 64):
    """The scan h_t = exp(log_a_t) * h_{t-1} + x_t, computed in log space.

    Args:
        log_a: log gates, layout ``(..., L)`` (``-inf`` is a gate of 0).
        x: inputs, broadcastable with ``log_a``.
        h0: initial state of the leading shape, or None (zeros).
        reset: boolean mask broadcastable to ``(..., L)``; True sets the gate to 0.
        reverse: scan from t = L-1 down to 0.
        return_state: also return the final state (``h_0`` for reverse).
        chunk: steps per chunk (>= 2); the work grows with it, the recursion depth
            (log_chunk L levels, one rounding of a carry gate each) shrinks.

    Returns:
        ``h`` of the broadcast shape, or ``(h, h_last)``.  float16/bfloat16 accumulate
        in float32 and ``h`` comes back in their dtype; other dtypes run as given.

    Example:
        >>> import numpy as np
        >>> from scanweaver import log_scan
        >>> log_scan(np.log(np.full((1, 4), 0.5)), np.ones((1, 4))).tolist()
        [[1.0, 1.5, 1.75, 1.875]]
    """
    la, xv = as_array(API, "log_a", log_a), as_array(API, "x", x)
    for name, arr in (("log_a", la), ("x", xv)):
        if arr.dtype.kind == "c":
            raise ScanInputError(f"{API}: {name} has complex dtype {arr.dtype}; log-space scans need real "
                                 "log gates and inputs (positive gates)")
        if arr.ndim == 0:
            raise ScanInputError(f"{API}: {name} is a scalar; operands need layout (..., L)")
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 2:
        raise ScanInputError(f"{API}: chunk must be an int >= 2, got {chunk!r}")
    try:
        shape = np.broadcast_shapes(la.shape, xv.shape)
    except ValueError:
        raise ScanInputError(f"{API}: log_a{la.shape} and x{xv.shape} do not broadcast together") from None
    dtype = compute_dtype([la.dtype, xv.dtype])
    out_dtype = result_dtype([la.dtype, xv.dtype])
    batch, L = shape[:-1], shape[-1]
    lanes = int(np.prod(batch, dtype=np.int64))
    la2 = np.array(np.broadcast_to(la, shape), dtype=dtype).reshape(lanes, L)
    x2 = np.ascontiguousarray(np.broadcast_to(xv, shape), dtype=dtype).reshape(lanes, L)
    if reset is not None:
        r = np.asarray(reset)
        try:
            mask = np.broadcast_to(r != 0, shape).reshape(lanes, L)
        except ValueError:
            raise ScanInputError(f"{API}: reset has shape {r.shape}; it needs to broadcast to {shape}") from None
        la2[mask] = -np.inf
    h0v = np.zeros(lanes, dtype)
    if h0 is not None:
        hv = np.asarray(h0)
        if hv.shape != batch:
            raise ScanInputError(f"{API}: h0 has shape {hv.shape}; it needs the leading shape {batch}")
        h0v = hv.astype(dtype).reshape(lanes)
    if reverse:
        la2, x2 = la2[:, ::-1], x2[:, ::-1]
    h = np.empty((lanes, L), dtype)
    chunk = int(min(chunk, max(2, L)))  # one chunk covers the sequence: a longer one would only pad it
    step = max(1, BLOCK_ELEMENTS // max(1, L * chunk))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for i in range(0, lanes, step):
            if L:
                h[i:i + step] = _exact(la2[i:i + step], x2[i:i + step], h0v[i:i + step], int(chunk))
    h_last = (h[:, -1] if L else h0v).copy()
    if reverse:
        h = h[:, ::-1]
    y = np.ascontiguousarray(h).reshape(shape).astype(out_dtype, copy=False)
    return (y, h_last.reshape(batch)) if return_state else y
