"""The peers' pure-PyTorch references of the matrix-state tests, loaded without their GPU code.

* flash-linear-attention (``pip install fla-core==0.6.0``): its ``naive`` modules import only
  torch (and einops), but the ``fla`` package imports Triton, so the files are loaded by path.
* mamba-ssm has only an sdist that compiles CUDA; ``.ci/run`` extracts its pure-Python files
  into ``.deps/mamba_ssm_ref`` (git-ignored; ``SCANWEAVER_MAMBA_SSM_REF`` names another folder),
  and only the named reference functions are taken from them (their modules import Triton).
* :func:`parameters` reads a peer function's parameter names from its source (the public calls,
  ``chunk_gla`` or ``mamba_chunk_scan_combined``, sit in modules that import Triton), so that the
  porting tests can hold ScanWeaver's positional order to the peer's.

Each loader returns ``None`` when the peer is not installed; tests skip with the reason.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAMBA_REF = Path(os.environ.get("SCANWEAVER_MAMBA_SSM_REF", ROOT / ".deps" / "mamba_ssm_ref"))
FLA_WHY = "flash-linear-attention is not installed (pip install fla-core==0.6.0 einops)"
MAMBA_WHY = f"mamba-ssm's reference files are not in {MAMBA_REF} (.ci/run extracts them from the PyPI sdist)"


def fla_file(module: str) -> Path | None:
    """The path of ``fla/ops/<module>.py`` (e.g. ``gla/chunk``), or None when fla is not installed."""
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "ops" / f"{module}.py"
    return path if path.exists() else None


@functools.cache
def fla(module: str):
    """``fla/ops/<module>.py`` loaded by path (e.g. ``gla/naive``), or None."""
    path = fla_file(module)
    if path is None or importlib.util.find_spec("einops") is None:
        return None
    mod_spec = importlib.util.spec_from_file_location(f"_fla_{module.replace('/', '_')}", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


#: The mamba-ssm reference functions and the files that define them.
_MAMBA_FUNCS = {"ssd_minimal.py": ("segsum", "ssd_minimal_discrete"),
                "ssd_combined.py": ("ssd_chunk_scan_combined_ref",),
                "ssd_chunk_state.py": ("chunk_state_ref",),
                "ssd_state_passing.py": ("state_passing_ref",),
                "ssd_chunk_scan.py": ("chunk_scan_ref",)}


@functools.cache
def mamba_ref() -> dict | None:
    """``{name: function}`` of mamba-ssm's pure-PyTorch SSD references, or None."""
    if not all((MAMBA_REF / f).exists() for f in _MAMBA_FUNCS) or importlib.util.find_spec("einops") is None:
        return None
    import math

    import torch
    import torch.nn.functional as F
    from einops import rearrange, repeat

    env = {"torch": torch, "F": F, "rearrange": rearrange, "repeat": repeat, "math": math}
    for fname, names in _MAMBA_FUNCS.items():
        tree = ast.parse((MAMBA_REF / fname).read_text())
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
        exec(compile(ast.Module(defs, type_ignores=[]), str(MAMBA_REF / fname), "exec"), env)
    return env


#: mamba-ssm's other references (the decode step, Mamba-1's scan) and the files that define them; each is
#: loaded on its own, so that an older extraction without these files still serves the SSD references.
_MAMBA_MORE = {"selective_state_update_ref": "selective_state_update.py",
               "selective_scan_ref": "selective_scan_interface.py"}


@functools.cache
def mamba_fn(name: str):
    """mamba-ssm's pure-PyTorch reference ``name`` (a key of :data:`_MAMBA_MORE`), or None."""
    path = MAMBA_REF / _MAMBA_MORE[name]
    if not path.exists() or importlib.util.find_spec("einops") is None:
        return None
    import torch
    import torch.nn.functional as F
    from einops import rearrange, repeat

    env = {"torch": torch, "F": F, "rearrange": rearrange, "repeat": repeat}
    tree = ast.parse(path.read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    exec(compile(ast.Module(defs, type_ignores=[]), str(path), "exec"), env)
    return env[name]


def parameters(path: Path | None, name: str) -> list[tuple[str, object]] | None:
    """``[(parameter, default)]`` of function ``name`` in source file ``path``, in order (``...`` for no
    default, and for a default that is no literal), read without importing the file; None when absent."""
    if path is None or not path.exists():
        return None
    tree = ast.parse(path.read_text())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return None
    args = fn.args.posonlyargs + fn.args.args
    defaults = [...] * (len(args) - len(fn.args.defaults)) + [_literal(d) for d in fn.args.defaults]
    return [(a.arg, d) for a, d in zip(args, defaults, strict=True)]


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...
