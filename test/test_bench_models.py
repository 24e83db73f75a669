"""The GPU model scoreboard's float64 references and its check, on the CPU.

The references are cross-checked against independent implementations: our
fused Mamba-1 kernels (forward and gradients), Mamba-2 spelled as Mamba-1 with
one A per head, and flash-linear-attention's naive recurrent GLA (loaded from
its file: the package imports Triton).  The GPU entries themselves run only on
a GPU; here each is skipped with its reason.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'scanweaver[torch]')")

import scanweaver  # noqa: E402
from scanweaver.benchmarks import model_refs, models  # noqa: E402


def test_mamba1_reference_matches_our_fused_kernels_and_their_gradients():
    import scanweaver.torch as swt

    ins = model_refs.inputs("mamba1", (2, 6, 3, 37), torch.float64)
    w = torch.randn(2, 6, 37, dtype=torch.float64)
    ref_y, ref_g = model_refs.reference("mamba1", ins, w)
    leaf = {k: v.clone().requires_grad_(True) for k, v in ins.items()}
    y = swt.mamba_selective_scan(leaf["u"], leaf["delta"], leaf["A"], leaf["B"], leaf["C"], leaf["D"],
                                 delta_bias=leaf["delta_bias"], delta_softplus=True, backend="numpy")
    (y * w).sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), ref_y.numpy(), rtol=1e-9, atol=1e-9)
    for k, v in leaf.items():
        np.testing.assert_allclose(v.grad.numpy(), ref_g[k].numpy(), rtol=1e-7, atol=1e-9, err_msg=k)


def test_mamba2_reference_is_mamba1_with_one_decay_per_head():
    b, L, H, P, N = 2, 29, 3, 4, 5
    i = model_refs.inputs("mamba2", (b, L, H, P, N), torch.float64)
    y = model_refs.mamba2(*(i[n] for n in model_refs.REFERENCES["mamba2"][1]))
    per = lambda t: t.repeat_interleave(P).numpy()  # noqa: E731  (one value per channel h*P + p)
    u = i["x"].permute(0, 2, 3, 1).reshape(b, H * P, L).numpy()
    delta = i["dt"].permute(0, 2, 1).repeat_interleave(P, dim=1).numpy()
    A = np.repeat(per(i["A"])[:, None], N, axis=1)
    B, C = (i[k].permute(0, 2, 3, 1).numpy() for k in ("B", "C"))
    ey = scanweaver.mamba_selective_scan(u, delta, A, B, C, D=per(i["D"]), delta_bias=per(i["dt_bias"]),
                                         delta_softplus=True, backend="numpy")
    np.testing.assert_allclose(y.numpy(), ey.reshape(b, H, P, L).transpose(0, 3, 1, 2), rtol=1e-9, atol=1e-9)


def test_gla_reference_matches_fla_naive_recurrent_gla():
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed (pip install flash-linear-attention)")
    path = f"{spec.submodule_search_locations[0]}/ops/gla/naive.py"
    loc = importlib.util.spec_from_file_location("fla_gla_naive", path)
    naive = importlib.util.module_from_spec(loc)
    loc.loader.exec_module(naive)
    i = model_refs.inputs("gla", (2, 23, 3, 4, 5), torch.float64)
    got = model_refs.gla(**i)
    want = naive.naive_recurrent_gla(i["q"], i["k"], i["v"], i["g"])[0]
    np.testing.assert_allclose(got.numpy(), want.double().numpy(), rtol=1e-5, atol=1e-5)


def test_check_passes_a_right_entry_and_catches_a_wrong_one():
    import scanweaver.torch as swt

    def right(i):  # the entry's call on the NumPy definition of the fused kernels (no compiler in the test)
        return swt.mamba_selective_scan(i["u"], i["delta"], i["A"], i["B"], i["C"], i["D"],
                                        delta_bias=i["delta_bias"], delta_softplus=True, backend="numpy")

    errors = models.check(right, "mamba1", (1, 4, 3, 40), device="cpu")
    assert set(errors) == {"y", "du", "ddelta", "dA", "dB", "dC", "dD", "ddelta_bias"}
    assert max(errors.values()) < models.TOLERANCE
    off = models.check(lambda i: right(i) * 1.05, "mamba1", (1, 4, 3, 40), device="cpu")
    assert off["y"] > models.TOLERANCE and off["du"] > models.TOLERANCE


def test_entries_without_a_gpu_are_skipped_with_their_reason(monkeypatch):
    if models.cuda_reason() is None:
        pytest.skip("a CUDA device is present: the entries run instead (bench/gpu_session.sh)")
    results = models.run(quick=True)
    assert [r.entry for r in results] == [e.name for e in models.ENTRIES]
    assert all(r.status == "skipped" and "needs an NVIDIA GPU" in r.reason for r in results)
    assert not models.failed_ours(results)
    table = models.markdown(results)
    assert "mamba_chunk_scan_combined" in table and "chunk_gla" in table and "selective_scan_cuda" in table


def test_a_scanweaver_function_that_does_not_exist_yet_is_a_skip_reason(monkeypatch):
    monkeypatch.delattr(scanweaver, "mamba2_scan", raising=False)
    monkeypatch.setattr(models, "cuda_reason", lambda: None)
    entry = next(e for e in models.ENTRIES if e.name == "scanweaver-mamba2")
    r = models.run_entry(entry, quick=True)
    assert r.status == "skipped" and "scanweaver.mamba2_scan does not exist yet" in r.reason


def test_table_gives_ours_against_the_fastest_checked_peer():
    rows = [models.ModelResult("ours", "ours", "gla", "ours", (1,), "ok", forward_ms=2.0, backward_ms=5.0),
            models.ModelResult("p1", "p1", "gla", "peer", (1,), "ok", forward_ms=3.0, backward_ms=20.0),
            models.ModelResult("p2", "p2", "gla", "peer", (1,), "ok", forward_ms=4.0, backward_ms=10.0),
            models.ModelResult("p3", "p3", "gla", "peer", (1,), "failed", reason="wrong", forward_ms=0.1)]
    table = models.markdown(rows)
    assert "| 1.50x, 2.00x |" in table and "failed: wrong" in table


def test_mamba_ssm_files_load_one_after_another_without_the_package_init(tmp_path, monkeypatch):
    """The scoreboard loads mamba-ssm's files (Mamba-1's reference, then Mamba-2's Triton scan) without its
    ``__init__`` (which imports the CUDA extension); the second load once failed on the H200 with
    ``mamba_ssm.__spec__ is None`` (the stand-in package had no spec), which skipped the Mamba-2 peer."""
    import sys

    pkg = tmp_path / "mamba_ssm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('the package __init__ ran')\n")
    (pkg / "first.py").write_text("VALUE = 1\n")
    (pkg / "second.py").write_text("import importlib.util\nSPEC = importlib.util.find_spec('mamba_ssm')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("mamba_ssm", "mamba_ssm.first", "mamba_ssm.second", "selective_scan_cuda"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert models.mamba_ssm_module("first").VALUE == 1
    assert models.mamba_ssm_module("second").SPEC.submodule_search_locations == [str(pkg)]
    assert models.mamba_ssm_module("first").VALUE == 1
