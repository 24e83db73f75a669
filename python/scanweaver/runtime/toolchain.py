"""The system C compiler and an on-disk cache of compiled kernels.

:func:`find_toolchain` locates a compiler (``$CC``, then ``cc``, ``gcc``,
``clang``) and probes once which optimisation flags it accepts (``-O3``,
``-march=native``, ``-fopenmp``; each is dropped when the compiler rejects
it, so plain C without OpenMP still works).  :meth:`Toolchain.build` compiles
a source to a shared object stored under the cache directory
(``$SCANWEAVER_CACHE_DIR``, else ``platformdirs.user_cache_dir("scanweaver")``)
named by a hash of the source, the flags and the compiler's identity
(path and ``--version``).

Concurrency and corruption: a build writes to a unique temporary name and
moves it into place with :func:`os.replace` (atomic), under a per-entry lock
file when the platform has ``fcntl``; a ``.sha256`` file written last records
the object's checksum.  An entry whose checksum file is missing or does not
match (a half-written or damaged object) is rebuilt, never loaded.

Example:
    >>> from scanweaver.runtime.toolchain import find_toolchain
    >>> lib = find_toolchain().load("int sw_answer(void) { return 42; }")
    >>> lib.sw_answer()
    42
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendUnavailable, CompileError

#: Compilers tried, in order, when ``$CC`` is not set.
CANDIDATES = ("cc", "gcc", "clang")
#: Flags every build uses: position-independent shared object, errno-free math (lets
#: sqrt and friends inline; results are unchanged, NaN and Inf behave as in C).
BASE_FLAGS = ("-shared", "-fPIC", "-fno-math-errno")
#: Optional flags, each kept only when the compiler accepts it.
OPTIONAL_FLAGS = ("-O3", "-march=native", "-fopenmp")
#: Seconds one compilation may take.
COMPILE_TIMEOUT_S = 120

_PROBE_SOURCE = """
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
double sw_probe(double v) { return sqrt(v); }
"""


def cache_dir() -> Path:
    """The kernel cache directory (``$SCANWEAVER_CACHE_DIR`` or the per-user cache)."""
    env = os.environ.get("SCANWEAVER_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("scanweaver"))


@dataclass(frozen=True)
class Toolchain:
    """A C compiler command and the flags it accepts.

    Attributes:
        command: the compiler and any arguments from ``$CC`` (e.g. ``("gcc",)``).
        flags: every flag used for kernels, in order.
        identity: path and ``--version`` text (part of the cache key).
    """

    command: tuple[str, ...]
    flags: tuple[str, ...]
    identity: str

    @property
    def openmp(self) -> bool:
        """True when kernels are built with OpenMP."""
        return "-fopenmp" in self.flags

    def key(self, source: str, extra_flags: tuple[str, ...] = (), identity: str = "") -> str:
        """The cache key of ``source`` built by this toolchain (with ``extra_flags``, for ``identity``)."""
        h = hashlib.sha256()
        for part in (source, "\0".join((*self.flags, *extra_flags)), self.identity + identity):
            h.update(part.encode())
            h.update(b"\0\1")
        return h.hexdigest()[:32]

    def build(self, source: str, directory: Path | None = None, *, extra_flags: tuple[str, ...] = (),
              identity: str = "") -> Path:
        """The path of a verified shared object for ``source``, compiling it when needed.

        Args:
            source: C source text.
            directory: the cache directory (default: ``cache_dir() / "c"``).
            extra_flags: flags beyond the kernels' (e.g. an include path), part of the cache key.
            identity: more text for the cache key (e.g. the Python version of an extension module).

        Raises:
            CompileError: with the compiler's log when compilation fails.
        """
        directory = Path(directory) if directory is not None else cache_dir() / "c"
        directory.mkdir(parents=True, exist_ok=True)
        key = self.key(source, extra_flags, identity)
        lib = directory / f"sw_{key}.so"
        if _verified(lib):
            return lib
        with _locked(directory / f"sw_{key}.lock"):
            if _verified(lib):
                return lib
            (directory / f"sw_{key}.c").write_text(source)
            fd, tmp = tempfile.mkstemp(prefix=f"sw_{key}.", suffix=".tmp.so", dir=directory)
            os.close(fd)
            try:
                self._compile(directory / f"sw_{key}.c", Path(tmp), extra_flags)
                digest = _sha256(Path(tmp))
                os.replace(tmp, lib)
                _atomic_write(lib.with_suffix(".sha256"), digest)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return lib

    def load(self, source: str) -> ctypes.CDLL:
        """Builds ``source`` (or finds it in the cache) and loads it; cached per process."""
        return _load(self, source)

    def _compile(self, src: Path, out: Path, extra_flags: tuple[str, ...] = ()) -> None:
        cmd = [*self.command, *self.flags, *extra_flags, str(src), "-o", str(out), "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError(f"cpu backend: could not run the C compiler ({shlex.join(cmd)}): {exc}") from exc
        if proc.returncode != 0:
            log = (proc.stdout + proc.stderr).strip() or "(the compiler printed nothing)"
            raise CompileError(
                f"cpu backend: the C compiler failed (exit {proc.returncode}) on {src}\n"
                f"command: {shlex.join(cmd)}\n{log}"
            )


_loaded: dict[tuple[Toolchain, str], ctypes.CDLL] = {}
_load_lock = threading.Lock()


def _load(tc: Toolchain, source: str) -> ctypes.CDLL:
    key = (tc, tc.key(source))
    with _load_lock:
        if key not in _loaded:
            _loaded[key] = ctypes.CDLL(str(tc.build(source)))
        return _loaded[key]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _verified(lib: Path) -> bool:
    """True when ``lib`` exists and matches the checksum written after it."""
    try:
        return lib.with_suffix(".sha256").read_text().strip() == _sha256(lib)
    except (FileNotFoundError, OSError):
        return False


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` between processes (a no-op without ``fcntl``)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _compiler_command() -> tuple[str, ...] | None:
    env = os.environ.get("CC", "").strip()
    if env:
        parts = shlex.split(env)
        path = shutil.which(parts[0])
        return (path, *parts[1:]) if path else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return (path,)
    return None


def _identity(command: tuple[str, ...]) -> str:
    try:
        proc = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=30)
        version = (proc.stdout or proc.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        version = f"unknown ({exc})"
    return f"{shlex.join(command)}\n{version}\n{_host_cpu()}"


def _host_cpu() -> str:
    """The CPU model and feature flags (``-march=native`` objects are only valid on the same kind)."""
    import platform

    text = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                text += "\n" + line
            if line.startswith("flags"):
                break
    return text


def _accepts(command: tuple[str, ...], flags: list[str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="sw_probe_") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(_PROBE_SOURCE)
        cmd = [*command, *BASE_FLAGS, *flags, str(src), "-o", str(Path(tmp) / "probe.so"), "-lm"]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=COMPILE_TIMEOUT_S).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False


def missing_reason() -> str | None:
    """Why no C compiler can be used, or ``None`` when one is found."""
    if _compiler_command() is None:
        cc = os.environ.get("CC", "").strip()
        if cc:
            return f"no C compiler found: CC={cc!r} is not an executable; set CC to a C compiler or install gcc"
        return "no C compiler found: set CC or install gcc"
    return None


@functools.lru_cache(maxsize=8)
def _probe(command: tuple[str, ...]) -> Toolchain:
    flags: list[str] = []
    for flag in OPTIONAL_FLAGS:
        if _accepts(command, [*flags, flag]):
            flags.append(flag)
    return Toolchain(command=command, flags=(*BASE_FLAGS, *flags), identity=_identity(command))


def find_toolchain() -> Toolchain:
    """The compiler from ``$CC`` (or the first of cc, gcc, clang) with its probed flags.

    Raises:
        BackendUnavailable: when no compiler is found.
    """
    command = _compiler_command()
    if command is None:
        raise BackendUnavailable(f"backend 'cpu' is unavailable: {missing_reason()}")
    return _probe(command)
