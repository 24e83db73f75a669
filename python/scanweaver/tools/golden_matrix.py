"""Golden vectors of the matrix-state scan, forward and backward, written and checked with the scan's.

``python -m scanweaver.tools.golden`` writes these files too, under ``test/golden/matrix``.  The
inputs (and the cotangents ``dout``, ``dh_last``) come from the exact dyadic grid of the scan's
cases (:func:`.golden.grid`); the expected outputs and gradients from the float64 NumPy definition
of :mod:`scanweaver.fused.matrix_state` (``forward_reference``, ``backward_reference``).
ScanWeaver.jl's matrix-state kernels are tested against them (``test/golden_matrix.jl``).

Schema of each file (Python shapes; flat arrays in C order, which Julia reads column-major with the
dimensions reversed: ``q`` of shape ``[batch, T, Hq, K]`` is ``(K, Hq, T, batch)`` in Julia)::

    name = "matrix_scalar_f64"
    kind = "matrix"
    dtype = "float64"              # the inputs are exact values of it
    shape = [batch, T, H, Hq, K, V]
    decay = "scalar"               # "none", "scalar" ([batch, T, H]) or "key" ([batch, T, H, K])
    readout = "after"              # or "bonus" (RWKV-6, with u [H, K])
    reverse = false
    cu_seqlens = [0, ..., T]       # optional: packed sequences (batch 1)
    q = [...]  k = [...]  v = [...]  g = [...]  u = [...]  h0 = [...]   # g, u, h0 optional; h0 [nseq, H, K, V]
    dout = [...]  dh_last = [...]  # the cotangents of o [batch, T, H, V] and of the final state
    y = [...]                      # expected o
    h_last = [...]                 # expected final states [nseq, H, K, V]
    grad_dq = [...]  grad_dk = [...]  grad_dv = [...]               # expected gradients, in the inputs'
    grad_dg = [...]  grad_du = [...]  grad_dh0 = [...]              # shapes (those of absent inputs absent)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .golden import SEED, _toml_value, grid

#: Seed offset keeping these draws apart from the scan's and Mamba's cases.
SEED_OFFSET = 2000

#: Inputs in file order, then the gradients of the backward.
INPUTS = ("q", "k", "v", "g", "u", "h0", "dout", "dh_last")
GRADIENTS = ("dq", "dk", "dv", "dg", "du", "dh0")


@dataclass(frozen=True)
class MatrixCase:
    """One matrix-state golden case: ``(batch, T, H, Hq, K, V)`` and its options."""

    name: str
    shape: tuple[int, int, int, int, int, int]
    dtype: str = "float64"
    decay: str = "scalar"
    readout: str = "after"
    reverse: bool = False
    with_h0: bool = False
    cu_seqlens: tuple[int, ...] = ()


MATRIX_CASES = (
    MatrixCase("matrix_scalar_f64", (2, 13, 2, 2, 3, 4), with_h0=True),
    MatrixCase("matrix_key_groups_f64", (1, 17, 4, 2, 4, 3), decay="key"),
    MatrixCase("matrix_none_reverse_f32", (2, 9, 2, 1, 5, 2), dtype="float32", decay="none", reverse=True,
               with_h0=True),
    MatrixCase("matrix_bonus_f64", (2, 11, 2, 2, 3, 5), decay="key", readout="bonus", with_h0=True),
    MatrixCase("matrix_varlen_f64", (1, 21, 2, 1, 3, 3), with_h0=True, cu_seqlens=(0, 5, 6, 14, 21)),
    MatrixCase("matrix_length1_f32", (3, 1, 1, 1, 2, 3), dtype="float32", decay="key", readout="bonus"),
)


def make_inputs(case: MatrixCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Grid-valued operands and cotangents of ``case`` in its dtype (exact on every machine)."""
    batch, T, H, Hq, K, V = case.shape
    nseq = len(case.cu_seqlens) - 1 if case.cu_seqlens else batch
    state = (nseq, H, K, V)
    out = {"q": grid(rng, -1.0, 1.0, (batch, T, Hq, K)), "k": grid(rng, -1.0, 1.0, (batch, T, Hq, K)),
           "v": grid(rng, -2.0, 2.0, (batch, T, H, V))}
    if case.decay == "scalar":
        out["g"] = -grid(rng, 0.0, 1.0, (batch, T, H))
    elif case.decay == "key":
        out["g"] = -grid(rng, 0.0, 1.0, (batch, T, H, K))
    if case.readout == "bonus":
        out["u"] = grid(rng, -1.0, 1.0, (H, K))
    if case.with_h0:
        out["h0"] = grid(rng, -1.0, 1.0, state)
    out["dout"] = grid(rng, -1.0, 1.0, (batch, T, H, V))
    out["dh_last"] = grid(rng, -1.0, 1.0, state)
    return {k: v.astype(case.dtype) for k, v in out.items()}


def expected(case: MatrixCase, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``y`` (o), ``h_last`` and every gradient from the float64 NumPy definition."""
    from ..fused.matrix_state import backward_reference, forward_reference

    w = {k: v.astype(np.float64) for k, v in inputs.items()}
    cu = np.asarray(case.cu_seqlens, np.int64) if case.cu_seqlens else None
    opts = dict(decay=case.decay, readout=case.readout, u=w.get("u"), h0=w.get("h0"), cu_seqlens=cu,
                reverse=case.reverse)
    o, h = forward_reference(w["q"], w["k"], w["v"], w.get("g"), **opts)
    grads = backward_reference(w["q"], w["k"], w["v"], w.get("g"), **opts, do=w["dout"], dhlast=w["dh_last"])
    out = {"y": o, "h_last": h}
    out.update({f"grad_{n}": grads[n] for n in GRADIENTS if grads[n] is not None and (n != "dh0" or case.with_h0)})
    return out


def render(case: MatrixCase) -> str:
    """The TOML text of ``case`` (deterministic)."""
    rng = np.random.default_rng([SEED, SEED_OFFSET + MATRIX_CASES.index(case)])
    inputs = make_inputs(case, rng)
    header = {"name": case.name, "kind": "matrix", "dtype": case.dtype, "shape": list(case.shape),
              "decay": case.decay, "readout": case.readout, "reverse": case.reverse}
    if case.cu_seqlens:
        header["cu_seqlens"] = list(case.cu_seqlens)
    lines = [f"{k} = {_toml_value(v)}" for k, v in header.items()]
    for key in INPUTS:
        if key in inputs:
            lines.append(f"{key} = {_toml_value([float(e) for e in inputs[key].ravel()])}")
    for key, value in expected(case, inputs).items():
        lines.append(f"{key} = {_toml_value([float(e) for e in np.asarray(value).ravel()])}")
    return "# Generated by `python -m scanweaver.tools.golden`; do not edit.\n" + "\n".join(lines) + "\n"


def files(out: Path) -> list[tuple[Path, str]]:
    """``(path, text)`` of every matrix-state golden file under ``out / "matrix"``.

    Example:
        >>> from scanweaver.tools.golden import DEFAULT_DIR
        >>> [p.name for p, _ in files(DEFAULT_DIR)][:1]
        ['matrix_scalar_f64.toml']
    """
    return [(out / "matrix" / f"{case.name}.toml", render(case)) for case in MATRIX_CASES]


def load(path: str | Path) -> dict:
    """A matrix-state golden file as a dict of NumPy arrays in their Python shapes."""
    import tomllib

    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    batch, T, H, Hq, K, V = raw["shape"]
    nseq = len(raw["cu_seqlens"]) - 1 if "cu_seqlens" in raw else batch
    dt = np.dtype(raw["dtype"])
    qk, vo, state = (batch, T, Hq, K), (batch, T, H, V), (nseq, H, K, V)
    g = (batch, T, H, K) if raw["decay"] == "key" else (batch, T, H)
    shapes = {"q": qk, "k": qk, "v": vo, "g": g, "u": (H, K), "h0": state, "dout": vo, "dh_last": state,
              "y": vo, "h_last": state, "grad_dq": qk, "grad_dk": qk, "grad_dv": vo, "grad_dg": g, "grad_du": (H, K),
              "grad_dh0": state}
    out = dict(raw)
    for key, shape in shapes.items():
        if key in raw:
            wide = key in ("y", "h_last") or key.startswith("grad_")
            out[key] = np.asarray(raw[key], dtype=np.float64 if wide else dt).reshape(shape)
    if "cu_seqlens" in raw:
        out["cu_seqlens"] = np.asarray(raw["cu_seqlens"], dtype=np.int64)
    return out
