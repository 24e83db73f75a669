"""``scanweaver ir``: print every lowering stage, like MLIR's print-after-all."""

from __future__ import annotations

import argparse

from . import command

RECURRENCES = ("selective", "selective_h")
#: Matrix-state examples (stages matrix_scan and matrix_state): step source per name.
MATRIX = ("gla", "mamba2", "rwkv6")


def _matrix(name: str):
    """The example matrix-state recurrence ``name`` (the README's steps)."""
    import numpy as np

    from ..api import recurrence

    def gla(S, q, k, v, g):
        S = np.exp(g)[:, None] * S + k[:, None] * v[None, :]
        return S, q @ S

    def mamba2(S, x, dt, A, B, C):
        S = np.exp(dt * A) * S + np.outer(dt * x, B)
        return S, S @ C

    def rwkv6(S, r, k, v, w, u):
        return np.exp(w)[:, None] * S + np.outer(k, v), r @ (S + np.outer(u * k, v))

    steps = {"gla": (gla, ("K", "V"), "qkvg"), "mamba2": (mamba2, ("P", "N"), "xBC"),
             "rwkv6": (rwkv6, ("K", "V"), "rkvwu")}
    step, shape, vectors = steps[name]
    return recurrence(step, state_shape=shape).traced(frozenset(vectors))[0]


def _param(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--param must look like name=value, got {text!r}")
    return key, int(value) if value.lstrip("-").isdigit() else value


def target_backend(target: str) -> str:
    """The backend whose emitter renders ``target``."""
    from ..runtime import REGISTRY

    for name, cls in REGISTRY.items():
        if cls.target == target:
            return name
    known = sorted({c.target for c in REGISTRY.values()})
    raise argparse.ArgumentTypeError(f"--target {target!r} is unknown; known targets: {', '.join(known)}")


@command("ir", help="print the stages scan -> affine_scan -> assoc_scan -> schedule -> kernel (or mlir)")
class IR:
    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--schedule", default="auto", help="schedule name (default: the target's default)")
        p.add_argument("--target", default="c", help="numpy, c, opencl, cuda or mlir (default c)")
        p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
        p.add_argument("--recurrence", choices=RECURRENCES + MATRIX, default="selective",
                       help="selective: y = c*h; selective_h: y = h; gla, mamba2, rwkv6: matrix-state steps "
                            "(stages matrix_scan and matrix_state)")
        p.add_argument("--param", type=_param, action="append", default=[],
                       help="a tunable as name=value, e.g. --param chunk=1024 (repeatable)")
        p.add_argument("--stage", default=None, help="print only this stage")
        p.add_argument("--mlir", action="store_true",
                       help="print only the MLIR module (stage mlir of the iree backend; same as --target mlir "
                            "--stage mlir)")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        from ..api import SELECTIVE, SELECTIVE_NO_C

        if args.mlir:
            args.target, args.stage = "mlir", "mlir"
        try:
            backend = target_backend(args.target)
        except argparse.ArgumentTypeError as exc:
            print(f"scanweaver ir: error: {exc}")
            return 2
        if args.recurrence in MATRIX:
            ir = _matrix(args.recurrence)
            print(ir.text().get(args.stage, ir))
            return 0
        rec = SELECTIVE if args.recurrence == "selective" else SELECTIVE_NO_C
        stages = rec.lower(backend=backend, schedule=args.schedule, dtype=args.dtype, **dict(args.param))
        if args.stage:
            text = stages.text()
            if args.stage not in text:
                print(f"scanweaver ir: error: --stage {args.stage!r} is not one of {', '.join(text)}")
                return 2
            print(text[args.stage])
        else:
            print(stages)
        return 0
