"""GPU-only peers: ``accelerated-scan`` and a CuPy ``cumsum`` memory-speed proxy.

Both need an NVIDIA GPU; on a machine without one they are listed as skipped
with the reason, never silently dropped.
"""

from __future__ import annotations

from . import Peer, installed, register


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


@register
class AcceleratedScan(Peer):
    """``accelerated_scan.warp.scan(gates, tokens)``: a fused CUDA first-order scan (PyPI accelerated-scan)."""

    name = "accelerated-scan"
    label = "accelerated-scan (CUDA warp scan)"
    note = "accelerated-scan: CUDA only; needs L a power of two >= 32."
    ns_per_element = 0.1

    def availability(self):
        return _torch_cuda_reason() or _cuda_reason("accelerated_scan.warp", "accelerated-scan")

    def device(self) -> str:
        import torch

        return torch.cuda.get_device_name()

    def skip_reason(self, case, settings):
        if case.L < 32 or case.L & (case.L - 1):
            return f"accelerated-scan needs L a power of two >= 32, got L={case.L}"
        return super().skip_reason(case, settings)

    def prepare(self, ops):
        import torch
        from accelerated_scan.warp import scan

        a, b, x, c = (torch.from_numpy(ops[k]).cuda() for k in ("a", "b", "x", "c"))

        def run():
            y = c * scan(a, b * x)
            torch.cuda.synchronize()
            return y

        return run

    def to_numpy(self, out):
        return out.cpu().numpy()


@register
class CupyCumsum(Peer):
    """``cupy.cumsum`` over L of ``b*x``: not the scan, a memory-speed yardstick on the GPU."""

    name = "cupy-cumsum"
    label = "CuPy cumsum (memory-speed proxy)"
    kind = "bound"
    recurrence = "prefix sum (proxy, not the scan)"
    checked = False
    note = "CuPy cumsum: a memory-speed proxy on the GPU; it does not compute the recurrence and is not checked."
    ns_per_element = 0.1

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

        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()

    def prepare(self, ops):
        import cupy

        a, b, x, c = (cupy.asarray(ops[k]) for k in ("a", "b", "x", "c"))

        def run():
            y = c * cupy.cumsum(b * x, axis=-1)
            cupy.cuda.get_current_stream().synchronize()
            return y

        return run

    def to_numpy(self, out):
        import cupy

        return cupy.asnumpy(out)
