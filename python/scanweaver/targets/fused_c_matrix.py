"""C (CPU) rendering of the fused matrix-state scan (:mod:`scanweaver.fused.matrix_state`).

Two algorithms for the forward, chosen by the tunable ``algorithm``:

* ``recurrent`` (:mod:`.matrix_c_recurrent`): per (sequence, head, block of
  value columns) the state tile stays in L1 while time advances, vectorised
  over V; parts of a long sequence run on several threads through the affine
  carry when items are few;
* ``chunked`` (:mod:`.matrix_c_chunked`): the matmul form on chunks of
  ``chunk`` steps, register-blocked products, only chunk-end states carried.

The backward (:mod:`.matrix_c_backward`) is the fused recurrent reverse sweep.
Sizes K and V and every feature are compile-time constants; the tunables
``chunk``, ``block_v`` and ``threads`` are ``#define`` s (Kernel Tuner's bare
names win in its units), ``width`` and ``algorithm`` shape the text.

Entry points (ABI order of :meth:`~scanweaver.fused.matrix_state.MatrixState.params`)::

    int sw_matrix_state_forward(q, k, v, g, u, h0, cu_seqlens, o, hlast, long batch, long T, long H, long Hq,
                                long nseq);
    int sw_matrix_state_backward(q, k, v, g, u, h0, cu_seqlens, do, dhlast, dq, dk, dv, dg, du, dh0,
                                 long batch, long T, long H, long Hq, long nseq);

returning 0, 1 (scratch memory short) or 2 (sizes or ``cu_seqlens`` inconsistent).
"""

from __future__ import annotations

from ..fused.matrix_state import MatrixState, MatrixStateFeatures
from .c_source import THREADS, algorithm_defines, fused_timed, tunable_defines
from .chunk_engine import engine_source
from .cvec import vector_prelude
from .fused import KERNELS, FusedKernel
from .fused_c_mamba1 import HEAD, TAIL
from .matrix_c_backward import GRADS as BACKWARD_GRADS
from .matrix_c_backward import HEAD as BACKWARD_HEAD
from .matrix_c_backward import RUN as BACKWARD_RUN
from .matrix_c_chunked import CHUNKED
from .matrix_c_chunked_backward import BACKWARD as CHUNKED_BACKWARD
from .matrix_c_common import COMMON
from .matrix_c_recurrent import RECURRENT

#: State elements x steps per call below which the forward runs on one thread (a few hundred microseconds)...
ONE_THREAD_WORK = 1 << 22
#: ... unless the state has this many elements or more: a short call (decode) then streams the state from memory,
#: and two threads moved it faster than one (bench/linear_rnn.py's decode rows, 2 cores: Mamba-2's 24 x 128 x 64
#: state, 196608 elements, 1.3x at batch 1 and 1.8x at batch 16; GLA's 16 x 64 x 64, 1.5-1.8x at batch 16 and
#: no gain at batch 1, 65536 elements).
ONE_THREAD_STATE = 1 << 17

#: ``decay`` -> the value of ``SW_DECAY`` in C.
DECAY_CODE = {"none": 0, "scalar": 1, "key": 2}

FORWARD = r"""
int sw_matrix_state_forward(const SW_T* q, const SW_T* k, const SW_T* v, const SW_T* g, const SW_T* u,
                            const SW_T* h0, const int64_t* cu_seqlens, SW_T* o, SW_T* hlast,
                            long batch, long T, long H, long Hq, long nseq) {
  const sw_ms m = {q, k, v, g, u, h0, cu_seqlens, batch, T, H, Hq, nseq};
  if (batch <= 0 || H <= 0 || nseq <= 0) return SW_OK;
  const int bad = sw_check(&m);
  if (bad) return bad;
#if SW_CHUNKED
  return sw_forward_chunked(&m, o, hlast);
#else
  return sw_forward_recurrent(&m, o, hlast);
#endif
}
"""


def defines(features: MatrixStateFeatures, config: dict, kernel_tuner: bool = False) -> str:
    """``#define`` lines of the features and tunables (tunables under ``#ifndef`` guards; with
    ``kernel_tuner``, Kernel Tuner's bare-name defines win)."""
    f = features
    flags = {"SW_K": f.K, "SW_V": f.V, "SW_DECAY": DECAY_CODE[f.decay], "SW_BONUS": int(f.readout == "bonus"),
             "SW_REVERSE": int(f.reverse), "SW_HAS_H0": int(f.has_h0), "SW_HAS_SEQLENS": int(f.has_seqlens),
             "SW_HAS_DHLAST": int(f.has_dhlast)}
    lines = [f"#define {k} {v}" for k, v in flags.items()]
    lines += algorithm_defines(config.get("algorithm") == "chunked", kernel_tuner)
    lines += tunable_defines(("chunk", "block_v", "threads"), config, kernel_tuner)
    return "\n".join(lines)


def render(renderer, call, kernel_tuner: bool = False) -> str:
    """The C unit of ``call`` (a :class:`~scanweaver.fused.FusedCall` of ``matrix_state``).

    With ``kernel_tuner``, ``chunk``, ``block_v``, ``threads`` and ``algorithm`` read Kernel Tuner's bare-name
    defines (one unit holds both algorithms); ``width`` shapes the text, so it is one unit per value.
    """
    f, cfg = call.features, call.params
    title = (f"/* scanweaver fused C kernel: matrix_state {call.part}, {f.dtype}, K={f.K}, V={f.V}, "
             f"decay {f.decay}, readout {f.readout}, {cfg['algorithm']}, width {cfg['width']} */")
    chunked = cfg["algorithm"] == "chunked"
    recurrent, engine = kernel_tuner or not chunked, (engine_source(), CHUNKED) if kernel_tuner or chunked else ()
    if call.part == "forward":
        body = [RECURRENT if recurrent else "", *engine, FORWARD]
    else:  # Kernel Tuner picks the algorithm by its define: one unit holds both
        body = [BACKWARD_GRADS, BACKWARD_HEAD if recurrent else "", *engine, CHUNKED_BACKWARD if engine else "",
                BACKWARD_RUN]
    parts = [title, defines(f, cfg, kernel_tuner), HEAD, THREADS, vector_prelude(f.dtype, cfg["width"]), COMMON,
             *body]
    if kernel_tuner:
        parts.append(fused_timed(MatrixState(), call))
    return "\n".join([*parts, TAIL])


def defaults(features: MatrixStateFeatures, sizes: dict) -> dict:
    """Defaults by shape (the algorithm is the operation's rule, :meth:`~scanweaver.fused.FusedOp.algorithm`):
    for the recurrent form, whole rows of the state up to 128 value columns per block
    (one item per head: the packed rows of q, k and the decays are read and exponentiated once per step;
    measured faster than narrower blocks at V = 64 and 128 by bench/linear_rnn.py), and one thread, with no
    OpenMP region, below :data:`ONE_THREAD_WORK` state elements per call with a state below
    :data:`ONE_THREAD_STATE` elements (decode of a small state: a parallel region costs more than the work, and
    on a loaded machine it waits for a descheduled thread)."""
    cfg: dict = {"block_v": min(128, max(16, 1 << (features.V - 1).bit_length()))}
    state = sizes.get("nseq", sizes.get("batch", 1)) * sizes.get("H", 1) * features.K * features.V
    if MatrixState().work(features, sizes) < ONE_THREAD_WORK and state < ONE_THREAD_STATE:
        cfg["threads"] = 1
    return cfg


KERNELS.register(FusedKernel(MatrixState.name, "c", ("forward", "backward"), render,
                             lambda part: f"sw_matrix_state_{part}", defaults=defaults))
