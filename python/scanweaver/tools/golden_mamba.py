"""Golden vectors of the Mamba-1 selective scan, written and checked with the scan's (:mod:`.golden`).

``python -m scanweaver.tools.golden`` writes these files too, under ``test/golden/mamba`` (a
subfolder, so readers of the scan files do not take them for scan cases).  The inputs come from
the same exact dyadic grid as the scan's (:func:`.golden.grid`); the expected outputs from
``scanweaver.mamba_selective_scan(..., backend="numpy")`` in float64, the reference path with
``mamba_ssm``'s ``selective_scan_ref`` semantics.  ScanWeaver.jl's fused Mamba kernel is tested
against them (``test/golden_mamba.jl``).

Schema of each file (Python shapes; flat arrays in C order, which Julia reads column-major with the
dimensions reversed: ``u`` of shape ``[batch, D, L]`` is ``(L, D, batch)`` in Julia)::

    name = "mamba_per_step_f64"
    kind = "mamba"
    dtype = "float32"              # the inputs are exact values of it
    shape = [batch, D, L]
    state_size = N
    groups_b = 1                   # 0: B fixed [D, N]; 1: [batch, N, L]; G > 1: [batch, G, N, L]
    groups_c = 1                   # likewise for C
    delta_softplus = true
    return_state = true
    cu_seqlens = [0, ..., L]       # optional: packed sequences (states restart from zero)
    u = [...]  delta = [...]  A = [...]  B = [...]  C = [...]      # A: [D, N]
    D = [...]  z = [...]  delta_bias = [...]  h0 = [...]             # optional; h0: [batch, D, N]
    dout = [...]  dh_last = [...]  # cotangents of y [batch, D, L] and of h_last [batch, D, N]
    y = [...]                      # expected [batch, D, L]
    h_last = [...]                 # expected [batch, D, N]
    grad_du = [...]  grad_ddelta = [...]  grad_dA = [...]  grad_dB = [...]  grad_dC = [...]
    grad_dD = [...]  grad_dz = [...]  grad_ddelta_bias = [...]  grad_dh0 = [...]
                                   # expected gradients of sum(y * dout) + sum(h_last * dh_last), in the
                                   # inputs' shapes (those of absent inputs absent), from the float64
                                   # NumPy backward of scanweaver.fused.mamba1
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .golden import SEED, _toml_value, grid

#: Seed offset keeping these draws apart from the scan cases'.
SEED_OFFSET = 1000


@dataclass(frozen=True)
class MambaCase:
    """One Mamba golden case: shape ``(batch, D, L)``, ``N`` states, and its optional parts.

    Attributes:
        groups_b, groups_c: 0 for a fixed ``(D, N)`` operand, 1 for ``(batch, N, L)``, G for ``(batch, G, N, L)``.
    """

    name: str
    shape: tuple[int, int, int]
    N: int
    dtype: str = "float64"
    groups_b: int = 1
    groups_c: int = 1
    with_D: bool = False
    with_z: bool = False
    with_bias: bool = False
    softplus: bool = False
    with_h0: bool = False
    cu_seqlens: tuple[int, ...] = ()


MAMBA_CASES = (
    MambaCase("mamba_per_step_f64", (2, 4, 37), 4, with_D=True, with_z=True, with_bias=True, softplus=True,
              with_h0=True),
    MambaCase("mamba_grouped_f64", (2, 6, 29), 3, groups_b=2, groups_c=3, softplus=True),
    MambaCase("mamba_fixed_f32", (1, 3, 41), 5, dtype="float32", groups_b=0, groups_c=0, with_D=True,
              with_z=True),
    MambaCase("mamba_mixed_h0_f64", (1, 4, 50), 1, groups_c=0, with_bias=True, with_h0=True),
    MambaCase("mamba_varlen_f64", (1, 3, 45), 2, with_D=True, softplus=True, with_h0=True,
              cu_seqlens=(0, 10, 11, 30, 45)),
    MambaCase("mamba_length1_f32", (2, 2, 1), 16, dtype="float32", groups_b=2, with_z=True, with_h0=True),
)


def _bc_shape(groups: int, batch: int, dim: int, N: int, L: int) -> tuple[int, ...]:
    if groups == 0:
        return (dim, N)
    return (batch, N, L) if groups == 1 else (batch, groups, N, L)


def make_inputs(case: MambaCase, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Grid-valued operands of ``case`` in its dtype (exact on every machine)."""
    batch, dim, L = case.shape
    N = case.N
    out = {
        "u": grid(rng, -2.0, 2.0, (batch, dim, L)),
        "delta": grid(rng, -1.0, 1.0, (batch, dim, L)) if case.softplus else grid(rng, 0.01, 0.5, (batch, dim, L)),
        "A": -grid(rng, 0.25, 2.0, (dim, N)),
        "B": grid(rng, -2.0, 2.0, _bc_shape(case.groups_b, batch, dim, N, L)),
        "C": grid(rng, -2.0, 2.0, _bc_shape(case.groups_c, batch, dim, N, L)),
    }
    if case.with_D:
        out["D"] = grid(rng, -1.0, 1.0, (dim,))
    if case.with_z:
        out["z"] = grid(rng, -3.0, 3.0, (batch, dim, L))
    if case.with_bias:
        out["delta_bias"] = grid(rng, -0.5, 0.5, (dim,)) if case.softplus else grid(rng, 0.0, 0.25, (dim,))
    if case.with_h0:
        out["h0"] = grid(rng, -2.0, 2.0, (batch, dim, N))
    out["dout"] = grid(rng, -1.0, 1.0, (batch, dim, L))
    out["dh_last"] = grid(rng, -1.0, 1.0, (batch, dim, N))
    return {k: v.astype(case.dtype) for k, v in out.items()}


#: The gradients of the backward, each named after its input (``dA`` is A's).
GRADIENTS = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dh0")


def expected_gradients(case: MambaCase, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every gradient of ``sum(y * dout) + sum(h_last * dh_last)`` in float64, from
    :func:`scanweaver.fused.mamba1.backward_reference`, in the inputs' shapes."""
    from ..fused.mamba1 import backward_reference

    w = {k: v.astype(np.float64) for k, v in inputs.items()}
    batch, dim, L = case.shape
    reset = None
    if case.cu_seqlens:
        reset = np.zeros(L, np.uint8)
        reset[[s for s in case.cu_seqlens[1:-1] if s < L]] = 1

    def grouped(M, groups):
        return M if groups != 1 else M.reshape(batch, 1, *M.shape[1:])

    grads = backward_reference(w["u"], w["delta"], w["A"], grouped(w["B"], case.groups_b),
                               grouped(w["C"], case.groups_c), D=w.get("D"), z=w.get("z"),
                               delta_bias=w.get("delta_bias"), delta_softplus=case.softplus, h0=w.get("h0"),
                               reset=reset, dout=w["dout"], dhlast=w["dh_last"])
    present = {"dD": "D", "dz": "z", "ddelta_bias": "delta_bias", "dh0": "h0"}
    shapes = {"dB": inputs["B"].shape, "dC": inputs["C"].shape}
    return {f"grad_{n}": np.asarray(grads[n]).reshape(shapes.get(n, np.shape(grads[n]))) for n in GRADIENTS
            if present.get(n, "u") in inputs}


def expected(case: MambaCase, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(y, h_last)`` from ``mamba_selective_scan(..., backend="numpy")`` in float64."""
    from ..mamba import mamba_selective_scan

    wide = {k: v.astype(np.float64) for k, v in inputs.items() if k not in ("dout", "dh_last")}
    cu = np.asarray(case.cu_seqlens) if case.cu_seqlens else None
    return mamba_selective_scan(wide["u"], wide["delta"], wide["A"], wide["B"], wide["C"], D=wide.get("D"),
                                z=wide.get("z"), delta_bias=wide.get("delta_bias"), delta_softplus=case.softplus,
                                h0=wide.get("h0"), return_state=True, cu_seqlens=cu, backend="numpy")


def render(case: MambaCase) -> str:
    """The TOML text of ``case`` (deterministic)."""
    rng = np.random.default_rng([SEED, SEED_OFFSET + MAMBA_CASES.index(case)])
    inputs = make_inputs(case, rng)
    y, h_last = expected(case, inputs)
    header = {"name": case.name, "kind": "mamba", "dtype": case.dtype, "shape": list(case.shape),
              "state_size": case.N, "groups_b": case.groups_b, "groups_c": case.groups_c,
              "delta_softplus": case.softplus, "return_state": True}
    if case.cu_seqlens:
        header["cu_seqlens"] = list(case.cu_seqlens)
    lines = [f"{k} = {_toml_value(v)}" for k, v in header.items()]
    for key in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0", "dout", "dh_last"):
        if key in inputs:
            lines.append(f"{key} = {_toml_value([float(e) for e in inputs[key].ravel()])}")
    lines.append(f"y = {_toml_value([float(e) for e in np.asarray(y).ravel()])}")
    lines.append(f"h_last = {_toml_value([float(e) for e in np.asarray(h_last).ravel()])}")
    for key, value in expected_gradients(case, inputs).items():
        lines.append(f"{key} = {_toml_value([float(e) for e in value.ravel()])}")
    return "# Generated by `python -m scanweaver.tools.golden`; do not edit.\n" + "\n".join(lines) + "\n"


def files(out: Path) -> list[tuple[Path, str]]:
    """``(path, text)`` of every Mamba golden file under ``out / "mamba"``.

    Example:
        >>> from scanweaver.tools.golden import DEFAULT_DIR
        >>> [p.name for p, _ in files(DEFAULT_DIR)][:1]
        ['mamba_per_step_f64.toml']
    """
    return [(out / "mamba" / f"{case.name}.toml", render(case)) for case in MAMBA_CASES]


def load(path: str | Path) -> dict:
    """A Mamba golden file as a dict of NumPy arrays in their Python shapes."""
    import tomllib

    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    batch, dim, L = raw["shape"]
    N = raw["state_size"]
    dt = np.dtype(raw["dtype"])
    shapes = {"u": (batch, dim, L), "delta": (batch, dim, L), "z": (batch, dim, L), "A": (dim, N),
              "B": _bc_shape(raw["groups_b"], batch, dim, N, L), "C": _bc_shape(raw["groups_c"], batch, dim, N, L),
              "D": (dim,), "delta_bias": (dim,), "h0": (batch, dim, N), "y": (batch, dim, L),
              "h_last": (batch, dim, N), "dout": (batch, dim, L), "dh_last": (batch, dim, N)}
    shapes.update({f"grad_d{k}": shapes[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")})
    out = dict(raw)
    for key, shape in shapes.items():
        if key in raw:
            wide = key in ("y", "h_last") or key.startswith("grad_")
            out[key] = np.asarray(raw[key], dtype=np.float64 if wide else dt).reshape(shape)
    if "cu_seqlens" in raw:
        out["cu_seqlens"] = np.asarray(raw["cu_seqlens"], dtype=np.int64)
    return out
