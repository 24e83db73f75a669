"""ScanWeaver: a compiler and auto-tuned runtime for affine recurrences.

``import scanweaver`` loads NumPy only; Kernel Tuner, PyOpenCL, CuPy and
juliacall are imported when the feature that needs them is first used.
"""

from .api import Recurrence, recurrence, selective_scan
from .plans import plan
from .autodiff import vjp
from .errors import (
    BackendUnavailable,
    CompileError,
    NotAffineError,
    ScanInputError,
    ScanWeaverError,
    VerificationError,
)
from .frontend import sigmoid, silu, softplus
from .tuning import tune
from .logspace import log_scan
from .mamba import mamba_selective_scan
from .matrix import linear_attention, linear_attention_step, mamba2_scan, mamba2_step, rwkv6, rwkv6_step
from .matrix.delta_rule import delta_rule

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "CompileError",
    "NotAffineError",
    "Recurrence",
    "ScanInputError",
    "ScanWeaverError",
    "VerificationError",
    "delta_rule",
    "linear_attention",
    "linear_attention_step",
    "log_scan",
    "mamba2_scan",
    "mamba2_step",
    "mamba_selective_scan",
    "plan",
    "recurrence",
    "rwkv6",
    "rwkv6_step",
    "selective_scan",
    "sigmoid",
    "silu",
    "softplus",
    "tune",
    "vjp",
]
