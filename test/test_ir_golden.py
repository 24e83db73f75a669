"""Golden text of every stage: the printed IR is deterministic and pinned.

Regenerate after an intended change with ``SCANWEAVER_UPDATE_GOLDEN=1 pytest test/test_ir_golden.py``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver import VerificationError
from scanweaver.api import SELECTIVE, SELECTIVE_NO_C
from scanweaver.ir import expr as E
from scanweaver.ir.stages import Features
from scanweaver.ir.verifier import verify_affine
from scanweaver.passes import lower

GOLDEN = Path(__file__).parent / "golden_ir"
UPDATE = os.environ.get("SCANWEAVER_UPDATE_GOLDEN") == "1"

CASES = {
    "selective_sequential": (SELECTIVE, dict(schedule="sequential")),
    "selective_chunked_f64": (SELECTIVE, dict(schedule="chunked", dtype="float64", chunk=512)),
    "selective_blelloch_features": (SELECTIVE, dict(schedule="blelloch", workgroup_size=64, features=Features(
        reverse=True, has_h0=True, has_reset=True, return_state=True))),
    "state_only_chunked": (SELECTIVE_NO_C, dict(schedule="chunked")),
}


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text + "\n")
    assert path.exists(), f"missing golden file {path}; run with SCANWEAVER_UPDATE_GOLDEN=1"
    assert text + "\n" == path.read_text()


@pytest.mark.parametrize("name", sorted(CASES))
def test_stages_text_is_pinned(name):
    rec, kw = CASES[name]
    stages = rec.lower(backend="numpy", **kw)
    check_golden(name, str(stages))


KERNELS = {
    "kernel_c_chunked": ("cpu", dict(schedule="chunked", chunk=1024, threads=0, interleave=8)),
    "kernel_opencl_blelloch": ("opencl", dict(schedule="blelloch", workgroup_size=128)),
    "kernel_cuda_hybrid": ("cuda", dict(schedule="hybrid", workgroup_size=256, items_per_thread=8,
                                        lanes_per_group=1)),
}


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_source_is_pinned(name):
    backend, kw = KERNELS[name]
    stages = SELECTIVE.lower(backend=backend, **kw)
    assert stages.kernel, f"{backend} emitted no kernel"
    check_golden(name, stages.text()["kernel"])


def test_text_is_deterministic():
    assert str(SELECTIVE.lower(backend="numpy", schedule="chunked")) == str(
        SELECTIVE.lower(backend="numpy", schedule="chunked"))


def test_custom_recurrence_stages_text():
    @scanweaver.recurrence
    def gated(h, delta, A, x):
        g = np.exp(delta * A)
        return g * h + (1 - g) * x

    check_golden("gated_chunked", str(gated.lower(backend="numpy", schedule="chunked", chunk=128)))


def test_verifier_names_pass_and_node():
    aff = SELECTIVE.lower(backend="numpy").affine
    bad = type(aff)(**{**aff.__dict__, "U": E.mul(E.STATE, E.inp("x"))})
    with pytest.raises(VerificationError, match=r"after pass 'normalize_affine': node U: must not read h"):
        verify_affine(bad)
    bad = type(aff)(**{**aff.__dict__, "A": E.inp("q")})
    with pytest.raises(VerificationError, match=r"node A: reads undeclared input 'q'"):
        verify_affine(bad)


def test_lowering_without_schedule_stops_at_assoc():
    from scanweaver.frontend import trace

    stages = lower(trace(lambda h, a, x: a * h + x))
    assert list(stages.text()) == ["scan", "affine_scan", "assoc_scan"]
