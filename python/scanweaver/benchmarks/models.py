"""The model scans of the GPU scoreboard: Mamba-1, Mamba-2 and GLA, ours beside their reference libraries.

Part of ``scanweaver bench --suite gpu``.  Per model, every entry first runs
on a small check shape on the GPU with float32 tensors that need gradients;
its output and the gradient of ``sum(y * w)`` for every input are compared
with the float64 host reference of :mod:`.model_refs` (relative to the
largest reference value).  An entry that fails the check is not timed.  Then
forward and forward + backward are timed on the model's shape (median of
synchronised calls after a warm-up).

Entries (each skipped with the reason where it cannot run):

* ``mamba1``: ``scanweaver.torch.mamba_selective_scan`` (the fused CUDA kernels) and mamba-ssm's
  ``selective_scan_ref`` in PyTorch on the GPU (mamba-ssm's CUDA extension needs a build with
  nvcc and a package registry, which the GPU machine lacks, so it is not an entry);
* ``mamba2``: ``scanweaver.mamba2_scan`` and mamba-ssm's Triton ``mamba_chunk_scan_combined``;
* ``gla``: ``scanweaver.linear_attention`` and flash-linear-attention's Triton ``chunk_gla``;
* ``gated_delta``: ``scanweaver.gated_delta_rule`` (where this tree has it) and flash-linear-attention's Triton
  ``chunk_gated_delta_rule``.

mamba-ssm and flash-linear-attention come from ``.deps/site`` (``bench/gpu_deps.sh``).

Example:
    >>> from scanweaver.benchmarks import models
    >>> sorted({e.model for e in models.ENTRIES})
    ['gated_delta', 'gla', 'mamba1', 'mamba2']
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import statistics
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import model_refs

#: Model -> (check shape, timed shape, quick timed shape); sizes as in :func:`.model_refs.inputs`.
SHAPES = {"mamba1": ((1, 32, 8, 300), (4, 1536, 16, 2048), (1, 64, 16, 256)),
          "mamba2": ((1, 300, 4, 16, 16), (4, 2048, 32, 64, 128), (1, 256, 4, 16, 16)),
          "gla": ((1, 300, 2, 32, 32), (4, 2048, 16, 128, 128), (1, 256, 2, 32, 32)),
          "gated_delta": ((1, 300, 2, 32, 32), (4, 2048, 16, 128, 128), (1, 256, 2, 32, 32))}
#: Largest relative error (to the reference's largest value) of an output or gradient that passes: float32
#: kernels whose chunked forms take products in TF32 (Triton's default for float32 dots) land near 1e-3.
TOLERANCE = 1e-2


@functools.cache
def mamba_ssm_module(name: str):
    """Module ``mamba_ssm.<name>`` loaded without the package's ``__init__`` (which imports its CUDA
    extension): the pure-Python and Triton files only; ``selective_scan_cuda`` is stubbed when absent."""
    if not hasattr(sys.modules.get("mamba_ssm"), "__path__"):
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("mamba_ssm is not importable (bench/gpu_deps.sh unpacks it into .deps/site)")
        # the package object with its spec and path, its __init__ not run (a second call finds it as it is)
        sys.modules["mamba_ssm"] = importlib.util.module_from_spec(spec)
    if "selective_scan_cuda" not in sys.modules and importlib.util.find_spec("selective_scan_cuda") is None:
        sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    return importlib.import_module(f"mamba_ssm.{name}")


def _scanweaver(name: str) -> Callable:
    import scanweaver

    fn = getattr(scanweaver, name, None)
    if fn is None:
        raise ImportError(f"scanweaver.{name} does not exist yet in this tree")
    return fn


def _mamba1_ours():
    import scanweaver.torch as swt

    return lambda i: swt.mamba_selective_scan(i["u"], i["delta"], i["A"], i["B"], i["C"], i["D"],
                                              delta_bias=i["delta_bias"], delta_softplus=True)


def _mamba1_ref():
    ref = mamba_ssm_module("ops.selective_scan_interface").selective_scan_ref
    return lambda i: ref(i["u"], i["delta"], i["A"], i["B"], i["C"], i["D"], delta_bias=i["delta_bias"],
                         delta_softplus=True)


def _mamba2_ours():
    fn = _scanweaver("mamba2_scan")
    return lambda i: _first(fn(i["x"], i["dt"], i["A"], i["B"], i["C"], D=i["D"], dt_bias=i["dt_bias"],
                               dt_softplus=True))


def _mamba2_peer():
    fn = mamba_ssm_module("ops.triton.ssd_combined").mamba_chunk_scan_combined
    return lambda i: _first(fn(i["x"], i["dt"], i["A"], i["B"], i["C"], 256, D=i["D"], dt_bias=i["dt_bias"],
                               dt_softplus=True))


def _gla_ours():
    fn = _scanweaver("linear_attention")
    return lambda i: _first(fn(i["q"], i["k"], i["v"], g=i["g"]))


def _gla_peer():
    from fla.ops.gla import chunk_gla

    return lambda i: chunk_gla(i["q"], i["k"], i["v"], i["g"])[0]


def _gated_delta_ours():
    fn = _scanweaver("gated_delta_rule")
    return lambda i: _first(fn(i["q"], i["k"], i["v"], i["g"], i["beta"]))


def _gated_delta_peer():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return lambda i: chunk_gated_delta_rule(i["q"], i["k"], i["v"], i["g"], i["beta"])[0]


def _first(result):
    return result[0] if isinstance(result, tuple) else result


@dataclass(frozen=True)
class ModelEntry:
    """One timed entry of the model table: ``load()`` returns ``call(inputs) -> y`` or raises ImportError."""

    name: str
    label: str
    model: str
    kind: str
    load: Callable[[], Callable[[dict], Any]]


ENTRIES = (
    ModelEntry("scanweaver-mamba1", "scanweaver.torch.mamba_selective_scan (fused CUDA)", "mamba1", "ours",
               _mamba1_ours),
    ModelEntry("mamba-ssm-ref", "mamba-ssm selective_scan_ref (PyTorch, GPU)", "mamba1", "peer", _mamba1_ref),
    ModelEntry("scanweaver-mamba2", "scanweaver.mamba2_scan", "mamba2", "ours", _mamba2_ours),
    ModelEntry("mamba-ssm-chunk-scan", "mamba-ssm mamba_chunk_scan_combined (Triton)", "mamba2", "peer", _mamba2_peer),
    ModelEntry("scanweaver-gla", "scanweaver.linear_attention (GLA)", "gla", "ours", _gla_ours),
    ModelEntry("fla-chunk-gla", "flash-linear-attention chunk_gla (Triton)", "gla", "peer", _gla_peer),
    ModelEntry("scanweaver-gated-delta", "scanweaver.gated_delta_rule", "gated_delta", "ours", _gated_delta_ours),
    ModelEntry("fla-chunk-gated-delta-rule", "flash-linear-attention chunk_gated_delta_rule (Triton)", "gated_delta",
               "peer", _gated_delta_peer),
)
#: Why the mamba-ssm CUDA kernel is not an entry.
NOTES = ("mamba-ssm's CUDA extension (selective_scan_cuda) is not an entry: it builds with nvcc from its sources "
         "through a package registry, which the GPU machine has no route to.",)


@dataclass
class ModelResult:
    """One entry's outcome: ``ok`` (checked and timed), ``failed`` (wrong: not timed), ``skipped``, ``error``."""

    entry: str
    label: str
    model: str
    kind: str
    shape: tuple[int, ...]
    status: str = "skipped"
    reason: str = ""
    errors: dict[str, float] = field(default_factory=dict)
    forward_ms: float | None = None
    backward_ms: float | None = None


def cuda_reason() -> str | None:
    """``None`` when PyTorch sees a CUDA device, else why not."""
    try:
        import torch
    except ImportError:
        return "needs an NVIDIA GPU: torch is not installed"
    return None if torch.cuda.is_available() else "needs an NVIDIA GPU: torch.cuda.is_available() is False here"


def check(call: Callable[[dict], Any], model: str, shape: tuple, device: str = "cuda") -> dict[str, float]:
    """Relative errors of ``call``'s output (``y``) and of every input's gradient against the float64 reference."""
    import torch

    ins = {k: v.requires_grad_(True) for k, v in model_refs.inputs(model, shape, torch.float32, device, seed=1).items()}
    y = call(ins)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref_y, ref_g = model_refs.reference(model, ins, w)
    errors = {"y": _rel(y, ref_y)}
    if y.requires_grad:
        (y * w.to(device=y.device, dtype=y.dtype)).sum().backward()
        errors.update({f"d{k}": _rel(v.grad, ref_g[k]) for k, v in ins.items()})
    return errors


def _rel(got, want) -> float:
    import torch

    if got is None or tuple(got.shape) != tuple(want.shape):
        return float("inf")
    g = got.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(g).all()):
        return float("inf")
    return float((g - want).abs().max() / max(float(want.abs().max()), 1e-30))


def time_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of ``fn()`` (synchronised) after one warm-up."""
    import torch

    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_entry(entry: ModelEntry, quick: bool = False, repeats: int = 10) -> ModelResult:
    """Checks ``entry`` against the float64 reference, then times forward and forward + backward."""
    check_shape, shape, quick_shape = SHAPES[entry.model]
    res = ModelResult(entry.name, entry.label, entry.model, entry.kind, quick_shape if quick else shape)
    why = cuda_reason()
    if why is None:
        try:
            call = entry.load()
        except Exception as exc:  # a library that does not import here is a skip with its reason
            why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        res.reason = why
        return res
    import torch

    try:
        res.errors = check(call, entry.model, check_shape)
        bad = {k: v for k, v in res.errors.items() if not v <= TOLERANCE}
        if bad:
            res.status, res.reason = "failed", f"over {TOLERANCE:g} against the float64 reference: {bad}"
            return res
        ins = {k: v.requires_grad_(True) for k, v in model_refs.inputs(entry.model, res.shape, torch.float32,
                                                                      "cuda").items()}
        res.forward_ms = time_ms(lambda: call(ins), repeats)
        if len(res.errors) > 1:
            y = call(ins)
            w = torch.randn_like(y)
            res.backward_ms = time_ms(lambda: torch.autograd.grad(call(ins), list(ins.values()), w, allow_unused=True),
                                      repeats)
        else:
            res.reason = "no gradients through this call: forward only"
        res.status = "ok"
    except Exception as exc:  # reported, never hidden: an entry that raises is an error row
        res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"
    return res


def run(quick: bool = False, repeats: int = 10, log: Callable[[str], None] | None = None,
        budget_s: float = float("inf"),
        on_result: Callable[[list[ModelResult]], None] | None = None,
        only: tuple[str, ...] = ()) -> list[ModelResult]:
    """Every entry of :data:`ENTRIES`, in order; entries not started within ``budget_s`` seconds are skipped
    with that reason (a Triton peer may compile and autotune for a minute).  ``on_result`` gets the results
    so far after each entry (to write them before a time limit cuts the run); ``only`` keeps the entries of
    those models (all when empty)."""
    out = []
    start = time.perf_counter()
    for entry in ENTRIES:
        if only and entry.model not in only:
            continue
        spent = time.perf_counter() - start
        if spent >= budget_s:
            shape = SHAPES[entry.model][2 if quick else 1]
            r = ModelResult(entry.name, entry.label, entry.model, entry.kind, shape,
                            reason=f"time budget: {spent:.0f} s of {budget_s:g} s spent before it started")
        else:
            r = run_entry(entry, quick, repeats)
        if log is not None:
            log(f"models: {r.entry} {r.status} {r.reason}".rstrip())
        out.append(r)
        if on_result is not None:
            on_result(out)
    return out


def markdown(results: list[ModelResult]) -> str:
    """The model table: per entry its check errors and times; for ours, the fastest checked peer's time
    of the same model divided by ours (above 1: ours is faster)."""
    lines = ["## Model scans on the GPU (float32; checked against a float64 host reference first)", "",
             "| model | entry | shape | status | max error (y, grads) | forward ms | fwd+bwd ms | peer/ours fwd, "
             "fwd+bwd |", "|---|---|---|---|---|---|---|---|"]

    def fastest(model: str, attr: str) -> float | None:
        times = [getattr(r, attr) for r in results if r.model == model and r.kind == "peer" and r.status == "ok"
                 and getattr(r, attr) is not None]
        return min(times) if times else None

    def ratio(peer: float | None, ours: float | None) -> str:
        return f"{peer / ours:.2f}x" if peer is not None and ours else "-"

    for r in results:
        err = f"{max(r.errors.values()):.1e}" if r.errors else "-"
        f = f"{r.forward_ms:.3f}" if r.forward_ms is not None else "-"
        b = f"{r.backward_ms:.3f}" if r.backward_ms is not None else "-"
        vs = (f"{ratio(fastest(r.model, 'forward_ms'), r.forward_ms)}, "
              f"{ratio(fastest(r.model, 'backward_ms'), r.backward_ms)}") if r.kind == "ours" else ""
        status = r.status if r.status == "ok" else f"{r.status}: {r.reason}"
        lines.append(f"| {r.model} | {r.label} | {'x'.join(map(str, r.shape))} | {status} | {err} | {f} | {b} | "
                     f"{vs} |")
    return "\n".join([*lines, "", *(f"- {n}" for n in NOTES), ""])


def failed_ours(results: list[ModelResult]) -> list[ModelResult]:
    """Our entries that failed their correctness check or raised."""
    return [r for r in results if r.kind == "ours" and r.status in ("failed", "error")]
