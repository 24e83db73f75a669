"""The jobs of :mod:`scanweaver.tools.crosscheck`: every C kernel the ``cpu`` backend runs, with answers.

* scans: the golden vectors on both schedules, then generated cases for what the golden files do not
  reach (every math function, every output term, scalar and per-lane operands, dense states up to the
  largest, long dense lanes split into tiles of stripes over two threads);
* the fused backward of gradients (:mod:`scanweaver.targets.c_backward`), against the ``numpy``
  backend's backward;
* every part of every fused operation with a C rendering (:mod:`scanweaver.targets.fused`), against the
  operation's NumPy definition, in several vector widths.

Inputs are grid values (:func:`scanweaver.tools.golden.grid`); answers are computed in float64.

Example:
    >>> from scanweaver.tools.crosscheck_jobs import jobs
    >>> js = jobs()
    >>> {j.entry for j in js} >= {"sw_scan", "sw_backward"}, len({j.source for j in js}) > 50
    (True, True)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..arrays import compute_dtype
from ..ir.stages import Features
from ..targets.c_target import MAX_DENSE_STATE
from ..targets.reference import oracle
from . import golden
from .crosscheck import Arg, Job

#: Relative tolerance by compute dtype (of max(1, max|answer|) for the absolute part).
RTOL = {"float32": 2e-4, "float64": 1e-10}


def _recurrences() -> dict:
    """Diagonal recurrences beyond the selective scan: every math function, and every output term."""
    from .. import api, sigmoid, silu, softplus

    def functions(h, p, q, x):
        s = np.abs(q) + 0.5
        a = 0.45 * sigmoid(p) + 0.2 * np.exp(-s) + 0.1 * np.tanh(s) + 0.05 * np.cos(p) * np.sin(q)
        u = (np.log(s) + np.log1p(s) + np.expm1(-s) + np.sqrt(s) + softplus(q) + silu(p) + s ** p
             + np.maximum(p, q) - np.minimum(p, q) + 0.25 * np.sign(p) + np.where(p > q, 0.1, -0.1) * (s >= 1.0)
             + 0.01 * (p < 0) - 0.02 * (q <= 0) + 0.3 * (p == q) + 0.04 * (p != 0.5))
        return a * h + u * x

    def outputs(h, a, b, x, c, d):
        hn = a * h + b * x
        return hn, c * hn + d * h + 0.5 * x

    def biquad(h, b0, b1, b2, a1, a2, x):
        y = b0 * x + h[0]
        return (b1 * x - a1 * y + h[1], b2 * x - a2 * y), y

    def gated(h, p, x):
        g = sigmoid(p)
        return (g * h[0] + 0.1 * h[2] + x, 0.5 * h[0] + np.exp(-np.abs(p)) * h[1], 0.3 * h[1] - 0.2 * h[2]), h[1]

    return {"selective": api.SELECTIVE, "selective_h": api.SELECTIVE_NO_C,
            "functions": api.Recurrence(functions), "outputs": api.Recurrence(outputs),
            "biquad": api.Recurrence(biquad, state_size=2), "gated": api.Recurrence(gated, state_size=3)}


#: Operand values sent for each layout: all of them, one, or one per lane.
SMALL = {"full": lambda v: v, "scalar": lambda v: v[:1, 0], "lane": lambda v: v[:, 0]}


def _job(name, rec, schedule, config, features, dtype, inputs, h0, reset, want=None, rtol=None) -> Job:
    """A scan kernel's call: ``sw_scan(operands..., y, h0, hlast, reset, nlanes, L)``."""
    stages = rec.lower(backend="cpu", schedule=schedule, dtype=dtype, features=features, **config)
    if want is None:
        ir = rec.lower(backend="numpy", schedule="sequential", dtype="float64", features=features).affine
        want = oracle(ir, inputs, h0, reset)
    y, h_last = want
    aff = stages.affine
    args = [Arg.input(SMALL[aff.features.layout(n)](np.asarray(inputs[n])), dtype) for n in aff.inputs]
    lanes, L = y.shape
    args += [Arg.output((lanes, L), dtype), Arg.input(h0, dtype) if h0 is not None else Arg.null(),
             Arg.output(h_last.shape, dtype), Arg.input(reset, np.uint8) if reset is not None else Arg.null(),
             Arg.long(lanes), Arg.long(L)]
    n = len(aff.inputs)
    assert stages.kernel is not None
    return Job(name, stages.kernel, "sw_scan", args, {n: y, n + 2: h_last}, rtol or RTOL[dtype], stages)


#: Configurations of each schedule: (label, tunables).  Tiles of 13 end inside vector blocks;
#: two threads on 3 lanes take the chunked schedule's split layout (one lane's tiles over threads).
CONFIGS = {
    "sequential": (("", {"threads": 1}), ("t2", {"threads": 2})),
    "chunked": (("c13", {"chunk": 13, "threads": 2, "interleave": 1}),
                ("c64i2", {"chunk": 64, "threads": 1, "interleave": 2}),
                ("c8192i4", {"chunk": 8192, "threads": 2, "interleave": 4})),
}


def _golden_jobs() -> list[Job]:
    out = []
    for case in golden.CASES:
        g = golden.load(golden.DEFAULT_DIR / f"{case.name}.toml")
        B, D, L = g["shape"]
        k, lanes = g["state_size"], B * D
        dtype = compute_dtype([np.dtype(g["dtype"])]).name
        if k > 1:
            rec, operands = golden.dense_recurrence(k), golden.dense_operands(g)
        else:
            rec = _recurrences()["selective" if "c" in g else "selective_h"]
            operands = {n: g[n] for n in rec.inputs}
        inputs = {n: v.reshape(lanes, L) for n, v in operands.items()}
        h0 = g["h0"].reshape((lanes,) if k == 1 else (lanes, k)) if "h0" in g else None
        reset = g["reset"].reshape(lanes, L) if "reset" in g else None
        features = Features(reverse=g["reverse"], has_h0=h0 is not None, has_reset=reset is not None,
                            return_state=True)
        want = (g["y"].reshape(lanes, L), g["h_last"].reshape((lanes,) if k == 1 else (lanes, k)))
        rtol = g.get("rtol", RTOL[dtype])
        for schedule, configs in CONFIGS.items():
            for label, config in configs[:2]:
                out.append(_job(f"golden {case.name} {schedule} {label}", rec, schedule, config, features,
                                dtype, inputs, h0, reset, want, rtol))
    return out


def _generated_jobs() -> list[Job]:
    """Kernels the golden files do not reach: math functions, output terms, dense states up to the maximum."""
    out = []
    rng = np.random.default_rng([golden.SEED, 99])
    recs = _recurrences()
    lanes, L = 3, 77
    every = Features(reverse=True, has_h0=True, has_reset=True)
    variants = [(r, f) for r in ("functions", "outputs") for f in (Features(), every)]
    variants += [("functions", Features(reverse=True, operands=(("p", "scalar"),))),
                 ("outputs", Features(has_h0=True, operands=(("a", "lane"), ("d", "scalar"))))]
    for i, (rec_name, feats) in enumerate(variants):
        rec = recs[rec_name]
        dtype = ("float32", "float64")[i % 2]
        inputs = {n: golden.grid(rng, -1.0, 1.0, (lanes, L)) for n in rec.inputs}
        if "a" in inputs:
            inputs["a"] = golden.grid(rng, 0.5, 0.99, (lanes, L))
        inputs = _laid_out(inputs, feats)
        h0 = golden.grid(rng, -2.0, 2.0, lanes) if feats.has_h0 else None
        reset = (rng.integers(0, 8, (lanes, L)) == 0) if feats.has_reset else None
        for schedule, configs in CONFIGS.items():
            for label, config in configs:
                out.append(_job(f"{rec_name} {dtype} {feats} {schedule} {label}", rec, schedule, config, feats,
                                dtype, inputs, h0, reset))
    for k in range(2, MAX_DENSE_STATE + 1):
        dtype = ("float32", "float64")[k % 2]
        case = golden.Case(f"dense{k}", (1, lanes, 45), dtype=dtype, with_h0=k % 2 == 0, reverse=k % 3 == 0,
                           reset="random" if k % 2 else "", state_size=k)
        g = golden.make_inputs(case, rng)
        rec, operands = golden.dense_recurrence(k), golden.dense_operands(g)
        inputs = {n: v.reshape(lanes, -1).astype(np.float64) for n, v in operands.items()}
        h0 = g["h0"].reshape(lanes, k).astype(np.float64) if "h0" in g else None
        reset = g["reset"].reshape(lanes, -1) if "reset" in g else None
        feats = Features(reverse=case.reverse, has_h0=h0 is not None, has_reset=reset is not None)
        for schedule, configs in CONFIGS.items():
            label, config = configs[-1]
            out.append(_job(f"dense{k} {dtype} {schedule} {label}", rec, schedule, config, feats, dtype, inputs,
                            h0, reset))
        if k <= 3:  # a filter: the matrix entries one value for all (scalars), the input gain one per lane
            feats = Features(reverse=case.reverse, has_h0=h0 is not None, has_reset=reset is not None,
                             operands=(*((n, "scalar") for n in rec.inputs if n.startswith("a")), ("b0", "lane")))
            laid = _laid_out(inputs, feats)
            for schedule, configs in CONFIGS.items():
                label, config = configs[0]
                out.append(_job(f"dense{k} filter {dtype} {schedule} {label}", rec, schedule, config, feats, dtype,
                                laid, h0, reset))
    out += _long_dense_jobs(rng, recs)
    return out


def _long_dense_jobs(rng: np.random.Generator, recs: dict) -> list[Job]:
    """Dense lanes long enough for many tiles of stripes: a filter (coefficients per lane, A the same at
    every step) on one lane, its tiles over two threads; a gated 3-state recurrence (functions: the
    element-by-element path) with resets on three lanes."""
    out = []
    cases = (("biquad", 1, 2000, Features(reverse=True, has_h0=True, operands=tuple(
        (n, "lane") for n in ("a1", "a2", "b0", "b1", "b2"))), "float64"),
             ("gated", 3, 700, Features(has_reset=True), "float32"))
    for name, lanes, L, feats, dtype in cases:
        rec = recs[name]
        inputs = {n: golden.grid(rng, -1.0, 1.0, (lanes, L)) for n in rec.inputs}
        if name == "biquad":
            inputs["a1"], inputs["a2"] = golden.grid(rng, -0.9, 0.9, (lanes, L)), golden.grid(rng, 0.1, 0.5, (lanes, L))
        inputs = _laid_out(inputs, feats)
        h0 = golden.grid(rng, -2.0, 2.0, (lanes, rec.state_size)) if feats.has_h0 else None
        reset = (rng.integers(0, 50, (lanes, L)) == 0) if feats.has_reset else None
        config = {"chunk": 13, "threads": 2, "interleave": 1}
        out.append(_job(f"{name} long {dtype} chunked", rec, "chunked", config, feats, dtype, inputs, h0, reset))
    return out


def _laid_out(inputs: dict[str, np.ndarray], feats: Features) -> dict[str, np.ndarray]:
    """``inputs`` with the operands of ``feats.operands`` made constant: one value, or one per lane."""
    out = dict(inputs)
    for name, layout in feats.operands:
        v = inputs[name]
        out[name] = np.broadcast_to(v[:1, :1] if layout == "scalar" else v[:, :1], v.shape).copy()
    return out


def _backward_jobs(rng: np.random.Generator) -> list[Job]:
    """The fused backward kernel: ``sw_backward(operands..., dy, h0, dhlast, reset, states, d_<wrt>..., dh0,
    nlanes, L)`` with saved or recomputed states, against the ``numpy`` backend's backward in float64."""
    from ..passes import lower
    from ..passes.adjoint import adjoint
    from ..runtime import get_backend
    from ..runtime.base import Cotangents, ScanArrays
    from ..targets.c_backward import render_backward

    recs = _recurrences()
    out = []
    lanes, L = 3, 70
    cases = (("selective", "float64", Features(reverse=True, has_h0=True, has_reset=True), True),
             ("functions", "float32", Features(has_reset=True), False),
             ("outputs", "float64", Features(has_h0=True), False))
    for name, dtype, feats, saved in cases:
        rec = recs[name]
        flags = dict(dh0=feats.has_h0, dh_last=feats.has_h0, saved_states=saved)
        adj = adjoint(lower(rec.scan_ir(dtype, feats)).affine, **flags)
        adj64 = adjoint(lower(rec.scan_ir("float64", feats)).affine, **flags)
        inputs = {n: golden.grid(rng, -1.0, 1.0, (lanes, L)) for n in rec.inputs}
        if "a" in inputs:
            inputs["a"] = golden.grid(rng, 0.5, 0.99, (lanes, L))
        h0 = golden.grid(rng, -2.0, 2.0, lanes) if feats.has_h0 else None
        reset = (rng.integers(0, 10, (lanes, L)) == 0).astype(np.uint8) if feats.has_reset else None
        dy, dh_last = golden.grid(rng, -1.0, 1.0, (lanes, L)), golden.grid(rng, -1.0, 1.0, lanes)
        states = None
        if saved:
            hrec = recs["selective_h"]
            ir = hrec.lower(backend="numpy", schedule="sequential", dtype="float64", features=feats).affine
            states = oracle(ir, {n: inputs[n] for n in hrec.inputs}, h0, reset)[0]
        arrays = ScanArrays(inputs=inputs, h0=h0, reset=reset, batch_shape=(lanes,), dtype=np.dtype("float64"))
        cot = Cotangents(dy=dy, grads={n: np.empty((lanes, L)) for n in adj.wrt},
                         dh_last=dh_last if adj.dh_last else None, states=states,
                         dh0=np.empty(lanes) if feats.has_h0 else None)
        get_backend("numpy").backward(adj64, arrays, cot)
        opt = lambda v, t=dtype: Arg.input(v, t) if v is not None else Arg.null()  # noqa: E731
        args = [Arg.input(inputs[n], dtype) for n in rec.inputs]
        args += [Arg.input(dy, dtype), opt(h0), opt(cot.dh_last), opt(reset, np.uint8), opt(states)]
        expected = {len(args) + i: cot.grads[n] for i, n in enumerate(adj.wrt)}
        args += [Arg.output((lanes, L), dtype) for _ in adj.wrt]
        if cot.dh0 is not None:
            expected[len(args)] = cot.dh0
        args += [Arg.output(lanes, dtype) if cot.dh0 is not None else Arg.null(), Arg.long(lanes), Arg.long(L)]
        source = render_backward(adj, threads=2, chunk=16)
        out.append(Job(f"backward {name} {dtype} {feats.text()}", source, "sw_backward", args, expected,
                       1e-9 if dtype == "float64" else 2e-4))
    return out


def _fused_job(name: str, part: str, feats, config: dict, sizes: dict, ranges: dict, rng: np.random.Generator,
               label: str) -> Job:
    """One fused kernel as a job: inputs on a grid (``ranges`` per parameter, packed sequences of two),
    the expected outputs from the operation's float64 NumPy definition."""
    from ..fused import REGISTRY as FUSED
    from ..targets.c_target import CRenderer
    from ..targets.fused import kernel_for

    op, kernel = FUSED.get(name), kernel_for("c", name)
    shapes = op.shapes(part, feats, sizes)
    arrays, args, expected = {}, [], {}
    for p in op.params(part):
        if p.name == "cu_seqlens" and op.enabled(p.name, feats):
            arrays[p.name] = np.array([0, 15, sizes["T"]], np.int64)
        elif p.kind == "in" and op.enabled(p.name, feats):
            lo, hi = ranges.get(p.name, (-1.0, 1.0))
            arrays[p.name] = (golden.grid(rng, lo, hi, shapes[p.name]) if p.dtype != "uint8"
                              else (rng.integers(0, 8, shapes[p.name]) == 0).astype(np.uint8))
        elif p.kind == "out" and op.enabled(p.name, feats):
            arrays[p.name] = np.empty(shapes[p.name])
    op.reference(part, dataclasses.replace(feats, dtype="float64"), arrays, sizes)
    for p in op.params(part):
        if p.kind == "int":
            args.append(Arg.long(sizes[p.name]))
        elif p.name not in arrays:
            args.append(Arg.null())
        elif p.kind == "in":
            args.append(Arg.input(arrays[p.name], p.dtype or feats.dtype))
        else:
            expected[len(args)] = arrays[p.name]
            args.append(Arg.output(shapes[p.name], feats.dtype))
    call = op.call(part, feats, op.resolve("c", {**config, "threads": 2}, {}, "crosscheck"))
    return Job(f"fused {name} {part} {feats.dtype} {label} width {config['width']}",
               kernel.render(CRenderer(), call), kernel.entry(part), args, expected,
               1e-9 if feats.dtype == "float64" else 1e-4)


def _fused_jobs(rng: np.random.Generator) -> list[Job]:
    """Every part of every fused operation rendered for C.

    Mamba-1 with every optional input on and off, B and C per step and fixed, vector widths 4, 8 and 16
    (partial vector blocks of channels); matrix_state's forward algorithms and backward, every decay and
    readout, packed sequences, reverse, groups (Hq < H), widths 4 and 8 with V not a multiple of them;
    delta_rule's forms (delta, dplr), gates, l2 normalisation and grouped value heads, forward and backward.
    """
    from ..fused.delta_rule import DeltaRuleFeatures as D
    from ..fused.mamba1 import Mamba1Features as M
    from ..fused.matrix_state import MatrixStateFeatures as F
    from ..targets.fused import kernel_for

    out: list[Job] = []
    every = dict(has_D=True, has_z=True, has_bias=True, softplus=True, has_h0=True, has_reset=True)
    mamba = {"batch": 2, "dim": 5, "L": 37, "groups_b": 1, "groups_c": 1}
    for part, feats, config in (("forward", M("float64", 3, **every), {"width": 4, "chunk": 16}),
                                ("forward", M("float32", 4, b_fixed=True, c_fixed=True), {"width": 16, "chunk": 32}),
                                ("backward", M("float64", 2, **every, has_dhlast=True), {"width": 8, "chunk": 16}),
                                ("backward", M("float32", 3, b_fixed=True, has_z=True), {"width": 4, "chunk": 16})):
        if kernel_for("c", "mamba1") is not None and part in kernel_for("c", "mamba1").parts:
            out.append(_fused_job("mamba1", part, feats, config, mamba, {"delta": (0.05, 0.5), "A": (-2.0, -0.5),
                                  "delta_bias": (-0.2, 0.2)}, rng, f"N={feats.N}"))
    packed = dict(has_h0=True, has_seqlens=True)
    for part, feats, config in (
            ("forward", F("float64", 5, 6, "key", "bonus", True, **packed), {"width": 4, "block_v": 4}),
            ("forward", F("float32", 8, 12, "scalar", "after", has_h0=True), {"width": 8, "algorithm": "chunked",
                                                                             "chunk": 16}),
            ("forward", F("float64", 6, 5, "key", "after", **packed), {"width": 4, "algorithm": "chunked", "chunk": 8}),
            ("backward", F("float64", 5, 6, "key", "after", True, **packed, has_dhlast=True), {"width": 4}),
            ("backward", F("float32", 8, 12, "scalar", "bonus", has_h0=True), {"width": 8})):
        if kernel_for("c", "matrix_state") is not None:
            sizes = {"batch": 1 if feats.has_seqlens else 2, "T": 37, "H": 4, "Hq": 2, "nseq": 2}
            out.append(_fused_job("matrix_state", part, feats, config, sizes, {"g": (-1.0, -0.05)}, rng,
                                  f"K={feats.K} V={feats.V} {feats.decay} {feats.readout}"))
    for part, feats, config in (
            ("forward", D("float64", 5, 6, **packed, gate="scalar", l2norm=True), {"width": 4}),
            ("forward", D("float32", 8, 12, has_h0=True, gate="key", form="dplr"), {"width": 8}),
            ("backward", D("float64", 5, 6, **packed, has_dhlast=True, gate="key", l2norm=True), {"width": 4}),
            ("backward", D("float64", 4, 9, has_h0=True, has_dhlast=True, form="dplr", gate="scalar"), {"width": 8})):
        if kernel_for("c", "delta_rule") is not None:
            sizes = {"batch": 1 if feats.has_seqlens else 2, "T": 37, "H": 4, "Hq": 2, "nseq": 2}
            out.append(_fused_job("delta_rule", part, feats, config, sizes,
                                  {"g": (-1.0, -0.05), "beta": (0.1, 0.9), "a": (-0.3, 0.3), "b": (-0.3, 0.3)}, rng,
                                  f"K={feats.K} V={feats.V} {feats.form} {feats.gate}"))
    return out


def jobs() -> list[Job]:
    """Every check: the golden vectors on each scan schedule, generated scans, backward and fused kernels."""
    rng = np.random.default_rng([golden.SEED, 7])
    return _golden_jobs() + _generated_jobs() + _backward_jobs(rng) + _fused_jobs(rng)
