"""Mamba-1 selective scan on the CPU: the fused kernels against mamba-ssm's reference, ggml and the bounds.

For each (batch, D, N, L), float32, with D, z, delta_bias and delta_softplus,
in one process: time (median of repeated calls after a warm-up) and, in a
fresh process per entry after a warm-up on a small problem, peak extra
memory (the rise of the resident set's high-water mark during the first full
call, reset through ``/proc/self/clear_refs``) of

* ``ours fwd``: ``scanweaver.mamba_selective_scan`` (the fused C kernel; the
  output allocation included);
* ``ours fwd+bwd``: the fused forward and backward (``scanweaver.mamba.forward``
  and ``backward``: every gradient, states recomputed from checkpoints), and
  the same through ``scanweaver.torch.mamba_selective_scan`` with autograd
  (``ours torch fwd+bwd``, the like-for-like peer of the reference's autograd);
* ``ref fwd`` / ``ref fwd+bwd``: mamba-ssm's pure-PyTorch ``selective_scan_ref``
  (``pip install mamba-ssm==2.3.2.post1`` with ``MAMBA_SKIP_CUDA_BUILD=TRUE
  MAMBA_FORCE_BUILD=TRUE --no-build-isolation --no-deps``, plus einops), loaded
  from its file with stubs for its CUDA extension and Triton imports.  Its
  autograd backward takes minutes: by default it is timed on the first
  ``--ref-bwd-L`` steps and scaled to L (its cost is linear in L: one Python
  step per t); ``--full-ref`` times the whole sequence;
* ``scan path``: ``fused=False``, the materialising lowering;
* ``ggml``: llama.cpp's ``ggml_ssm_scan`` (``pip install ggml-python``), its
  graph compute only, on time-major copies of the inputs (its layout); it
  computes softplus(dt), the scan and the C contraction (no D, no z);

and two bounds measured in the same process: *compute*, the vector
instructions of one (b, d, n, t) step (a 2^x of a product: 9, then 4
multiply-adds) at the FMA rate of this machine's vectors on every core; and
*memory*, the bytes of the inputs and the output at the bandwidth of the
roofline kernel (:mod:`scanweaver.runtime.roofline`).  Every output is
checked first (ours against the float64 oracle on a slice of channels, the
peers against ours).

Usage::

    python bench/mamba.py [--json] [--quick] [--full-ref] [--torch-threads N] [--shapes 2x768x16x2048,...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import importlib.util
import json
import statistics
import sys
import time
import types

import numpy as np

import scanweaver
from scanweaver import mamba
from scanweaver.fused.mamba1 import forward_reference
from scanweaver.runtime import roofline
from scanweaver.runtime.cpu_backend import cpu_model, cpu_threads, simd_bytes
from scanweaver.runtime.toolchain import find_toolchain

SHAPES = ((2, 768, 16, 2048), (1, 1536, 16, 8192))
QUICK = ((1, 128, 16, 512),)
#: Vector instructions of one (b, d, n, t) step of the fused forward: dt*A, 2^x (round, reduce,
#: 6 polynomial multiply-adds, scale), dt*u*B, the state's multiply-add and the contraction's.
OPS_PER_STEP = 13


def rss() -> tuple[int, int]:
    """(current resident bytes, peak resident bytes) of this process."""
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def peak_extra(fn):
    """``(result, bytes)``: what ``fn()`` returns and how far the peak RSS rose above the RSS before it.

    Free heap memory is returned to the system first (glibc ``malloc_trim``), so that an allocation
    cannot hide in pages the process still holds from earlier temporaries.
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    before = rss()[0]
    out = fn()
    return out, max(0, rss()[1] - before)


def timed(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` after one warm-up."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def inputs(batch: int, D: int, N: int, L: int) -> dict[str, np.ndarray]:
    """Mamba-like float32 operands: softplus(delta + bias) mostly in (0.001, 0.1), A = -(1..16)."""
    rng = np.random.default_rng(0)
    f = np.float32
    return {"u": rng.standard_normal((batch, D, L), f), "delta": rng.standard_normal((batch, D, L), f) - 4,
            "A": -(1 + 15 * rng.random((D, N), f)), "B": rng.standard_normal((batch, N, L), f),
            "C": rng.standard_normal((batch, N, L), f), "D": rng.standard_normal(D, f),
            "z": rng.standard_normal((batch, D, L), f), "delta_bias": rng.random(D, f) - 0.5}


def nbytes(ops: dict) -> int:
    """Bytes of the inputs plus the output y."""
    return sum(a.nbytes for a in ops.values()) + ops["u"].nbytes


def check_slice(ops: dict, y: np.ndarray, channels: int = 8) -> float:
    """Max error of ``y`` on the first channels against the float64 oracle, relative to max |y|."""
    wide = {k: v.astype(np.float64) for k, v in ops.items()}
    sl = slice(0, channels)
    ey, _ = forward_reference(wide["u"][:, sl], wide["delta"][:, sl], wide["A"][sl], wide["B"][:, None],
                              wide["C"][:, None], wide["D"][sl], wide["z"][:, sl], wide["delta_bias"][sl], True)
    return float(np.abs(y[:, sl] - ey).max() / np.abs(ey).max())


@functools.cache
def load_reference():
    """mamba-ssm's ``selective_scan_ref``, or the reason it cannot be loaded."""
    spec = importlib.util.find_spec("mamba_ssm")
    if spec is None or importlib.util.find_spec("torch") is None or importlib.util.find_spec("einops") is None:
        return None, "mamba-ssm, torch or einops is not installed"
    base = spec.submodule_search_locations[0]
    stub_ln = types.ModuleType("mamba_ssm.ops.triton.layer_norm")
    stub_ln._layer_norm_fwd = None
    pkg = types.ModuleType("mamba_ssm")
    pkg.__path__ = [base]
    for name, mod in (("selective_scan_cuda", types.ModuleType("selective_scan_cuda")),
                      ("mamba_ssm.ops.triton.layer_norm", stub_ln), ("mamba_ssm", pkg)):
        sys.modules.setdefault(name, mod)
    loc = importlib.util.spec_from_file_location("mamba_ssm.ops.selective_scan_interface",
                                                 f"{base}/ops/selective_scan_interface.py")
    module = importlib.util.module_from_spec(loc)
    loc.loader.exec_module(module)
    return module.selective_scan_ref, ""


def ggml_entry(ops: dict, y_plain: np.ndarray, repeats: int) -> dict:
    """llama.cpp's ggml_ssm_scan, checked against our fused y without D and z: the time of its graph
    compute, and the peak extra memory of its set-up (inputs copied into its context) and first compute."""
    try:
        import ggml
        from ggml.utils import to_numpy
    except ImportError as exc:
        return {"skipped": f"ggml-python is not installed ({exc})"}
    holder: dict = {}
    _, extra = peak_extra(lambda: holder.update(_ggml_graph(ggml, ops)))
    ctx, out, run = holder["ctx"], holder["out"], holder["run"]
    try:
        batch, D, L = ops["u"].shape
        y = to_numpy(out)[: batch * L * D].reshape(batch, L, D).transpose(0, 2, 1)
        err = float(np.abs(y - y_plain).max() / np.abs(y_plain).max())
        if err > 1e-3:
            return {"failed": f"ggml_ssm_scan differs from the fused kernel by {err:.2e} (relative)"}
        return {"s": timed(run, repeats), "peak_extra_bytes": extra, "rel_err_vs_ours": err,
                "note": "graph compute; its time-major copies of the inputs made beforehand; no D, no z"}
    finally:
        ggml.ggml_free(ctx)


def _ggml_graph(ggml, ops: dict) -> dict:
    """A ggml context holding the inputs in its layout (time-major), the ssm_scan graph, computed once."""
    batch, D, L = ops["u"].shape
    N = ops["A"].shape[1]
    tm = {"x": ops["u"].transpose(0, 2, 1), "dt": (ops["delta"] + ops["delta_bias"][:, None]).transpose(0, 2, 1),
          "B": ops["B"].transpose(0, 2, 1), "C": ops["C"].transpose(0, 2, 1)}
    mem = sum(v.nbytes for v in tm.values()) + 2 * batch * D * (L + N) * 4 + (16 << 20)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None))

    def tensor(shape, data):
        make = {1: ggml.ggml_new_tensor_1d, 2: ggml.ggml_new_tensor_2d, 3: ggml.ggml_new_tensor_3d,
                4: ggml.ggml_new_tensor_4d}[len(shape)]
        t = make(ctx, ggml.GGML_TYPE_I32 if data.dtype == np.int32 else ggml.GGML_TYPE_F32, *shape)
        dst = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(t), ctypes.POINTER(ctypes.c_byte)),
                                    (data.nbytes,)).view(data.dtype).reshape(data.shape)
        dst[...] = data
        return t

    s = tensor((N, 1, D, batch), np.zeros((batch, D, 1, N), np.float32))
    x = tensor((1, D, L, batch), tm["x"])
    dt = tensor((D, L, batch), tm["dt"])
    A = tensor((N, D), np.ascontiguousarray(ops["A"]))
    Bt = tensor((N, 1, L, batch), tm["B"])
    Ct = tensor((N, 1, L, batch), tm["C"])
    ids = tensor((batch,), np.arange(batch, dtype=np.int32))
    out = ggml.ggml_ssm_scan(ctx, s, x, dt, A, Bt, Ct, ids)
    graph = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(graph, out)
    threads = cpu_threads()

    def run():
        ggml.ggml_graph_compute_with_ctx(ctx, graph, threads)

    run()
    return {"ctx": ctx, "out": out, "run": run}


FMA_SOURCE = r"""
typedef float sw_v __attribute__((vector_size(@VB@)));
double sw_fma_rate(long iters) {  /* vector multiply-adds per second on every core */
  double t0 = 0, t1 = 0;
  long total = 0;
#pragma omp parallel reduction(+:total)
  {
    sw_v x[12], m, c;
    for (int k = 0; k < 12; ++k) { x[k] = (sw_v){0} + 1.0f + 1e-3f * k; }
    m = (sw_v){0} + 0.9999f; c = (sw_v){0} + 1e-4f;
#pragma omp barrier
#pragma omp master
    t0 = omp_get_wtime();
    for (long i = 0; i < iters; ++i)
      for (int k = 0; k < 12; ++k) x[k] = x[k] * m + c;
    float s = 0;
    for (int k = 0; k < 12; ++k) s += x[k][0];
    total += 12 * iters + (s == 12345.f);
#pragma omp barrier
#pragma omp master
    t1 = omp_get_wtime();
  }
  return (double)total / (t1 - t0);
}
"""


def bounds(batch: int, D: int, N: int, L: int, ops: dict) -> dict:
    """Compute and memory bounds of the fused forward, measured here."""
    vb = simd_bytes()
    fn = find_toolchain().load("#include <omp.h>\n" + FMA_SOURCE.replace("@VB@", str(vb))).sw_fma_rate
    fn.argtypes, fn.restype = [ctypes.c_long], ctypes.c_double
    rate = max(fn(20_000_000) for _ in range(3))
    steps = batch * D * N * L
    roof = roofline.measure_roofline(1, 1 << 24, "float32", repeats=3)
    bandwidth = roofline.bytes_per_element("float32") * (1 << 24) / roof
    return {"compute_s": steps * OPS_PER_STEP / (vb // 4) / rate, "vector_fma_per_s": rate,
            "memory_s": nbytes(ops) / bandwidth, "bandwidth_GB_s": bandwidth / 1e9}


def entries(ops: dict, ref_steps: int) -> dict:
    """Name -> zero-argument call of every entry on ``ops`` (the reference backward on ``ref_steps`` steps)."""
    kw = dict(D=ops["D"], z=ops["z"], delta_bias=ops["delta_bias"], delta_softplus=True, backend="cpu")
    args = (ops["u"], ops["delta"], ops["A"], ops["B"], ops["C"])
    dout = np.random.default_rng(1).standard_normal(ops["u"].shape, np.float32)

    def fwd_bwd():
        prep = mamba.prepare(*args, ops["D"], ops["z"], ops["delta_bias"], True)
        mamba.forward(prep, backend="cpu", return_state=False)
        return mamba.backward(prep, dout, backend="cpu")

    calls = {"ours fwd": lambda: scanweaver.mamba_selective_scan(*args, **kw), "ours fwd+bwd": fwd_bwd,
             "scan path": lambda: scanweaver.mamba_selective_scan(*args, **kw, fused=False)}
    if importlib.util.find_spec("torch") is not None:
        import torch

        import scanweaver.torch as swt

        leaves = {k: torch.from_numpy(v).requires_grad_(True) for k, v in ops.items()}
        dy = torch.from_numpy(dout)

        def torch_fwd_bwd():
            for v in leaves.values():
                v.grad = None
            y = swt.mamba_selective_scan(**leaves, delta_softplus=True, backend="cpu")
            y.backward(dy)

        calls["ours torch fwd+bwd"] = torch_fwd_bwd
    ref, _ = load_reference()
    if ref is not None:
        import torch

        t = [torch.from_numpy(ops[k]) for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
        sub = [a[..., :ref_steps].clone().requires_grad_(True) if a.ndim == 3 else a.clone().requires_grad_(True)
               for a in t]

        def ref_fwd():
            with torch.no_grad():
                return ref(*t, True)

        def ref_fwd_bwd():
            for a in sub:
                a.grad = None
            res = ref(*sub, True)
            res.backward(torch.ones_like(res))

        calls["ref fwd"], calls["ref fwd+bwd"] = ref_fwd, ref_fwd_bwd
    return calls


def warm_ops(ops: dict) -> dict:
    """A small problem with the same features (the same compiled kernels), to warm up before measuring."""
    return {k: np.ascontiguousarray(v[:1, :8, :64] if v.ndim == 3 else v[:8]) if k != "A" else v[:8]
            for k, v in ops.items()}


def measure_memory(shape: tuple, name: str, ref_steps: int) -> int:
    """Peak extra bytes of the first call of entry ``name``, in this (fresh) process, after a warm-up."""
    ops = inputs(*shape)
    small = warm_ops(ops)
    small["B"], small["C"] = (np.ascontiguousarray(ops[k][:1, :, :64]) for k in ("B", "C"))
    entries(small, 32)[name]()
    return peak_extra(entries(ops, ref_steps)[name])[1]


def memory_in_subprocess(shape: tuple, name: str, ref_steps: int) -> int | None:
    """:func:`measure_memory` in a fresh interpreter (freed memory of other entries is not recycled)."""
    import subprocess

    code = (f"import sys; sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r}); import mamba as m; "
            f"print(m.measure_memory({tuple(shape)!r}, {name!r}, {ref_steps}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    return int(proc.stdout.split()[-1]) if proc.returncode == 0 and proc.stdout.strip() else None


def bench_shape(batch: int, D: int, N: int, L: int, repeats: int, full_ref: bool, bwd_L: int) -> dict:
    ops = inputs(batch, D, N, L)
    steps = L if full_ref else min(L, bwd_L)
    calls = entries(ops, steps)
    y = calls["ours fwd"]()
    res: dict = {"shape": [batch, D, N, L], "inputs_output_bytes": nbytes(ops), "config": mamba.last.config,
                 "ours fwd": {"s": timed(calls["ours fwd"], repeats), "rel_err_vs_oracle": check_slice(ops, y)},
                 "ours fwd+bwd": {"s": timed(calls["ours fwd+bwd"], max(1, repeats // 2))}}
    if "ours torch fwd+bwd" in calls:
        res["ours torch fwd+bwd"] = {"s": timed(calls["ours torch fwd+bwd"], max(1, repeats // 2)),
                                     "note": "scanweaver.torch.mamba_selective_scan, autograd"}
    if "ref fwd" in calls:
        err = float(np.abs(calls["ref fwd"]().numpy() - y).max() / np.abs(y).max())
        res["ref fwd"] = {"s": timed(calls["ref fwd"], max(1, repeats // 3)), "rel_err_vs_ours": err}
        t0 = time.perf_counter()
        calls["ref fwd+bwd"]()
        note = "timed on the whole sequence" if steps == L else f"timed on L={steps}, scaled to L={L} (linear in L)"
        res["ref fwd+bwd"] = {"s": (time.perf_counter() - t0) * L / steps, "note": note}
    else:
        why = load_reference()[1]
        res["ref fwd"], res["ref fwd+bwd"] = {"skipped": why}, {"skipped": why}
    ys = calls["scan path"]()
    res["scan path"] = {"s": timed(calls["scan path"], max(1, repeats // 3)),
                        "rel_err_vs_ours": float(np.abs(ys - y).max() / np.abs(y).max())}
    del ys
    plain = scanweaver.mamba_selective_scan(ops["u"], ops["delta"] + ops["delta_bias"][:, None], ops["A"], ops["B"],
                                            ops["C"], delta_softplus=True, backend="cpu")
    res["ggml"] = ggml_entry(ops, plain, repeats)
    for name in calls:
        res[name]["peak_extra_bytes"] = memory_in_subprocess((batch, D, N, L), name, steps)
    res["bounds"] = bounds(batch, D, N, L, ops)
    ours = res["ours fwd"]["s"]
    res["ratios"] = {k: v["s"] / (ours if "bwd" not in k else res["ours fwd+bwd"]["s"])
                     for k, v in res.items() if isinstance(v, dict) and "s" in v and not k.startswith("ours")}
    if "ours torch fwd+bwd" in res and "s" in res.get("ref fwd+bwd", {}):
        res["ratios"]["ref fwd+bwd / ours torch fwd+bwd"] = res["ref fwd+bwd"]["s"] / res["ours torch fwd+bwd"]["s"]
    res["ratios"]["compute bound / ours fwd"] = res["bounds"]["compute_s"] / ours
    res["ratios"]["memory bound / ours fwd"] = res["bounds"]["memory_s"] / ours
    mem = res["ours fwd"]["peak_extra_bytes"]
    if mem is not None:
        res["ratios"]["ours fwd peak extra / (inputs + output)"] = mem / nbytes(ops)
    return res


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        size = r["inputs_output_bytes"] / 2**20
        lines.append(f"(batch, D, N, L) = {tuple(r['shape'])}; inputs + output {size:.0f} MiB; "
                     f"fused config {r['config']}")
        for k, v in r.items():
            if not isinstance(v, dict) or k in ("bounds", "ratios", "config"):
                continue
            if "s" not in v:
                lines.append(f"  {k:<20} {v.get('skipped') or v.get('failed')}")
                continue
            mem = v.get("peak_extra_bytes")
            mem_text = "   n/a" if mem is None else f"{mem / 2**20:8.1f} MiB"
            lines.append(f"  {k:<20} {v['s'] * 1e3:10.1f} ms  peak extra {mem_text}  {v.get('note', '')}")
        b = r["bounds"]
        lines.append(f"  compute bound  {b['compute_s'] * 1e3:10.1f} ms   memory bound {b['memory_s'] * 1e3:.1f} ms "
                     f"({b['bandwidth_GB_s']:.1f} GB/s)")
        lines += [f"  {k}: {v:.3g}" for k, v in r["ratios"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--quick", action="store_true", help="one small shape, few repeats (seconds)")
    p.add_argument("--repeats", type=int, default=7, help="timed runs of our calls (fewer for the slow peers)")
    p.add_argument("--full-ref", action="store_true", help="time selective_scan_ref's backward on the whole L")
    p.add_argument("--ref-bwd-L", type=int, default=256, help="steps the reference backward is timed on")
    p.add_argument("--torch-threads", type=int, help="torch.set_num_threads for the reference (default: torch's)")
    p.add_argument("--shapes", help="BxDxNxL,... (default: 2x768x16x2048,1x1536x16x8192)")
    args = p.parse_args(argv)
    shapes = QUICK if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    repeats = 2 if args.quick else args.repeats
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    results = [bench_shape(*s, repeats, args.full_ref, args.ref_bwd_L) for s in shapes]
    report = {"device": f"{cpu_model()} ({cpu_threads()} threads)", "dtype": "float32", "shapes": results}
    print(json.dumps(report, indent=1) if args.json else f"{report['device']}\n{table(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
