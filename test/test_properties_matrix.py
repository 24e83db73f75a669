"""Property tests of the matrix-state and delta-rule operations: random problems against float64 loops.

Every example draws one problem for one named operation on one backend: shapes (T = 1, odd, long; q/k heads
dividing v's), a dtype, packed sequences (empty ones among them) or a batch, an initial state or none, reverse
where the operation takes it, and extreme gates: log decays of 0 and -inf, very negative ones, positive ones
whose products stay finite (growing states, one large spike), beta 0 and 2.  The call must return finite values
equal to the float64 loop of the recurrence (``matrix_loops``, ``delta_family``: written from the definitions),
or raise ``ScanInputError`` naming one of its arguments.  On the compiled backends the long run draws the
algorithm too (recurrent, or chunked at 1, 3, 16 or 64 steps), and a second property holds the chunked form's
output, final state and every gradient (float64, through ``scanweaver.torch``) to the recurrent form's.

Compiled backends build one kernel per feature set (dtype, K, V, decay, readout, reverse, h0, packed sequences,
algorithm), so the default run keeps one feature set per operation there and draws the rest (batch, T, heads,
sequences, data, gates).  ``SCANWEAVER_FUZZ_EXAMPLES=N`` runs N examples per operation and backend with every
feature drawn, OpenCL included where a device is present: the long run (``pytest -s`` prints what it refused).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import scanweaver
from scanweaver import ScanInputError
from scanweaver.runtime import REGISTRY
from delta_family import PUBLIC, call_public, loop
from matrix_loops import la_loop, mamba2_loop

#: Examples per operation and backend in the long run (0: the short default run).
LONG = int(os.environ.get("SCANWEAVER_FUZZ_EXAMPLES", "0") or 0)
MATRIX = ("linear_attention", "simple_gla", "retention", "rwkv6", "mamba2_scan")
DELTA = tuple(PUBLIC)
BACKENDS = ("numpy", "cpu", "opencl")
#: Largest error, relative to the largest magnitude of the loop's result, per dtype of the operands.
TOL = {"float64": 1e-8, "float32": 2e-4, "float16": 5e-3, "bfloat16": 3e-2}
#: Largest log growth of any product of decays (e^cap): states stay far inside each dtype's range.
GROWTH = {"float64": 300.0, "float32": 60.0, "float16": 2.0, "bfloat16": 2.0}
GATES = ("decay", "zero", "minus_inf", "growing", "spike", "mixed")
#: The default run: a few examples per operation (more on NumPy, which compiles nothing); the long run draws
#: without shrinking (each shrink step may build a kernel) and goes on past a failure, listing every one.
SETTINGS = {backend: settings(max_examples=LONG or (6 if backend == "numpy" else 3), deadline=None,
                              derandomize=not LONG, database=None, suppress_health_check=list(HealthCheck),
                              phases=(Phase.explicit, Phase.generate) if LONG else tuple(Phase))
            for backend in ("numpy", "cpu", "opencl")}


def _dtypes() -> tuple[str, ...]:
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return ("float64", "float32", "float16")
    return ("float64", "float32", "float16", "bfloat16")


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def need(backend: str) -> None:
    cls = REGISTRY.get(backend, None)
    if cls is None or not cls.availability().ok:
        pytest.skip(f"backend {backend!r} unavailable: {cls.availability().reason if cls else 'not registered'}")
    if backend == "opencl" and not LONG:
        pytest.skip("OpenCL builds one kernel per feature set (slow on PoCL): in the long run only "
                    "(SCANWEAVER_FUZZ_EXAMPLES=N)")


@dataclass
class Problem:
    """One call: ``arrays`` rounded to ``dtype`` (the loop reads the same values in float64)."""

    op: str
    dtype: str
    arrays: dict
    options: dict = field(default_factory=dict)
    tunables: dict = field(default_factory=dict)

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        shapes = {n: (None if a is None else np.shape(a)) for n, a in self.arrays.items()}
        return f"Problem({self.op}, {self.dtype}, {shapes}, {self.options}, {self.tunables})"


def log_gates(rng, shape: tuple, mode: str, cap: float) -> np.ndarray:
    """Log decays of ``shape`` (T on axis 1) in ``mode``; no product over a window grows past e^cap."""
    T = shape[1]
    g = -np.exp(rng.uniform(np.log(1e-3), np.log(4.0), shape))
    if mode == "zero":
        g[:] = 0.0
    elif mode == "minus_inf":
        g[rng.random(shape) < 0.3] = -np.inf
    elif mode == "growing":
        g = rng.uniform(0.0, cap / T, shape)
    elif mode == "spike":
        g[:, rng.integers(T)] = cap
    elif mode == "mixed":
        pick = rng.random(shape)
        g[pick < 0.15] = 0.0
        g[(pick >= 0.15) & (pick < 0.3)] = -np.inf
        g[(pick >= 0.3) & (pick < 0.4)] = -1e4
        g[pick >= 0.9] = cap / T
    return g


def _round(arrays: dict, dtype: str) -> dict:
    """Operands in ``dtype``; states in its accumulation dtype (float32 for the half types)."""
    store, state = _np_dtype(dtype), np.dtype(np.float64 if dtype == "float64" else np.float32)
    return {n: None if a is None else np.asarray(a).astype(state if n == "h0" else store)
            if n != "cu_seqlens" else a for n, a in arrays.items()}


@st.composite
def problems(draw, op: str, backend: str, dtype: str | None = None, cap: float | None = None) -> Problem:
    """One problem of ``op`` for ``backend`` (``dtype``, where given, in place of a drawn one; ``cap``, where
    given, the largest log growth in place of the dtype's)."""
    fixed = backend != "numpy" and not LONG
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = dtype or ("float32" if fixed else draw(st.sampled_from(_dtypes())))
    K = 4 if fixed else draw(st.sampled_from((1, 2, 3, 4, 7, 16)))
    V = 3 if fixed else draw(st.sampled_from((1, 2, 3, 5, 8)))
    T = draw(st.one_of(st.just(1), st.integers(2, 17), st.integers(18, 300 if LONG else 70)))
    H = draw(st.sampled_from((1, 2, 3, 4)))
    same_heads = op in ("mamba2_scan", "rwkv6", "rwkv7")  # (Mamba-2's groups are drawn below)
    Hq = H if same_heads else draw(st.sampled_from([d for d in (1, 2, 3, 4) if H % d == 0]))
    packed = True if fixed else draw(st.booleans())
    cu = None
    if packed:
        cuts = sorted(draw(st.lists(st.integers(0, T), max_size=4)))
        cu, batch = np.array([0, *cuts, T], np.int64), 1
    else:
        batch = draw(st.integers(1, 3))
    nseq = batch if cu is None else len(cu) - 1
    with_h0 = True if fixed else draw(st.booleans())
    mode = draw(st.sampled_from(GATES))
    cap = cap or GROWTH[dtype]
    q, k = rng.standard_normal((batch, T, Hq, K)), rng.standard_normal((batch, T, Hq, K))
    v = rng.standard_normal((batch, T, H, V))
    h0 = rng.standard_normal((nseq, H, K, V)) if with_h0 else None
    p = Problem(op, dtype, {})
    if op in DELTA:
        return _algorithm(draw, _delta(draw, rng, p, q, k, v, h0, cu, mode, cap, fixed), backend, fixed)
    if op == "mamba2_scan":
        return _algorithm(draw, _mamba2(draw, rng, p, v, h0, cu, mode, cap), backend, fixed)
    reverse = op != "rwkv6" and not fixed and draw(st.booleans())
    scale = float(rng.uniform(0.1, 1.5))
    arrays = {"q": q, "k": k, "v": v, "h0": h0, "cu_seqlens": cu}
    if op == "linear_attention":
        arrays["g"] = log_gates(rng, (batch, T, H, K), mode, cap)
    elif op == "rwkv6":
        arrays["g"], arrays["u"] = log_gates(rng, (batch, T, H, K), mode, cap), rng.standard_normal((H, K))
    elif op == "simple_gla":
        if draw(st.booleans()):
            arrays["g_head"] = log_gates(rng, (batch, T, H), mode, cap)
        else:
            arrays["decay"] = np.minimum(log_gates(rng, (1, T, H), mode, cap)[0, 0], cap / T)  # constant per step
    p.arrays, p.options = _round(arrays, dtype), {"scale": scale, "reverse": reverse}
    return _algorithm(draw, p, backend, fixed)


def _algorithm(draw, p: Problem, backend: str, fixed: bool) -> Problem:
    """The algorithm of a compiled backend's call: in the long run drawn for every operation (recurrent or chunked,
    at chunks of 1, 3, 16 or 64 steps); in the default run the chunked form of ``linear_attention`` on ``cpu``."""
    if backend not in ("cpu", "opencl") or not (LONG or (p.op == "linear_attention" and backend == "cpu")):
        return p
    algorithm = "chunked" if fixed else draw(st.sampled_from(("recurrent", "chunked")))
    p.tunables = {"algorithm": algorithm}
    if algorithm == "chunked":
        p.tunables["chunk"] = 16 if fixed else draw(st.sampled_from((1, 3, 16, 64)))
    return p


def _mamba2(draw, rng, p: Problem, x, h0, cu, mode: str, cap: float) -> Problem:
    """Mamba-2's problem: log decays dt * A (A per head), the state (N, H, P, N) transposed from the others'."""
    batch, T, H, P = x.shape
    N = 1 if h0 is None else h0.shape[2]
    N = draw(st.sampled_from((1, 2, 4, 16))) if h0 is None else N
    G = draw(st.sampled_from([d for d in (1, 2, H) if H % d == 0]))
    dt = rng.uniform(0.01, 1.0, (batch, T, H))
    A = {"decay": -rng.uniform(0.5, 4.0, H), "zero": np.zeros(H), "growing": np.full(H, cap / T),
         "minus_inf": np.where(rng.random(H) < 0.5, -np.inf, -1.0), "spike": -rng.uniform(0.5, 4.0, H),
         "mixed": rng.choice([0.0, -1e4, -1.0, cap / T], H)}[mode]
    if mode == "spike":  # one very long step: the state forgets, and takes dt * x at once
        dt[:, rng.integers(T)] = 1e3 if cap > 10 else 8.0
    if mode == "mixed":
        dt[rng.random(dt.shape) < 0.2] = 0.0
    softplus = draw(st.booleans())
    bias = rng.normal(0.0, 0.5, H) if softplus and draw(st.booleans()) else None
    if softplus and mode != "spike":  # raw dt of either sign, then softplus(dt + dt_bias) > 0
        dt = np.where(dt == 0.0, -30.0, rng.normal(0.0, 2.0, dt.shape))
    if softplus:  # growing heads: no product over the sequence past e^cap with the steps softplus makes
        steps = np.logaddexp(0.0, dt + (0.0 if bias is None else bias)).sum(axis=1).max(axis=0)
        A = np.where(A > 0, np.minimum(A, cap / np.maximum(steps, 1e-30)), A)
    p.arrays = _round({"x": x, "dt": dt, "A": A, "B": rng.standard_normal((batch, T, G, N)),
                       "C": rng.standard_normal((batch, T, G, N)),
                       "D": rng.standard_normal(H) if draw(st.booleans()) else None,
                       "z": rng.standard_normal(x.shape) if draw(st.booleans()) else None,
                       "dt_bias": bias,
                       "h0": None if h0 is None else rng.standard_normal((h0.shape[0], H, P, N)), "cu_seqlens": cu},
                      p.dtype)
    p.options = {"softplus": softplus}
    return p


def _delta(draw, rng, p: Problem, q, k, v, h0, cu, mode: str, cap: float, fixed: bool) -> Problem:
    batch, T, H, _ = v.shape
    K = q.shape[3]
    l2norm = p.op != "rwkv7" and not fixed and draw(st.booleans())
    if not l2norm:
        k = k / np.linalg.norm(k, axis=-1, keepdims=True)  # raw keys make the delta rule diverge (docs)
    arrays = {"q": q, "k": k, "v": v, "h0": h0, "cu_seqlens": cu}
    if p.op in ("gated_delta_rule", "kda", "rwkv7"):
        arrays["g"] = log_gates(rng, (batch, T, H, K) if p.op != "gated_delta_rule" else (batch, T, H), mode, cap)
    if p.op == "rwkv7":
        kappa = rng.standard_normal((batch, T, H, K))
        kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
        iclr = rng.choice([0.0, 1.0, 2.0, 0.5], (batch, T, H, 1)) if mode == "mixed" else rng.uniform(
            0.05, 0.95, (batch, T, H, K))
        arrays["a"], arrays["b"] = -kappa, kappa * iclr
    else:
        beta = rng.uniform(0.0, 1.0, (batch, T, H))
        if mode in ("mixed", "spike", "zero"):
            beta[rng.random(beta.shape) < 0.3] = 0.0
            beta[rng.random(beta.shape) < 0.3] = 2.0
        arrays["beta"] = beta
    sigmoid = None  # use_beta_sigmoid_in_kernel: beta = c * sigmoid(raw), c = 2 with allow_neg_eigval
    if p.op in ("gated_delta_rule", "kda") and draw(st.booleans()):
        sigmoid = 2.0 if draw(st.booleans()) else 1.0
        arrays["beta"] = np.where(rng.random(beta.shape) < 0.2, rng.choice([-1e4, 1e4], beta.shape),
                                  rng.normal(0.0, 3.0, beta.shape))
    p.arrays = _round(arrays, p.dtype)
    p.options = {"scale": float(rng.uniform(0.1, 1.5)), "l2norm": l2norm, "sigmoid": sigmoid}
    return p


def run(p: Problem, backend: str, module=scanweaver, arrays: dict | None = None, tunables: dict | None = None) -> tuple:
    """``(o, final states per sequence)`` of the public call (of ``module``'s entry point, ``scanweaver.torch``'s
    too, on ``arrays`` in place of the problem's, with ``tunables`` in place of its own where given)."""
    a, o = (p.arrays if arrays is None else arrays), p.options
    tun = p.tunables if tunables is None else tunables
    if p.op in DELTA:
        named = {"g": a.get("g"), "beta": a.get("beta"), "a": a.get("a"), "b": a.get("b")}
        named = {**{n: a[n] for n in ("q", "k", "v", "h0", "cu_seqlens")}, **named}
        fn = getattr(module, p.op)
        if o["sigmoid"] is not None:
            return fn(named["q"], named["k"], named["v"], named["g"], named["beta"], o["scale"], named["h0"], True,
                      o["l2norm"], use_beta_sigmoid_in_kernel=True, allow_neg_eigval=o["sigmoid"] == 2.0,
                      cu_seqlens=named["cu_seqlens"], backend=backend, **tun)
        return call_public(fn, p.op, named, scale=o["scale"], l2norm=o["l2norm"], backend=backend, **tun)
    kw = {"backend": backend, **tun}
    if p.op == "mamba2_scan":
        cu = a["cu_seqlens"]
        out = module.mamba2_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], D=a["D"], z=a["z"], dt_bias=a["dt_bias"],
                                 initial_states=a["h0"], cu_seqlens=cu, dt_softplus=o["softplus"],
                                 return_final_states=True, return_varlen_states=cu is not None, **kw)
        return out[0], out[-1]
    common = dict(scale=o["scale"], initial_state=a["h0"], output_final_state=True, cu_seqlens=a["cu_seqlens"], **kw)
    if p.op == "rwkv6":
        return module.rwkv6(a["q"], a["k"], a["v"], a["g"], a["u"], **common)
    if p.op == "retention":
        return module.retention(a["q"], a["k"], a["v"], reverse=o["reverse"], **common)
    if p.op == "simple_gla":
        return module.simple_gla(a["q"], a["k"], a["v"], g=a.get("g_head"), g_gamma=a.get("decay"),
                                 reverse=o["reverse"], **common)
    return module.linear_attention(a["q"], a["k"], a["v"], g=a["g"], reverse=o["reverse"], **common)


def oracle(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """The float64 loop of ``p``'s recurrence on its rounded values."""
    a = {n: None if x is None or n == "cu_seqlens" else np.asarray(x, np.float64) for n, x in p.arrays.items()}
    cu = p.arrays.get("cu_seqlens")
    if p.op in DELTA:
        named = {n: x for n, x in a.items() if x is not None}
        if p.options["sigmoid"] is not None:
            with np.errstate(over="ignore"):  # exp(1e4): inf, and the logistic 0, as it should be
                named["beta"] = p.options["sigmoid"] / (1.0 + np.exp(-named["beta"]))
        return loop(PUBLIC[p.op], {**named, "cu_seqlens": cu}, scale=p.options["scale"], l2norm=p.options["l2norm"])
    if p.op == "mamba2_scan":
        return mamba2_loop(a["x"], a["dt"], a["A"], a["B"], a["C"], D=a["D"], z=a["z"], dt_bias=a["dt_bias"],
                           softplus=p.options["softplus"], h0=a["h0"], cu=cu)
    q, k, v = a["q"], a["k"], a["v"]
    full = (*v.shape[:3], q.shape[3])
    if p.op == "retention":
        gk = np.broadcast_to(np.log1p(-(2.0 ** (-5.0 - np.arange(v.shape[2]))))[:, None], full)
    elif p.op == "simple_gla":
        gk = np.broadcast_to((a["g_head"] if a.get("g_head") is not None else a["decay"])[..., None], full)
    else:
        gk = a["g"]
    return la_loop(q, k, v, gk, p.options["scale"], h0=a["h0"], cu=cu, reverse=p.options.get("reverse", False),
                   bonus=a.get("u"))


#: Refusals seen (operation, backend, message): allowed when they name an argument; printed by the long run.
REFUSED: list[tuple[str, str, str]] = []
ARGUMENTS = ("q", "k", "v", "g", "g_gamma", "u", "r", "w", "a", "b", "beta", "initial_state", "initial_states",
             "cu_seqlens", "x", "dt", "A", "B", "C", "D", "scale", "chunk", "algorithm", "chunk_size", "backend")


def check(p: Problem, backend: str) -> None:
    try:
        got = run(p, backend)
    except ScanInputError as exc:
        text = str(exc)
        named = [n for n in ARGUMENTS if re.search(rf"(?<![\w.]){re.escape(n)}(?![\w(])", text)]
        assert text.startswith(p.op) and named, f"{p}: unclear refusal: {text}"
        REFUSED.append((p.op, backend, text.splitlines()[0]))
        if LONG:
            print(f"refused {p.op}[{backend}] {p}: {text.splitlines()[0]}")
        return
    want = oracle(p)
    tol = TOL[p.dtype]
    for name, g, w in (("o", got[0], want[0]), ("final state", got[1], want[1])):
        g = np.asarray(g, np.float64)
        assert np.isfinite(w).all(), f"{p}: the problem is not finite ({name} of the loop): a bug of the test"
        assert g.shape == w.shape, f"{p}: {name} has shape {g.shape}, the loop's {w.shape}"
        assert np.isfinite(g).all(), f"{p}: {name} has {np.count_nonzero(~np.isfinite(g))} non-finite values " \
                                     "where the loop's are finite"
        err, size = np.abs(g - w).max(initial=0.0), np.abs(w).max(initial=0.0)
        assert err <= tol * max(size, 1e-30), f"{p}: {name} differs from the loop by {err:.3g} (max |{name}| " \
                                             f"{size:.3g}, tolerance {tol:g} of it)"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", MATRIX + DELTA)
def test_named_operation_equals_the_loop_on_random_problems(op, backend):
    need(backend)
    examples(f"{op}[{backend}]", SETTINGS[backend], problems(op, backend), lambda p: check(p, backend))


def examples(what: str, setting, strategy, check_one) -> None:
    """``check_one`` on the problems of ``strategy`` under ``setting``: the default run stops at the first failure;
    the long run lists every failure (wrong values, unclear errors, crashes) and fails at the end."""
    failures, runs = [], [0]

    @setting
    @given(problem=strategy)
    def one(problem):
        runs[0] += 1
        try:
            check_one(problem)
        except Exception as exc:
            if not LONG:
                raise
            failures.append(f"{type(exc).__name__}: {exc}")
            print(f"DEFECT {what}: {failures[-1]} ({problem})")

    one()
    if LONG:
        print(f"fuzz {what}: {runs[0]} cases, {len(failures)} failed")
    assert not failures, f"{len(failures)} of {runs[0]} cases failed; the first: {failures[0]}"


#: The gradient examples' largest log growth of a product of decays: the adjoints grow as the states do.
GRAD_CAP = 20.0
#: The gradient examples' largest difference between the algorithms, relative to the largest magnitude of each
#: gradient (float64 both), or to 1e-4 of the largest of all (at least 1) where that is larger: a decay's gradient
#: that is 0 by the definition (one step and no initial state, or a decay that underflows: Mamba-2's dt = 1000) is
#: cancellation noise of terms as large as the other gradients in either algorithm.
GRAD_TOL = 1e-8


def gradients(p: Problem, backend: str, tunables: dict) -> tuple[dict, object]:
    """Every gradient of ``sum(o * do) + sum(final * dfinal)`` (fixed random cotangents) through
    ``scanweaver.torch``, float64, with ``tunables``, and ``scanweaver.matrix.last`` after the backward."""
    import torch
    import scanweaver.torch as swt

    t = {n: x if x is None or n == "cu_seqlens" else torch.tensor(np.asarray(x, np.float64), requires_grad=True)
         for n, x in p.arrays.items()}
    o, h = run(p, backend, swt, t, tunables)
    rng = np.random.default_rng(0)
    (o * torch.tensor(rng.standard_normal(tuple(o.shape)))).sum().add(
        (h * torch.tensor(rng.standard_normal(tuple(h.shape)))).sum()).backward()
    grads = {n: x.grad.numpy() for n, x in t.items() if n != "cu_seqlens" and x is not None and x.grad is not None}
    return {"o": o.detach().numpy(), "final": h.detach().numpy(), **grads}, scanweaver.matrix.last


def check_gradients(p: Problem, backend: str) -> None:
    try:
        rec, _ = gradients(p, backend, {"algorithm": "recurrent"})
    except ScanInputError as exc:
        REFUSED.append((p.op, backend, str(exc).splitlines()[0]))
        return
    got, ran = gradients(p, backend, p.tunables)
    assert ran.part == "backward", f"{p}: scanweaver.matrix.last reports {ran}"
    top = max([1.0] + [float(np.abs(w[np.isfinite(w)]).max(initial=0.0)) for w in rec.values()])
    for name, want in rec.items():
        fin = np.isfinite(want)
        wider = fin & ~np.isfinite(got[name])
        assert not wider.any(), f"{p}: {name} of the chunked form non-finite at {np.argwhere(wider).tolist()[:4]}, " \
                                "the recurrent one's finite"
        size = float(np.abs(want[fin]).max(initial=0.0))
        err = float(np.abs(got[name][fin] - want[fin]).max(initial=0.0))
        assert err <= GRAD_TOL * max(size, 1e-4 * top), f"{p}: {name} of the chunked form differs from the " \
                                                        f"recurrent one's by {err:.3g} (max |{name}| {size:.3g})"


@pytest.mark.parametrize("backend", ("cpu", "opencl"))
@pytest.mark.parametrize("op", MATRIX + DELTA)
def test_the_chunked_gradients_equal_the_recurrent_ones_on_random_problems(op, backend):
    """The chunked form's output, final state and every gradient (float64, through ``scanweaver.torch``) equal the
    recurrent form's on random problems (every gate mode, packed sequences, reverse, groups), and are non-finite
    only where the recurrent ones are.  The default run draws two problems of one feature set for each delta-rule
    operation on ``cpu``; the long run every feature, on OpenCL too."""
    pytest.importorskip("torch")
    need(backend)
    if not LONG and op not in DELTA:
        pytest.skip("the chunked gradients of the matrix-state operations are compared in their own tests "
                    "(test_chunked_grad.py); here in the long run (SCANWEAVER_FUZZ_EXAMPLES=N)")
    chunks = st.sampled_from((1, 3, 16, 64) if LONG else (16,))
    strategy = st.tuples(problems(op, backend, dtype="float64", cap=GRAD_CAP), chunks)

    def one(drawn):
        problem, chunk = drawn
        problem.tunables = {"algorithm": "chunked", "chunk": chunk}
        check_gradients(problem, backend)

    examples(f"gradients {op}[{backend}]", settings(SETTINGS[backend], max_examples=LONG or 2), strategy, one)
