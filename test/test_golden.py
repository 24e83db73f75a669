"""Golden vectors (test/golden/*.toml) against every runtime backend available here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver.golden import CASES, DEFAULT_DIR, load
from scanweaver.runtime import REGISTRY, load_all
from scanweaver.schedules import get_schedule

GOLDEN = Path(__file__).parent / "golden"
load_all()

#: Relative tolerance by dtype of the inputs (expected values are float64 oracle results).
RTOL = {"float32": 2e-4, "float64": 1e-10}


def _smallest_config(backend_cls, schedule: str) -> dict:
    """The smallest candidate of every integer tunable: blocks and chunks short enough to split the cases."""
    tunables = (*get_schedule(schedule).tunables, *backend_cls.extra_tunables)
    return {t.name: min(t.values) for t in tunables if isinstance(t.default, int) and t.values}


def _runs():
    for name in sorted(REGISTRY):
        cls = REGISTRY[name]
        for schedule in cls.schedules:
            yield pytest.param(name, schedule, id=f"{name}-{schedule}")


def test_golden_files_match_the_oracle():
    assert DEFAULT_DIR == GOLDEN
    proc = subprocess.run([sys.executable, "-m", "scanweaver.golden", "--check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_golden_files_are_small_and_cover_the_cases():
    files = sorted(GOLDEN.glob("*.toml"))
    assert {f.stem for f in files} == {c.name for c in CASES}
    assert all(f.stat().st_size < 50_000 for f in files)
    shapes = [load(f)["shape"] for f in files]
    assert [1, 1, 257] in shapes and any(s[2] == 1 for s in shapes) and any(s[0] * s[1] >= 32 for s in shapes)


@pytest.mark.parametrize("backend,schedule", list(_runs()))
def test_backend_matches_golden(backend, schedule):
    cls = REGISTRY[backend]
    avail = cls.availability()
    if not avail.ok:
        pytest.skip(f"backend {backend!r} unavailable here: {avail.reason}")
    config = _smallest_config(cls, schedule)
    checked = 0
    for path in sorted(GOLDEN.glob("*.toml")):
        g = load(path)
        if g["dtype"] not in cls.dtypes:
            continue
        y, h_last = scanweaver.selective_scan(
            g["a"], g["b"], g["x"], g.get("c"), h0=g.get("h0"), reset=g.get("reset"), reverse=g["reverse"],
            return_state=True, backend=backend, schedule=schedule, config=config,
        )
        rtol = RTOL[g["dtype"]]
        atol = rtol * max(1.0, float(np.abs(g["y"]).max()))
        np.testing.assert_allclose(y, g["y"], rtol=rtol, atol=atol, err_msg=f"{path.name}: y")
        np.testing.assert_allclose(h_last, g["h_last"], rtol=rtol, atol=atol, err_msg=f"{path.name}: h_last")
        checked += 1
    assert checked >= 5
