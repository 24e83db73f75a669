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

/* Threads to use: SW_THREADS, or every core when it is 0; never more than SW_THREADS_PER_CPU per processor
 * (more only oversubscribes, and an OpenMP runtime that cannot create them ends the process), nor more than
 * sw_thread_cap when it is set (1 in a process forked after kernels ran: see scanweaver.runtime.forksafe). */
#define SW_THREADS_PER_CPU 4
int sw_thread_cap = 0;
static int sw_threads(void) {
#ifdef _OPENMP
  const int most = SW_THREADS_PER_CPU * omp_get_num_procs();
  int n = SW_THREADS > 0 ? SW_MIN(SW_THREADS, most) : omp_get_max_threads();
  if (sw_thread_cap > 0 && n > sw_thread_cap) n = sw_thread_cap;
  return n;
#else
  return 1;
#endif
}
"""

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
