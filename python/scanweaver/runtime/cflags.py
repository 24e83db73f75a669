"""The flags the C compiler takes on this host, probed once per compiler.

Each group is tried in order and the first form the compiler accepts is kept (none when it accepts
none), by compiling and linking a small shared library with it:

* optimisation: ``-O3``;
* diagnostics that must stop a build (:data:`DIAGNOSTIC_FLAGS`, each kept when accepted; GCC and Clang
  both take them): integer overflow in a constant expression, constant division by zero;
* the machine: ``-march=native`` on x86; on 64-bit Arm ``-mcpu=native`` (GCC, and Apple clang on
  Apple Silicon), then ``-march=native``, else nothing (generic ARMv8 code, still NEON);
* OpenMP: ``-fopenmp`` (GCC; Clang with libomp); on macOS, where Apple clang has no OpenMP of its own,
  Homebrew's libomp: ``-Xpreprocessor -fopenmp -I<libomp>/include -L<libomp>/lib -lomp`` (found at
  ``$HOMEBREW_PREFIX/opt/libomp``, ``/opt/homebrew/opt/libomp`` or ``/usr/local/opt/libomp``);
  without any, kernels run on one thread and :attr:`Probe.notes` says how to get more.

The link mode is ``-shared -fPIC`` (``-dynamiclib -fPIC`` on macOS, ``-shared`` on Windows, where code is
position-independent anyway).  Before any of this, the compiler must build GCC vector extensions
(``vector_size``, shuffles), which every kernel uses: GCC and Clang do, MSVC's ``cl`` does not.

Example:
    >>> from scanweaver.runtime.cflags import Host, base_flags, machine_flags
    >>> base_flags(Host("Darwin", "arm64")), machine_flags(Host("Darwin", "arm64"))
    (('-dynamiclib', '-fPIC', '-fno-math-errno'), (('-mcpu=native',), ('-march=native',)))
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .host import Host

#: Seconds one probe compilation may take.
PROBE_TIMEOUT_S = 120
#: Where Homebrew installs libomp (Apple Silicon, then Intel Macs), after ``$HOMEBREW_PREFIX/opt/libomp``.
LIBOMP_PREFIXES = ("/opt/homebrew/opt/libomp", "/usr/local/opt/libomp")

PROBE_SOURCE = """
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
int sw_probe_threads(void) { return omp_get_max_threads(); }
#endif
double sw_probe(double v) { return sqrt(v); }
"""

#: Warnings that are errors in every kernel build: a tunable that overflowed its ``#define`` (GCC truncates
#: 2**64 to 0 and then compiles a constant division by zero, which traps) must fail the build, not run.
#: Both exist in GCC and Clang (``-Woverflow``, ``-Wdiv-by-zero``; Clang's ``-Wdivision-by-zero`` answers to it).
DIAGNOSTIC_FLAGS = ("-Werror=overflow", "-Werror=div-by-zero")

#: What every kernel needs from the compiler: GCC vector extensions and their shuffles.
VECTOR_SOURCE = """
typedef float sw_v4 __attribute__((vector_size(16)));
typedef int sw_i4 __attribute__((vector_size(16)));
#if defined(__clang__)
#define SW_SHUF(x, y) __builtin_shufflevector((x), (y), 1, 0, 5, 4)
#else
#define SW_SHUF(x, y) __builtin_shuffle((x), (y), (sw_i4){1, 0, 5, 4})
#endif
float sw_probe_vec(float v) { sw_v4 a = {v, 1, 2, 3}; sw_v4 b = SW_SHUF(a, a * a); return b[0] + b[2]; }
"""

#: ``accepts(command, flags, source) -> (ok, compiler output)``: compile and link a shared library.
Accepts = Callable[[Sequence[str], Sequence[str], str], tuple[bool, str]]


@dataclass(frozen=True)
class Probe:
    """What the probe found.

    Attributes:
        flags: every flag for kernels, link mode first.
        openmp: how OpenMP was enabled (``-fopenmp``, ``Homebrew libomp at <prefix>``) or ``""``.
        notes: notices for the user (e.g. why kernels run on one thread and how to change it).
        missing: why the compiler cannot build kernels at all, or ``""``.
    """

    flags: tuple[str, ...]
    openmp: str = ""
    notes: tuple[str, ...] = ()
    missing: str = ""


def base_flags(host: Host) -> tuple[str, ...]:
    """The link mode and errno-free math (lets sqrt and friends inline; NaN and Inf behave as in C)."""
    if host.macos:
        return ("-dynamiclib", "-fPIC", "-fno-math-errno")
    if host.windows:
        return ("-shared", "-fno-math-errno")
    return ("-shared", "-fPIC", "-fno-math-errno")


def machine_flags(host: Host) -> tuple[tuple[str, ...], ...]:
    """Forms of "optimise for this CPU", best first."""
    if host.arm64:
        return (("-mcpu=native",), ("-march=native",))
    return (("-march=native",),)


def libomp_prefixes(host: Host, env: dict[str, str] | None = None) -> list[Path]:
    """Homebrew libomp installations on macOS (with both ``include/omp.h`` and ``lib``), most specific first."""
    if not host.macos:
        return []
    env = os.environ if env is None else env
    candidates = [Path(env["HOMEBREW_PREFIX"]) / "opt" / "libomp"] if env.get("HOMEBREW_PREFIX") else []
    candidates += [Path(p) for p in LIBOMP_PREFIXES]
    return [p for p in dict.fromkeys(candidates) if (p / "include" / "omp.h").is_file() and (p / "lib").is_dir()]


def openmp_flags(host: Host, env: dict[str, str] | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """``(description, flags)`` forms of OpenMP to try, best first."""
    forms = [("-fopenmp", ("-fopenmp",))]
    for prefix in libomp_prefixes(host, env):
        forms.append((f"Homebrew libomp at {prefix}", ("-Xpreprocessor", "-fopenmp", f"-I{prefix}/include",
                                                         f"-L{prefix}/lib", "-lomp")))
    return forms


def single_thread_note(host: Host) -> str:
    """Why kernels run on one thread, and what to install."""
    if host.macos:
        return ("OpenMP: not found (Apple clang has none of its own); kernels run on one thread; "
                "`brew install libomp` lets them use every core")
    return "OpenMP: the C compiler does not accept -fopenmp; kernels run on one thread (install libgomp or libomp)"


def accepts(command: Sequence[str], flags: Sequence[str], source: str) -> tuple[bool, str]:
    """Compiles and links ``source`` into a shared library with ``command`` and ``flags``."""
    with tempfile.TemporaryDirectory(prefix="sw_probe_") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(source)
        cmd = [*command, *flags, str(src), "-o", str(Path(tmp) / "probe.lib"), "-lm"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def probe(command: Sequence[str], host: Host | None = None, check: Accepts = accepts,
          env: dict[str, str] | None = None) -> Probe:
    """The flags ``command`` takes on ``host`` (see the module docstring).

    Args:
        command: the compiler and its own arguments.
        host: the platform (default: this one).
        check: how a flag set is tried (tests pass recorded compiler answers).
        env: environment for finding libomp (default: ``os.environ``).
    """
    host = host or Host.current()
    flags = list(base_flags(host))
    ok, log = check(command, flags, VECTOR_SOURCE)
    if not ok:
        first = log.splitlines()[0] if log else "no output"
        return Probe(tuple(flags), missing=(
            f"the C compiler {' '.join(command)} cannot build the kernels: it lacks GCC vector extensions or "
            f"cannot link a shared library ({first}); use clang or gcc (on Windows: LLVM clang or MinGW-w64 gcc, "
            "not MSVC's cl) and set CC"))
    if check(command, [*flags, "-O3"], PROBE_SOURCE)[0]:
        flags.append("-O3")
    flags += [f for f in DIAGNOSTIC_FLAGS if check(command, [*flags, f], PROBE_SOURCE)[0]]
    for form in machine_flags(host):
        if check(command, [*flags, *form], PROBE_SOURCE)[0]:
            flags += form
            break
    for how, form in openmp_flags(host, env):
        if check(command, [*flags, *form], PROBE_SOURCE)[0]:
            return Probe((*flags, *form), openmp=how)
    return Probe(tuple(flags), notes=(single_thread_note(host),))
