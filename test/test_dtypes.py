"""Dtype paths: float16/bfloat16 storage with float32 accumulation, complex transitions, error bounds.

The documented bound (bounded gates a in (0.5, 1), L <= 4096) per element is

    |y - y*| <= u_out * |y*| + 1e-6 * max_t |y*|

with y* the float64 oracle of the same (rounded) inputs and u_out the unit
roundoff of the output dtype: 2^-24 float32, 2^-11 float16, 2^-8 bfloat16.
The first term is the final rounding to the output dtype, the second the
float32 accumulation.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.runtime import REGISTRY

UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ACCUMULATION = 1e-6


def bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs the optional ml_dtypes package "
                                                        "(pip install scanweaver[bfloat16])")
    return ml_dtypes.bfloat16


def half_dtypes():
    out = [np.float16]
    try:
        import ml_dtypes

        out.append(ml_dtypes.bfloat16)
    except ImportError:
        pass
    return out


def operands(rng, shape, dtype):
    return [rng.uniform(0.5, 1.0, shape).astype(dtype)] + [rng.standard_normal(shape).astype(dtype)
                                                           for _ in range(3)]


def oracle(ops, **kw):
    return scanweaver.selective_scan(*(np.asarray(v, np.float64) for v in ops), backend="numpy",
                                     schedule="sequential", return_state=True, **kw)


def assert_within_bound(y, ey, dtype_name):
    y64 = np.asarray(y, np.float64)
    scale = np.abs(ey).max(axis=-1, keepdims=True)
    bound = UNIT_ROUNDOFF[dtype_name] * np.abs(ey) + ACCUMULATION * scale
    excess = np.abs(y64 - ey) - bound
    assert excess.max() <= 0, f"{dtype_name}: error exceeds the documented bound by {excess.max():.3g}"


@pytest.mark.parametrize("L", [1, 129, 4096])
@pytest.mark.parametrize("dtype", [np.float32, *half_dtypes()], ids=lambda d: np.dtype(d).name)
def test_documented_bound_on_every_numpy_schedule(rng, dtype, L):
    ops = operands(rng, (3, L), dtype)
    h0 = rng.standard_normal(3).astype(dtype)
    ey, eh = oracle(ops, h0=h0)
    for sched in REGISTRY["numpy"].schedules:
        y, h = scanweaver.selective_scan(*ops, h0=h0, return_state=True, backend="numpy", schedule=sched)
        assert y.dtype == np.dtype(dtype), sched
        assert h.dtype == np.float32, "the state keeps the float32 accumulation"
        assert_within_bound(y, ey, np.dtype(dtype).name)
        np.testing.assert_allclose(h, eh, rtol=1e-5, atol=1e-5 * np.abs(eh).max())


def test_half_inputs_are_not_accumulated_in_half(rng):
    L = 4096
    ops = [rng.uniform(0.99, 1.0, (2, L)).astype(np.float16), *operands(rng, (2, L), np.float16)[1:3]]
    ey, _ = oracle(ops)
    naive = np.zeros(2, np.float16)
    out = np.empty((2, L), np.float16)
    for t in range(L):
        naive = ops[0][:, t] * naive + ops[1][:, t] * ops[2][:, t]
        out[:, t] = naive
    y = scanweaver.selective_scan(*ops, backend="numpy")
    assert_within_bound(y, ey, "float16")
    assert np.abs(y - ey).max() < np.abs(out.astype(np.float64) - ey).max() / 4


def test_bfloat16_mixed_with_float16_computes_float32(rng):
    bf16 = bfloat16()
    a, b, x, _ = operands(rng, (2, 30), np.float32)
    y = scanweaver.selective_scan(a.astype(bf16), b.astype(np.float16), x.astype(bf16), backend="numpy")
    assert y.dtype == np.float32


@pytest.mark.parametrize("dtype", half_dtypes(), ids=lambda d: np.dtype(d).name)
def test_mamba_half_inputs(rng, dtype):
    name = np.dtype(dtype).name
    ops = dict(u=rng.standard_normal((2, 8, 300)), delta=rng.uniform(0.01, 0.5, (2, 8, 300)),
               A=-rng.uniform(0.5, 8, (8, 4)), B=rng.standard_normal((2, 4, 300)),
               C=rng.standard_normal((2, 4, 300)), D=rng.standard_normal(8), z=rng.standard_normal((2, 8, 300)))
    ops = {k: v.astype(dtype) for k, v in ops.items()}
    y = scanweaver.mamba_selective_scan(**ops, delta_softplus=True, backend="numpy")
    ey = scanweaver.mamba_selective_scan(**{k: v.astype(np.float64) for k, v in ops.items()},
                                         delta_softplus=True, backend="numpy")
    assert y.dtype == np.dtype(dtype)
    assert_within_bound(y, ey, name)


@pytest.mark.parametrize("sched", ["sequential", "chunked", "blelloch"])
def test_complex64_transitions_on_numpy(rng, sched):
    shape = (3, 77)
    radius, angle = rng.uniform(0.5, 1.0, shape), rng.uniform(-np.pi, np.pi, shape)
    a = (radius * np.exp(1j * angle)).astype(np.complex64)
    b, x = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    c = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    h0 = (rng.standard_normal(3) + 1j).astype(np.complex64)
    y, h = scanweaver.selective_scan(a, b, x, c, h0=h0, return_state=True, backend="numpy", schedule=sched)
    assert y.dtype == np.complex64
    ey = np.empty(shape, np.complex128)
    hh = h0.astype(np.complex128)
    for t in range(shape[1]):
        hh = a[:, t].astype(np.complex128) * hh + b[:, t] * x[:, t].astype(np.float64)
        ey[:, t] = c[:, t] * hh
    np.testing.assert_allclose(y, ey, rtol=0, atol=2e-6 * np.abs(ey).max())
    np.testing.assert_allclose(h, hh, rtol=0, atol=2e-6 * np.abs(hh).max())


def test_complex128_oracle(rng):
    a = (0.9 * np.exp(1j * rng.uniform(-1, 1, (2, 20))))
    ones = np.ones((2, 20))
    y = scanweaver.selective_scan(a, ones, ones, backend="numpy", schedule="blelloch", workgroup_size=4)
    assert y.dtype == np.complex128
    h = np.zeros(2, complex)
    for t in range(20):
        h = a[:, t] * h + 1
    np.testing.assert_allclose(y[:, -1], h, rtol=1e-13)


def test_auto_backend_picks_one_that_supports_complex(rng):
    a = np.full((1, 5), 0.5 + 0.5j, np.complex64)
    y = scanweaver.selective_scan(a, np.ones((1, 5), np.float32), np.ones((1, 5), np.float32))
    assert y.dtype == np.complex64
    assert scanweaver.api.SELECTIVE_NO_C.last.backend in [n for n, c in REGISTRY.items() if "complex64" in c.dtypes]


def test_complex_on_a_backend_without_it_is_an_error_naming_it():
    real_only = [n for n, c in REGISTRY.items() if "complex64" not in c.dtypes and c.availability().ok]
    if not real_only:
        pytest.skip("no available backend without complex support is registered in this build")
    a = np.full((1, 5), 0.5 + 0.5j, np.complex64)
    with pytest.raises(ScanInputError, match=f"backend '{real_only[0]}' does not support dtype complex64.*"
                                             r"use backend='(\w+)'") as err:
        scanweaver.selective_scan(a, a, a, backend=real_only[0])
    suggested = re.search(r"use backend='(\w+)'", str(err.value)).group(1)
    assert "complex64" in REGISTRY[suggested].dtypes and REGISTRY[suggested].availability().ok, str(err.value)


def test_one_rule_tells_the_floating_dtypes():
    """arrays.is_real / is_floating: the one test of a dtype the scans take (kind == "f" misses bfloat16)."""
    from scanweaver.arrays import is_floating, is_real

    bf16 = bfloat16()
    for d in (np.float16, bf16, np.float32, np.float64, np.dtype(">f4"), np.dtype(">f8")):
        assert is_real(d) and is_floating(d), d
    for d in (np.complex64, np.complex128):
        assert is_floating(d) and not is_real(d)
    for d in (np.int32, np.bool_, np.uint8, object, np.dtype("V2"), "float128" if hasattr(np, "float128") else "U3"):
        assert not is_real(d) and not is_floating(d), d


def _matrix_loop(q, k, v, logd, bonus=None):
    """o_t = S_t^T q_t (or S_{t-1}^T q_t + (q_t . (u * k_t)) v_t with ``bonus`` u), S_t = exp(logd_t)[:, None]
    S_{t-1} + k_t v_t^T, per batch row and head, in float64; logd (batch, T, H[, K])."""
    q, k, v, logd = (np.asarray(x, np.float64) for x in (q, k, v, logd))
    batch, T, H, K = q.shape
    o = np.zeros(v.shape)
    for b in range(batch):
        for h in range(H):
            S = np.zeros((K, v.shape[-1]))
            for t in range(T):
                d = np.exp(logd[b, t, h]) * np.ones(K)
                new = d[:, None] * S + np.outer(k[b, t, h], v[b, t, h])
                if bonus is None:
                    o[b, t, h] = new.T @ q[b, t, h]
                else:
                    u = np.asarray(bonus, np.float64)[h]
                    o[b, t, h] = S.T @ q[b, t, h] + (q[b, t, h] @ (u * k[b, t, h])) * v[b, t, h]
                S = new
    return o


@pytest.mark.parametrize("op", ["linear_attention", "rwkv6", "mamba2_scan"])
def test_bfloat16_numpy_inputs_to_the_matrix_operations(rng, op):
    bf16 = bfloat16()
    B, T, H, K, V = 1, 9, 2, 4, 3
    q, k = (rng.standard_normal((B, T, H, K)).astype(bf16) for _ in range(2))
    v = rng.standard_normal((B, T, H, V)).astype(bf16)
    if op == "linear_attention":
        g = (-rng.uniform(0.05, 1, (B, T, H, K))).astype(bf16)
        got, _ = scanweaver.linear_attention(q, k, v, g=g, scale=1.0)
        want = _matrix_loop(q, k, v, g)
    elif op == "rwkv6":
        w, u = (-rng.uniform(0.05, 1, (B, T, H, K))).astype(bf16), rng.standard_normal((H, K)).astype(bf16)
        got, _ = scanweaver.rwkv6(q, k, v, w, u, scale=1.0)
        want = _matrix_loop(q, k, v, w, bonus=u)
    else:  # x (B, T, H, P=V), dt (B, T, H), A (H,), B = k, C = q with one group
        dt, A = rng.uniform(0.1, 1, (B, T, H)).astype(bf16), (-rng.uniform(0.5, 1, H)).astype(bf16)
        Bm, Cm = k[:, :, :1], q[:, :, :1]
        got = scanweaver.mamba2_scan(v, dt, A, Bm, Cm)
        d64, x64 = np.asarray(dt, np.float64), np.asarray(v, np.float64)
        want = _matrix_loop(np.repeat(Cm, H, 2), np.repeat(Bm, H, 2), d64[..., None] * x64,
                            d64 * np.asarray(A, np.float64))  # the state transposed: (N, P), read by C
    assert np.dtype(got.dtype) == np.dtype(bf16), "o comes back in the input dtype"
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2**-7, atol=2**-7 * np.abs(want).max())


@pytest.mark.parametrize("op", ["linear_attention", "selective_scan"])
def test_jax_bfloat16_inputs(rng, op):
    jnp = pytest.importorskip("jax.numpy")
    if op == "selective_scan":
        ops = operands(rng, (3, 17), np.float32)
        got = scanweaver.selective_scan(*(jnp.asarray(x, jnp.bfloat16) for x in ops))
        want, _ = oracle([np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64) for x in ops])
    else:
        q, k, v = (rng.standard_normal((1, 7, 2, 4)) for _ in range(3))
        g = -rng.uniform(0.05, 1, (1, 7, 2, 4))
        args = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v, g)]
        got, _ = scanweaver.linear_attention(*args[:3], g=args[3], scale=1.0)
        want = _matrix_loop(*(np.asarray(a, np.float64) for a in args))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2**-7, atol=2**-7 * np.abs(want).max())


#: The named operations whose whole-sequence forms return ``(o, final state)``.
NAMED = ("linear_attention", "simple_gla", "retention", "rwkv6", "mamba2_scan", "delta_rule", "gated_delta_rule",
         "kda", "rwkv7")


def _framework(name: str):
    """(module with the entry points, NumPy bfloat16 -> that framework's bfloat16 array, back to float64)."""
    if name == "numpy":
        return scanweaver, lambda a: a, lambda a: np.asarray(a, np.float64)
    if name == "jax":
        jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed (pip install scanweaver[jax])")
        return scanweaver, jnp.asarray, lambda a: np.asarray(a, np.float64)
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install scanweaver[torch])")
    return (scanweaver, lambda a: torch.tensor(np.asarray(a, np.float32)).to(torch.bfloat16),
            lambda t: t.detach().float().numpy().astype(np.float64))


def _named_problem(rng, op: str, bf16):
    """``(call(fn, conv), o oracle, state oracle)`` of one small problem in bfloat16 (the oracle reads the rounded
    values in float64)."""
    from delta_family import PUBLIC, call_public, loop, problem
    from matrix_loops import la_loop, mamba2_loop

    B, T, H, K, V = 1, 11, 2, 4, 3

    def rnd(x):
        return np.asarray(x).astype(bf16)

    def f64(*xs):
        return [np.asarray(x, np.float64) for x in xs]

    if op in PUBLIC:
        _, a, _ = problem(rng, PUBLIC[op], batch=B, T=T, H=H, Hq=H, K=K, V=V, h0=False, dtype="bfloat16")
        want = loop(PUBLIC[op], {n: np.asarray(x, np.float64) for n, x in a.items()}, scale=1.0)
        return lambda fn, conv: call_public(fn, op, {n: conv(x) for n, x in a.items()}, scale=1.0), *want
    q, k = rnd(rng.standard_normal((B, T, H, K))), rnd(rng.standard_normal((B, T, H, K)))
    v = rnd(rng.standard_normal((B, T, H, V)))
    if op == "mamba2_scan":
        dt, A = rnd(rng.uniform(0.1, 1, (B, T, H))), rnd(-rng.uniform(0.5, 1, H))
        want = mamba2_loop(*f64(v, dt, A, k[:, :, :1], q[:, :, :1]))
        return (lambda fn, conv: fn(conv(v), conv(dt), conv(A), conv(k[:, :, :1]), conv(q[:, :, :1]),
                                    return_final_states=True)), *want
    g = rnd(-rng.uniform(0.05, 1, (B, T, H, K)))
    if op == "linear_attention":
        return (lambda fn, conv: fn(conv(q), conv(k), conv(v), g=conv(g), scale=1.0, output_final_state=True),
                *la_loop(*f64(q, k, v, g), 1.0))
    if op == "rwkv6":
        u = rnd(rng.standard_normal((H, K)))
        return (lambda fn, conv: fn(conv(q), conv(k), conv(v), conv(g), conv(u), scale=1.0, output_final_state=True),
                *la_loop(*f64(q, k, v, g), 1.0, bonus=np.asarray(u, np.float64)))
    if op == "simple_gla":
        gs = g[..., 0]
        return (lambda fn, conv: fn(conv(q), conv(k), conv(v), g=conv(gs), scale=1.0, output_final_state=True),
                *la_loop(*f64(q, k, v), np.broadcast_to(np.asarray(gs, np.float64)[..., None], g.shape), 1.0))
    gamma = np.log(1 - 2.0 ** (-5.0 - np.arange(H)))  # retention: one decay per head
    return (lambda fn, conv: fn(conv(q), conv(k), conv(v), scale=1.0, output_final_state=True),
            *la_loop(*f64(q, k, v), np.broadcast_to(gamma[:, None], g.shape), 1.0))


@pytest.mark.parametrize("framework", ["numpy", "jax", "torch"])
@pytest.mark.parametrize("op", NAMED)
def test_every_named_operation_takes_bfloat16(rng, op, framework):
    """bfloat16 operands are storage: computed in float32, o returned in bfloat16, the final state in float32."""
    bf16 = bfloat16()
    mod, conv, back = _framework(framework)
    if framework != "numpy":
        mod = __import__(f"scanweaver.{framework}", fromlist=[op])
    call, want_o, want_s = _named_problem(rng, op, bf16)
    o, state = call(getattr(mod, op), conv)
    assert str(o.dtype).endswith("bfloat16"), f"{op}[{framework}]: o is {o.dtype}, the input dtype is bfloat16"
    assert str(state.dtype).endswith("float32"), f"{op}[{framework}]: the final state is {state.dtype}"
    for got, want in ((back(o), want_o), (back(state), want_s)):
        np.testing.assert_allclose(got, want, rtol=2**-7, atol=2**-7 * np.abs(want).max())


def test_beta_through_the_sigmoid_keeps_bfloat16_storage(rng):
    """use_beta_sigmoid_in_kernel with bfloat16 beta: beta stays bfloat16, so the state is float32 (not float64)."""
    bf16 = bfloat16()
    q, k = (rng.standard_normal((1, 6, 2, 4)).astype(bf16) for _ in range(2))
    v = rng.standard_normal((1, 6, 2, 3)).astype(bf16)
    g, beta = (-rng.uniform(0.05, 1, (1, 6, 2))).astype(bf16), rng.standard_normal((1, 6, 2)).astype(bf16)
    o, state = scanweaver.gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_beta_sigmoid_in_kernel=True)
    assert o.dtype == np.dtype(bf16) and state.dtype == np.float32


def test_bfloat16_h0_is_a_real_state(rng):
    """h0 in bfloat16 passes the one state-dtype rule (arrays.check_state_dtype), for NumPy and Dask alike."""
    bf16 = bfloat16()
    a, b, x, _ = operands(rng, (2, 13), np.float32)
    h0 = rng.standard_normal(2).astype(bf16)
    y = scanweaver.selective_scan(a, b, x, h0=h0, backend="numpy")
    want = oracle([a, b, x, np.ones_like(a)], h0=np.asarray(h0, np.float64))[0]
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with pytest.raises(ScanInputError, match=r"h0 has dtype <U1; it needs a real float dtype"):
        scanweaver.selective_scan(a, b, x, h0=np.array(["x", "y"]), backend="numpy")
    da = pytest.importorskip("dask.array", reason="Dask is not installed (pip install scanweaver[dask])")
    import scanweaver.dask as swd

    got = swd.selective_scan(*(da.from_array(v, chunks=(2, 7)) for v in (a, b, x)), h0=da.from_array(h0))
    np.testing.assert_allclose(np.asarray(got.compute()), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=lambda d: np.dtype(d).name)
def test_retention_decays_do_not_widen_the_call(rng, dtype):
    """retention derives its decays itself: float32 (and float16) operands keep a float32 state, not float64."""
    from matrix_loops import la_loop

    q, k, v = (rng.standard_normal((1, 9, 2, 3)).astype(dtype) for _ in range(3))
    o, state = scanweaver.retention(q, k, v, scale=1.0, output_final_state=True)
    assert o.dtype == np.dtype(dtype) and state.dtype == np.float32
    gamma = np.log(1 - 2.0 ** (-5.0 - np.arange(2)))
    want_o, want_s = la_loop(*(np.asarray(x, np.float64) for x in (q, k, v)),
                             np.broadcast_to(gamma[:, None], (1, 9, 2, 3)), 1.0)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(o, want_o, rtol=tol, atol=tol * np.abs(want_o).max())
    np.testing.assert_allclose(state, want_s, rtol=1e-5, atol=1e-5 * np.abs(want_s).max())


@pytest.mark.parametrize("op", ["linear_attention", "rwkv6", "mamba2_scan", "gated_delta_rule", "rwkv7"])
@pytest.mark.parametrize("half", ["value", "others"])
def test_the_output_takes_the_value_operands_dtype_in_every_framework(rng, op, half):
    """o is returned in v's dtype (x's for Mamba-2) whatever the other operands' dtypes: bfloat16 q and k with
    float32 v give a float32 o, and the other way round, in NumPy, JAX and PyTorch alike (PyTorch once took the
    first operand's)."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install scanweaver[torch])")
    bf16 = bfloat16()
    B, T, H, K, V = 1, 6, 2, 4, 3
    f = lambda *shape: rng.standard_normal(shape)  # noqa: E731
    value = {"mamba2_scan": "x"}.get(op, "v")
    args = {"linear_attention": dict(q=f(B, T, H, K), k=f(B, T, H, K), v=f(B, T, H, V),
                                     g=-rng.uniform(0.05, 1, (B, T, H, K))),
            "rwkv6": dict(r=f(B, T, H, K), k=f(B, T, H, K), v=f(B, T, H, V), w=-rng.uniform(0.05, 1, (B, T, H, K)),
                          u=f(H, K)),
            "mamba2_scan": dict(x=f(B, T, H, V), dt=rng.uniform(0.1, 1, (B, T, H)), A=-rng.uniform(0.5, 1, H),
                                B=f(B, T, 1, K), C=f(B, T, 1, K)),
            "gated_delta_rule": dict(q=f(B, T, H, K), k=f(B, T, H, K) / 3, v=f(B, T, H, V),
                                     g=-rng.uniform(0.05, 1, (B, T, H)), beta=rng.uniform(0, 1, (B, T, H))),
            "rwkv7": dict(r=f(B, T, H, K), w=-rng.uniform(0.05, 1, (B, T, H, K)), k=f(B, T, H, K) / 3,
                          v=f(B, T, H, V), a=f(B, T, H, K) / 3, b=f(B, T, H, K) / 3)}[op]
    narrow = {n for n in args if (n == value) == (half == "value")}
    as_np = {n: x.astype(bf16 if n in narrow else np.float32) for n, x in args.items()}
    want = bf16 if value in narrow else np.float32
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed (pip install scanweaver[jax])")
    for name, conv in (("numpy", lambda n, x: x), ("jax", lambda n, x: jnp.asarray(x)),
                       ("torch", lambda n, x: torch.tensor(np.asarray(x, np.float32)).to(
                           torch.bfloat16 if n in narrow else torch.float32))):
        o = getattr(scanweaver, op)(**{n: conv(n, x) for n, x in as_np.items()})
        o = o[0] if isinstance(o, tuple) else o
        assert str(o.dtype).endswith(np.dtype(want).name), f"{op}[{name}], {sorted(narrow)} bfloat16: o is {o.dtype}"
