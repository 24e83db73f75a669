"""PyTorch peers: the loop over L, ``associative_scan`` (eager and compiled), the log-space form."""

from __future__ import annotations

import functools

import numpy as np

from ..machine import host_cpu
from . import Peer, installed, register

#: torch.compile of the generic associative scan takes about a minute per shape on 2 cores.
COMPILE_SECONDS = 60.0


def _tensors(ops: dict[str, np.ndarray]):
    import torch

    return tuple(torch.from_numpy(ops[k]) for k in ("a", "b", "x", "c"))


def combine(left, right):
    """Affine pairs, later after earlier: (A2, U2) o (A1, U1) = (A2*A1, A2*U1 + U2)."""
    a1, u1 = left
    a2, u2 = right
    return a2 * a1, a2 * u1 + u2


class TorchPeer(Peer):
    """Shared availability and device text of the PyTorch peers."""

    def availability(self):
        return installed("torch", "torch")

    def device(self) -> str:
        import torch

        return f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads of {host_cpu()}"

    def to_numpy(self, out):
        return out.numpy()


@register
class TorchLoop(TorchPeer):
    """The paper's reference: h = a_t*h + b_t*x_t in a Python loop over L (time-major tensors)."""

    name = "torch-loop"
    label = "PyTorch loop over L"
    paper = True
    ns_per_element = 25.0
    us_per_step = 25.0

    def prepare(self, ops):
        import torch

        a, b, x, c = _tensors(ops)
        shape = a.shape
        L = shape[-1]

        def run():
            at, ut, ct = (v.reshape(-1, L).T.contiguous() for v in (a, b * x, c))
            h = torch.zeros(at.shape[1], dtype=at.dtype)
            out = torch.empty_like(ut)
            for t in range(L):
                torch.mul(at[t], h, out=h)
                h.add_(ut[t])
                torch.mul(ct[t], h, out=out[t])
            return out.T.reshape(shape)

        return run

    def to_numpy(self, out):
        return out.contiguous().numpy()


@functools.cache
def _assoc_scan_reason() -> str | None:
    """Why ``torch._higher_order_ops.associative_scan`` cannot run on CPU here, or ``None``."""
    try:
        import torch
        from torch._higher_order_ops.associative_scan import associative_scan

        a = torch.full((1, 4), 0.5)
        _, h = associative_scan(combine, (a, torch.ones(1, 4)), dim=-1, combine_mode="generic")
        if not torch.allclose(h, torch.tensor([[1.0, 1.5, 1.75, 1.875]])):
            return "torch associative_scan returned a wrong result on a 4-element check"
    except Exception as exc:  # a private API: any failure means it does not run here
        return f"torch associative_scan does not run here: {type(exc).__name__}: {exc}"
    return None


def _assoc(a, u):
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(combine, (a, u), dim=-1, combine_mode="generic")[1]


@register
class TorchAssociativeScan(TorchPeer):
    """``torch._higher_order_ops.associative_scan`` over affine pairs, eager (generic combine mode)."""

    name = "torch-assoc"
    label = "PyTorch associative_scan (eager)"
    note = ("PyTorch associative_scan: combine_mode='pointwise' needs CUDA, so the CPU run uses "
            "combine_mode='generic'.")
    ns_per_element = 150.0

    def availability(self):
        return super().availability() or _assoc_scan_reason()

    def prepare(self, ops):
        a, b, x, c = _tensors(ops)
        return lambda: c * _assoc(a, b * x)


@register
class TorchAssociativeScanCompiled(TorchAssociativeScan):
    """The same scan under ``torch.compile`` (static shapes), run on the headline shape only."""

    name = "torch-assoc-compiled"
    label = "PyTorch associative_scan (torch.compile)"
    note = ("torch.compile'd associative_scan: compiling takes about a minute per shape on 2 cores "
            "(excluded from timing), so it runs on the headline shape only.")
    ns_per_element = 30.0

    def skip_reason(self, case, settings):
        if settings.max_compile_s < COMPILE_SECONDS:
            return f"torch.compile takes ~{COMPILE_SECONDS:g} s per shape, over this mode's compile limit"
        if not case.headline:
            return "torch.compile takes ~1 min per shape: run on the headline shape only"
        return super().skip_reason(case, settings)

    def prepare(self, ops):
        import torch

        a, b, x, c = _tensors(ops)
        fn = torch.compile(lambda a, b, x, c: c * _assoc(a, b * x), dynamic=False)
        return lambda: fn(a, b, x, c)


@register
class TorchLogSpace(TorchPeer):
    """h_t = exp(cumsum log a) * cumsum(b*x*exp(-cumsum log a)): two cumsums, positive gates only."""

    name = "torch-logspace"
    label = "PyTorch log-space cumsum form"
    note = ("Log-space form: exact algebra for positive gates, but exp(-cumsum log a) overflows once the "
            "cumulative log-gate passes -88 in float32 (-709 in float64), and precision degrades well before; "
            "it fails the oracle check on long sequences.")
    ns_per_element = 20.0

    def prepare(self, ops):
        import torch

        a, b, x, c = _tensors(ops)

        def run():
            la = torch.cumsum(torch.log(a), dim=-1)
            return c * (torch.exp(la) * torch.cumsum(b * x * torch.exp(-la), dim=-1))

        return run
