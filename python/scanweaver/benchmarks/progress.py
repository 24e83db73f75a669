"""A progress bar for long runs: rich when installed, else tqdm, else none (imported lazily)."""

from __future__ import annotations

import sys


class Progress:
    """``total`` steps; ``describe`` names the current one, ``advance`` finishes it.

    Example:
        >>> bar = Progress(2, enabled=False)
        >>> bar.advance(); bar.advance(); bar.close()
    """

    def __init__(self, total: int, enabled: bool = True):
        self._rich = self._tqdm = None
        self.visible = False
        if not enabled or not sys.stderr.isatty():
            return
        try:
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(transient=False)
            self._task = self._rich.add_task("benchmarks", total=total)
            self._rich.start()
            self.visible = True
            return
        except ImportError:
            pass
        try:
            from tqdm import tqdm

            self._tqdm = tqdm(total=total, file=sys.stderr, unit="entry")
            self.visible = True
        except ImportError:
            pass

    def describe(self, text: str) -> None:
        """Shows what runs now."""
        if self._rich is not None:
            self._rich.update(self._task, description=text)
        elif self._tqdm is not None:
            self._tqdm.set_description_str(text[:60])

    def advance(self) -> None:
        """One step done."""
        if self._rich is not None:
            self._rich.advance(self._task)
        elif self._tqdm is not None:
            self._tqdm.update(1)

    def close(self) -> None:
        """Removes the bar."""
        if self._rich is not None:
            self._rich.stop()
        elif self._tqdm is not None:
            self._tqdm.close()
