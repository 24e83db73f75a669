"""C (CPU) rendering of the fused delta rule (:mod:`scanweaver.fused.delta_rule`): recurrent and chunked forms.

The tunable ``algorithm`` picks the forward: ``recurrent`` (below) or ``chunked``, the WY form of
:mod:`.delta_c_chunked` on the chunk engine (chunks of ``chunk`` steps, both forms); and the backward: the
recurrent one (:mod:`.delta_c_backward`) or the chunked WY backward of :mod:`.delta_c_chunked_backward` (both
forms: DeltaNet, Gated DeltaNet, KDA and RWKV-7).

Forward: one work item per (sequence, value head, block of ``block_v`` value
columns) (the columns of the state evolve independently); blocks of
``SW_TB`` steps are packed (:mod:`.delta_c_common`), then each column group
of the state tile runs through them in registers, one pass over the K rows
per step.  Backward (:mod:`.delta_c_backward`): per (sequence, q/k head),
checkpoints every ``checkpoint`` steps and each chunk's states recomputed in
the reverse sweep; never a state per step.

Sizes K and V and every feature are compile-time constants; ``block_v``,
``checkpoint`` and ``threads`` are ``#define`` s, ``width`` shapes the text.
Threads: OpenMP, at most the free cores and never more than the fork-safe cap
(``sw_threads`` of :data:`~.c_source.THREADS`).

Entry points (ABI order of :meth:`~scanweaver.fused.delta_rule.DeltaRule.params`; float16/bfloat16 operands
as 16-bit storage, states in float32)::

    int sw_delta_rule_forward(q, k, v, g, beta, a, b, h0, cu_seqlens, o, hlast,
                              long batch, long T, long H, long Hq, long nseq);
    int sw_delta_rule_backward(q, k, v, g, beta, a, b, h0, cu_seqlens, dout, dhlast, dq, dk, dv, dg, dbeta,
                               da, db, dh0, long batch, long T, long H, long Hq, long nseq);

returning 0, 1 (scratch memory short) or 2 (sizes or ``cu_seqlens`` inconsistent).
"""

from __future__ import annotations

from ..fused.delta_rule import GATES, DeltaRule, DeltaRuleFeatures
from .c_source import THREADS, algorithm_defines, fused_timed, tunable_defines
from .chunk_engine import engine_source
from .chunk_tiles import CHUNK_TILES
from .cvec import vector_prelude
from .delta_c_backward import BACKWARD
from .delta_c_chunked import WY
from .delta_c_chunked_backward import WY_BACKWARD
from .delta_c_common import COMMON
from .fused import KERNELS, FusedKernel
from .fused_c_mamba1 import HEAD, TAIL

#: Bytes of the backward's chunk (its ``checkpoint + 2`` state tiles of K x block columns) kept within a
#: core's L2 (512 KiB on the machines measured): the block of value columns is halved until they fit.
BWD_TILE_BYTES = 384 * 1024
#: Vectors of value columns per register group of the sweep (the update's X and Y, the readout and the next
#: projection per vector stay in registers across the K rows): 4 ran the forward in 0.75 of the time of 2 at
#: (1, 1024, 16, 128, 128) float32 with AVX2 (one thread, CPU time; 8 was level with 4 within the noise).
GROUP_VECTORS = 4
#: ``dtype`` -> ``SW_STORE``: operands stored as the accumulation type, _Float16, or bfloat16 bits.
STORE_CODE = {"float32": 0, "float64": 0, "float16": 1, "bfloat16": 2}

FORWARD = r"""
#define SW_CB0 (((SW_BLOCK_V) + SW_W - 1) / SW_W * SW_W)
#define SW_CB (SW_CB0 < SW_VP ? SW_CB0 : SW_VP)
#define SW_NCB ((SW_V + SW_CB - 1) / SW_CB)

/* Item it: (sequence, value head, column block); its steps through the state tile S, o written. */
static void sw_fwd_item(const sw_dr* m, sw_pk* P, SW_T* S, long it, sw_s* o, SW_T* hlast) {
  const long cbk = it % SW_NCB, h = it / SW_NCB % m->H, row = it / SW_NCB / m->H;
  long b, start, stop;
  sw_seq(m, row, &b, &start, &stop);
  const long hq = h / (m->H / m->Hq), c0 = cbk * SW_CB;
  const int nv = (int)SW_MIN((long)SW_CB, SW_V - c0);
  sw_state_in(m, SW_HAS_H0 ? m->h0 : NULL, row, h, c0, nv, SW_CB, S);
  for (long s0 = start; s0 < stop; s0 += SW_TB) {
    const int n = (int)SW_MIN((long)SW_TB, stop - s0);
    sw_pack(m, P, b, h, hq, s0, n, c0, nv, NULL, SW_TB);
    sw_groups(P, n, S, 0, 1, 0);
    for (int i = 0; i < n; ++i) sw_store_row(o + SW_VO(m, b, s0 + i, h) + c0, P->o + i * SW_CB, nv);
  }
  sw_state_out(m, hlast, row, h, c0, nv, SW_CB, S);
}

int sw_delta_rule_forward(const sw_s* q, const sw_s* k, const sw_s* v, const sw_s* g, const sw_s* beta,
                          const sw_s* a, const sw_s* b, const SW_T* h0, const int64_t* cu_seqlens, sw_s* o,
                          SW_T* hlast, long batch, long T, long H, long Hq, long nseq) {
  const sw_dr m = {q, k, v, g, beta, a, b, h0, cu_seqlens, batch, T, H, Hq, nseq};
  if (batch <= 0 || H <= 0 || nseq <= 0) return SW_OK;
  const int bad = sw_check(&m);
  if (bad) return bad;
#if SW_CHUNKED
  return sw_forward_chunked(&m, o, hlast);
#endif
  const long items = nseq * H * SW_NCB;
  const int nt = (int)SW_MIN((long)sw_threads(), items);
  int status = SW_OK;
#pragma omp parallel num_threads(nt)
  {
    sw_pk P;
    P.raw = NULL;
    void* raw;
    SW_T* S = (SW_T*)sw_alloc(sizeof(SW_T) * (size_t)SW_K * SW_CB, &raw);
    const int ok = S && sw_pk_new(&P, SW_TB, SW_CB) == SW_OK;
    if (!ok) {
#pragma omp atomic write
      status = SW_ENOMEM;
    }
#pragma omp for schedule(dynamic, 1)
    for (long it = 0; it < items; ++it)
      if (ok) sw_fwd_item(&m, &P, S, it, o, hlast);
    free(raw);
    free(P.raw);
  }
  return status;
}
"""


def _round(n: int, w: int) -> int:
    return -(-n // w) * w


def backward_columns(features: DeltaRuleFeatures, config: dict) -> int:
    """The backward's block of value columns: ``block_v`` (whole vectors, at most V's), halved until the chunk's
    tiles fit :data:`BWD_TILE_BYTES`."""
    w, item = config["width"], 8 if features.state_dtype == "float64" else 4
    cols = min(_round(config["block_v"], w), _round(features.V, w))
    while cols > w and (config["checkpoint"] + 2) * features.K * cols * item > BWD_TILE_BYTES:
        cols = _round(cols // 2, w)
    return cols


def defines(features: DeltaRuleFeatures, config: dict, part: str = "forward", kernel_tuner: bool = False) -> str:
    """``#define`` lines of the features and tunables (of ``part``'s kernel; with ``kernel_tuner``, Kernel Tuner's
    bare-name defines of the tunables, ``algorithm`` among them, win)."""
    f = features
    flags = {"SW_K": f.K, "SW_V": f.V, "SW_GATE": GATES.index(f.gate), "SW_DPLR": int(f.form == "dplr"),
             "SW_L2": int(f.l2norm), "SW_HAS_H0": int(f.has_h0), "SW_HAS_SEQLENS": int(f.has_seqlens),
             "SW_HAS_DHLAST": int(f.has_dhlast), "SW_STORE": STORE_CODE[f.dtype], "SW_GV": GROUP_VECTORS,
             "SW_CBB": backward_columns(f, config), "SW_DECAY": GATES.index(f.gate), "SW_BONUS": 0}
    lines = [f"#define {k} {v}" for k, v in flags.items()]
    lines += algorithm_defines(chunked(f, config, part), kernel_tuner)
    return "\n".join(lines + tunable_defines(("chunk", "block_v", "checkpoint", "threads"), config, kernel_tuner))


def chunked(features: DeltaRuleFeatures, config: dict, part: str = "forward") -> bool:
    """True when ``part`` runs the chunked (WY) form: ``algorithm`` chunked (forward and backward, both forms)."""
    return config.get("algorithm") == "chunked"


def render(renderer, call, kernel_tuner: bool = False) -> str:
    """The C unit of ``call`` (a :class:`~scanweaver.fused.FusedCall` of ``delta_rule``).

    With ``kernel_tuner``, the tunables and ``algorithm`` read Kernel Tuner's bare-name defines (one unit holds
    both algorithms) and a ``*_timed`` entry is added; ``width`` shapes the text, so it is one unit per value.
    """
    f, cfg = call.features, call.params
    title = (f"/* scanweaver fused C kernel: delta_rule {call.part}, {f.dtype}, K={f.K}, V={f.V}, gate {f.gate}, "
             f"form {f.form}, l2norm {int(f.l2norm)}, {cfg['algorithm']}, width {cfg['width']} */")
    wy = kernel_tuner or chunked(f, cfg, call.part)
    if call.part == "forward":
        body = [engine_source(), CHUNK_TILES, WY, FORWARD] if wy else [FORWARD]
    else:
        body = [engine_source(), CHUNK_TILES, WY, BACKWARD, WY_BACKWARD] if wy else [BACKWARD]
    parts = [title, defines(f, cfg, call.part, kernel_tuner), HEAD, THREADS,
             vector_prelude(f.state_dtype, cfg["width"]), COMMON, *body]
    if kernel_tuner:
        parts.append(fused_timed(DeltaRule(), call))
    return "\n".join([*parts, TAIL])


def defaults(features: DeltaRuleFeatures, sizes: dict) -> dict:
    """Whole rows of the state up to 128 value columns per forward item (the packed rows of a step are read once
    per item)."""
    return {"algorithm": "recurrent", "block_v": min(128, max(16, 1 << (features.V - 1).bit_length()))}


KERNELS.register(FusedKernel(DeltaRule.name, "c", ("forward", "backward"), render,
                             lambda part: f"sw_delta_rule_{part}", defaults=defaults))
