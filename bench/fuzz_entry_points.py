"""Every public entry point against odd inputs and tunables: right answer, clear error, or defect.

Entry points: the plain call (``scanweaver.selective_scan`` and a custom
recurrence), a repeated call (served by its call plan), an explicit
``scanweaver.plan``, ``scanweaver.mamba_selective_scan``, the
``scanweaver.torch`` and ``scanweaver.jax`` wrappers and ``scanweaver.dask``
(each where its framework is installed).  Each case is judged against a
float64 loop oracle:

* ``right``: the result matches the oracle (NaN where the oracle has NaN);
* ``error``: a :class:`scanweaver.ScanWeaverError` (``ScanInputError`` ...) with a
  message naming the API, for inputs that are wrong;
* ``defect``: anything else: a wrong answer, an answer where an error was due, a
  bare ``TypeError``/``KeyError``/``RuntimeError``, a compile error.

A crash or hang of the interpreter ends the script; the test that runs it
(``test/test_fuzz.py``) runs it in a subprocess with a timeout.

Usage:
    python bench/fuzz_entry_points.py [--quick] [--backends numpy,cpu,opencl] [--json results.json]

Prints one line per case and a summary; exits 1 when any case is a defect.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

import scanweaver  # noqa: E402
from scanweaver.errors import CompileError, ScanWeaverError, VerificationError  # noqa: E402

WRONG = "error"  # a case whose inputs are wrong: only a clear error is right


@dataclass
class Case:
    """One call: ``kind`` is ``scan`` or ``mamba``; ``want`` is the oracle's output or :data:`WRONG`."""

    name: str
    kind: str
    ops: tuple
    kwargs: dict
    want: object
    rtol: float = 1e-4


# -- oracles -------------------------------------------------------------------------------------------------------


def scan_oracle(a, b, x, c=None, h0=None, reset=None, reverse=False, return_state=False):
    """h_t = a_t h_{t-1} + b_t x_t, y_t = c_t h_t, in float64 with NumPy broadcasting."""
    arrs = [np.asarray(v, np.float64) for v in (a, b, x) + (() if c is None else (c,))]
    shape = np.broadcast_shapes(*(v.shape for v in arrs))
    a, b, x = (np.broadcast_to(v, shape) for v in arrs[:3])
    c = None if c is None else np.broadcast_to(arrs[3], shape)
    h = np.zeros(shape[:-1]) if h0 is None else np.asarray(h0, np.float64).copy()
    y = np.empty(shape)
    order = range(shape[-1] - 1, -1, -1) if reverse else range(shape[-1])
    with np.errstate(all="ignore"):
        for t in order:
            at = a[..., t] if reset is None else np.where(np.asarray(reset)[..., t], 0.0, a[..., t])
            h = at * h + b[..., t] * x[..., t]
            y[..., t] = h if c is None else c[..., t] * h
    return (y, h) if return_state else y


def mamba_oracle(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Mamba-1's selective_scan_ref in float64 (B and C of shape (batch, N, L))."""
    u, delta, A, B, C = (np.asarray(v, np.float64) for v in (u, delta, A, B, C))
    if delta_bias is not None:
        delta = delta + np.asarray(delta_bias, np.float64)[:, None]
    if delta_softplus:
        delta = np.logaddexp(0.0, delta)
    bsz, d, L = u.shape
    h = np.zeros((bsz, d, A.shape[1]))
    y = np.empty((bsz, d, L))
    for t in range(L):
        h = np.exp(delta[:, :, t, None] * A) * h + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        y[:, :, t] = np.einsum("bdn,bn->bd", h, C[:, :, t])
    if D is not None:
        y = y + np.asarray(D, np.float64)[:, None] * u
    if z is not None:
        zz = np.asarray(z, np.float64)
        y = y * zz / (1 + np.exp(-zz))
    return y


# -- cases ---------------------------------------------------------------------------------------------------------


def scan_cases(rng) -> list[Case]:
    def ops(shape, dtype=np.float32):
        a = rng.uniform(0.5, 1.0, shape).astype(dtype)
        return (a, *(rng.standard_normal(shape).astype(dtype) for _ in range(3)))

    def case(name, operands, want=None, rtol=1e-4, **kw):
        want = scan_oracle(*operands, **{k: v for k, v in kw.items() if k in ("h0", "reset", "reverse",
                                                                               "return_state")}) \
            if want is None else want
        return Case(name, "scan", tuple(operands), kw, want, rtol)

    base = ops((3, 37))
    out = []
    out.append(case("float32 (3, 37)", base))
    out.append(case("float64 (2, 50)", ops((2, 50), np.float64), rtol=1e-9))
    out.append(case("L = 1", ops((4, 1))))
    out.append(case("one lane, 1-D (129,)", ops((129,))))
    out.append(case("batch dims (2, 3, 17)", ops((2, 3, 17))))
    out.append(case("empty L (3, 0)", ops((3, 0))))
    out.append(case("no lanes (0, 8)", ops((0, 8))))
    nan = [v.copy() for v in base]
    nan[1][0, 5], nan[2][1, 7], nan[0][2, 3] = np.nan, np.inf, -np.inf
    out.append(case("NaN and Inf values", nan))
    out.append(case("float16 operands", [v.astype(np.float16) for v in base], rtol=2e-2,
                    want=scan_oracle(*[v.astype(np.float16) for v in base])))
    out.append(case("big-endian >f4", [v.astype(">f4") for v in base]))
    out.append(case("big-endian >f8", [v.astype(">f8") for v in base]))
    out.append(case("strided views", [np.repeat(v, 2, axis=1)[:, ::2] for v in base]))
    raw = [np.frombuffer(b"\0" + v.tobytes(), np.float32, v.size, 1).reshape(v.shape) for v in base]
    out.append(case("misaligned buffers", raw))
    out.append(case("Python lists", [v.tolist() for v in base]))
    out.append(case("mixed float32/float64", [base[0], base[1].astype(np.float64), base[2], base[3]]))
    h0 = rng.standard_normal(3).astype(np.float32)
    out.append(case("h0", base, h0=h0))
    out.append(case("reset (bool)", base, reset=rng.random((3, 37)) < 0.2))
    out.append(case("reset (int 0/1)", base, reset=(rng.random((3, 37)) < 0.2).astype(np.int8)))
    out.append(case("reverse, return_state", base, reverse=True, return_state=True))
    out.append(case("h0 and reset and reverse", base, h0=h0, reset=rng.random((3, 37)) < 0.3, reverse=True))
    # wrong inputs: a clear error is the only right answer
    wrong = [
        ("shapes differ", (base[0], base[1][:, :10], base[2], base[3]), {}),
        ("int64 operand", (base[0], np.ones((3, 37), np.int64), base[2], base[3]), {}),
        ("string operand", (base[0], "abc", base[2], base[3]), {}),
        ("object array", (base[0], np.array([[object()] * 37] * 3), base[2], base[3]), {}),
        ("0-d operands", tuple(np.float32(0.5) for _ in range(4)), {}),
        ("None operand", (base[0], None, base[2], base[3]), {}),
        ("h0 wrong shape", base, {"h0": np.zeros(4, np.float32)}),
        ("h0 of strings", base, {"h0": np.array(["x"] * 3)}),
        ("reset wrong shape", base, {"reset": np.zeros((3, 36), bool)}),
        ("reset of floats", base, {"reset": np.zeros((3, 37), np.float32)}),
        ("out is an operand", base, {"out": base[2]}),
        ("out overlaps h0", base, {"out": "h0-alias"}),
        ("out read-only", base, {"out": "read-only"}),
        ("out wrong dtype", base, {"out": np.empty((3, 37), np.float64)}),
        ("unknown backend", base, {"backend": "no-such-backend"}),
        ("unknown schedule", base, {"schedule": "no-such-schedule"}),
        ("config not a dict", base, {"config": 42}),
        ("unknown tunable", base, {"chonk": 4}),
    ]
    for value in (0, -1, "abc", 1.5, True, None, [64], 2**64, 2**64 + 1):
        wrong.append((f"chunk={value!r}", base, {"schedule": "chunked", "chunk": value}))
    for value in (-1, 100_000, 2**63):
        wrong.append((f"threads={value!r}", base, {"threads": value}))
    for name, operands, kw in wrong:
        out.append(Case(name, "scan", tuple(operands), kw, WRONG))
    return out


def mamba_cases(rng) -> list[Case]:
    def ops(b, d, n, L, dtype=np.float32):
        u = rng.standard_normal((b, d, L)).astype(dtype)
        delta = rng.uniform(0.01, 0.5, (b, d, L)).astype(dtype)
        A = -rng.uniform(0.5, 2.0, (d, n)).astype(dtype)
        B, C = (rng.standard_normal((b, n, L)).astype(dtype) for _ in range(2))
        return u, delta, A, B, C

    def case(name, operands, rtol=2e-4, **kw):
        return Case(name, "mamba", tuple(operands), kw, mamba_oracle(*operands, **kw), rtol)

    base = ops(2, 3, 4, 19)
    out = [case("mamba (2, 3, 4, 19)", base), case("mamba N = 1, L = 1", ops(1, 2, 1, 1)),
           case("mamba float64", ops(1, 2, 3, 9, np.float64), rtol=1e-8),
           case("mamba D, z, delta_bias, softplus", base, D=rng.standard_normal(3).astype(np.float32),
                z=rng.standard_normal((2, 3, 19)).astype(np.float32),
                delta_bias=rng.standard_normal(3).astype(np.float32), delta_softplus=True),
           case("mamba big-endian", [v.astype(">f4") for v in base])]
    u, delta, A, B, C = base
    for name, operands in (("mamba A wrong shape", (u, delta, A[:, :2], B, C)),
                           ("mamba B wrong length", (u, delta, A, B[:, :, :5], C)),
                           ("mamba int u", (u.astype(np.int32), delta, A, B, C)),
                           ("mamba string delta", (u, "x", A, B, C))):
        out.append(Case(name, "mamba", operands, {}, WRONG))
    return out


# -- entry points --------------------------------------------------------------------------------------------------


def _resolve_out(kwargs: dict, ops: tuple) -> dict:
    kw = dict(kwargs)
    special = kw.get("out") if isinstance(kw.get("out"), str) else None
    if special == "h0-alias":
        out = np.empty(np.shape(ops[0]), np.float32)
        kw["out"], kw["h0"] = out, out.reshape(-1)[:np.shape(ops[0])[0]]
    elif special == "read-only":
        out = np.empty(np.shape(ops[0]), np.float32)
        out.flags.writeable = False
        kw["out"] = out
    return kw


def numpy_entries(backend: str) -> dict[str, Callable[[Case], object]]:
    def call(c: Case):
        if c.kind == "mamba":
            return scanweaver.mamba_selective_scan(*c.ops, **{"backend": backend, **c.kwargs})
        return scanweaver.selective_scan(*c.ops, **{"backend": backend, **_resolve_out(c.kwargs, c.ops)})

    def repeat(c: Case):
        call(c)
        return call(c)

    def plan(c: Case):
        if c.kind == "mamba":
            return repeat(c)
        kw = _resolve_out(c.kwargs, c.ops)
        special = {k: kw.pop(k) for k in ("h0", "reset", "out") if k in kw}
        shape = np.shape(c.ops[0])
        dtype = getattr(c.ops[0], "dtype", np.float32)
        p = scanweaver.plan(scanweaver.selective_scan, shape, dtype, h0="h0" in special, reset="reset" in special,
                            **{"backend": backend, **kw})
        return p(*c.ops, **special)

    def custom(c: Case):
        if c.kind == "mamba":
            return call(c)
        return CUSTOM(*c.ops, **{"backend": backend, **_resolve_out(c.kwargs, c.ops)})

    return {f"call[{backend}]": call, f"repeat[{backend}]": repeat, f"plan[{backend}]": plan,
            f"recurrence[{backend}]": custom}


def _custom(h, a, b, x, c):
    return a * h + b * x, c * (a * h + b * x)


CUSTOM = scanweaver.recurrence(_custom, name="fuzz_custom")


def _framework_entry(module: str, convert: Callable, back: Callable) -> Callable[[Case], object]:
    def run(c: Case):
        mod = importlib.import_module(f"scanweaver.{module}")
        ops = tuple(convert(v) for v in c.ops)
        kw = {k: convert(v) if k in ("h0", "reset", "D", "z", "delta_bias") else v for k, v in c.kwargs.items()}
        if "out" in kw:
            return WRONG_SKIP
        fn = mod.mamba_selective_scan if c.kind == "mamba" else mod.selective_scan
        got = fn(*ops, **kw)
        return tuple(back(g) for g in got) if isinstance(got, tuple) else back(got)

    return run


#: The entry does not take this argument (e.g. ``out=`` on a framework wrapper): the case is not run there.
WRONG_SKIP = object()


def framework_entries() -> dict[str, Callable[[Case], object]]:
    entries = {}

    def plain(v):
        return isinstance(v, np.ndarray) and v.dtype.kind in "fbi" and v.dtype.isnative

    if importlib.util.find_spec("torch") is not None:
        import torch

        entries["torch"] = _framework_entry(
            "torch", lambda v: torch.from_numpy(np.array(v)) if plain(v) else v,
            lambda t: t.detach().numpy() if isinstance(t, torch.Tensor) else t)
    if importlib.util.find_spec("jax") is not None:
        entries["jax"] = _framework_entry(
            "jax", lambda v: __import__("jax.numpy").numpy.asarray(v) if plain(v) and v.dtype != np.float64 else v,
            lambda t: np.asarray(t))
    if importlib.util.find_spec("dask") is not None:
        def to_dask(v):
            import dask.array as da

            return da.from_array(v, chunks=max(1, v.shape[-1] // 2) if v.ndim else ()) if plain(v) and v.ndim \
                else v

        entries["dask"] = _framework_entry("dask", to_dask, lambda t: np.asarray(t.compute()) if hasattr(
            t, "compute") else np.asarray(t))
    return entries


# -- judging -------------------------------------------------------------------------------------------------------

CLEAR = (ScanWeaverError,)
NOT_CLEAR = (CompileError, VerificationError)


def _clear(exc: BaseException) -> bool:
    """A ScanWeaver error with a message (also when a framework wraps it, as torch's custom ops do)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, NOT_CLEAR):
            return False
        if isinstance(seen, CLEAR) and str(seen).strip():
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _close(got, want, rtol: float) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(
            _close(g, w, rtol) for g, w in zip(got, want, strict=True))
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape:
        return False
    finite = np.isfinite(w)
    # where the oracle is not finite the result must not be either (NaN or +-inf: a parallel schedule
    # reassociates, so inf * 0 may give NaN where the sequential loop gives inf)
    return bool(np.allclose(g[finite], w[finite], rtol=rtol, atol=rtol)) and not np.isfinite(g[~finite]).any()


def judge(entry: Callable[[Case], object], case: Case, lenient: bool = False) -> tuple[str, str]:
    """``(verdict, detail)``: ``right``, ``error`` (clear), ``skip`` or ``defect``.

    ``lenient``: the entry point documents that it refuses some valid inputs with a clear error (a plan takes
    only arrays of its signature; the framework wrappers take only their tensors), so such a refusal counts
    as a clear error; elsewhere refusing a valid input is a defect."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = entry(case)
    except Exception as exc:  # judged below: a clear error or a defect
        if _clear(exc):
            if case.want is WRONG or lenient:
                return "error", str(exc).splitlines()[0][:120]
            return "defect", f"refused valid input: {exc}".splitlines()[0][:160]
        return "defect", "".join(traceback.format_exception_only(type(exc), exc)).strip()[:200]
    if got is WRONG_SKIP:
        return "skip", "argument not taken by this entry point"
    if case.want is WRONG:
        return "defect", "accepted a wrong input without an error"
    if _close(got, case.want, case.rtol):
        return "right", ""
    return "defect", "wrong answer"


#: The valid cases ``--quick`` runs on compiled backends and through the framework wrappers.
QUICK = ("float32 (3, 37)", "L = 1", "one lane, 1-D (129,)", "empty L (3, 0)", "no lanes (0, 8)",
         "NaN and Inf values", "big-endian >f4", "misaligned buffers", "strided views", "Python lists", "h0",
         "mamba (2, 3, 4, 19)", "mamba N = 1, L = 1", "mamba big-endian")

#: Cases a framework wrapper cannot receive as such (their conversion would hide what is tested).
FRAMEWORK_SKIP = ("big-endian", "misaligned", "strided", "Python lists", "float16", "object array",
                  "string", "0-d", "mixed", "int64", "reset of floats", "h0 of strings", "NaN")


def run(backends: list[str], quick: bool) -> list[dict]:
    rng = np.random.default_rng(7)
    cases = scan_cases(rng) + mamba_cases(rng)
    entries: dict[str, Callable[[Case], object]] = {}
    for be in backends:
        entries.update(numpy_entries(be))
    frameworks = framework_entries()
    rows = []
    for name, entry in entries.items():
        for case in cases:
            if quick and not name.endswith("[numpy]") and case.want is not WRONG and case.name not in QUICK:
                continue  # each feature combination and dtype is another kernel to compile
            verdict, detail = judge(entry, case, lenient=name.startswith("plan["))
            rows.append({"entry": name, "case": case.name, "verdict": verdict, "detail": detail})
    for name, entry in frameworks.items():
        for case in cases:
            if any(s in case.name for s in FRAMEWORK_SKIP) or (quick and case.want is WRONG
                                                               and "chunk" in case.name):
                continue
            if quick and case.want is not WRONG and case.name not in QUICK:
                continue
            if name == "jax" and "float64" in case.name:
                continue  # JAX computes in float32 unless jax_enable_x64 is set
            verdict, detail = judge(entry, case, lenient=True)
            rows.append({"entry": name, "case": case.name, "verdict": verdict, "detail": detail})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer compiled configurations (what CI runs)")
    ap.add_argument("--backends", default="numpy,cpu", help="comma-separated backends for the NumPy entry points")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    from scanweaver.runtime.base import REGISTRY

    backends = [b for b in args.backends.split(",") if b and REGISTRY[b].availability().ok]
    rows = run(backends, args.quick)
    for r in rows:
        print(f"{r['verdict']:7} {r['entry']:18} {r['case']:34} {r['detail']}")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("right", "error", "skip", "defect")}
    print(f"fuzz: {counts['right']} right, {counts['error']} clear errors, {counts['skip']} skipped, "
          f"{counts['defect']} defects over {len(rows)} calls (backends {', '.join(backends)})")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": counts, "rows": rows}, indent=1))
    return 1 if counts["defect"] else 0


if __name__ == "__main__":
    sys.exit(main())
