"""The cpu backend's C kernels of the fused ``delta_rule`` op (DeltaNet, Gated DeltaNet, KDA, RWKV-7), forward and
backward, against the float64 loops of the recurrences (``delta_family.loop``) and the operation's NumPy
definition; float64 to rounding, float32 at realistic K and V with log decays from -20 to -1e-4 and -inf,
float16/bfloat16 storage; packed sequences with an empty one, grouped value heads, L2 normalisation, T = 1,
lengths that straddle the packed blocks and the checkpoints, value columns in several blocks, one and two
threads; K = 65536 from a thread with a 256 KiB stack.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from delta_family import FAMILIES, inputs_of, loop, problem

from scanweaver.errors import ScanInputError
from scanweaver.fused import REGISTRY as FUSED
from scanweaver.fused.delta_rule import backward_reference, forward_reference

OP = FUSED.get("delta_rule")


def run(be, f, a, sizes, part="forward", do=None, **tunables):
    """The C kernel's outputs of ``part`` (NaN-filled first, so an unwritten element shows)."""
    cfg = OP.resolve("c", tunables, be.fused_defaults(OP.name, f, sizes), "test")
    out = {}
    for p, enabled, shape, dtype in OP.layout(part, f, tuple(sorted(sizes.items()))):
        if p.kind == "out" and enabled:
            out[p.name] = np.full(shape, np.nan, dtype)
    extra = {"do": do} if part == "backward" else {}
    be.run_fused(OP.call(part, f, cfg), {**a, **extra, **out}, sizes)
    return out


def reference(f, a, do=None):
    """The NumPy definition in float64 on the same (stored) operands: ``(o, hlast)``, or the gradients."""
    wide = {n: (x if n == "cu_seqlens" else np.asarray(x, np.float64)) for n, x in a.items()}
    args = (wide["q"], wide["k"], wide["v"])
    if do is None:
        return forward_reference(*args, **inputs_of(wide), l2norm=f.l2norm)
    return backward_reference(*args, **inputs_of(wide), l2norm=f.l2norm, do=np.asarray(do, np.float64),
                              dhlast=wide.get("dhlast"))


#: name -> (problem() keywords, (threads, block_v, checkpoint)): value columns in one block and in several, chunks
#: of 1 to 8 steps that do not divide the lengths (T = 1 shares the plain case's compiled kernels).
CASES = {"plain": ({"T": 21}, (1, 16, 4)), "one_step": ({"T": 1}, (1, 16, 4)),
         "groups_l2norm": ({"T": 17, "Hq": 1, "H": 3, "l2norm": True}, (2, 64, 8)),
         "packed": ({"seqlens": [5, 0, 13, 1], "Hq": 1}, (2, 4, 1))}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_float64_forward_and_backward_match_the_definition(cpu, family, case):
    rng = np.random.default_rng(len(family) * 13 + len(case))
    kw, (threads, block_v, checkpoint) = CASES[case]
    f, a, sizes = problem(rng, family, K=6, V=21, dhlast=True, **kw)
    ro, rh = reference(f, a)
    want_o, want_h = loop(family, a, 1.0, f.l2norm)
    np.testing.assert_allclose(ro, want_o, rtol=1e-10, atol=1e-10)
    got = run(cpu, f, a, sizes, threads=threads, block_v=block_v, checkpoint=checkpoint)
    np.testing.assert_allclose(got["o"], want_o, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(got["hlast"], want_h, rtol=1e-11, atol=1e-11)
    do = rng.normal(size=ro.shape)
    grads = reference(f, a, do)
    got = run(cpu, f, a, sizes, "backward", do, threads=threads, block_v=block_v, checkpoint=checkpoint)
    assert set(got) == {n for n, g in grads.items() if g is not None}
    for n, g in got.items():
        np.testing.assert_allclose(g, grads[n], rtol=1e-10, atol=1e-10, err_msg=n)


@pytest.mark.parametrize("family,K,V,lo,hi", [
    ("deltanet", 64, 64, -1.0, -0.1), ("gated", 128, 128, -20.0, -1e-4), ("kda", 64, 128, -20.0, -1e-4),
    ("kda", 128, 64, -0.5, -1e-4), ("rwkv7", 64, 64, -20.0, -1e-4), ("rwkv7", 128, 32, -8.0, -1e-3)])
def test_float32_at_realistic_sizes_and_strong_and_weak_decays(cpu, family, K, V, lo, hi):
    rng = np.random.default_rng(K + V)
    f, a, sizes = problem(rng, family, batch=1, T=77, H=2, Hq=1, K=K, V=V, lo=lo, hi=hi, dtype="float32",
                          dhlast=True, l2norm=family != "rwkv7")
    if "g" in a:
        a["g"][0, 40, 0] = -np.inf  # an exact reset on one head
    ro, rh = reference(f, a)
    got = run(cpu, f, a, sizes)
    np.testing.assert_allclose(got["o"], ro, atol=2e-5 * np.abs(ro).max(), rtol=0)
    np.testing.assert_allclose(got["hlast"], rh, atol=2e-5 * np.abs(rh).max(), rtol=0)
    do = rng.normal(size=ro.shape).astype(np.float32)
    grads = reference(f, a, do)
    got = run(cpu, f, a, sizes, "backward", do)
    for n, g in got.items():
        assert np.isfinite(g).all(), n
        np.testing.assert_allclose(g, grads[n], atol=1e-4 * max(1.0, np.abs(grads[n]).max()), rtol=0, err_msg=n)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("family", ["gated", "rwkv7"])
def test_half_storage_accumulates_in_float32(cpu, family, dtype):
    rng = np.random.default_rng(5)
    f, a, sizes = problem(rng, family, batch=1, T=40, H=2, Hq=2, K=32, V=48, dtype=dtype, dhlast=True)
    ro, rh = reference(f, a)
    got = run(cpu, f, a, sizes)
    assert got["o"].dtype.name == dtype and got["hlast"].dtype == np.float32
    ulp = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    np.testing.assert_allclose(got["o"].astype(np.float64), ro, atol=2 * ulp * np.abs(ro).max(), rtol=0)
    np.testing.assert_allclose(got["hlast"], rh, atol=2e-5 * np.abs(rh).max(), rtol=0)
    do = rng.normal(size=ro.shape).astype(got["o"].dtype)
    grads = reference(f, a, do)
    got = run(cpu, f, a, sizes, "backward", do)
    assert got["dq"].dtype.name == dtype and got["dh0"].dtype == np.float32
    for n, g in got.items():
        np.testing.assert_allclose(np.asarray(g, np.float64), grads[n], atol=2 * ulp * np.abs(grads[n]).max(),
                                   rtol=0, err_msg=n)


SCRIPT = r"""
import json, sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from delta_family import problem
from scanweaver.fused import REGISTRY
from scanweaver.fused.delta_rule import backward_reference, forward_reference
from scanweaver.runtime import get_backend
op, cpu, out = REGISTRY.get("delta_rule"), get_backend("cpu"), {}

def run():
    f, a, sizes = problem(np.random.default_rng(0), "kda", batch=1, T=3, H=1, Hq=1, K=65536, V=3, dtype="float32")
    cfg = op.resolve("c", {}, cpu.fused_defaults(op.name, f, sizes), "t")
    o, h = np.empty(a["v"].shape, np.float32), np.empty(a["h0"].shape, np.float32)
    cpu.run_fused(op.call("forward", f, cfg), {**a, "o": o, "hlast": h}, sizes)
    wide = {n: np.asarray(x, np.float64) for n, x in a.items()}
    ro, _ = forward_reference(wide["q"], wide["k"], wide["v"], wide["beta"], g=wide["g"], h0=wide["h0"])
    do = np.ones_like(o)
    g = {"dq": np.empty(a["q"].shape, np.float32), "dk": np.empty(a["k"].shape, np.float32),
         "dv": np.empty(a["v"].shape, np.float32), "dg": np.empty(a["g"].shape, np.float32),
         "dbeta": np.empty(a["beta"].shape, np.float32), "dh0": np.empty(a["h0"].shape, np.float32)}
    cpu.run_fused(op.call("backward", f, cfg), {**a, "do": do, **g}, sizes)
    want = backward_reference(wide["q"], wide["k"], wide["v"], wide["beta"], g=wide["g"], h0=wide["h0"],
                              do=do.astype(np.float64))
    out["o"] = float(np.abs(o - ro).max() / np.abs(ro).max())
    out["dk"] = float(np.abs(g["dk"] - want["dk"]).max() / np.abs(want["dk"]).max())

threading.stack_size(256 * 1024)
t = threading.Thread(target=run)
t.start()
t.join()
print(json.dumps(out))
"""


def test_a_huge_key_dimension_runs_from_a_small_thread_stack(cpu):
    """K = 65536: the state tiles, packed rows and sums are heap scratch (a crash would show as a signal)."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(Path(__file__).parent)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    errs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert errs["o"] < 1e-4 and errs["dk"] < 1e-3, errs


def test_the_kernels_honour_the_fork_safe_thread_cap(cpu):
    """Each unit defines ``sw_thread_cap`` (set to 1 in a process forked after kernels ran) and its
    ``sw_threads`` obeys it, as the scans' do."""
    from scanweaver.runtime import toolchain
    from scanweaver.targets import TARGETS
    from scanweaver.targets.fused import kernel_for

    f, a, sizes = problem(np.random.default_rng(2), "gated", T=9, K=6, V=21)
    cfg = OP.resolve("c", {}, cpu.fused_defaults(OP.name, f, sizes), "test")
    for part in ("forward", "backward"):
        source = kernel_for(cpu.target, OP.name).render(TARGETS.get(cpu.target)(), OP.call(part, f, cfg))
        assert "sw_thread_cap > 0 && n > sw_thread_cap" in source
        lib = toolchain.find_toolchain().load(source)
        assert ctypes.c_int.in_dll(lib, "sw_thread_cap").value == 0


def test_bad_offsets_and_tunables_are_clear_errors(cpu):
    rng = np.random.default_rng(1)
    f, a, sizes = problem(rng, "gated", seqlens=[4, 6])
    a["cu_seqlens"] = np.array([0, 7, 5], np.int64)
    with pytest.raises(ScanInputError, match="cu_seqlens"):
        run(cpu, f, a, sizes)
    for bad in ({"checkpoint": 12}, {"block_v": 3}, {"algorithm": "wy"}, {"chunk": 0}, {"threads": 5000},
                {"width": 32}):
        with pytest.raises(ScanInputError, match=next(iter(bad))):
            OP.resolve("c", bad, {}, "test")
