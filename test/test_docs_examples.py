"""Every ```python block of README.md and docs/ runs as written, on the CPU.

The blocks of a page run in order in one fresh interpreter (a block may use
what the blocks above it defined). A block whose first line is
``# needs: BACKEND[, BACKEND]`` runs on its own after the page's unmarked
blocks above it, and is skipped with the backend's reason where one is not
available. ``docs/writing-docs.md`` states the convention.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import scanweaver
from scanweaver.runtime import REGISTRY

from doc_examples import ROOT, Block, page_blocks, pages

#: Fence languages that are Python but would escape this test: write ```python, or a plain fence.
HIDDEN_PYTHON = {"py", "python3", "pycon", "ipython", "py3"}
#: Seconds one page's blocks may take together (the slowest pages compile kernels or tune).
TIMEOUT_S = 900

#: Examples that are right but fail because of a defect: (page, a text only that block holds) ->
#: (reason, a text of the error it fails with). Each is expected to fail with that error, strictly: once it
#: runs, the test fails until its entry (and the page's note) go; a different error is a plain failure.
KNOWN_FAILURES: dict[tuple[str, str], tuple[str, str]] = {}


class ExampleFailed(AssertionError):
    """The block under test raised (the blocks before it ran)."""


def _python_blocks() -> dict[str, list[Block]]:
    found = {}
    for path in pages():
        blocks = [b for b in page_blocks(path) if b.lang == "python"]
        if blocks:
            found[blocks[0].page] = blocks
    return found


BLOCKS = _python_blocks()


def _known_failure(block: Block) -> tuple[str, str] | None:
    for (page, text), known in KNOWN_FAILURES.items():
        if page == block.page and text in block.code:
            return known
    return None


def _own_item(block: Block) -> bool:
    """Blocks that run on their own, not with the page: those with needs, and known failures."""
    return bool(block.needs) or _known_failure(block) is not None


def _run(blocks: list[Block], tmp_path) -> subprocess.CompletedProcess:
    """Runs ``blocks`` in order in a fresh interpreter, in ``tmp_path``, with a tuned store of their own."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(scanweaver.__file__))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env["SCANWEAVER_TUNED"] = str(tmp_path / "tuned.json")
    env["MPLBACKEND"] = "Agg"
    spec = json.dumps([{"page": b.page, "line": b.line, "code": b.code} for b in blocks])
    return subprocess.run([sys.executable, str(ROOT / "test" / "doc_examples.py")], input=spec, text=True,
                          capture_output=True, cwd=tmp_path, env=env, timeout=TIMEOUT_S)


def _failed_label(proc: subprocess.CompletedProcess) -> str | None:
    for line in proc.stdout.splitlines():
        if line.startswith("@@failed "):
            return line.split(" ", 1)[1]
    return None


def _report(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout (tail) ---\n{proc.stdout[-6000:]}\n--- stderr (tail) ---\n" \
           f"{proc.stderr[-3000:]}"


def _missing(needs: tuple[str, ...]) -> str | None:
    """Why the backends named are not all available here, or None."""
    reasons = [f"{name}: {REGISTRY.get(name).availability().reason}" for name in needs
               if not REGISTRY.get(name).availability().ok]
    return "; ".join(reasons) or None


def test_pages_have_examples():
    assert "README.md" in BLOCKS, "README.md has no ```python block (its tour)"
    assert len(BLOCKS) >= 10, f"only {len(BLOCKS)} pages have ```python blocks: {sorted(BLOCKS)}"


@pytest.mark.parametrize("path", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_fences_are_known(path):
    """No Python hides in a fence the examples test skips; every needs marker names a backend."""
    for block in page_blocks(path):
        assert block.lang not in HIDDEN_PYTHON, \
            f"{block.label}: ```{block.lang} is Python the examples test does not run; write ```python " \
            "(run) or a plain ``` fence (not run)"
        for name in block.needs:
            assert name in REGISTRY.names(), \
                f"{block.label}: '# needs: {name}' is not a backend; backends: {', '.join(REGISTRY.names())}"
        if block.needs:
            assert block.lang == "python", f"{block.label}: a '# needs:' marker on a ```{block.lang} block"


def test_known_failures_name_one_block_each():
    for page, text in KNOWN_FAILURES:
        holders = [b for b in BLOCKS.get(page, []) if text in b.code]
        assert len(holders) == 1, f"KNOWN_FAILURES entry {text!r} matches {len(holders)} blocks of {page}"


@pytest.mark.parametrize("page", sorted(p for p, blocks in BLOCKS.items() if not all(map(_own_item, blocks))))
def test_page_examples_run(page, tmp_path):
    """The page's blocks, in order, in one fresh interpreter (the ones that run on their own left out)."""
    blocks = [b for b in BLOCKS[page] if not _own_item(b)]
    proc = _run(blocks, tmp_path)
    assert proc.returncode == 0, f"{_failed_label(proc) or page} failed\n{_report(proc)}"
    assert proc.stdout.count("@@ok ") == len(blocks), _report(proc)


def _own_items():
    items = []
    for _, blocks in sorted(BLOCKS.items()):
        for block in blocks:
            if not _own_item(block):
                continue
            known = _known_failure(block)
            marks = [pytest.mark.xfail(raises=ExampleFailed, strict=True, reason=known[0])] if known else []
            items.append(pytest.param(block, id=block.label, marks=marks))
    return items


@pytest.mark.parametrize("block", _own_items())
def test_example_on_its_own(block, tmp_path):
    """A marked block, after the page's unmarked blocks above it; skipped where a backend it needs is not here."""
    missing = _missing(block.needs)
    if missing:
        pytest.skip(f"{block.label} needs {', '.join(block.needs)}, not available here: {missing}")
    before = [b for b in BLOCKS[block.page] if b.line < block.line and not _own_item(b)]
    proc = _run([*before, block], tmp_path)
    failed = _failed_label(proc)
    known = _known_failure(block)
    if failed == block.label and (known is None or known[1] in proc.stdout):
        raise ExampleFailed(f"{block.label} failed\n{_report(proc)}")
    if failed == block.label:
        pytest.fail(f"{block.label} failed, but not with the known error {known[1]!r}\n{_report(proc)}")
    assert proc.returncode == 0, f"{failed or block.page} (run before {block.label}) failed\n{_report(proc)}"
