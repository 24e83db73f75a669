"""The system C compiler and an on-disk cache of compiled kernels.

:func:`find_toolchain` locates a compiler (``$CC``, then ``cc``, ``gcc``,
``clang``) and probes once which flags it takes on this platform
(:mod:`.cflags`: ``-O3``, ``-march=native`` or ``-mcpu=native``, OpenMP by
``-fopenmp`` or Homebrew's libomp on macOS; a form it rejects is dropped, so
plain C without OpenMP still works).  :meth:`Toolchain.build` compiles a
source to a shared library (``.so``, ``.dylib`` on macOS, ``.dll`` on Windows)
stored under the cache directory (``$SCANWEAVER_CACHE_DIR``, else
``platformdirs.user_cache_dir("scanweaver")``: ``~/.cache/scanweaver`` on
Linux, ``~/Library/Caches/scanweaver`` on macOS) named by a hash of the
source, the flags and the compiler's identity (path, ``--version``, CPU).

Concurrency and corruption: a build writes to a unique temporary name and
moves it into place with :func:`os.replace` (atomic), under a lock per entry
(:mod:`.filelock`: between the threads of a process, then between processes)
that is waited for at most :data:`LOCK_TIMEOUT_S`; past that (a holder that
was stopped, or a file system without locks) the build goes ahead without
it, which the atomic replacement makes safe.  Threads loading different
kernels never wait for each other.  A ``.sha256`` file written last records
the object's checksum.  An entry whose checksum file is missing or does not
match (a half-written or damaged object) is rebuilt, never loaded.

Trust: kernels are loaded into the process, so the cache directory must be
private (:mod:`.private_dir`): it is created with mode 0700, and one owned
by another user or writable by others is replaced by a private directory of
this process, with a warning.  Cache files are opened without following
symbolic links, and only a regular file owned by this user is loaded.

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
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import environment
from ..errors import BackendUnavailable, CompileError
from . import cflags, filelock, forksafe, private_dir
from .host import Host, cpu_flags, cpu_model, isa_of

log = logging.getLogger("scanweaver")

#: Compilers tried, in order, when ``$CC`` is not set (Windows has no ``cc``; MSVC's ``cl`` cannot build kernels).
CANDIDATES = ("clang", "gcc") if Host.current().windows else ("cc", "gcc", "clang")
#: Flags every build here uses: the link mode and errno-free math (see :func:`.cflags.base_flags`).
BASE_FLAGS = cflags.base_flags(Host.current())
#: Flags that select a link mode or a library, left out where only compiling or preprocessing.
LINK_FLAGS = ("-shared", "-dynamiclib", "-fPIC")
#: Seconds one compilation may take.
COMPILE_TIMEOUT_S = 120
#: Seconds a build waits for another thread's or process's build of the same kernel before building it itself.
LOCK_TIMEOUT_S = COMPILE_TIMEOUT_S + 30.0


def cache_dir() -> Path:
    """The kernel cache directory (``$SCANWEAVER_CACHE_DIR`` or the per-user cache)."""
    env = environment.path("SCANWEAVER_CACHE_DIR")
    if env is not None:
        return env
    import platformdirs

    return Path(platformdirs.user_cache_dir("scanweaver"))


@dataclass(frozen=True)
class Toolchain:
    """A C compiler command and the flags it accepts.

    Attributes:
        command: the compiler and any arguments from ``$CC`` (e.g. ``("gcc",)``).
        flags: every flag used for kernels, in order.
        identity: path and ``--version`` text (part of the cache key).
        notes: notices about the build (e.g. why kernels run on one thread).
        suffix: file suffix of the shared libraries it builds.
    """

    command: tuple[str, ...]
    flags: tuple[str, ...]
    identity: str
    notes: tuple[str, ...] = ()
    suffix: str = ".so"

    @property
    def openmp(self) -> bool:
        """True when kernels are built with OpenMP."""
        return "-fopenmp" in self.flags

    @property
    def compile_flags(self) -> tuple[str, ...]:
        """The kernel flags without the link mode and libraries (for compiling or preprocessing only)."""
        return tuple(f for f in self.flags if f not in LINK_FLAGS and not f.startswith(("-l", "-L")))

    def preprocess(self, source: str) -> str:
        """``source`` after the preprocessor, with the kernel flags (what the compiler targets)."""
        return _run_preprocessor(self.command, self.compile_flags, source, ())

    def macros(self) -> dict[str, str]:
        """The compiler's predefined macros with the kernel flags, e.g. ``{"__AVX2__": "1", ...}``."""
        text = _run_preprocessor(self.command, self.compile_flags, "", ("-dM",))
        out = {}
        for line in text.splitlines():
            parts = line.split(None, 2)
            if len(parts) >= 2 and parts[0] == "#define":
                out[parts[1]] = parts[2] if len(parts) > 2 else ""
        return out

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
        directory = private_dir.private_directory(Path(directory) if directory is not None else cache_dir() / "c")
        key = self.key(source, extra_flags, identity)
        lib = directory / f"sw_{key}{self.suffix}"
        if _verified(lib):
            return lib
        try:
            with filelock.locked(directory / f"sw_{key}", LOCK_TIMEOUT_S, what="cpu backend: kernel cache"):
                if not _verified(lib):
                    self._build_into(source, directory, key, lib, extra_flags, private_source=False)
                return lib
        except filelock.LockError as exc:
            log.warning("%s; building the kernel without the lock", exc)
        self._build_into(source, directory, key, lib, extra_flags, private_source=True)
        return lib

    def _build_into(self, source: str, directory: Path, key: str, lib: Path, extra_flags: tuple[str, ...],
                    private_source: bool) -> None:
        """Compiles ``source`` to a temporary object, then moves it to ``lib`` and writes its checksum."""
        if private_source:  # another build may be writing sw_<key>.c: write a name of our own
            fd, name = tempfile.mkstemp(prefix=f"sw_{key}.", suffix=".c", dir=directory)
            os.close(fd)
            src = Path(name)
        else:
            src = directory / f"sw_{key}.c"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(src)  # a planted link is removed, never written through
        private_dir.write_text(src, source)
        fd, tmp = tempfile.mkstemp(prefix=f"sw_{key}.", suffix=f".tmp{self.suffix}", dir=directory)
        os.close(fd)
        try:
            self._compile(src, Path(tmp), extra_flags)
            digest = _sha256(Path(tmp))
            os.replace(tmp, lib)
            _atomic_write(lib.with_suffix(".sha256"), digest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            if private_source:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(src)

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


@functools.lru_cache(maxsize=64)
def _run_preprocessor(command: tuple[str, ...], flags: tuple[str, ...], source: str, extra: tuple[str, ...]) -> str:
    cmd = [*command, *flags, *extra, "-E", "-P", "-x", "c", "-"]
    try:
        proc = subprocess.run(cmd, input=source, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompileError(f"cpu backend: could not run the C preprocessor ({shlex.join(cmd)}): {exc}") from exc
    if proc.returncode != 0:
        raise CompileError(f"cpu backend: the C preprocessor failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                           f"{proc.stderr.strip()}")
    return proc.stdout


_loaded: dict[tuple[Toolchain, str], ctypes.CDLL] = {}


def _load(tc: Toolchain, source: str) -> ctypes.CDLL:
    """Loads ``source``'s library once per process; only :meth:`Toolchain.build` serialises (per kernel)."""
    key = (tc, tc.key(source))
    lib = _loaded.get(key)
    if lib is None:
        lib = _loaded.setdefault(key, forksafe.track(ctypes.CDLL(str(tc.build(source)))))
    return lib


def _sha256(path: Path) -> str:
    return hashlib.sha256(private_dir.read_bytes(path)).hexdigest()


def _verified(lib: Path) -> bool:
    """True when ``lib`` is a regular file of ours (no link) that matches the checksum written after it."""
    sha = lib.with_suffix(".sha256")
    if not (private_dir.regular_file(lib) and private_dir.regular_file(sha)):
        return False
    try:
        return private_dir.read_bytes(sha).decode().strip() == _sha256(lib)
    except (OSError, UnicodeDecodeError):
        return False


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


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
    host = Host.current()
    return f"{shlex.join(command)}\n{version}\n{host.system} {host.machine}\n{cpu_model(host)}\n{cpu_flags()}"


def missing_reason() -> str | None:
    """Why no C compiler can build kernels here, or ``None`` when one can (probing it once)."""
    command = _compiler_command()
    if command is None:
        cc = os.environ.get("CC", "").strip()
        if cc:
            return f"no C compiler found: CC={cc!r} is not an executable; set CC to a C compiler or install gcc"
        if Host.current().windows:
            return ("no C compiler found: the kernels need GCC vector extensions, which MSVC's cl lacks; "
                    "install LLVM (clang) or MinGW-w64 (gcc) and put it on PATH or set CC")
        return "no C compiler found: set CC or install gcc"
    return _probe(command).missing or None


@functools.lru_cache(maxsize=8)
def _probe(command: tuple[str, ...]) -> cflags.Probe:
    return cflags.probe(command)


@functools.lru_cache(maxsize=8)
def _toolchain(command: tuple[str, ...]) -> Toolchain:
    found = _probe(command)
    return Toolchain(command=command, flags=found.flags, identity=_identity(command), notes=found.notes,
                     suffix=Host.current().library_suffix)


def find_toolchain() -> Toolchain:
    """The compiler from ``$CC`` (or the first of cc, gcc, clang) with its probed flags.

    Raises:
        BackendUnavailable: when no compiler is found, or the one found cannot build kernels.
    """
    reason = missing_reason()
    if reason:
        raise BackendUnavailable(f"backend 'cpu' is unavailable: {reason}")
    command = _compiler_command()
    assert command is not None
    return _toolchain(command)


@functools.cache
def vector_isa() -> tuple[str, int]:
    """``(instruction set, vector bytes)`` the ``chunked`` C kernel is built for here, from the compiler.

    Returns ``("unknown", 16)`` when no compiler can be asked.
    """
    from ..targets.c_chunked import VECTOR_BYTES

    try:
        tc = find_toolchain()
        text = tc.preprocess(VECTOR_BYTES + "\nsw_vector_bytes = SW_VBYTES;\n")
        vbytes = int(text.split("sw_vector_bytes =", 1)[1].split(";", 1)[0])
        return isa_of(tc.macros()), vbytes
    except Exception:  # a report must not fail where the backend cannot run
        return "unknown", 16


def simd_bytes() -> int:
    """Bytes of the vectors the C compiler targets here with the kernel flags (``-march=native``).

    64 with AVX-512, 32 with AVX/AVX2, else 16 (SSE2, NEON, and anything unknown).
    """
    return vector_isa()[1]
