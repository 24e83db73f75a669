"""Repeated delta-rule calls run the plan their signature's first call kept, with the full path's results.

Every check compares a call that found a plan with the same call made by the full path (a fresh plan cache),
bit for bit: outputs, final states, their dtypes; and proves the plan ran by making the full path fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import scanweaver
from scanweaver.core import fastpath
from scanweaver.errors import ScanInputError
from scanweaver.ops.delta_rule import plans
from scanweaver.runtime import REGISTRY

pytestmark = pytest.mark.skipif(not REGISTRY.get("cpu").availability().ok, reason="the cpu backend needs a compiler")

OPS = ("delta_rule", "gated_delta_rule", "kda", "rwkv7")


def inputs(family: str, rng, B=2, T=1, H=2, HV=2, K=8, V=16, dtype=np.float32) -> list:
    """The arrays of one call of ``family`` in its positional order (fla's), decays negative, keys unit-length."""
    def n(*shape):
        return rng.standard_normal(shape).astype(dtype)

    k = n(B, T, H, K)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    if family == "rwkv7":
        kappa = n(B, T, HV, K)
        kappa /= np.linalg.norm(kappa, axis=-1, keepdims=True)
        return [n(B, T, H, K), -np.exp(n(B, T, HV, K)), k, n(B, T, HV, V), -kappa, (0.5 * kappa).astype(dtype)]
    out = [n(B, T, H, K), k, n(B, T, HV, V)]
    if family == "gated_delta_rule":
        out.append(-rng.uniform(0.01, 1, (B, T, HV)).astype(dtype))
    elif family == "kda":
        out.append(-rng.uniform(0.01, 1, (B, T, HV, K)).astype(dtype))
    return [*out, rng.uniform(0.1, 0.9, (B, T, HV)).astype(dtype)]


def state(rng, B=2, HV=2, K=8, V=16, dtype=np.float32):
    return rng.standard_normal((B, HV, K, V)).astype(dtype)


def same_bits(got, want) -> None:
    if want is None:
        assert got is None
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


class Forgetful(fastpath.PlanCache):
    """A plan cache that keeps nothing: every call takes the full path."""

    def put(self, key: tuple, plan: object) -> None:
        pass


@pytest.fixture
def fresh(monkeypatch):
    """``fresh(fn, *args, **kw)``: ``fn``'s calls all by the full path (no plan kept); the test's cache is new."""
    monkeypatch.setattr(plans, "PLANS", fastpath.PlanCache())

    def full(fn, *args, **kw):
        kept = plans.PLANS
        plans.PLANS = Forgetful()
        try:
            return fn(*args, **kw)
        finally:
            plans.PLANS = kept

    return full


@pytest.fixture
def no_full_path(monkeypatch):
    """A context in which the full path fails the test: what runs there ran from a plan."""
    import contextlib

    @contextlib.contextmanager
    def ctx():
        with monkeypatch.context() as m:
            m.setattr(plans, "reported_family_forward", lambda *a, **k: pytest.fail("the full path ran again"))
            yield

    return ctx


VARIANTS = {
    "h0": dict(state=True, output_final_state=True),
    "plain": dict(),
    "l2norm-scale": dict(state=True, output_final_state=True, use_qk_l2norm_in_kernel=True, scale=0.3),
    "grouped-float64": dict(state=True, output_final_state=True, HV=4, dtype=np.float64),
    "sigmoid-vfirst": dict(state=True, output_final_state=True, use_beta_sigmoid_in_kernel=True,
                           allow_neg_eigval=True, state_v_first=True),
    "float16": dict(state=True, output_final_state=True, dtype=np.float16),
}


@pytest.mark.parametrize("family", OPS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_repeated_call_gives_the_full_paths_bits(family, variant, rng, fresh, no_full_path):
    kw = dict(VARIANTS[variant])
    if family in ("delta_rule", "rwkv7") and "state_v_first" in kw:
        pytest.skip(f"{family} has no state_v_first nor beta logits")
    use_state, HV, dtype = kw.pop("state", False), kw.pop("HV", 2), kw.pop("dtype", np.float32)
    if family == "rwkv7":
        kw.pop("use_qk_l2norm_in_kernel", None)
    fn = getattr(scanweaver, family)

    def call(arrays, h0):
        return fn(*arrays, initial_state=h0, **kw)

    def data():
        h0 = state(rng, HV=HV, dtype=np.float32 if dtype == np.float16 else dtype)
        if kw.get("state_v_first"):
            h0 = np.ascontiguousarray(h0.swapaxes(-1, -2))
        return inputs(family, rng, HV=HV, dtype=dtype), h0 if use_state else None

    call(*data())  # the full path, which keeps a plan
    for _ in range(2):
        arrays, h0 = data()
        with no_full_path():
            o, h = call(arrays, h0)
        want_o, want_h = fresh(call, arrays, h0)
        same_bits(o, want_o)
        same_bits(h, want_h)
        for out in (o, h):
            assert out is None or not any(np.shares_memory(out, x) for x in [*arrays, h0] if x is not None)


@pytest.mark.parametrize("family", OPS)
def test_a_decode_loop_keeps_the_full_paths_states(family, rng, fresh):
    fn = getattr(scanweaver, family)
    tokens = [inputs(family, rng, T=1) for _ in range(6)]
    S0 = state(rng)

    def loop():
        S, outs = S0, []
        for arrays in tokens:
            o, S = fn(*arrays, initial_state=S, output_final_state=True)
            outs.append(o)
        return outs, S

    outs, S = loop()  # the first token keeps the plan, the others run it
    want_outs, want_S = fresh(loop)
    for o, w in zip(outs, want_outs, strict=True):
        same_bits(o, w)
    same_bits(S, want_S)
    assert len(plans.PLANS) >= 1


def test_decode_steps_and_pair_calls_run_the_plan(rng, fresh, no_full_path):
    arrays, S = inputs("gated_delta_rule", rng), state(rng)
    step = [x[:, 0] for x in arrays]
    first = scanweaver.gated_delta_rule_step(S, *step)
    with no_full_path():
        again = scanweaver.gated_delta_rule_step(S, *step)
    for got, want in zip(again, fresh(scanweaver.gated_delta_rule_step, S, *step), strict=True):
        same_bits(got, want)
    for got, want in zip(again, first, strict=True):
        same_bits(got, want)


def test_torch_tensors_run_the_plan(rng, fresh, no_full_path):
    torch = pytest.importorskip("torch")
    import scanweaver.torch as swt

    arrays, S = inputs("gated_delta_rule", rng), state(rng)
    tensors = [torch.from_numpy(x) for x in arrays]
    with torch.no_grad():
        swt.gated_delta_rule(*tensors, initial_state=torch.from_numpy(S), output_final_state=True)
        with no_full_path():
            o, h = swt.gated_delta_rule(*tensors, initial_state=torch.from_numpy(S), output_final_state=True)
    want_o, want_h = fresh(scanweaver.gated_delta_rule, *arrays, initial_state=S, output_final_state=True)
    same_bits(o.numpy(), want_o)
    same_bits(h.numpy(), want_h)


def test_bad_input_on_a_planned_signature_gets_the_full_paths_error(rng, fresh):
    arrays, S = inputs("gated_delta_rule", rng), state(rng)
    fn = scanweaver.gated_delta_rule
    fn(*arrays, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)
    q, k, v, g, beta = arrays
    bad = [((q, k, v[:1], g, beta), {}, "v has shape"),
           ((q, k, v, g, beta[..., None]), {}, "beta has shape"),
           ((q, k, v, g.astype(np.int32), beta), {}, "g"),
           (arrays, {"initial_state": S[:, :1]}, "initial_state has shape"),
           (arrays, {"use_qk_l2norm_in_kernel": 1}, "use_qk_l2norm_in_kernel must be True or False"),
           (arrays, {"scale": float("nan")}, "scale must be finite"),
           (arrays, {"use_gate_in_kernel": True}, "use_gate_in_kernel"),
           (arrays, {"cp_context": object()}, "cp_context"),
           (arrays, {"threads": -1}, "threads"),
           (arrays, {"bogus": 1}, "bogus")]
    for args, extra, match in bad:
        call = {"initial_state": S, "output_final_state": True, "use_qk_l2norm_in_kernel": True, **extra}
        with pytest.raises(ScanInputError, match=match) as planned:
            fn(*args, **call)
        with pytest.raises(ScanInputError) as full:
            fresh(fn, *args, **call)
        assert str(planned.value) == str(full.value)


def test_arrays_a_plan_cannot_take_run_the_full_path(rng, fresh):
    arrays, S = inputs("kda", rng), state(rng)
    fn = scanweaver.kda
    wide = rng.standard_normal((*arrays[0].shape[:-1], 2 * arrays[0].shape[-1])).astype(np.float32)
    strided = wide[..., ::2]
    raw = np.frombuffer(bytearray(S.nbytes + 1), np.uint8)[1:].view(np.float32).reshape(S.shape)
    raw[...] = S
    assert not strided.flags.c_contiguous and not raw.flags.aligned
    fn(*arrays, initial_state=S, output_final_state=True)  # plans the aligned, contiguous signature
    planned = len(plans.PLANS)
    for args, h0 in [([strided, *arrays[1:]], S), ([arrays[0].astype(np.float64), *arrays[1:]], S), (arrays, raw),
                     (arrays, S.astype(np.float64))]:
        for _ in range(2):
            o, h = fn(*args, initial_state=h0, output_final_state=True)
            want_o, want_h = fresh(fn, *args, initial_state=h0, output_final_state=True)
            same_bits(o, want_o)
            same_bits(h, want_h)
    assert len(plans.PLANS) == planned  # none of those kept a plan (the misaligned h0 has the planned signature)


def test_packed_sequences_take_the_full_path(rng, fresh):
    arrays = inputs("delta_rule", rng, B=1, T=5)
    cu = np.array([0, 2, 5])
    for _ in range(2):
        scanweaver.delta_rule(*arrays, output_final_state=True, cu_seqlens=cu)
    assert len(plans.PLANS) == 0


def test_threads_with_the_same_and_other_signatures(rng, fresh):
    problems = [(inputs("gated_delta_rule", rng), state(rng)),
                (inputs("gated_delta_rule", rng, HV=4), state(rng, HV=4)), (inputs("kda", rng), state(rng))]
    ops = [scanweaver.gated_delta_rule, scanweaver.gated_delta_rule, scanweaver.kda]
    want = [fresh(fn, *a, initial_state=h0, output_final_state=True) for fn, (a, h0) in zip(ops, problems, strict=True)]
    errors: list = []

    def work(seed: int) -> None:
        try:
            for i in range(60):
                j = (seed + i) % len(problems)
                o, h = ops[j](*problems[j][0], initial_state=problems[j][1], output_final_state=True)
                same_bits(o, want[j][0])
                same_bits(h, want[j][1])
                assert scanweaver.matrix.last.op == "delta_rule"
        except BaseException as exc:  # noqa: BLE001 (reported below, in the test's thread)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_changed_tuned_store_rebuilds_the_plan(rng, fresh, monkeypatch):
    from scanweaver.tuning import store

    arrays, S = inputs("gated_delta_rule", rng), state(rng)
    fn = scanweaver.gated_delta_rule
    runs = []
    full = plans.reported_family_forward
    monkeypatch.setattr(plans, "reported_family_forward", lambda *a, **k: runs.append(1) or full(*a, **k))
    fn(*arrays, initial_state=S, output_final_state=True)
    fn(*arrays, initial_state=S, output_final_state=True)
    fn(*arrays, initial_state=S, output_final_state=True, algorithm="chunked")
    fn(*arrays, initial_state=S, output_final_state=True, algorithm="chunked")
    assert len(runs) == 2
    stamp = store.stamp()
    monkeypatch.setattr(store, "stamp", lambda: (stamp, "written"))
    fn(*arrays, initial_state=S, output_final_state=True)  # read the store: runs the full path, plans again
    fn(*arrays, initial_state=S, output_final_state=True)
    fn(*arrays, initial_state=S, output_final_state=True, algorithm="chunked")  # its own tunables: still planned
    assert len(runs) == 3


def test_matrix_last_reports_what_a_planned_call_ran(rng, fresh):
    gated, kda = (inputs("gated_delta_rule", rng), state(rng)), (inputs("kda", rng), state(rng))
    la = [rng.standard_normal((1, 4, 2, 8)).astype(np.float32) for _ in range(3)]
    for _ in range(2):
        scanweaver.gated_delta_rule(*gated[0], initial_state=gated[1], algorithm="chunked", chunk=16)
        last = scanweaver.matrix.last
        assert (last.op, last.backend, last.algorithm, last.source) == ("delta_rule", "cpu", "chunked", "explicit")
        assert last.config["chunk"] == 16
        scanweaver.linear_attention(*la)
        assert scanweaver.matrix.last.op == "matrix_state"
        scanweaver.kda(*kda[0], initial_state=kda[1])
        last = scanweaver.matrix.last
        assert (last.op, last.algorithm, last.source) == ("delta_rule", "recurrent", "default")


FORK = r"""
import json, os, sys
import numpy as np
import scanweaver
from scanweaver.ops.delta_rule import plans

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, 4, 32)).astype(np.float32) for _ in range(3))
k /= np.linalg.norm(k, axis=-1, keepdims=True)
g, beta = -rng.uniform(0.1, 1, (2, 1, 1, 4)).astype(np.float32)
S = rng.standard_normal((1, 4, 32, 32)).astype(np.float32)

def call():
    return scanweaver.gated_delta_rule(q, k, v, g, -beta, initial_state=S, output_final_state=True, threads=2)

want = [x.tobytes() for x in call()]
assert [x.tobytes() for x in call()] == want and len(plans.PLANS) == 2  # the entry's key and the pair's
pid = os.fork()
if pid == 0:
    def fail(*a, **k):
        os._exit(4)
    plans.reported_family_forward = fail  # the child must run the parent's plan
    got = [x.tobytes() for x in call()]
    os._exit(0 if got == want else 3)
_, status = os.waitpid(pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status)}))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_child_runs_its_parents_plan():
    try:
        proc = subprocess.run([sys.executable, "-c", FORK], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the forked child hung")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"status": 0}
