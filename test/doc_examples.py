"""The code blocks of README.md and docs/: found, and run in order in a fresh interpreter.

Used by ``test/test_docs_examples.py``. As a script it runs the blocks a JSON
list on standard input names (``[{"page": ..., "line": ..., "code": ...}, ...]``)
in one namespace, one after another, printing a line ``@@ok PAGE:LINE`` after
each and, at the first that raises, its traceback (with the page's own line
numbers) and ``@@failed PAGE:LINE``, then exits 1.

Example:
    >>> blocks = fenced_blocks("Text\\n\\n```python\\nx = 1\\n```\\n", "page.md")
    >>> [(b.lang, b.line, b.code) for b in blocks]
    [('python', 3, 'x = 1\\n')]
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: An opening fence (``` or ~~~, any indent) with its info string; the block ends at the same fence.
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)\n(?P<body>.*?)"
                    r"^(?P=indent)(?P=fence)[ \t]*$", re.S | re.M)
#: ``# needs: cuda, julia`` on a block's first line.
_NEEDS = re.compile(r"\A[ \t]*#[ \t]*needs:[ \t]*(?P<names>[\w, \t-]+)$", re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page.

    Attributes:
        page: the page's path relative to the repository root.
        line: the line of its opening fence (1-based).
        lang: the fence's language (its info string's first word), ``""`` for a plain fence.
        code: the block's text, dedented to its fence.
        needs: the backends its ``# needs:`` marker names (empty without one).
    """

    page: str
    line: int
    lang: str
    code: str
    needs: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``page:line``, the block's name in reports."""
        return f"{self.page}:{self.line}"


def fenced_blocks(text: str, page: str) -> list[Block]:
    """Every fenced code block of a Markdown text, in order."""
    blocks = []
    for m in _FENCE.finditer(text):
        info = m.group("info").strip()
        lang = info.split()[0].lstrip("{.").rstrip("}") if info else ""
        code = textwrap.dedent(m.group("body"))
        needs = _NEEDS.match(code)
        names = tuple(n for n in re.split(r"[\s,]+", needs.group("names")) if n) if needs else ()
        blocks.append(Block(page, text.count("\n", 0, m.start()) + 1, lang, code, names))
    return blocks


def pages() -> list[Path]:
    """README.md and every page under docs/, sorted."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of one page."""
    return fenced_blocks(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())


def run(blocks: list[dict]) -> int:
    """Runs the blocks in one namespace, in order; 0 when all ran, 1 at the first that raised."""
    namespace: dict = {"__name__": "__main__"}
    for block in blocks:
        label = f"{block['page']}:{block['line']}"
        source = "\n" * block["line"] + block["code"]  # tracebacks then give the page's line numbers
        try:
            exec(compile(source, str(ROOT / block["page"]), "exec"), namespace)  # noqa: S102  (the project's own docs)
        except BaseException:  # noqa: BLE001  (reported to the test, which fails)
            traceback.print_exc(file=sys.stdout)
            print(f"@@failed {label}", flush=True)
            return 1
        print(f"@@ok {label}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(json.load(sys.stdin)))


def namespace_after(marker: str) -> dict:
    """The namespace of the first page whose Python block holds ``marker``, after running that page's
    unmarked blocks up to and including that one (for tests that check what an example computes)."""
    for path in pages():
        blocks = [b for b in page_blocks(path) if b.lang == "python" and not b.needs]
        hit = next((i for i, b in enumerate(blocks) if marker in b.code), None)
        if hit is None:
            continue
        ns: dict = {"__name__": "__doc_example__"}
        for b in blocks[: hit + 1]:
            exec(compile(b.code, b.label, "exec"), ns)  # noqa: S102  (our own documentation)
        return ns
    raise LookupError(f"no documentation example holds {marker!r}")
