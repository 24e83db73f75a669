"""Kernels asked for "every core" (``threads=0``) take the cores other processes leave free.

With a core busy elsewhere, two threads waited for that core at every barrier (a 0.3 ms call became 8 ms,
in 4 ms scheduler ticks); ``bench/load.py`` measures the times, this checks the thread count the kernels'
shared ``sw_threads()`` picks while a competing process spins on one core.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scanweaver.runtime import toolchain
from scanweaver.targets.c_source import THREADS

PROBE = """
#include <math.h>
#include <stdlib.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#define SW_THREADS 0
#define SW_MIN(p, q) ((p) < (q) ? (p) : (q))
""" + THREADS + """
int sw_probe_threads(void) { return sw_threads(); }
int sw_probe_procs(void) {
#ifdef _OPENMP
  return SW_MIN(omp_get_num_procs(), omp_get_max_threads());
#else
  return 1;
#endif
}
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the load is read from Linux's /proc/stat")
def test_every_core_means_the_free_cores():
    if toolchain.missing_reason():
        pytest.skip(f"no C toolchain: {toolchain.missing_reason()}")
    tc = toolchain.find_toolchain()
    if not tc.openmp:
        pytest.skip("no OpenMP: kernels run on one thread whatever the load")
    lib = tc.load(PROBE)
    procs = lib.sw_probe_procs()
    if procs < 2 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip(f"one core here ({procs} OpenMP threads): nothing to leave to another process")
    spin = subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
    try:
        time.sleep(0.3)
        lib.sw_probe_threads()  # opens a window of the host's busy time
        time.sleep(0.2)  # the spinner keeps a core busy for the whole window
        n = lib.sw_probe_threads()
    finally:
        spin.kill()
        spin.wait()
    assert 1 <= n <= procs - 1, f"{n} threads of {procs} with a core busy elsewhere"
