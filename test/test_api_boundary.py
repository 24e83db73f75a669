"""User-facing errors end at the user's line: ScanWeaver's internal frames are hidden (as in JAX)."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import TRACEBACK_ENV, ScanInputError

PACKAGE = os.path.dirname(scanweaver.__file__) + os.sep


def internal_frames(exc: BaseException) -> list[str]:
    return [f"{f.name} ({f.filename})" for f in traceback.extract_tb(exc.__traceback__)
            if f.filename.startswith(PACKAGE)]


def test_a_bad_call_shows_the_callers_frames_and_one_boundary_frame(monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    a = np.ones((2, 5))
    with pytest.raises(ScanInputError) as info:
        scanweaver.selective_scan(a, a, a[:, :3])
    assert [f.split(" ")[0] for f in internal_frames(info.value)] == ["boundary"]
    assert any(__file__ == f.filename for f in traceback.extract_tb(info.value.__traceback__))
    assert "SCANWEAVER_TRACEBACK=full" in "".join(getattr(info.value, "__notes__", []))


def test_not_affine_at_decoration_time_hides_the_tracer(monkeypatch):
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(scanweaver.NotAffineError) as info:
        @scanweaver.recurrence
        def branchy(h, x):
            return h + x if h > 0 else x
    names = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "branchy" in names  # the user's step function is the user's frame: it stays
    assert [f.split(" ")[0] for f in internal_frames(info.value)] == ["boundary"]


def test_the_full_trace_is_available_under_the_debug_setting(monkeypatch):
    monkeypatch.setenv(TRACEBACK_ENV, "full")
    a = np.ones((2, 5))
    with pytest.raises(ScanInputError) as info:
        scanweaver.selective_scan(a, a, a[:, :3])
    assert len(internal_frames(info.value)) > 3


def test_bugs_are_not_filtered():
    code = ("import scanweaver.errors as e\n"
            "@e.api_boundary\n"
            "def f():\n"
            "    raise KeyError('bug')\n"
            "f()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != TRACEBACK_ENV})
    assert "KeyError" in proc.stderr and "line 4, in f" in proc.stderr
