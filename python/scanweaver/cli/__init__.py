"""The ``scanweaver`` command: one module per subcommand, found through a registry."""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from collections.abc import Callable

from ..errors import ScanWeaverError


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line, argument set-up and entry point (returns the exit code)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {}

#: Subcommand modules, in the order ``--help`` lists them.
MODULES = ("run", "devices", "ir", "tune", "bench")


def command(name: str, help: str):
    """Registers ``add_arguments``/``run`` functions of a module-level class as subcommand ``name``."""

    def deco(cls):
        COMMANDS[name] = Command(name, help, cls.add_arguments, cls.run)
        return cls

    return deco


def parse_shape(text: str) -> tuple[int, ...]:
    """``B,D,L`` (or any comma-separated sizes) -> a tuple of ints, last one L."""
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shape must be comma-separated integers like 8,512,4096, got {text!r}") from None
    if not shape or any(s < 0 for s in shape):
        raise argparse.ArgumentTypeError(f"--shape must be non-negative sizes like 8,512,4096, got {text!r}")
    return shape


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    for mod in MODULES:
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{mod}":
                raise
    parser = argparse.ArgumentParser(
        prog="scanweaver",
        description="ScanWeaver: compile, tune and run parallel affine recurrences (selective scans).",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"scanweaver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in MODULES:
        if mod in COMMANDS:
            cmd = COMMANDS[mod]
            p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
            cmd.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scanweaver`` and ``python -m scanweaver``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # a sub-command's unknown option: its own usage, not the top level's
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if args.command in sub.choices:
            sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command].run(args)
    except ScanWeaverError as exc:
        print(f"scanweaver {args.command}: error: {exc}", file=sys.stderr)
        return 1
