"""One registry for every plug-in kind: schedules, backends, targets, tuning languages, interpreter ops.

A :class:`Registry` maps names to plug-ins of one kind.  Plug-ins add
themselves with :meth:`Registry.register` when their module is imported;
the registry finds those modules by naming convention (every public module of
the packages it is given, or the modules whose names end with a suffix), and
imports them lazily, the first time somebody asks for a name or for the list.
A module whose optional dependency is missing is remembered with the reason,
so that the error for an unknown name says what is known, what could not be
loaded, and why.

There is no hand-kept list of modules anywhere: adding a plug-in is adding a
module under the right package (``docs/extending.md``).

Example:
    >>> from scanweaver.registry import Registry
    >>> colours = Registry("colour")
    >>> @colours.register("red")
    ... class Red: ...
    >>> colours.get("red").__name__, colours.names()
    ('Red', ('red',))
    >>> colours.get("blue")
    Traceback (most recent call last):
    ...
    scanweaver.errors.UnknownPluginError: colour: unknown colour 'blue'; known: red
"""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from .errors import UnknownPluginError

T = TypeVar("T")
_MISSING = object()


@dataclass(frozen=True)
class Discovery:
    """Where a registry finds its plug-in modules: the naming convention of one kind.

    Attributes:
        package: a package whose modules are scanned (``scanweaver.schedules``).
        patterns: shell-style patterns a module name must match (``*_backend``);
            private modules (a leading ``_``) never match.
        exclude: module names that are support code, not plug-ins.
    """

    package: str
    patterns: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ("base",)

    def modules(self) -> list[str]:
        """Full names of the plug-in modules of :attr:`package`, sorted."""
        pkg = importlib.import_module(self.package)
        found = [
            f"{self.package}.{m.name}"
            for m in pkgutil.iter_modules(pkg.__path__)
            if not m.name.startswith("_") and m.name not in self.exclude
            and any(fnmatch.fnmatchcase(m.name, p) for p in self.patterns)
        ]
        return sorted(found)


class Registry(Generic[T]):
    """Name -> plug-in of one kind.

    Args:
        kind: what the plug-ins are (``schedule``, ``backend`` ...), used in messages.
        discover: where the plug-in modules are (imported on first lookup).
        describe: a short phrase for the error message's list of names, e.g.
            ``"or 'auto'"`` appended after the known names.
        key: the attribute that names a plug-in registered without an explicit name.
    """

    def __init__(self, kind: str, discover: tuple[Discovery, ...] = (), describe: str = "", key: str = "name"):
        self.kind = kind
        self.key = key
        self.discover = discover
        self.describe = describe
        self._items: dict[str, T] = {}
        self._failed: dict[str, str] = {}
        self._loaded = not discover
        self._loading = False
        self._lock = threading.RLock()

    def register(self, name: str | T | None = None, *, replace: bool = False):
        """Adds a plug-in; use as ``@reg.register``, ``@reg.register("name")`` or ``reg.register(obj)``.

        Without a name the plug-in's ``name`` attribute (or the registry's ``key``) is used.

        Raises:
            ValueError: a different plug-in already has that name (``replace=True`` allows it).
        """
        if name is not None and not isinstance(name, str):
            self.add(getattr(name, self.key), name, replace=replace)
            return name

        def deco(obj: T) -> T:
            self.add(name if name is not None else getattr(obj, self.key), obj, replace=replace)
            return obj

        return deco

    def add(self, name: str, obj: T, *, replace: bool = False) -> None:
        """Adds ``obj`` under ``name``; re-adding the same object (a module imported twice) is harmless."""
        with self._lock:
            old = self._items.get(name)
            if old is not None and old is not obj and not replace and _qualname(old) != _qualname(obj):
                raise ValueError(f"{self.kind} registry: {name!r} is already registered by {_qualname(old)}")
            self._items[name] = obj

    def remove(self, name: str) -> None:
        """Removes ``name`` (a no-op when absent): for tests and plug-ins that withdraw."""
        with self._lock:
            self._items.pop(name, None)

    def load(self) -> None:
        """Imports every plug-in module once; failures are remembered with their reason.

        Other threads wait until every module is imported (Dask runs tasks on
        threads that may all ask at once); a plug-in module that asks its own
        registry while being imported sees what is registered so far.
        """
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                for d in self.discover:
                    for mod in d.modules():
                        try:
                            importlib.import_module(mod)
                        except Exception as exc:  # an optional plug-in must not take the registry down
                            self._failed[mod] = f"{type(exc).__name__}: {exc}"
            finally:
                self._loading = False
            self._loaded = True

    def get(self, name: str, default: object = _MISSING):
        """The plug-in ``name`` (or ``default``, when one is given and the name is unknown).

        Raises:
            UnknownPluginError: naming the known plug-ins and the modules that failed to load.
        """
        try:
            return self._items[name]
        except (KeyError, TypeError):
            pass
        self.load()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            if default is not _MISSING:
                return default
            raise UnknownPluginError(self.unknown_message(name)) from None

    def unknown_message(self, name: object) -> str:
        """The error text for an unknown ``name``."""
        self.load()
        known = ", ".join(sorted(self._items)) or "none"
        msg = f"{self.kind}: unknown {self.kind} {name!r}; known: {known}"
        if self.describe:
            msg += f" {self.describe}"
        if self._failed:
            msg += "; could not load: " + "; ".join(f"{m} ({why})" for m, why in sorted(self._failed.items()))
        return msg

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        self.load()
        return tuple(sorted(self._items))

    def items(self) -> list[tuple[str, T]]:
        """``(name, plug-in)`` pairs, sorted by name."""
        self.load()
        return sorted(self._items.items())

    def values(self) -> list[T]:
        """The plug-ins, sorted by name."""
        return [v for _, v in self.items()]

    @property
    def failures(self) -> dict[str, str]:
        """Plug-in module -> why it could not be imported."""
        self.load()
        return dict(self._failed)

    def __contains__(self, name: object) -> bool:
        if name in self._items:
            return True
        self.load()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __repr__(self) -> str:
        return f"<Registry {self.kind}: {', '.join(self._items)}>"


def _qualname(obj: object) -> str:
    target = obj if isinstance(obj, type) or callable(obj) else type(obj)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
