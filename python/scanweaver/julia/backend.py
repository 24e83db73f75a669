"""The ``julia`` backend: ScanWeaver.jl's KernelAbstractions kernels through juliacall.

``selective_scan(..., backend="julia", device="cuda")`` runs the same kernels
a Julia user gets from ``using ScanWeaver``, on ``cpu``, ``cuda``, ``amdgpu``,
``oneapi`` or ``metal``.  NumPy buffers are handed to Julia by address: on
``cpu`` the kernels read the operands and write ``y`` in place (no copy); on a
GPU the operands are copied to device arrays and the results copied back.
Never picked by ``backend="auto"`` (starting Julia takes seconds).
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Callable, Mapping

import numpy as np

from ..errors import ScanInputError, ScanWeaverError
from ..fused import REGISTRY as FUSED
from ..ir.expr import Expr
from ..ir import Stages
from ..runtime import fastcall
from ..runtime.base import Availability, Backend, ScanArrays, register
from ..schedules import Tunable, get_schedule
from ..targets import TARGETS
from ..targets import reference
from . import delta, devices, kernels, mamba, matrix, session


def _device_rule(value: object) -> str | None:
    return None if value in devices.DEVICES else f"it must be one of {', '.join(devices.DEVICES)}"


def _hybrid(cfg: dict) -> tuple[str, dict]:
    if cfg.get("lanes_per_group", 1) != 1:
        raise ScanInputError(f"julia backend: hybrid runs one lane per workgroup; lanes_per_group="
                             f"{cfg['lanes_per_group']} is not supported (use 1)")
    return "hybrid", {"workgroup_size": cfg["workgroup_size"], "items_per_thread": cfg["items_per_thread"]}


def _reduce_then_scan(cfg: dict) -> tuple[str, dict]:
    chunk = cfg["workgroup_size"] * cfg["items_per_thread"] * cfg["tiles_per_block"]
    return "reduce_then_scan", {"workgroup_size": cfg["workgroup_size"], "chunk": chunk}


#: Work-items per workgroup where the Python schedule has no such tunable (one work-item
#: per lane or per chunk, so it only shapes the launch; 64 fills an AMD wavefront).
LAUNCH_WORKGROUP = 64

#: Python schedule -> (Julia schedule, its tunables) for a validated Python config.
SCHEDULE_MAP: dict[str, Callable[[dict], tuple[str, dict]]] = {
    "sequential": lambda cfg: ("sequential", {"workgroup_size": LAUNCH_WORKGROUP}),
    "blelloch": lambda cfg: ("blelloch", {"workgroup_size": cfg["workgroup_size"]}),
    "hybrid": _hybrid,
    "chunked": lambda cfg: ("reduce_then_scan", {"workgroup_size": LAUNCH_WORKGROUP, "chunk": cfg["chunk"]}),
    "reduce_then_scan": _reduce_then_scan,
}

#: Fused operation -> the ``run(call, arrays, sizes)`` of its ScanWeaver.jl rendering (the parts
#: ``scanweaver.targets.fused_julia`` registers); a new operation adds its module and one entry here.
RUNNERS: dict[str, Callable[..., None]] = {"mamba1": mamba.run, "matrix_state": matrix.run, "delta_rule": delta.run}


@TARGETS.register
class JuliaTarget:
    """ScanWeaver.jl as a target: the Python schedules :data:`SCHEDULE_MAP` maps onto its kernels."""

    target = "julia"

    @classmethod
    def implements(cls, schedule: str, kind: str) -> bool:
        """True when ``schedule`` maps onto a ScanWeaver.jl schedule (diagonal transitions from Python)."""
        if kind != "diagonal" or schedule not in SCHEDULE_MAP:
            return False
        julia_schedule, _ = SCHEDULE_MAP[schedule](get_schedule(schedule).defaults())
        return julia_schedule in kernels.SCHEDULES



def _is_input(e: Expr) -> bool:
    return e.op == "input"


def _is_zero(e: Expr) -> bool:
    return e.op == "const" and e.value == 0


def _offset_inputs(U: Expr) -> tuple[str, str] | None:
    """The input names ``(b, x)`` when ``U = b * x`` of two inputs, else ``None``."""
    if U.op == "mul" and len(U.args) == 2 and all(_is_input(arg) for arg in U.args):
        return U.args[0].name, U.args[1].name
    return None


def _output_input(out) -> str | None:
    """The input name ``c`` when ``y = c * h`` of an input, else ``None``."""
    return out.new.name if _is_input(out.new) and _is_zero(out.old) and _is_zero(out.const) else None


def _operand_plan(stages: Stages, arrays: ScanArrays) -> tuple[dict[str, np.ndarray | None], bool]:
    """``a, b, x, c`` buffers for the kernels, and whether y must be projected here from h.

    The kernels compute A_t = a, U_t = b * x (or b), y = c * h (or h).  Other
    affine forms are evaluated elementwise with NumPy first, and outputs other
    than ``c * h_t`` are formed here from the h the kernels return.
    """
    ir, inputs, dtype = stages.affine, arrays.inputs, arrays.dtype
    shape = (arrays.lanes, arrays.L)

    def materialise(e: Expr) -> np.ndarray:
        if _is_input(e):
            return inputs[e.name]
        return np.ascontiguousarray(reference.eval_operand(e, inputs, dtype, shape), dtype=dtype)

    bx = _offset_inputs(ir.U)
    b, x = (inputs[bx[0]], inputs[bx[1]]) if bx else (materialise(ir.U), None)
    c_name = _output_input(ir.output)
    c = inputs[c_name] if c_name else None
    return {"a": materialise(ir.A), "b": b, "x": x, "c": c}, not (ir.output.is_identity or c_name)


def _address(arr: np.ndarray | None) -> int:
    return 0 if arr is None else int(arr.ctypes.data)


def _direct_operands(stages: Stages) -> dict[str, str | None] | None:
    """The input names the kernels read as ``a, b, x, c`` when every one is an input read whole and ``y``
    is ``c * h`` or ``h``; else ``None`` (:func:`_operand_plan` must evaluate or project something)."""
    ir = stages.affine
    if any(ir.features.layout(n) != "full" for n in ir.inputs) or not _is_input(ir.A):
        return None
    bx = _offset_inputs(ir.U) or ((ir.U.name, None) if _is_input(ir.U) else None)
    c = None if ir.output.is_identity else _output_input(ir.output)
    if bx is None or (c is None and not ir.output.is_identity):
        return None
    return {"a": ir.A.name, "b": bx[0], "x": bx[1], "c": c}


@register
class JuliaBackend(Backend):
    """ScanWeaver.jl kernels on any KernelAbstractions device (``device=`` tunable)."""

    name = "julia"
    target = "julia"
    extra_tunables = (
        Tunable("device", "cpu", tuple(devices.DEVICES),
                "KernelAbstractions device: cpu, cuda, amdgpu, oneapi or metal", _device_rule),
    )
    auto_priority = -1
    dtypes = ("float32", "float64", "complex64", "complex128")

    @classmethod
    def probe(cls) -> Availability:
        ok, detail = session.probe()
        return Availability(ok, "" if ok else detail, detail if ok else "")

    def default_schedule_for(self, kind: str, lanes: int, L: int, tunables: Mapping[str, object] | None = None) -> str:
        """``sequential`` on ``device="cpu"`` (the default device): ScanWeaver.jl runs it as its own
        threaded CPU scan (``src/cpu.jl``), not as emulated GPU workgroups; else :meth:`default_schedule`."""
        if (tunables or {}).get("device", "cpu") == "cpu":
            return "sequential"
        return self.default_schedule(lanes, L)

    def default_schedule(self, lanes: int, L: int) -> str:
        if L <= 64 or lanes >= 2**14:
            return "sequential"
        return "reduce_then_scan" if L >= 2**16 else "hybrid"

    def emit(self, stages: Stages) -> Stages:
        julia_schedule, config = SCHEDULE_MAP[stages.schedule.schedule](stages.schedule.config)
        return replace(stages, kernel=kernels.render_call(julia_schedule, config), target="julia")

    def run_fused(self, call, arrays, sizes) -> None:
        """Runs a part of a fused operation in ScanWeaver.jl (:data:`RUNNERS`) after checking every buffer
        against the operation's ABI; buffers its features switch off are passed as absent."""
        op = FUSED.get(call.op)
        runner = RUNNERS.get(call.op)
        if runner is None or not op.runs_on(self.target, call.part):
            super().run_fused(call, arrays, sizes)
            return
        checked = op.arguments(call.part, call.features, arrays, sizes, "julia backend")
        runner(call, {p.name: a for p, a in zip(op.params(call.part), checked, strict=True) if p.kind != "int"}, sizes)

    def fast_invoker(self, stages: Stages, lanes: int, L: int):
        """``invoke(buffers, lanes, L)`` for a plan on ``device="cpu"``: ``buffers`` are the operands in call
        order, then ``y``, ``h0``, ``h_last``, ``reset`` (``None`` when absent), already checked by the plan
        against its signature. The ``ScanWeaver.HostScanner`` that ``host_scanner`` makes here for this
        ``(lanes, L)``, schedule and tunables (its schedule resolved once) is called as a C function
        (``host_scanner_entry``) through the checked trampoline of :mod:`scanweaver.runtime.fastcall`, like
        a compiled kernel: the addresses are read and checked in C, and no Python object crosses into Julia
        (through PythonCall, integers cost microseconds each and keywords about 25 us a call).
        ``None`` (the plan calls :meth:`run`) on a GPU device, where the operands are copied anyway, or when
        an operand must be evaluated or ``y`` projected first."""
        cfg = stages.schedule.config
        roles = _direct_operands(stages)
        if cfg.get("device") != "cpu" or roles is None or not self.availability().ok:
            return None
        dtype = np.dtype(stages.affine.dtype).name
        if dtype not in devices.runtime_dtypes("cpu"):
            return None
        names = list(stages.affine.inputs)
        picks = [None if roles[r] is None else names.index(roles[r]) for r in ("a", "b", "x", "c")]
        julia_schedule, tunables = SCHEDULE_MAP[stages.schedule.schedule](cfg)
        keywords = {"reverse": stages.affine.features.reverse, "schedule": julia_schedule,
                    **{kernels.JULIA_KEYWORDS[k]: v for k, v in tunables.items()}}
        scanner = session.function("ScanWeaver.host_scanner")("cpu", dtype, L, lanes, **keywords)
        entry = session.function("ScanWeaver.host_scanner_entry")(scanner)
        feats, item, n = stages.affine.features, np.dtype(dtype).itemsize, lanes * L
        operand = fastcall.Slot(n * item, item, optional=True)
        # the entry's argument order: y, h_last, a, b, x, c, h0, reset, then lanes, L
        call = session.locked(fastcall.invoker(int(entry.pointer), (
            fastcall.Slot(n * item, item, written=True), fastcall.Slot(lanes * item, item, written=True, optional=True),
            operand, operand, operand, operand, fastcall.Slot(lanes * item if feats.has_h0 else 0, item, optional=True),
            fastcall.Slot(n if feats.has_reset else 0, 1, optional=True)), n_sizes=2))
        n_in = len(names)

        def invoke(buffers: tuple, lanes: int, L: int) -> int:
            operands, (y, h0, h_last, reset) = buffers[:n_in], buffers[n_in:]
            # the addresses are read (and checked: sizes, alignment, y overlapping nothing) in C
            if call((y, h_last, *(None if i is None else operands[i] for i in picks), h0, reset), lanes, L):
                message = str(session.function("ScanWeaver.host_entry_error")(entry))
                kind = ScanInputError if message.startswith(("ArgumentError", "DimensionMismatch")) else \
                    ScanWeaverError
                raise kind(f"julia backend: {message}")
            return 0

        return invoke

    def run(self, stages: Stages, arrays: ScanArrays) -> tuple[np.ndarray, np.ndarray]:
        cfg = stages.schedule.config
        device = cfg["device"]
        dtype = arrays.dtype.name
        devices.activate(device)
        runs = devices.runtime_dtypes(device)
        if dtype not in runs:
            raise ScanInputError(f"julia backend: device={device!r} runs {', '.join(runs)}, not {dtype}; "
                                 "convert the operands or pick another device")
        julia_schedule, tunables = SCHEDULE_MAP[stages.schedule.schedule](cfg)
        ops, project = _operand_plan(stages, arrays)
        lanes, L = arrays.lanes, arrays.L
        h = np.empty((lanes, L), arrays.dtype)
        h_last = np.empty(lanes, arrays.dtype)
        buffers = (h, h_last, ops["a"], ops["b"], ops["x"], None if project else ops["c"], arrays.h0, arrays.reset)
        host_scan = session.function("ScanWeaver.host_scan!")
        host_scan(device, dtype, L, lanes, *(_address(buf) for buf in buffers),
                  reverse=stages.affine.features.reverse, schedule=julia_schedule,
                  **{kernels.JULIA_KEYWORDS[k]: v for k, v in tunables.items()})
        if not project:
            return h, h_last
        h0 = arrays.h0 if arrays.h0 is not None else np.zeros(lanes, arrays.dtype)
        hprev = reference.prev_states(h, h0, stages.affine.features.reverse)
        return reference.project(stages.affine, arrays.inputs, h, hprev, arrays.dtype), h_last
