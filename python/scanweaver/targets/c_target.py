"""The C (CPU) emitter: lowered stages -> one C translation unit.

The unit exports one entry point (parameters in the ABI order of
:class:`~scanweaver.targets.cstyle.CStyleRenderer`)::

    int sw_scan(const T* in_<name>..., T* y, const T* h0, T* hlast,
                const unsigned char* reset, long nlanes, long L);

It returns 0 on success and 1 (``SW_ENOMEM``) when scratch memory could not
be allocated; ``h0``, ``hlast`` and ``reset`` may be NULL when the matching
feature is off.  Operands are ``(nlanes, L)`` row-major.  Threads come from
OpenMP when the unit is built with it (``SW_THREADS``; 0 = the free cores, see ``c_source.THREADS``).

Tunables reach the source as ``#define SW_<NAME>`` behind ``#ifndef``
guards, so ``-DSW_CHUNK=4096`` overrides a lowered value.

Kernel Tuner contract (``render(stages, kernel_tuner=True)``): Kernel Tuner's
``lang="C"`` prepends ``#define <name> <value>`` for each tunable under its
bare name (``chunk``, ``threads``, ``interleave``); the variant maps each bare
name onto ``SW_<NAME>`` (the lowered value is the fallback) and adds::

    float sw_scan_timed(<same parameters as sw_scan>);

which runs the scan and returns its own elapsed time in milliseconds (-1 on
failure), as Kernel Tuner expects.  Pass ``kernel_name="sw_scan_timed"``, the
arguments as NumPy arrays plus ``np.int64`` for ``nlanes`` and ``L`` (NULL
pointers are not expressible, so give ``h0``, ``hlast`` and ``reset`` arrays
even when unused), and ``compiler_options=["-O3", "-march=native",
"-fopenmp"]`` (Kernel Tuner adds no optimisation flags).  The source compiles
as C and as C++ (Kernel Tuner uses ``g++``; it carries its own
``extern "C"``).

Example:
    >>> import scanweaver
    >>> from scanweaver.targets.c_target import CRenderer
    >>> stages = scanweaver.api.SELECTIVE.lower(backend="numpy", schedule="chunked")
    >>> "int sw_scan(" in CRenderer().render(stages)
    True
"""

from __future__ import annotations

from typing import ClassVar

from ..errors import ScanInputError
from ..ir import Stages
from . import c_dense, c_source
from .base import TARGETS, source_name
from .c_source import C_SCHEDULES
from .cstyle import CStyleRenderer, DenseMixin

#: Largest dense state the C target unrolls (k*k values per step live in registers and stack).
MAX_DENSE_STATE = 8

#: Defaults of the CPU tunables the C source reads, when a lowering does not set them.
TUNABLE_DEFAULTS: dict[str, int] = {"threads": 0, "interleave": 1, "chunk": 8192}


@TARGETS.register
class CRenderer(DenseMixin, CStyleRenderer):
    """Renders the schedules of :data:`~.c_source.C_SCHEDULES` as portable C (OpenMP optional)."""

    target: ClassVar[str] = "c"
    length_expr: ClassVar[str] = "sw->L"

    @classmethod
    def implements(cls, schedule: str, kind: str) -> bool:
        """True when ``schedule`` has a C rendering for ``kind`` transitions."""
        spec = C_SCHEDULES.get(schedule, None)
        return spec is not None and (kind == "diagonal" or spec.dense is not None)

    def render(self, stages: Stages, *, kernel_tuner: bool = False) -> str:
        """The C translation unit of ``stages`` (see the module docstring for the ABI).

        Args:
            stages: lowered stages with a ``sequential`` or ``chunked`` schedule.
            kernel_tuner: map Kernel Tuner's bare tunable names and add ``sw_scan_timed``.

        Raises:
            ValueError: when the schedule has no C rendering.
        """
        sched = stages.schedule
        spec = None if sched is None else C_SCHEDULES.get(sched.schedule, None)
        if spec is None or not self.implements(spec.name, stages.affine.kind):
            name = None if sched is None else sched.schedule
            raise ValueError(f"C emitter: no CPU rendering of schedule {name!r} for {stages.affine.kind} "
                             f"transitions; it renders {', '.join(C_SCHEDULES.names())}")
        dtype = stages.affine.dtype
        params = self.params(stages)
        dense = stages.affine.kind == "dense"
        if dense and stages.affine.state_size > MAX_DENSE_STATE:
            raise ScanInputError(f"C emitter: a dense state of size {stages.affine.state_size} exceeds "
                             f"{MAX_DENSE_STATE}; use backend='numpy' for larger states")
        parts = [
            f"/* scanweaver C kernel: {source_name(stages.affine.name)}, schedule {sched.schedule}, {dtype}"
            + (f", dense state {stages.affine.state_size}" if dense else "") + " */",
            self._defines(stages, kernel_tuner),
            c_source.PRELUDE,
            self.helpers(dtype),
            self._dense_context(stages) if dense else self._context(stages),
            spec.dense(self, stages) if dense and spec.dense else spec.body(self, stages),
            c_source.ENTRY.replace("@PARAMS@", ", ".join(params)).replace("@INIT@", self._init(stages)),
        ]
        if kernel_tuner:
            parts.append(c_source.TIMED.replace("@PARAMS@", ", ".join(params))
                         .replace("@ARGS@", ", ".join(self._arg_names(stages))))
        parts.append(c_source.EPILOGUE)
        return "\n".join(p.strip("\n") for p in parts) + "\n"

    def _defines(self, stages: Stages, kernel_tuner: bool) -> str:
        f = stages.affine.features
        lines = [
            f"#define SW_T {self.ctype(stages.affine.dtype)}",
            f"#define SW_REVERSE {int(f.reverse)}",
            f"#define SW_HAS_H0 {int(f.has_h0)}",
            f"#define SW_HAS_RESET {int(f.has_reset)}",
            f"#define SW_RETURN_STATE {int(f.return_state)}",
            f"#define SW_K {stages.affine.state_size}",
        ]
        values = {**TUNABLE_DEFAULTS, **{k: v for k, v in stages.schedule.params
                                          if isinstance(v, int) and not isinstance(v, bool)}}
        for name, value in sorted(values.items()):
            macro = f"SW_{name.upper()}"
            lines.append(f"#ifndef {macro}")
            if kernel_tuner:
                lines += [f"#ifdef {name}", f"#define {macro} ({name})", "#else",
                          f"#define {macro} {value}", "#endif"]
            else:
                lines.append(f"#define {macro} {value}")
            lines.append("#endif")
        return "\n".join(lines)

    def _arg_names(self, stages: Stages) -> list[str]:
        return [f"in_{n}" for n in stages.affine.inputs] + ["y", "h0", "hlast", "reset", "nlanes", "L"]

    def _context(self, stages: Stages) -> str:
        dtype = stages.affine.dtype
        fields = "\n".join(f"  {p.replace(' restrict', '').replace('const long', 'long')};"
                           for p in self.params(stages))
        unpack = "\n".join(
            [f"  const SW_T* restrict in_{n} = sw->in_{n}; (void)in_{n};" for n in stages.affine.inputs]
            + ["  const unsigned char* restrict reset = sw->reset; (void)reset;"]
        )
        A, U = self.element(stages, "i", dtype)
        out = self.output(stages, "i", "h", "hp", dtype)
        full = [n for n in stages.affine.inputs if stages.affine.features.layout(n) == "full"]
        prefetch = "\n".join([f"    SW_PREFETCH(sw->in_{n} + i, 0);" for n in full]
                              + ["    SW_PREFETCH(sw->y + i, 1);"])
        return (c_source.CONTEXT.replace("@FIELDS@", fields).replace("@UNPACK@", unpack)
                .replace("@PREFETCH@", prefetch)
                .replace("@A@", A).replace("@U@", U).replace("@OUT@", out))

    def _fields_unpack(self, stages: Stages) -> tuple[str, str]:
        fields = "\n".join(f"  {p.replace(' restrict', '').replace('const long', 'long')};"
                           for p in self.params(stages))
        unpack = "\n".join(
            [f"  const SW_T* restrict in_{n} = sw->in_{n}; (void)in_{n};" for n in stages.affine.inputs]
            + ["  const unsigned char* restrict reset = sw->reset; (void)reset;"]
        )
        return fields, unpack

    def _dense_context(self, stages: Stages) -> str:
        dtype = stages.affine.dtype
        fields, unpack = self._fields_unpack(stages)
        pair = "\n".join("  " + line for line in self.dense_element(stages, "i", dtype))
        out = self.dense_output(stages, "i", "h", "hp", dtype)
        return (c_dense.CONTEXT.replace("@FIELDS@", fields).replace("@UNPACK@", unpack)
                .replace("@PAIR@", pair).replace("@OUT@", out))

    def _init(self, stages: Stages) -> str:
        return "\n".join(f"  sw.{n} = {n};" for n in self._arg_names(stages))
