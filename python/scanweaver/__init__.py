"""ScanWeaver: a compiler and auto-tuned runtime for affine recurrences.

``import scanweaver`` loads NumPy only; Kernel Tuner, PyOpenCL, CuPy and
juliacall are imported when the feature that needs them is first used.
"""

from . import mamba, matrix  # noqa: F401  (public namespaces: scanweaver.mamba.last, scanweaver.matrix.last)
from .api import (
    Recurrence,
    delta_rule,
    delta_rule_step,
    gated_delta_rule,
    gated_delta_rule_step,
    kda,
    kda_step,
    linear_attention,
    linear_attention_step,
    log_scan,
    mamba2_scan,
    mamba2_state_update,
    mamba2_step,
    mamba_selective_scan,
    recurrence,
    retention,
    rwkv6,
    rwkv6_step,
    rwkv7,
    rwkv7_step,
    selective_scan,
    simple_gla,
)
from .core.autodiff import vjp
from .core.plans import plan
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
    "delta_rule_step",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "kda",
    "kda_step",
    "linear_attention",
    "linear_attention_step",
    "log_scan",
    "mamba2_scan",
    "mamba2_state_update",
    "mamba2_step",
    "mamba_selective_scan",
    "plan",
    "recurrence",
    "retention",
    "rwkv6",
    "rwkv6_step",
    "rwkv7",
    "rwkv7_step",
    "selective_scan",
    "simple_gla",
    "sigmoid",
    "silu",
    "softplus",
    "tune",
    "vjp",
]
