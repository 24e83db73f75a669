"""Golden vectors: small TOML files of inputs and oracle outputs, shared by both test suites.

``python -m scanweaver.tools.golden [--out DIR] [--check]`` writes (or, with
``--check``, verifies) one file per case under ``test/golden``, the Mamba-1
cases of :mod:`.golden_mamba` under ``test/golden/mamba`` and the matrix-state
cases of :mod:`.golden_matrix` under ``test/golden/matrix``.  Expected values
come from the float64 sequential oracle (:func:`scanweaver.targets.reference.oracle`).

Reproducible on any machine: the inputs are non-uniform random draws from a
grid of multiples of ``2**-GRID_BITS`` made with integer arithmetic only (a
seeded generator's integers, sums, square roots and power-of-two scaling, all
exact or correctly rounded in IEEE arithmetic), so every CPU writes the same
inputs, and they are exact values of float16, float32 and float64.  The oracle's
outputs may differ in the last bits between machines (summation order and fused
multiply-adds of NumPy's linear algebra vary with the SIMD path), so ``--check``
compares the inputs exactly and the outputs within :data:`OUTPUT_RTOL`.

Schema of each file (flat arrays are in C order of the Python shape, which is
Julia's column-major order of the reversed shape)::

    name = "basic_f64"           # the case
    kind = "dense"               # optional: "diagonal" (the default when absent) or "dense"
    dtype = "float64"            # "float16", "float32" or "float64"; the inputs are exact values of it
    shape = [B, D, L]            # Python layout (..., L); Julia's (L, D, B)
    state_size = k               # dense only: the state is a vector of k components
    reverse = false
    return_state = true
    rtol = 0.002                 # optional: tolerance of a backend's result, elementwise
    atol = 0.002                 #   |got - y| <= atol + rtol * |y|; readers default by dtype
    cu_seqlens = [0, 7, ..., L]  # optional: packed sequences along L; `reset` holds the same
                                 # segments as a mask (see scanweaver.arrays.seqlens_reset)
    a = [...]  b = [...]  x = [...]
    c = [...]                    # optional: y = c * h, else y = h
    h0 = [...]                   # optional, shape [B, D] ([B, D, k] when dense)
    reset = [0, 1, ...]          # optional 0/1 flags, shape [B, D, L]
    y = [...]                    # expected, shape [B, D, L]
    h_last = [...]               # expected final state, shape [B, D] ([B, D, k] when dense)

Dense files hold h_t = A_t h_{t-1} + b_t x_t, y_t = c_t . h_t with ``a`` of
shape ``[B, D, L, k, k]``: ``a[b, d, t, r, j]`` is row ``r``, column ``j`` of
``A_t``, so each run of k*k values is one matrix in row-major order.  Julia
reads that run column-major, which is the transpose: build the matrix as
``transpose(SMatrix{k, k}(run))``.  ``b`` and ``c`` have shape ``[B, D, L, k]``.
In Python the scan is :func:`dense_recurrence` with operands
``a00 .. a{k-1}{k-1}, b0 .. b{k-1}, x, c0 .. c{k-1}`` (see :func:`dense_operands`).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Where the files live in a source checkout.
DEFAULT_DIR = Path(__file__).resolve().parents[3] / "test" / "golden"
SEED = 20240611
#: Inputs are multiples of ``2**-GRID_BITS`` below 8 in magnitude: at most 11 significant bits, exact in float16.
GRID_BITS = 8
#: Relative tolerance (of max(1, max|y|)) between two machines' float64 oracle outputs for the same inputs.
OUTPUT_RTOL = 1e-12
#: Block boundaries the reset case straddles: blocks of 64, 128 and 256 elements.
RESET_POSITIONS = (63, 64, 127, 128, 255, 256)
#: ``(rtol, atol)`` written into files whose dtype needs its own tolerance: float16 results are
#: rounded to float16 (relative 2**-11) after float32 accumulation.
TOLERANCE = {"float16": (2e-3, 2e-3)}


@dataclass(frozen=True)
class Case:
    """One golden case: its shape, dtype and which features it exercises.

    Attributes:
        state_size: k > 1 makes a dense case (k x k transitions).
        form: how dense transitions are drawn: ``companion`` (a second-order filter) or ``random``.
        cu_seqlens: offsets of packed sequences along L (a varlen case), or empty.
    """

    name: str
    shape: tuple[int, int, int]
    dtype: str = "float64"
    with_c: bool = True
    with_h0: bool = False
    reverse: bool = False
    reset: str = ""
    return_state: bool = True
    state_size: int = 1
    form: str = "random"
    cu_seqlens: tuple[int, ...] = ()


CASES = (
    Case("basic_f64", (2, 3, 37)),
    Case("basic_f32", (2, 3, 37), dtype="float32"),
    Case("no_c_f64", (1, 2, 33), with_c=False),
    Case("h0_f64", (2, 2, 29), with_h0=True),
    Case("reverse_f32", (1, 3, 41), dtype="float32", with_h0=True, reverse=True),
    Case("reset_blocks_f64", (1, 1, 300), with_c=False, with_h0=True, reset="blocks"),
    Case("reverse_reset_f64", (1, 2, 50), with_h0=True, reverse=True, reset="random"),
    Case("length1_f32", (3, 4, 1), dtype="float32", with_h0=True),
    Case("odd257_one_lane_f32", (1, 1, 257), dtype="float32"),
    Case("many_lanes_f64", (4, 8, 9), with_h0=True),
    Case("h0_f16", (2, 3, 45), dtype="float16", with_h0=True),
    Case("reverse_f16", (1, 2, 70), dtype="float16", with_h0=True, reverse=True),
    Case("varlen_f64", (2, 2, 61), with_c=False, with_h0=True, cu_seqlens=(0, 7, 8, 30, 61)),
    Case("varlen_reverse_f64", (1, 3, 50), with_h0=True, reverse=True, cu_seqlens=(0, 1, 19, 20, 50)),
    Case("dense2_companion_f64", (2, 2, 37), with_h0=True, reset="random", state_size=2, form="companion"),
    Case("dense2_reverse_f32", (1, 3, 45), dtype="float32", with_h0=True, reverse=True, reset="random",
         state_size=2),
    Case("dense3_reverse_f64", (1, 3, 29), with_h0=True, reverse=True, reset="random", state_size=3),
    Case("dense3_length1_f64", (2, 2, 1), with_h0=True, reverse=True, reset="random", state_size=3),
)


@functools.cache
def dense_recurrence(k: int):
    """The dense scan of state size ``k``: ``h_t = A_t h_{t-1} + b_t x_t``, ``y_t = c_t . h_t``.

    Operands, in call order: ``a{r}{j}`` (row r, column j of A_t) for r, j < k,
    then ``b0 .. b{k-1}``, ``x``, ``c0 .. c{k-1}``, each of layout ``(..., L)``.

    Example:
        >>> import numpy as np
        >>> rec = dense_recurrence(2)
        >>> rec.inputs[:5]
        ('a00', 'a01', 'a10', 'a11', 'b0')
        >>> ops = dict(a00=0.5, a01=0.0, a10=1.0, a11=0.0, b0=1.0, b1=0.0, x=1.0, c0=0.0, c1=1.0)
        >>> rec(**{n: np.full((1, 3), v) for n, v in ops.items()}, backend="numpy").tolist()
        [[0.0, 1.0, 1.5]]
    """
    from ..api import Recurrence

    names = ([f"a{r}{j}" for r in range(k) for j in range(k)] + [f"b{r}" for r in range(k)] + ["x"]
             + [f"c{r}" for r in range(k)])

    def step(h, *ops):
        A = np.array(ops[:k * k], dtype=object).reshape(k, k)
        b, x, c = ops[k * k:k * k + k], ops[k * k + k], ops[k * k + k + 1:]
        hn = A @ h + np.array([bj * x for bj in b], dtype=object)
        return hn, sum(cj * hj for cj, hj in zip(c, hn, strict=True))

    param = inspect.Parameter
    step.__signature__ = inspect.Signature(
        [param(n, param.POSITIONAL_OR_KEYWORD) for n in ("h", *names)])
    return Recurrence(step, name=f"dense{k}", broadcast=False, state_size=k)


def dense_operands(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The operands of :func:`dense_recurrence` from ``a (..., L, k, k)``, ``b, c (..., L, k)``, ``x (..., L)``."""
    a, b, c = inputs["a"], inputs["b"], inputs["c"]
    k = b.shape[-1]
    out = {f"a{r}{j}": a[..., r, j] for r in range(k) for j in range(k)}
    out.update({f"b{r}": b[..., r] for r in range(k)})
    out["x"] = inputs["x"]
    out.update({f"c{r}": c[..., r] for r in range(k)})
    return out


def grid(rng: np.random.Generator, lo: float, hi: float, shape) -> np.ndarray:
    """Uniform draws from the multiples of ``2**-GRID_BITS`` in ``[lo, hi]``, the same on every machine.

    ``lo`` and ``hi`` may be arrays (broadcast against ``shape``); they are rounded to the grid.

    Example:
        >>> v = grid(np.random.default_rng(0), -1.0, 1.0, 1000)
        >>> bool((v * 2 ** GRID_BITS == np.round(v * 2 ** GRID_BITS)).all()), float(v.min()) >= -1.0
        (True, True)
    """
    scale = 2 ** GRID_BITS
    lo_i, hi_i = np.ceil(np.multiply(lo, scale)), np.floor(np.multiply(hi, scale))
    return rng.integers(lo_i.astype(np.int64), hi_i.astype(np.int64), size=shape, endpoint=True) / scale


def contraction(m: np.ndarray, bound: float = 0.95) -> np.ndarray:
    """Integer matrices ``m (..., k, k)`` scaled by powers of two to an infinity norm in ``(bound/2, bound]``.

    Each matrix is divided by the smallest power of two that brings its largest absolute row
    sum under ``bound`` (an exact scaling), so ``h -> A h`` is a contraction and the scan stays bounded.

    Example:
        >>> contraction(np.array([[3, -1], [0, 2]])).tolist()
        [[0.375, -0.125], [0.0, 0.25]]
    """
    rowsum = np.maximum(np.abs(m).sum(axis=-1).max(axis=-1), 1).astype(np.float64)
    scale = np.ones_like(rowsum)
    while (too_big := rowsum > bound * scale).any():
        scale = np.where(too_big, 2 * scale, scale)
    return m / scale[..., None, None]


def _dense_transitions(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` of a dense case: stable k x k matrices and input vectors, on the grid."""
    k, lead = case.state_size, case.shape
    if case.form == "companion":
        r2 = grid(rng, 0.36, 0.9, lead)
        root = np.sqrt(r2)
        a = np.zeros((*lead, 2, 2))
        a[..., 0, 0] = grid(rng, 0.72 * root, 1.98 * root, lead)
        a[..., 0, 1], a[..., 1, 0] = -r2, 1.0
        b = np.zeros((*lead, 2))
        b[..., 0] = grid(rng, -2.0, 2.0, lead)
        return a, b
    return contraction(rng.integers(-16, 16, (*lead, k, k), endpoint=True)), grid(rng, -2.0, 2.0, (*lead, k))


def make_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Non-uniform random operands for ``case``: grid values, exact in its dtype and on every machine."""
    from ..arrays import seqlens_reset

    B, D, L = case.shape
    k = case.state_size
    dt = np.dtype(case.dtype)
    if k == 1:
        out = {"a": grid(rng, 0.55, 0.996, (B, D, L)), "b": grid(rng, -2.0, 2.0, (B, D, L))}
    else:
        out = dict(zip(("a", "b"), _dense_transitions(case, rng), strict=True))
    out["x"] = grid(rng, -3.5, 4.5, (B, D, L))
    vec = () if k == 1 else (k,)
    if case.with_c:
        out["c"] = grid(rng, -3.0, 3.0, (B, D, L, *vec))
    if case.with_h0:
        out["h0"] = grid(rng, -6.0, 6.0, (B, D, *vec))
    out = {key: v.astype(dt) for key, v in out.items()}
    if case.reset == "blocks":
        r = np.zeros((B, D, L), np.int64)
        r[..., list(RESET_POSITIONS)] = 1
        r |= (rng.integers(0, 50, (B, D, L)) == 0).astype(np.int64)
        out["reset"] = r
    elif case.reset == "random":
        out["reset"] = (rng.integers(0, 10, (B, D, L)) == 0).astype(np.int64)
    elif case.cu_seqlens:
        mask = seqlens_reset("golden", np.asarray(case.cu_seqlens), L, case.reverse)
        out["reset"] = np.broadcast_to(mask, (B, D, L)).astype(np.int64)
    return out


def expected(case: Case, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(y, h_last)`` from the float64 oracle, shaped ``(B, D, L)`` and ``(B, D)`` (``(B, D, k)`` dense)."""
    from ..api import SELECTIVE, SELECTIVE_NO_C
    from ..ir.stages import Features
    from ..targets.reference import oracle

    B, D, L = case.shape
    k = case.state_size
    features = Features(reverse=case.reverse, has_h0=case.with_h0, has_reset="reset" in inputs,
                        return_state=case.return_state)
    if k > 1:
        rec, operands = dense_recurrence(k), dense_operands(inputs)
    else:
        rec = SELECTIVE if case.with_c else SELECTIVE_NO_C
        operands = {n: inputs[n] for n in rec.inputs}
    ir = rec.lower(backend="numpy", schedule="sequential", dtype="float64", features=features).affine
    ops = {n: v.reshape(B * D, L).astype(np.float64) for n, v in operands.items()}
    state = (B * D,) if k == 1 else (B * D, k)
    h0 = inputs["h0"].reshape(state).astype(np.float64) if case.with_h0 else None
    reset = inputs["reset"].reshape(B * D, L) if "reset" in inputs else None
    y, h_last = oracle(ir, ops, h0, reset)
    return y.reshape(B, D, L), h_last.reshape((B, D) if k == 1 else (B, D, k))


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, float):
        return repr(v)
    return "[" + ", ".join(_toml_value(e) for e in v) + "]"


def _flat(arr: np.ndarray) -> list:
    if arr.dtype.kind in "iub":
        return [int(e) for e in arr.ravel()]
    return [float(e) for e in arr.ravel()]


def _header(case: Case) -> dict:
    """The scalar fields of ``case``'s file, in file order (diagonal files carry no kind)."""
    fields: dict = {"name": case.name}
    if case.state_size > 1:
        fields["kind"] = "dense"
    fields.update(dtype=case.dtype, shape=list(case.shape))
    if case.state_size > 1:
        fields["state_size"] = case.state_size
    fields.update(reverse=case.reverse, return_state=case.return_state)
    if case.dtype in TOLERANCE:
        fields["rtol"], fields["atol"] = TOLERANCE[case.dtype]
    if case.cu_seqlens:
        fields["cu_seqlens"] = list(case.cu_seqlens)
    return fields


def render(case: Case) -> str:
    """The TOML text of ``case`` (deterministic)."""
    rng = np.random.default_rng([SEED, CASES.index(case)])
    inputs = make_inputs(case, rng)
    y, h_last = expected(case, inputs)
    lines = [f"{k} = {_toml_value(v)}" for k, v in _header(case).items()]
    for key in ("a", "b", "x", "c", "h0", "reset"):
        if key in inputs:
            lines.append(f"{key} = {_toml_value(_flat(inputs[key]))}")
    lines.append(f"y = {_toml_value(_flat(y))}")
    lines.append(f"h_last = {_toml_value(_flat(h_last))}")
    return "# Generated by `python -m scanweaver.tools.golden`; do not edit.\n" + "\n".join(lines) + "\n"


def load(path: str | Path) -> dict:
    """A golden file as a dict of NumPy arrays in their shapes (Python layout).

    Adds ``kind`` (``"diagonal"`` when the file has none) and ``state_size``
    (1 for diagonal files); ``cu_seqlens`` becomes an int64 array.
    """
    import tomllib

    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    B, D, L = raw["shape"]
    dt = np.dtype(raw["dtype"])
    out = dict(raw)
    out.setdefault("kind", "diagonal")
    k = out.setdefault("state_size", 1)
    vec = () if k == 1 else (k,)
    shapes = {"a": (B, D, L, *vec, *vec), "b": (B, D, L, *vec), "x": (B, D, L), "c": (B, D, L, *vec),
              "y": (B, D, L), "h0": (B, D, *vec), "h_last": (B, D, *vec)}
    for key, shape in shapes.items():
        if key in raw:
            out[key] = np.asarray(raw[key], dtype=np.float64 if key in ("y", "h_last") else dt).reshape(shape)
    if "reset" in raw:
        out["reset"] = np.asarray(raw["reset"], dtype=bool).reshape(B, D, L)
    if "cu_seqlens" in raw:
        out["cu_seqlens"] = np.asarray(raw["cu_seqlens"], dtype=np.int64)
    return out


def differences(path: str | Path, text: str) -> list[str]:
    """How the golden file at ``path`` differs from freshly rendered ``text`` (empty when it matches).

    Header fields and inputs must be equal; the expected outputs ``y``, ``h_last`` and gradients
    ``grad_*`` may differ by :data:`OUTPUT_RTOL` of ``max(1, max|y|)`` (of ``max|grad|`` for a gradient),
    the rounding of the float64 oracle on another machine.

    Example:
        >>> case = CASES[0]
        >>> differences(DEFAULT_DIR / f"{case.name}.toml", render(case))
        []
    """
    import tomllib

    if not Path(path).is_file():
        return ["missing"]
    with open(path, "rb") as fh:
        have = tomllib.load(fh)
    want = tomllib.loads(text)
    if set(have) != set(want):
        return [f"fields {sorted(set(have) ^ set(want))} differ"]
    scale = max(1.0, float(np.abs(np.asarray(want["y"], np.float64)).max(initial=0.0)))
    out = []
    for key, value in want.items():
        if key in ("y", "h_last") or key.startswith("grad_"):
            got, exp = np.asarray(have[key], np.float64), np.asarray(value, np.float64)
            size = max(1.0, float(np.abs(exp).max(initial=0.0))) if key.startswith("grad_") else scale
            if got.shape != exp.shape or not np.allclose(got, exp, rtol=OUTPUT_RTOL, atol=OUTPUT_RTOL * size):
                err = float(np.abs(got - exp).max()) if got.shape == exp.shape else float("inf")
                out.append(f"{key} differs by up to {err:.3g} (tolerance {OUTPUT_RTOL:g} of {size:.3g})")
        elif have[key] != value:
            out.append(f"{key} differs")
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: write the golden files, or check that they match the oracle."""
    parser = argparse.ArgumentParser(prog="python -m scanweaver.tools.golden", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"directory (default {DEFAULT_DIR})")
    parser.add_argument("--check", action="store_true",
                        help="verify the files instead of writing them (inputs exactly, outputs within OUTPUT_RTOL)")
    args = parser.parse_args(argv)
    from .golden_mamba import files as mamba_files
    from .golden_matrix import files as matrix_files

    stale = []
    written = [(args.out / f"{case.name}.toml", render(case)) for case in CASES] + mamba_files(args.out) \
        + matrix_files(args.out)
    for path, text in written:
        if args.check:
            stale += [f"{path}: {why}" for why in differences(path, text)]
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("golden files differ from the oracle (regenerate with `python -m scanweaver.tools.golden`):\n  "
              + "\n  ".join(stale), file=sys.stderr)
        return 1
    print(f"{len(written)} golden files {'match the oracle' if args.check else 'written'} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
