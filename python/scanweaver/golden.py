"""Golden vectors: small TOML files of inputs and oracle outputs, shared by both test suites.

``python -m scanweaver.golden [--out DIR] [--check]`` writes (or, with
``--check``, verifies) one file per case under ``test/golden``.  Values come
from the float64 sequential oracle (:func:`scanweaver.targets.reference.oracle`)
on non-uniform random data from a fixed seed, so the files are reproducible.

Schema of each file::

    name = "basic_f64"           # the case
    dtype = "float64"            # or "float32"; the inputs are exact values of this dtype
    shape = [B, D, L]            # Python layout (..., L); flat arrays are in C order,
                                 # which is Julia's column-major (L, D, B)
    reverse = false
    return_state = true
    a = [...]  b = [...]  x = [...]
    c = [...]                    # optional: y = c * h, else y = h
    h0 = [...]                   # optional, shape [B, D]
    reset = [0, 1, ...]          # optional 0/1 flags, shape [B, D, L]
    y = [...]                    # expected, shape [B, D, L]
    h_last = [...]               # expected final state, shape [B, D]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: Where the files live in a source checkout.
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "test" / "golden"
SEED = 20240611
#: Block boundaries the reset case straddles: blocks of 64, 128 and 256 elements.
RESET_POSITIONS = (63, 64, 127, 128, 255, 256)


@dataclass(frozen=True)
class Case:
    """One golden case: its shape, dtype and which features it exercises."""

    name: str
    shape: tuple[int, int, int]
    dtype: str = "float64"
    with_c: bool = True
    with_h0: bool = False
    reverse: bool = False
    reset: str = ""
    return_state: bool = True
    extra: dict = field(default_factory=dict)


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
)


def make_inputs(case: Case, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Non-uniform random operands for ``case`` (exact values of its dtype)."""
    B, D, L = case.shape
    dt = np.dtype(case.dtype)
    out = {
        "a": rng.uniform(0.55, 0.999, (B, D, L)),
        "b": rng.normal(0.0, 1.0, (B, D, L)),
        "x": rng.normal(0.5, 2.0, (B, D, L)),
    }
    if case.with_c:
        out["c"] = rng.normal(0.0, 1.5, (B, D, L))
    if case.with_h0:
        out["h0"] = rng.normal(0.0, 3.0, (B, D))
    out = {k: v.astype(dt) for k, v in out.items()}
    if case.reset == "blocks":
        r = np.zeros((B, D, L), np.int64)
        r[..., list(RESET_POSITIONS)] = 1
        r |= (rng.random((B, D, L)) < 0.02).astype(np.int64)
        out["reset"] = r
    elif case.reset == "random":
        out["reset"] = (rng.random((B, D, L)) < 0.1).astype(np.int64)
    return out


def expected(case: Case, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(y, h_last)`` from the float64 oracle, shaped ``(B, D, L)`` and ``(B, D)``."""
    from .api import SELECTIVE, SELECTIVE_NO_C
    from .ir.stages import Features
    from .targets.reference import oracle

    B, D, L = case.shape
    rec = SELECTIVE if case.with_c else SELECTIVE_NO_C
    features = Features(reverse=case.reverse, has_h0=case.with_h0, has_reset="reset" in inputs,
                        return_state=case.return_state)
    ir = rec.lower(backend="numpy", schedule="sequential", dtype="float64", features=features).affine
    names = ("a", "b", "x", "c") if case.with_c else ("a", "b", "x")
    ops = {n: inputs[n].reshape(B * D, L).astype(np.float64) for n in names}
    h0 = inputs["h0"].reshape(B * D).astype(np.float64) if case.with_h0 else None
    reset = inputs["reset"].reshape(B * D, L) if "reset" in inputs else None
    y, h_last = oracle(ir, ops, h0, reset)
    return y.reshape(B, D, L), h_last.reshape(B, D)


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


def render(case: Case) -> str:
    """The TOML text of ``case`` (deterministic)."""
    rng = np.random.default_rng([SEED, CASES.index(case)])
    inputs = make_inputs(case, rng)
    y, h_last = expected(case, inputs)
    fields = {"name": case.name, "dtype": case.dtype, "shape": list(case.shape), "reverse": case.reverse,
              "return_state": case.return_state}
    lines = [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    for key in ("a", "b", "x", "c", "h0", "reset"):
        if key in inputs:
            lines.append(f"{key} = {_toml_value(_flat(inputs[key]))}")
    lines.append(f"y = {_toml_value(_flat(y))}")
    lines.append(f"h_last = {_toml_value(_flat(h_last))}")
    return "# Generated by `python -m scanweaver.golden`; do not edit.\n" + "\n".join(lines) + "\n"


def load(path: str | Path) -> dict:
    """A golden file as a dict of NumPy arrays in their shapes (Python layout)."""
    import tomllib

    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    B, D, L = raw["shape"]
    dt = np.dtype(raw["dtype"])
    out = dict(raw)
    for key in ("a", "b", "x", "c", "y"):
        if key in raw:
            out[key] = np.asarray(raw[key], dtype=np.float64 if key == "y" else dt).reshape(B, D, L)
    for key in ("h0", "h_last"):
        if key in raw:
            out[key] = np.asarray(raw[key], dtype=np.float64 if key == "h_last" else dt).reshape(B, D)
    if "reset" in raw:
        out["reset"] = np.asarray(raw["reset"], dtype=bool).reshape(B, D, L)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: write the golden files, or check that they match the oracle."""
    parser = argparse.ArgumentParser(prog="python -m scanweaver.golden", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help=f"directory (default {DEFAULT_DIR})")
    parser.add_argument("--check", action="store_true", help="verify the files instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for case in CASES:
        path = args.out / f"{case.name}.toml"
        text = render(case)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("golden files differ from the oracle (regenerate with `python -m scanweaver.golden`):\n  "
              + "\n  ".join(stale), file=sys.stderr)
        return 1
    print(f"{len(CASES)} golden files {'match the oracle' if args.check else 'written'} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
