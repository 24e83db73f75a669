"""C source pieces of the CPU target, assembled by :mod:`scanweaver.targets.c_target`.

Tokens ``@NAME@`` are filled in by the emitter.  Everything here is plain
C99 that also compiles as C++ (Kernel Tuner builds ``lang="C"`` kernels
with ``g++``): pointers from ``malloc`` are cast, ``restrict`` maps to
``__restrict`` under C++, and no identifier equals a tunable's bare name
(Kernel Tuner ``#define``s those).  OpenMP and vector units are optional:
without ``-fopenmp`` the pragmas are ignored and one thread runs.

Each schedule's C rendering is a :class:`CSchedule` in :data:`C_SCHEDULES`,
registered by the ``c_*`` module that owns it (``sequential`` here,
``chunked`` in :mod:`.c_chunked`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..registry import Discovery, Registry
from . import c_dense


@dataclass(frozen=True)
class CSchedule:
    """How one schedule becomes C on CPU cores.

    Attributes:
        name: the schedule.
        body: ``body(renderer, stages)`` -> C source defining ``static int sw_run(const sw_ctx*)``
            for diagonal transitions.
        dense: ``dense(renderer, stages)`` -> the same for dense k x k transitions, or ``None`` when
            not rendered.
        reads: the CPU tunables the source reads (Kernel Tuner pins the others).
    """

    name: str
    body: Callable
    dense: Callable | None
    reads: tuple[str, ...]


#: Schedule name -> its C rendering (from the ``c_*`` modules of this package).
C_SCHEDULES: Registry[CSchedule] = Registry(
    "C schedule", (Discovery("scanweaver.targets", ("c_*",), exclude=("c_target",)),))

#: How many threads a kernel runs (``sw_threads``), shared by every C unit (scan, backward, fused kernels).
#: SW_THREADS 0 means "the free cores": every core less those the host's other processes kept busy over the
#: last window of at least SW_LOAD_WINDOW_S seconds (the busy time of /proc/stat's aggregate line less this
#: process's own CPU time, so its own spinning workers never count).  With one of two cores busy elsewhere,
#: two threads waited for the busy core at every barrier (4 ms scheduler ticks: 0.3 ms calls became 8 ms);
#: one thread on the free core loses only that core's share.  Linux reads the load; elsewhere every core.
THREADS = r"""
#if defined(__linux__)
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>
#endif
#define SW_LOAD_WINDOW_S 0.05
/* Cores the host's other processes kept busy in the last window (0 before the first window ends). */
static int sw_busy_elsewhere(void) {
#if defined(__linux__)
  static double t_prev = -1, busy_prev = 0, self_prev = 0;
  static int others = 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const double now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  if (t_prev >= 0 && now - t_prev < SW_LOAD_WINDOW_S) return others;
  unsigned long long v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  FILE* f = fopen("/proc/stat", "r");
  if (!f) return 0;
  const int got = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                         &v[5], &v[6], &v[7]);
  fclose(f);
  if (got < 4) return 0;
  /* busy: user, nice, system, irq, softirq, steal (not idle, iowait) */
  const double busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)sysconf(_SC_CLK_TCK);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const double self = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                      (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
  if (t_prev >= 0) {
    const double load = ((busy - busy_prev) - (self - self_prev)) / (now - t_prev);
    others = load > 0.5 ? (int)(load + 0.5) : 0;
  }
  t_prev = now;
  busy_prev = busy;
  self_prev = self;
  return others;
#else
  return 0;
#endif
}

/* Threads to use: SW_THREADS, or the free cores (above) when it is 0; never more than SW_THREADS_PER_CPU per
 * processor (more only oversubscribes, and an OpenMP runtime that cannot create them ends the process), nor
 * more than sw_thread_cap when it is set (1 in a process forked after kernels ran: scanweaver.runtime.forksafe). */
#define SW_THREADS_PER_CPU 4
#if defined(__GNUC__)
__attribute__((weak)) /* one shared definition where several units link into one program */
#endif
int sw_thread_cap = 0;
static int sw_threads(void) {
#ifdef _OPENMP
  const int procs = omp_get_num_procs(), most = SW_THREADS_PER_CPU * procs;
  int n = SW_THREADS > 0 ? SW_MIN(SW_THREADS, most) : SW_MIN(omp_get_max_threads(), procs - sw_busy_elsewhere());
  if (sw_thread_cap > 0 && n > sw_thread_cap) n = sw_thread_cap;
  return n > 1 ? n : 1;
#else
  return 1;
#endif
}
"""

PRELUDE = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sched.h>
#define SW_YIELD() sched_yield()
#else
#define SW_YIELD() ((void)0)
#endif
/* Ready flags between the threads of a split lane: set once (release), polled (acquire); a waiting
 * thread yields its core after SW_SPINS polls. */
#define SW_SPINS 2048
static inline int sw_flag_get(int* p) {
#if defined(__GNUC__)
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  int v;
#pragma omp atomic read
  v = *p;
#pragma omp flush
  return v;
#endif
}

static inline void sw_flag_set(int* p) {
#if defined(__GNUC__)
  __atomic_store_n(p, 1, __ATOMIC_RELEASE);
#else
#pragma omp flush
#pragma omp atomic write
  *p = 1;
#endif
}

static inline void sw_flag_wait(int* p) {
  long spins = 0;
  while (!sw_flag_get(p))
    if (++spins > SW_SPINS) SW_YIELD();
}
#ifdef __cplusplus
#define restrict __restrict
#endif
#ifdef __cplusplus
extern "C" {
#endif

/* Status codes of sw_scan. */
#define SW_OK 0
#define SW_ENOMEM 1

/* Scan position s (0 = first element in scan order) -> time index. */
#define SW_POS(len, s) (SW_REVERSE ? (len) - 1 - (s) : (s))
#define SW_MIN(p, q) ((p) < (q) ? (p) : (q))

@THREADS@
"""
#: The prelude with :data:`THREADS` in place.
PRELUDE = PRELUDE.replace("@THREADS@", THREADS)

CONTEXT = r"""
/* Kernel operands, passed by pointer to the schedule's helpers. */
typedef struct {
@FIELDS@
} sw_ctx;

/* (A_t, U_t) of element i, resets applied. */
static inline void sw_pair(const sw_ctx* sw, long i, SW_T* A, SW_T* U) {
@UNPACK@
  *A = @A@;
  *U = @U@;
}

/* y_t of element i from h_t and h_{t-1} (previous in scan order). */
static inline SW_T sw_out(const sw_ctx* sw, long i, SW_T h, SW_T hp) {
@UNPACK@
  (void)h; (void)hp;
  return @OUT@;
}

#if defined(__GNUC__)
#define SW_PREFETCH(p, rw) __builtin_prefetch((p), (rw), 2)
#else
#define SW_PREFETCH(p, rw) ((void)(p))
#endif
/* Elements per cache line (prefetch stride). */
#define SW_LINE (64 / (long)sizeof(SW_T))

/* Prefetches the operands and outputs of flat elements [lo, hi) into cache. */
static inline void sw_prefetch_range(const sw_ctx* sw, long lo, long hi) {
  for (long i = lo; i < hi; i += SW_LINE) {
@PREFETCH@
  }
}

static inline SW_T sw_h0(const sw_ctx* sw, long lane) {
  return SW_HAS_H0 ? sw->h0[lane] : (SW_T)0;
}

/* hlast is written whenever it is given (SW_RETURN_STATE only documents the call site). */
static inline void sw_store_last(const sw_ctx* sw, long lane, SW_T h) {
  if (sw->hlast) sw->hlast[lane] = h;
}

"""

SEQUENTIAL = r"""
/* Schedule `sequential`: one loop over L per lane, lanes split over threads. */
static int sw_run(const sw_ctx* sw) {
  const long nl = sw->nlanes, len = sw->L;
  const int nt = (int)SW_MIN((long)sw_threads(), nl);
  (void)nt;
#pragma omp parallel for schedule(static) num_threads(nt)
  for (long lane = 0; lane < nl; ++lane) {
    SW_T h = sw_h0(sw, lane);
    for (long s = 0; s < len; ++s) {
      const long i = lane * len + SW_POS(len, s);
      SW_T A, U;
      sw_pair(sw, i, &A, &U);
      const SW_T hp = h;
      h = A * h + U;
      sw->y[i] = sw_out(sw, i, h, hp);
    }
    sw_store_last(sw, lane, h);
  }
  return SW_OK;
}
"""

C_SCHEDULES.register(CSchedule("sequential", lambda renderer, stages: SEQUENTIAL,
                               lambda renderer, stages: c_dense.SEQUENTIAL, ("threads",)))

#: Wall-clock seconds for the ``*_timed`` entry points Kernel Tuner calls (needs ``<time.h>``, ``<omp.h>``).
NOW = r"""
static double sw_now(void) {
#ifdef _OPENMP
  return omp_get_wtime();
#else
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}
"""

TIMED = NOW + r"""
/* Kernel Tuner lang="C" entry: runs the scan, returns its time in ms (-1 on failure). */
float sw_scan_timed(@PARAMS@) {
  const double t0 = sw_now();
  const int rc = sw_scan(@ARGS@);
  const double t1 = sw_now();
  return rc == SW_OK ? (float)((t1 - t0) * 1e3) : -1.0f;
}
"""

ENTRY = r"""
/* Entry point: 0 on success, SW_ENOMEM when scratch memory is short. */
int sw_scan(@PARAMS@) {
  sw_ctx sw;
@INIT@
  if (nlanes <= 0 || L <= 0) return SW_OK;
  return sw_run(&sw);
}
"""

EPILOGUE = r"""
#ifdef __cplusplus
}
#endif
"""


def fused_timed(op, call) -> str:
    """``float <entry>_timed(<the entry's parameters>)`` of fused operation ``op`` (a
    :class:`~scanweaver.fused.FusedOp`) for ``call``: runs ``sw_<op>_<part>`` and returns its own time in ms (-1 on
    failure), the Kernel Tuner ``lang="C"`` convention.  Buffers are the ABI's in order (``do`` is ``dout`` in C),
    of the accumulation type unless their dtype says ``uint8`` or ``int64``."""
    f = call.features
    T = "double" if getattr(f, "state_dtype", f.dtype) == "float64" else "float"
    ctypes = {"uint8": "unsigned char", "int64": "int64_t"}
    decl, names = [], []
    for p in op.params(call.part):
        name = "dout" if p.name == "do" else p.name
        names.append(name)
        if p.kind == "int":
            decl.append(f"long {name}")
        else:
            decl.append(f"{'const ' if p.kind == 'in' else ''}{ctypes.get(p.dtype, T)}* {name}")
    entry = f"sw_{op.name}_{call.part}"
    return (NOW + f"float {entry}_timed({', '.join(decl)}) {{\n  const double t0 = sw_now();\n"
            f"  const int rc = {entry}({', '.join(names)});\n  const double t1 = sw_now();\n"
            "  return rc == SW_OK ? (float)((t1 - t0) * 1e3) : -1.0f;\n}")


def algorithm_defines(chunked: bool, kernel_tuner: bool = False) -> list[str]:
    """``#define SW_CHUNKED`` (1 for the chunked form); with ``kernel_tuner``, Kernel Tuner's bare-token define
    of the ``algorithm`` tunable (``recurrent`` or ``chunked``, each named a number here) wins."""
    if not kernel_tuner:
        return [f"#define SW_CHUNKED {int(chunked)}"]
    return ["#define recurrent 0", "#define chunked 1", "#ifdef algorithm", "#define SW_CHUNKED (algorithm)",
            "#else", f"#define SW_CHUNKED {int(chunked)}", "#endif"]


def tunable_defines(names, config: dict, kernel_tuner: bool = False) -> list[str]:
    """``#define SW_<NAME>`` lines of the tunables ``names`` under ``#ifndef`` guards; with ``kernel_tuner``,
    Kernel Tuner's bare-name define of a tunable wins over ``config``'s value."""
    lines: list[str] = []
    for name in names:
        macro = f"SW_{name.upper()}"
        lines += [f"#ifndef {macro}"]
        lines += ([f"#ifdef {name}", f"#define {macro} ({name})", "#else", f"#define {macro} {config[name]}",
                   "#endif"] if kernel_tuner else [f"#define {macro} {config[name]}"])
        lines += ["#endif"]
    return lines
