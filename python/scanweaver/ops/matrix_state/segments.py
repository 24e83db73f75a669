"""mamba-ssm's ``seq_idx`` on the fused kernel: rows and sequence indices as packed segments.

mamba-ssm marks the sequences of a row with ``seq_idx`` ``(batch, L)``, the
sequence index of every position: the state starts again from zero wherever
the index changes within a row.  The fused kernel knows one way to start a
state again, the packed offsets ``cu_seqlens`` of one row, so a call with
``seq_idx`` runs with its rows laid end to end (``(batch, L)`` as ``(1, batch*L)``,
a view) and cut into *segments* wherever a row starts, a sequence of
``cu_seqlens`` starts, or the index changes.  Each of the call's sequences (a
row, or a sequence of ``cu_seqlens``) is one or more consecutive segments: its
first segment starts from its initial state, the others from zero, and its
final state is that of its last segment.  :class:`Segments` holds that map;
the wrappers of :mod:`.mamba2` spread the initial states and the final states'
cotangents over the segments and gather the final states and the initial
states' gradients back.

Example:
    >>> from scanweaver.ops.matrix_state.segments import seq_idx_option, segments
    >>> opt = seq_idx_option("demo", [[0, 0, 1, 1, 1], [0, 1, 1, 2, 2]])
    >>> s = segments("demo", 2, 5, None, opt)
    >>> s.cu.tolist(), s.first.tolist(), s.last.tolist()
    ([0, 2, 5, 6, 8, 10], [0, 2], [1, 4])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...checks import check_seqlens
from ...errors import ScanInputError


def seq_idx_option(api: str, seq_idx) -> dict | None:
    """``seq_idx`` for a kernel pair's options (Python literals): its shape and the flat positions
    ``row * L + t`` (``t >= 1``) where the index changes within a row; ``None`` stays.

    Raises:
        ScanInputError: not a 2-D array of integers, naming ``seq_idx``.
    """
    if seq_idx is None:
        return None
    rule = "(batch, L) integers (the sequence index of every position, as mamba-ssm takes it)"
    try:
        s = np.asarray(seq_idx)
    except Exception:  # a traced or device value
        raise ScanInputError(f"{api}: seq_idx must be {rule}, known when the call is made; got "
                             f"{type(seq_idx).__name__}") from None
    if s.ndim != 2 or s.dtype.kind not in "iu":
        raise ScanInputError(f"{api}: seq_idx must be {rule}; got shape {s.shape}, dtype {s.dtype}")
    rows, cols = np.nonzero(s[:, 1:] != s[:, :-1])
    return {"shape": [int(n) for n in s.shape], "starts": (rows * s.shape[1] + cols + 1).tolist()}


@dataclass(frozen=True)
class Segments:
    """The kernel's segments of a call with ``seq_idx`` (see the module docstring).

    Attributes:
        cu: the kernel's offsets along the rows laid end to end (int64, ``[0, ..., batch*L]``).
        first: per sequence of the call, the index of its first segment.
        last: per sequence of the call, the index of its last segment.
    """

    cu: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @property
    def count(self) -> int:
        """Segments in all."""
        return len(self.cu) - 1

    def spread(self, states: np.ndarray | None, at: np.ndarray) -> np.ndarray | None:
        """``states`` (one per sequence) on the segments ``at`` (``first`` or ``last``), zeros elsewhere."""
        if states is None:
            return None
        xp = np if isinstance(states, np.ndarray) else __import__(type(states).__module__.partition(".")[0])
        out = xp.zeros((self.count, *states.shape[1:]), states.dtype)
        out[xp.asarray(at)] = states
        return out


def segments(api: str, batch: int, L: int, cu_seqlens, seq_idx: dict | None) -> Segments | None:
    """The segments of a call (``seq_idx`` as :func:`seq_idx_option` gives it), or None without ``seq_idx``.

    Raises:
        ScanInputError: ``seq_idx`` not of the inputs' ``(batch, L)``; bad ``cu_seqlens``.
    """
    if seq_idx is None:
        return None
    if tuple(seq_idx["shape"]) != (batch, L):
        raise ScanInputError(f"{api}: seq_idx has shape {tuple(seq_idx['shape'])}; it needs (batch, L) = "
                             f"{(batch, L)}")
    seqs = np.arange(batch + 1, dtype=np.int64) * L if cu_seqlens is None else \
        check_seqlens(api, cu_seqlens, L, batch)
    extra = np.setdiff1d(np.asarray(seq_idx["starts"], dtype=np.int64), seqs)
    where = np.arange(len(seqs)) + np.searchsorted(extra, seqs)  # each offset of seqs among the merged ones
    cu = np.sort(np.concatenate([seqs, extra]), kind="stable")
    return Segments(cu, where[:-1], where[1:] - 1)
