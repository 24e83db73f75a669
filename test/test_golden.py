"""Golden vectors (test/golden/*.toml) against every runtime backend available here."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver import ScanInputError
from scanweaver.arrays import compute_dtype, seqlens_reset
from scanweaver.tools.golden import CASES, DEFAULT_DIR, dense_operands, dense_recurrence, load
from scanweaver.ir.stages import Features
from scanweaver.runtime import REGISTRY, get_backend
from scanweaver.schedules import get_schedule

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.toml"))

#: Relative tolerance by dtype of the inputs, for files that state none (expected values are float64 oracle results).
RTOL = {"float32": 2e-4, "float64": 1e-10}


@functools.cache
def _load(path: Path) -> dict:
    return load(path)


def _tolerance(g: dict) -> tuple[float, float]:
    """``(rtol, atol)``: the file's own, else by dtype with an absolute floor scaled to the data."""
    rtol = g.get("rtol", RTOL.get(g["dtype"]))
    return rtol, g.get("atol", rtol * max(1.0, float(np.abs(g["y"]).max())))


def _smallest_config(backend_cls, schedule: str) -> dict:
    """The smallest candidate of every integer tunable: blocks and chunks short enough to split the cases."""
    tunables = (*get_schedule(schedule).tunables, *backend_cls.extra_tunables)
    return {t.name: min(t.values) for t in tunables if isinstance(t.default, int) and t.values}


def _runs():
    for name in sorted(REGISTRY):
        for schedule in REGISTRY[name].schedules:
            for path in FILES:
                yield pytest.param(name, schedule, path, id=f"{name}-{schedule}-{path.stem}")


def _features(g: dict) -> Features:
    return Features(reverse=g["reverse"], has_h0="h0" in g, has_reset="reset" in g, return_state=True)


def _unsupported(backend: str, schedule: str, g: dict) -> str | None:
    """Why ``backend`` with ``schedule`` cannot run golden case ``g`` (``None`` when it can).

    A dense case is refused only by a schedule other than the backend's default one for dense
    transitions, and only with the library's own explanation, so a regression cannot hide as a skip.
    """
    cls = REGISTRY[backend]
    dtype = compute_dtype([np.dtype(g["dtype"])]).name
    if dtype not in cls.dtypes:
        return f"{g['dtype']} accumulates in {dtype}, which backend {backend!r} does not run ({', '.join(cls.dtypes)})"
    if g["kind"] not in cls.kinds:
        return f"backend {backend!r} does not run {g['kind']} transitions (kinds: {', '.join(cls.kinds)})"
    if g["kind"] == "dense":
        B, D, L = g["shape"]
        if schedule == get_backend(backend).default_schedule_for("dense", B * D, L):
            return None
        try:
            dense_recurrence(g["state_size"]).lower(backend=backend, schedule=schedule, dtype=dtype,
                                                    features=_features(g))
        except ScanInputError as exc:
            return str(exc)
    return None


def test_golden_files_match_the_oracle():
    assert DEFAULT_DIR == GOLDEN
    proc = subprocess.run([sys.executable, "-m", "scanweaver.tools.golden", "--check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_golden_files_are_small_and_cover_the_cases():
    assert {f.stem for f in FILES} == {c.name for c in CASES}
    assert all(f.stat().st_size < 50_000 for f in FILES)
    gs = [_load(f) for f in FILES]
    shapes = [g["shape"] for g in gs]
    assert [1, 1, 257] in shapes and any(s[2] == 1 for s in shapes) and any(s[0] * s[1] >= 32 for s in shapes)
    dense = [g for g in gs if g["kind"] == "dense"]
    assert {g["state_size"] for g in dense} == {2, 3}
    assert any(g["reverse"] for g in dense) and not all(g["reverse"] for g in dense)
    assert all("h0" in g and "reset" in g for g in dense)
    assert {g["dtype"] for g in gs} == {"float16", "float32", "float64"}
    assert {g["reverse"] for g in gs if "cu_seqlens" in g} == {False, True}


def test_diagonal_files_have_no_kind_field():
    """Files from before dense cases stay as they were: a missing ``kind`` means diagonal."""
    for path in FILES:
        text = path.read_text()
        assert ('kind = "dense"' in text) == (_load(path)["kind"] == "dense")
        assert 'kind = "diagonal"' not in text


@pytest.mark.parametrize("path", [f for f in FILES if "cu_seqlens" in f.read_text()], ids=lambda p: p.stem)
def test_varlen_reset_mask_is_the_cu_seqlens_segments(path):
    g = _load(path)
    B, D, L = g["shape"]
    mask = seqlens_reset("test", g["cu_seqlens"], L, g["reverse"])
    np.testing.assert_array_equal(g["reset"], np.broadcast_to(mask, (B, D, L)))
    starts = np.flatnonzero(g["reset"][0, 0])
    ends = g["cu_seqlens"][1:-1]
    np.testing.assert_array_equal(starts, ends - 1 if g["reverse"] else ends)


def _dense_loop(g: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(y, h_last)`` of a dense file by a plain loop that reads ``a[..., r, j]`` as row r, column j."""
    a, b, x, c = (g[k].astype(np.float64) for k in ("a", "b", "x", "c"))
    L = x.shape[-1]
    h = g["h0"].astype(np.float64)
    y = np.empty(x.shape)
    for t in (range(L - 1, -1, -1) if g["reverse"] else range(L)):
        A = np.where(g["reset"][..., t, None, None], 0.0, a[..., t, :, :])
        h = np.einsum("...rj,...j->...r", A, h) + b[..., t, :] * x[..., t, None]
        y[..., t] = np.einsum("...r,...r->...", c[..., t, :], h)
    return y, h


@pytest.mark.parametrize("path", [f for f in FILES if 'kind = "dense"' in f.read_text()], ids=lambda p: p.stem)
def test_dense_files_hold_row_major_matrices(path):
    g = _load(path)
    k = g["state_size"]
    assert g["a"].shape[-2:] == (k, k) and g["b"].shape[-1] == k and g["h_last"].shape[-1] == k
    y, h_last = _dense_loop(g)
    np.testing.assert_allclose(y, g["y"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h_last, g["h_last"], rtol=1e-12, atol=1e-12)
    if "companion" in g["name"]:
        assert (g["a"][..., 1, 0] == 1).all() and (g["a"][..., 1, 1] == 0).all() and (g["b"][..., 1] == 0).all()
        assert (g["a"][..., 0, 1] < 0).all()


@pytest.mark.parametrize("backend,schedule,path", list(_runs()))
def test_backend_matches_golden(backend, schedule, path):
    cls = REGISTRY[backend]
    avail = cls.availability()
    if not avail.ok:
        pytest.skip(f"backend {backend!r} unavailable here: {avail.reason}")
    g = _load(path)
    why = _unsupported(backend, schedule, g)
    if why:
        pytest.skip(why)
    run = {"h0": g.get("h0"), "reset": g.get("reset"), "cu_seqlens": g.get("cu_seqlens"), "reverse": g["reverse"],
           "return_state": True, "backend": backend, "schedule": schedule, "config": _smallest_config(cls, schedule)}
    if "cu_seqlens" in g:
        run["reset"] = None
    if g["kind"] == "dense":
        y, h_last = dense_recurrence(g["state_size"])(**dense_operands(g), **run)
    else:
        y, h_last = scanweaver.selective_scan(g["a"], g["b"], g["x"], g.get("c"), **run)
    assert y.dtype == np.dtype(g["dtype"])
    assert h_last.dtype == compute_dtype([np.dtype(g["dtype"])])
    rtol, atol = _tolerance(g)
    np.testing.assert_allclose(y, g["y"], rtol=rtol, atol=atol, err_msg=f"{path.name}: y")
    np.testing.assert_allclose(h_last, g["h_last"], rtol=rtol, atol=atol, err_msg=f"{path.name}: h_last")


def test_golden_inputs_are_exact_grid_values_drawn_without_platform_routines(monkeypatch):
    """Inputs come from integer draws only: no libm, SIMD transcendental or LAPACK routine can change them."""
    from scanweaver.tools import golden

    def refuse(*args, **kwargs):
        raise AssertionError("golden inputs must not depend on platform-specific routines")

    for name in ("cos", "sin", "exp", "log", "log2", "tanh"):
        monkeypatch.setattr(np, name, refuse)
    monkeypatch.setattr(np.linalg, "norm", refuse)
    monkeypatch.setattr(np.linalg, "svd", refuse)
    for i, case in enumerate(CASES):
        inputs = golden.make_inputs(case, np.random.default_rng([golden.SEED, i]))
        for key, v in inputs.items():
            scaled = v.astype(np.float64) * 2 ** golden.GRID_BITS
            assert (scaled == np.round(scaled)).all() and (np.abs(v) <= 8).all(), (case.name, key)
            assert (v.astype(np.float16).astype(v.dtype) == v).all(), (case.name, key)
        stored = _load(GOLDEN / f"{case.name}.toml")
        for key, v in inputs.items():
            np.testing.assert_array_equal(stored[key], v.astype(stored[key].dtype), err_msg=f"{case.name}: {key}")


def test_golden_check_compares_outputs_numerically(tmp_path):
    """Another machine's oracle may round the last bits differently; the check accepts that and nothing more."""
    from scanweaver.tools.golden import OUTPUT_RTOL, differences, render

    case = next(c for c in CASES if c.state_size == 3 and c.shape[2] > 1)
    text = render(case)
    path = tmp_path / "case.toml"
    path.write_text(text)
    assert differences(path, text) == []
    g = _load(GOLDEN / f"{case.name}.toml")
    y = g["y"].ravel()
    for scale, ok in ((4 * np.finfo(np.float64).eps, True), (100 * OUTPUT_RTOL, False)):
        bumped = y * (1 + scale)
        old = "y = [" + ", ".join(repr(float(v)) for v in y) + "]"
        new = "y = [" + ", ".join(repr(float(v)) for v in bumped) + "]"
        assert old in text
        path.write_text(text.replace(old, new))
        assert (differences(path, text) == []) == ok
    a0 = repr(float(g["a"].ravel()[0]))
    path.write_text(text.replace(f"a = [{a0}", f"a = [{float(a0) + 2.0 ** -20!r}", 1))
    assert differences(path, text) == ["a differs"]
