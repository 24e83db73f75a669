"""GPU peers: the PyTorch loop, torch.compile'd associative_scan, accelerated-scan (Triton and warp), and the
GPU roofline.

Each takes NumPy operands (copied to the GPU before timing) or, in the ``gpu``
suite, CuPy operands made on the GPU (shared with PyTorch through DLPack, no
copy).  Every call ends with a synchronisation, so the harness's host timer
measures the work, as a user of these libraries would see it (their own
``b*x`` and ``c*`` passes included).  On a machine without CUDA each is
listed as skipped with the reason.  JAX's ``associative_scan`` runs on the GPU
through :mod:`.jax_peers` wherever JAX sees one.
"""

from __future__ import annotations

import functools
import os

from . import Peer, installed, register
from .torch_peers import combine


#: Longest L the torch.compile'd associative_scan runs at (compiles take tens of seconds per shape).
MAX_COMPILED_L = 4096
#: Set to 1 to skip accelerated-scan's warp kernel (and its build at import).
SKIP_WARP_BUILD = "SCANWEAVER_SKIP_WARP_BUILD"


def _cuda_reason(module: str, pip_name: str) -> str | None:
    missing = installed(module, pip_name)
    if missing:
        return f"needs an NVIDIA GPU: {missing}"
    return None


def _torch_cuda_reason() -> str | None:
    missing = _cuda_reason("torch", "torch")
    if missing:
        return missing
    import torch

    if not torch.cuda.is_available():
        return "needs an NVIDIA GPU: torch.cuda.is_available() is False here"
    return None


def torch_operands(ops):
    """``a, b, x, c`` as CUDA tensors: zero-copy from CuPy through DLPack, else copied from NumPy."""
    import torch

    def one(v):
        if type(v).__module__.split(".")[0] == "cupy":
            return torch.from_dlpack(v)
        return torch.from_numpy(v).cuda()

    return tuple(one(ops[k]) for k in ("a", "b", "x", "c"))


class TorchCUDAPeer(Peer):
    """Shared availability, device text and result conversion of the PyTorch-on-CUDA peers."""

    gpu = True
    ns_per_element = 0.5

    def availability(self):
        return _torch_cuda_reason()

    def device(self) -> str:
        import torch

        return f"{torch.cuda.get_device_name()} (PyTorch {torch.__version__})"

    def to_numpy(self, out):
        return out.cpu().numpy()


@register
class TorchLoopCUDA(TorchCUDAPeer):
    """The paper's reference on the GPU: h = a_t*h + b_t*x_t in a Python loop over L (time-major tensors)."""

    name = "torch-loop-cuda"
    label = "PyTorch loop over L (CUDA)"
    us_per_step = 40.0

    def prepare(self, ops):
        import torch

        a, b, x, c = torch_operands(ops)
        shape, L = a.shape, a.shape[-1]

        def run():
            at, ut, ct = (v.reshape(-1, L).T.contiguous() for v in (a, b * x, c))
            h = torch.zeros(at.shape[1], dtype=at.dtype, device=at.device)
            out = torch.empty_like(ut)
            for t in range(L):
                torch.mul(at[t], h, out=h)
                h.add_(ut[t])
                torch.mul(ct[t], h, out=out[t])
            torch.cuda.synchronize()
            return out.T.reshape(shape)

        return run


@functools.cache
def _pointwise_reason() -> str | None:
    try:
        import torch
        from torch._higher_order_ops.associative_scan import associative_scan

        a = torch.full((1, 4), 0.5, device="cuda")
        fn = torch.compile(lambda a, u: associative_scan(combine, (a, u), dim=-1, combine_mode="pointwise")[1])
        h = fn(a, torch.ones(1, 4, device="cuda"))
        if not torch.allclose(h.cpu(), torch.tensor([[1.0, 1.5, 1.75, 1.875]])):
            return "torch associative_scan (pointwise) returned a wrong result on a 4-element check"
    except Exception as exc:  # a private API: any failure means it does not run here
        return f"torch.compile'd associative_scan (pointwise) does not run here: {type(exc).__name__}: {exc}"
    return None


@register
class TorchCompiledAssocCUDA(TorchCUDAPeer):
    """``associative_scan`` over affine pairs under ``torch.compile`` on CUDA (pointwise combine, else generic)."""

    name = "torch-assoc-compiled-cuda"
    label = "PyTorch associative_scan (torch.compile, CUDA)"
    note = ("torch.compile'd associative_scan on CUDA: combine_mode='pointwise' (Triton) where it compiles, "
            "else 'generic'; compilation excluded (warm-up).")

    def skip_reason(self, case, settings):
        if case.L > MAX_COMPILED_L:
            return (f"torch.compile'd associative_scan runs up to L = {MAX_COMPILED_L} here (compile time and "
                    "log-depth intermediates grow with L)")
        return super().skip_reason(case, settings)

    def prepare(self, ops):
        import torch
        from torch._higher_order_ops.associative_scan import associative_scan

        mode = "pointwise" if _pointwise_reason() is None else "generic"
        a, b, x, c = torch_operands(ops)
        fn = torch.compile(lambda a, b, x, c: c * associative_scan(combine, (a, b * x), dim=-1,
                                                                   combine_mode=mode)[1], dynamic=False)

        def run():
            y = fn(a, b, x, c)
            torch.cuda.synchronize()
            return y

        return run


class AcceleratedScanPeer(TorchCUDAPeer):
    """``accelerated_scan.<module>.scan(gates, tokens)`` (PyPI accelerated-scan), then ``c *``."""

    module = ""
    note = "accelerated-scan: CUDA only; needs L a power of two >= 32 (its warp kernel builds at import, ~70 s)."
    ns_per_element = 0.1

    def availability(self):
        return _torch_cuda_reason() or _cuda_reason(f"accelerated_scan.{self.module}", "accelerated-scan")

    def skip_reason(self, case, settings):
        if case.L < 32 or case.L & (case.L - 1):
            return f"accelerated-scan needs L a power of two >= 32, got L={case.L}"
        return super().skip_reason(case, settings)

    def prepare(self, ops):
        import importlib

        import torch

        scan = importlib.import_module(f"accelerated_scan.{self.module}").scan
        a, b, x, c = (v.contiguous() for v in torch_operands(ops))

        def run():
            y = c * scan(a, b * x)
            torch.cuda.synchronize()
            return y

        return run


@register
class AcceleratedScanWarp(AcceleratedScanPeer):
    """accelerated-scan's CUDA C++ warp kernel (PyTorch builds it at the first import, about 70 s)."""

    name = "accelerated-scan"
    label = "accelerated-scan (CUDA warp scan)"
    module = "warp"

    def availability(self):
        if os.environ.get(SKIP_WARP_BUILD, "") not in ("", "0"):
            return f"skipped by {SKIP_WARP_BUILD}=1 (its CUDA C++ builds at import, about 70 s)"
        return super().availability()


@register
class AcceleratedScanTriton(AcceleratedScanPeer):
    """accelerated-scan's Triton kernel (``accelerated_scan.scalar``: ``tl.associative_scan`` in chunks)."""

    name = "accelerated-scan-triton"
    label = "accelerated-scan (Triton)"
    module = "scalar"


@register
class GPURoofline(Peer):
    """``y = a*b + x*c`` as one CuPy elementwise kernel: the scan's traffic (4 reads, 1 write) on the GPU."""

    name = "gpu-roofline"
    label = "GPU roofline: elementwise a*b+x*c (memory bound)"
    kind = "bound"
    recurrence = "elementwise (no recurrence)"
    checked = False
    gpu = True
    note = "GPU roofline: a CuPy elementwise kernel with the scan's bytes, timed like every entry (synchronised)."
    ns_per_element = 0.05

    def availability(self):
        missing = _cuda_reason("cupy", "cupy-cuda12x")
        if missing:
            return missing
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                return "needs an NVIDIA GPU: CuPy sees no CUDA device"
        except Exception as exc:  # no driver, no device
            return f"needs an NVIDIA GPU: {type(exc).__name__}: {exc}"
        return None

    def device(self) -> str:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()

    def prepare(self, ops):
        import cupy

        a, b, x, c = (cupy.asarray(ops[k]) for k in ("a", "b", "x", "c"))
        y = cupy.empty_like(a)
        kernel = cupy.ElementwiseKernel("T a, T b, T x, T c", "T y", "y = a * b + x * c", "sw_roofline")

        def run():
            kernel(a, b, x, c, y)
            cupy.cuda.get_current_stream().synchronize()
            return y

        return run
