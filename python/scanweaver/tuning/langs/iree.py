"""The ``iree`` backend under Kernel Tuner ``lang="C"``: a C bridge that calls back into the IREE module.

Kernel Tuner has no language for IREE modules, but its ``lang="C"`` runs any C
function that returns its own time in milliseconds.  The kernel it compiles here
is a bridge, ``sw_iree_timed(y, callback)``: it passes the configuration Kernel
Tuner defined (``sw_schedule_index``, ``chunk``, ``workgroup_size`` as
``#define`` s) to a Python callback (a ``ctypes`` function whose address is the
second argument), which lowers the scan for that configuration, compiles the
MLIR module once (outside the timed region), runs it on the tuning inputs
through the ``iree`` backend, copies ``y`` into Kernel Tuner's buffer for
verification and returns the host-clock time of that one call.  Every
configuration is therefore a real IREE run; compile time is not counted.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from pathlib import Path

import numpy as np

from ...arrays import prepare
from ..problem import TuneProblem
from ..space import SearchSpace
from .base import KernelSpec, KernelTunerTarget, register

#: The C bridge.  ``extern "C"`` is named so that Kernel Tuner does not wrap the unit itself.
BRIDGE = """/* scanweaver iree tuning bridge (declares its own extern "C" for C++ compilers). */
#ifdef __cplusplus
extern "C" {
#endif
#ifndef chunk
#define chunk 0
#endif
#ifndef workgroup_size
#define workgroup_size 0
#endif
typedef float (*sw_iree_run)(long, long, long, void*);
float sw_iree_timed(void* y, long long callback) {
    return ((sw_iree_run)(void*)callback)(sw_schedule_index, chunk, workgroup_size, (void*)y);
}
#ifdef __cplusplus
}
#endif
"""

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p)


@register
class IreeTarget(KernelTunerTarget):
    """IREE modules on ``llvm-cpu``, timed by the host clock around one module call."""

    backend = "iree"
    lang = "C"
    requires = ("kernel_tuner", "iree.compiler", "iree.runtime")
    install = "pip install scanweaver[tune,iree]"
    timing = "host clock around one call of the compiled IREE module (compile excluded), through a C bridge"

    def __init__(self) -> None:
        self._callbacks: list = []  # the ctypes callbacks must outlive the tune

    def owners(self, schedules, names):
        return {n: () for n in names}  # ``device`` is the device being tuned, not searched

    def kernel(self, problem: TuneProblem, space: SearchSpace, inputs: dict[str, np.ndarray],
               workdir: Path) -> KernelSpec:
        from ...runtime import get_backend
        from .c import CTarget

        be = get_backend("iree")
        order = list(space.schedules)
        arrays = prepare("tune", {n: inputs[n] for n in problem.stages.affine.inputs},
                         problem.h0(), problem.reset())
        lanes, L = problem.lanes, problem.L
        dtype = np.dtype(problem.dtype)

        def run(index: int, chunk: int, workgroup_size: int, y_ptr: int) -> float:
            schedule = order[index]
            knobs = {"chunk": chunk, "workgroup_size": workgroup_size}
            cfg = {k: v for k, v in knobs.items() if k in _tunables(schedule)}
            stages = problem.recurrence.lower(backend="iree", schedule=schedule, dtype=problem.dtype,
                                              features=problem.features, lanes=lanes, L=L, **cfg)
            be.function(stages)  # compile outside the timed region
            t0 = time.perf_counter()
            y, _ = be.run(stages, arrays)
            elapsed = time.perf_counter() - t0
            ctype = ctypes.c_double if dtype == np.float64 else ctypes.c_float
            out = np.ctypeslib.as_array(ctypes.cast(y_ptr, ctypes.POINTER(ctype)), (lanes * L,))
            out[:] = np.asarray(y, dtype).ravel()
            return float(elapsed * 1e3)

        callback = _CALLBACK(run)
        self._callbacks.append(callback)
        address = ctypes.cast(callback, ctypes.c_void_p).value
        workdir.mkdir(parents=True, exist_ok=True)
        src = workdir / "iree_bridge.c"
        src.write_text(BRIDGE)
        compiler, options = CTarget().compiler()
        digest = hashlib.sha256("\0".join([BRIDGE, *order, problem.dtype]).encode()).hexdigest()[:12]
        return KernelSpec(
            lang=self.lang, kernel_name="sw_iree_timed", kernel_source=str(src), problem_size=lanes,
            arguments=[np.zeros(lanes * L, dtype), np.int64(address)], output=0,
            defines={"sw_schedule_index": lambda p: order.index(space.schedule_of(p))},
            compiler=compiler, compiler_options=options, fingerprint=f"iree-{digest}",
        )


def _tunables(schedule: str) -> set[str]:
    from ...schedules import get_schedule

    return {t.name for t in get_schedule(schedule).tunables}
