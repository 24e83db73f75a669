"""The MLIR target: lowered stages -> one MLIR module in upstream dialects (``func arith math tensor linalg``).

The module exports one function (the kernel ABI of the ``iree`` backend)::

    func.func @sw_scan(%in_<name>: tensor<?x?xT>..., [%h0: tensor<?xT>], [%reset: tensor<?x?xi8>])
        -> (tensor<?x?xT>, tensor<?xT>)          // y (lanes, L), h_last (lanes,)

``h0`` is a parameter when the lowering has ``has_h0``, ``reset`` when it
has ``has_reset``.  Every schedule op is a private function the entry calls
(``@sequential_scan``, ``@chunked_reduce`` ...), so the module reads like
the ``schedule`` stage; IREE inlines them.  A reverse scan flips its
operands along L (``@sw_flip``), runs forward and flips ``y`` back.  Shapes
are dynamic: one module serves every ``(lanes, L)``, and the schedules
split L into whole chunks or blocks plus a tail scanned sequentially from
their carry.  Per-schedule renderings are found through :data:`MLIR_SCHEDULES`
(modules ``targets/mlir_*.py``).

Example:
    >>> import scanweaver
    >>> from scanweaver.targets.mlir_target import MLIRRenderer
    >>> stages = scanweaver.api.SELECTIVE.lower(backend="numpy", schedule="sequential")
    >>> "func.func @sw_scan(" in MLIRRenderer().render(stages)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir import Stages
from ..ir.stages import AffineScanIR, Features
from ..registry import Discovery, Registry
from .base import TARGETS
from .mlir_module import Module, flip_function

#: Entry point of every module.
ENTRY = "sw_scan"


@dataclass
class Lowering:
    """What a schedule rendering works with: the module, the scan, and the entry's SSA values.

    Attributes:
        m: the module being written (add private functions to ``m.functions``).
        aff: the affine normal form.
        config: the schedule's tunables.
        ins: operand name -> its ``(lanes, L)`` value in the entry (already in scan order).
        reset: the mask's value, or ``None``.
        h0: the initial state's value (zeros when the call has none).
        lines: the entry's body so far; a rendering appends to it.
    """

    m: Module
    aff: AffineScanIR
    config: dict[str, object]
    ins: dict[str, str]
    reset: str | None
    h0: str
    lines: list[str] = field(default_factory=list)
    _n: int = 0

    def fresh(self, stem: str) -> str:
        """A new SSA name in the entry."""
        self._n += 1
        return f"%{stem}{self._n}"

    def emit(self, line: str) -> None:
        """Appends one line to the entry."""
        self.lines.append("  " + line)

    def operands(self) -> list[tuple[str, str, str]]:
        """``(name, value, element type)`` of every per-step operand, the mask last."""
        out = [(n, v, self.m.ty) for n, v in self.ins.items()]
        if self.reset is not None:
            out.append(("reset", self.reset, "i8"))
        return out


@dataclass(frozen=True)
class MLIRSchedule:
    """The MLIR rendering of one schedule.

    Attributes:
        name: the schedule.
        render: ``render(lowering) -> (y, h_last)``: appends the schedule's private functions to
            the module and their calls to the entry, and returns the entry's result values.
    """

    name: str
    render: Callable[[Lowering], tuple[str, str]]


#: Schedule name -> its MLIR rendering (modules ``targets/mlir_*.py`` register them).
MLIR_SCHEDULES: Registry[MLIRSchedule] = Registry(
    "MLIR schedule", (Discovery("scanweaver.targets", ("mlir_*",), exclude=("mlir_target", "mlir_module",
                                                                             "mlir_expr")),))


@TARGETS.register
class MLIRRenderer:
    """Renders lowered stages as an MLIR module (diagonal transitions; see :mod:`.mlir_schedules`)."""

    target = "mlir"
    kinds = ("diagonal",)

    @classmethod
    def implements(cls, schedule: str, kind: str) -> bool:
        """True when ``schedule`` has an MLIR rendering for transitions of ``kind``."""
        return kind in cls.kinds and schedule in MLIR_SCHEDULES

    def render(self, stages: Stages) -> str:
        """The module text of ``stages`` (which must have a schedule).

        Raises:
            ValueError: the schedule or transition kind has no MLIR rendering.
        """
        sched, aff = stages.schedule, stages.affine
        if sched is None:
            raise ValueError("mlir target: the stages have no schedule to render")
        if not self.implements(sched.schedule, aff.kind):
            raise ValueError(f"mlir target: no rendering of schedule {sched.schedule!r} for {aff.kind} "
                             f"transitions; it renders {', '.join(MLIR_SCHEDULES.names())} (diagonal)")
        m = Module.for_dtype(aff.dtype)
        feats: Features = aff.features
        params = [f"%in_{n}: {m.t2}" for n in aff.inputs]
        if feats.has_h0:
            params.append(f"%h0: {m.state}")
        if feats.has_reset:
            params.append(f"%reset: {m.mask2}")
        first = f"%in_{aff.inputs[0]}"
        head = [f"func.func @{ENTRY}({', '.join(params)}) -> ({m.t2}, {m.state}) {{",
                "  %c0 = arith.constant 0 : index", "  %c1 = arith.constant 1 : index",
                f"  %n = tensor.dim {first}, %c0 : {m.t2}", f"  %l = tensor.dim {first}, %c1 : {m.t2}"]
        ins = {n: f"%in_{n}" for n in aff.inputs}
        reset = "%reset" if feats.has_reset else None
        if feats.reverse:
            m.functions.append(flip_function(m, "sw_flip", m.ty))
            for n in aff.inputs:
                head.append(f"  %rev_{n} = call @sw_flip(%in_{n}) : ({m.t2}) -> {m.t2}")
                ins[n] = f"%rev_{n}"
            if reset is not None:
                m.functions.append(flip_function(m, "sw_flip_mask", "i8"))
                head.append(f"  %rev_reset = call @sw_flip_mask(%reset) : ({m.mask2}) -> {m.mask2}")
                reset = "%rev_reset"
        h0 = "%h0"
        if not feats.has_h0:
            head += [f"  %h0_empty = tensor.empty(%n) : {m.state}",
                     f"  %h0_zero = arith.constant 0.0 : {m.ty}",
                     f"  %h0 = linalg.fill ins(%h0_zero : {m.ty}) outs(%h0_empty : {m.state}) -> {m.state}"]
        low = Lowering(m, aff, sched.config, ins, reset, h0)
        y, h_last = MLIR_SCHEDULES.get(sched.schedule).render(low)
        tail = []
        if feats.reverse:
            tail.append(f"  %y_fwd = call @sw_flip({y}) : ({m.t2}) -> {m.t2}")
            y = "%y_fwd"
        tail += [f"  return {y}, {h_last} : {m.t2}, {m.state}", "}"]
        m.functions.insert(0, "\n".join(head + low.lines + tail))
        return m.text()
