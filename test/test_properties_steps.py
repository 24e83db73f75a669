"""Property tests of the delta-rule decode steps: chained over T tokens, a step equals the float64 loop.

Each example draws one problem (batch, T from 1 to 12, grouped heads, K, V, dtype, l2 normalisation, log decays
from near 0 to strongly negative and exact resets, beta 0 to 2 where the family takes it) and runs the step
function token by token from the initial state; the outputs and the final state must equal the float64 loop of
the recurrence (``delta_family.loop``, written from the definitions), or the call must raise
``ScanInputError`` naming an argument.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scanweaver
from scanweaver import ScanInputError
from delta_family import PUBLIC, loop, problem

#: The step's positional operands after the state, per operation (the problem's array names).
OPERANDS = {"delta_rule": "q k v beta", "rwkv7": "q g k v a b"}
TOL = {"float64": 1e-9, "float32": 2e-4}


@st.composite
def _steps(draw, op):
    hq = draw(st.sampled_from((1, 2)))
    shape = {"batch": draw(st.integers(1, 3)), "T": draw(st.integers(1, 12)), "Hq": hq,
             "H": hq * draw(st.sampled_from((1, 2))), "K": draw(st.integers(1, 7)), "V": draw(st.integers(1, 6))}
    lo = draw(st.sampled_from((-30.0, -2.0, -1e-3)))
    return shape, lo, draw(st.sampled_from(("float64", "float32"))), draw(st.booleans()), draw(st.booleans()), \
        draw(st.integers(0, 2**31 - 1))


@pytest.mark.parametrize("op", sorted(PUBLIC))
@settings(max_examples=8, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_chained_steps_equal_the_loop(op, data):
    shape, lo, dtype, l2norm, reset, seed = data.draw(_steps(op))
    rng = np.random.default_rng(seed)
    family = PUBLIC[op]
    l2norm = l2norm and op != "rwkv7"
    _, a, _ = problem(rng, family, lo=lo, hi=min(-1e-4, lo / 10), dtype=dtype, l2norm=l2norm, **shape)
    if reset and "g" in a:
        a["g"][:, rng.integers(0, shape["T"])] = -np.inf  # an exact reset at one token
    if "beta" in a:
        a["beta"][..., :1] = rng.choice([0.0, 2.0])  # the extremes delta rules allow
    scale = 1.0 if op == "rwkv7" else shape["K"] ** -0.5
    want_o, want_h = loop(family, a, scale, l2norm)
    kw = {} if op == "rwkv7" else {"use_qk_l2norm_in_kernel": l2norm}
    step = getattr(scanweaver, op + "_step")
    S = a["h0"]
    outs = []
    try:
        for t in range(shape["T"]):
            o, S = step(S, *(np.ascontiguousarray(a[n][:, t]) for n in OPERANDS.get(op, "q k v g beta").split()),
                        **kw)
            outs.append(np.asarray(o, np.float64))
    except ScanInputError as e:
        assert re.search(r"\b(state|q|k|v|g|beta|a|b|r|w)\b", str(e)), e
        return
    got = np.stack(outs, axis=1)
    big = max(1.0, float(np.abs(want_o).max()), float(np.abs(want_h).max()))
    assert np.isfinite(got).all() and np.isfinite(S).all()
    assert np.abs(got - want_o).max() <= TOL[dtype] * big, (op, shape, dtype)
    assert np.abs(np.asarray(S, np.float64) - want_h).max() <= TOL[dtype] * big, (op, shape, dtype)
