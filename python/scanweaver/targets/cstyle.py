"""One C-family renderer for the lowered IR; targets override strings.

:class:`CStyleRenderer` turns expressions, the kernel ABI and the call-site
features into C text.  Subclasses for C (CPU), OpenCL C and CUDA C mostly
override strings (qualifiers, barriers, work-item ids, function names), in
the manner of tinygrad's ``cstyle`` renderers; each schedule's loop structure
is rendered by the target module that owns it.

Kernel ABI (every target, in this order):
``in_<name>...`` (one const pointer per operand, ``(lanes, L)`` row-major),
``y`` (output), ``h0`` (per-lane initial state; read when ``SW_HAS_H0``),
``hlast`` (per-lane final state; written when ``SW_RETURN_STATE``),
``reset`` (uint8 ``(lanes, L)``; read when ``SW_HAS_RESET``), ``nlanes``, ``L``.
"""

from __future__ import annotations

import math
from typing import ClassVar
from collections.abc import Callable

from ..ir.expr import BINARY, Expr, is_const
from ..ir.functions import COMPARISONS
from ..ir import Stages

CTYPES = {"float32": "float", "float64": "double"}


class CStyleRenderer:
    """Base renderer: strings and helpers shared by every C-family target."""

    target: ClassVar[str] = "c"
    #: qualifier of kernel entry points
    kernel_prefix: ClassVar[str] = ""
    #: qualifier of global-memory pointers
    global_prefix: ClassVar[str] = ""
    #: qualifier of helper functions
    function_prefix: ClassVar[str] = "static inline "
    #: qualifier of workgroup-local arrays
    local_prefix: ClassVar[str] = ""
    #: workgroup barrier statement
    barrier: ClassVar[str] = ""
    #: integer type of sizes and indices
    index_type: ClassVar[str] = "long"
    #: expression of the sequence length L where element helpers run
    length_expr: ClassVar[str] = "L"
    #: unsigned byte type of reset masks
    byte_type: ClassVar[str] = "unsigned char"
    #: float32 math uses suffixed names (expf) in C and CUDA, overloads in OpenCL
    f32_suffix_math: ClassVar[bool] = True

    # GPU hooks (tinygrad-style strings); the C (CPU) target leaves them unused.
    #: qualifier of a pointer parameter into workgroup-local memory
    local_ptr_prefix: ClassVar[str] = ""
    #: qualifier of device helper functions on GPU targets
    device_prefix: ClassVar[str] = "static inline "
    #: expression of the work-item index inside its workgroup (dimension 0)
    code_for_local_id: ClassVar[str] = "0"
    #: expression of the workgroup index (dimension 0)
    code_for_group_id: ClassVar[str] = "0"
    #: subgroup (warp) width with shuffles, or 0 when the target scans in local memory instead
    warp_size: ClassVar[int] = 0
    #: shuffle of ``{v}`` from ``{d}`` lanes below, within segments of ``{w}`` lanes
    shuffle_up: ClassVar[str] = ""
    #: read of ``{v}`` from lane ``{src}`` of a segment of ``{w}`` lanes
    shuffle_idx: ClassVar[str] = ""
    #: fence that orders global-memory writes before later ones for other workgroups
    global_fence: ClassVar[str] = ""
    #: atomic ``old = *p; *p += 1`` on a global int (``{p}``)
    atomic_ticket: ClassVar[str] = ""
    #: coherent read of a global int flag ``{p}``
    flag_load: ClassVar[str] = ""
    #: coherent write of ``{v}`` to a global int flag ``{p}``
    flag_store: ClassVar[str] = ""
    #: source lines every kernel of the target starts with (pragmas, extensions)
    preamble: ClassVar[str] = ""
    #: kernel attribute bounding the work-items per workgroup to ``{n}`` (registers are budgeted for it)
    launch_bounds: ClassVar[str] = ""
    #: the same, also asking for ``{blocks}`` workgroups resident per multiprocessor (what lets the compiler
    #: budget more registers than its occupancy heuristic would); empty: :attr:`launch_bounds`
    launch_bounds_blocks: ClassVar[str] = ""
    #: unsigned 64-bit integer type (look-back status words)
    u64_type: ClassVar[str] = "unsigned long long"
    #: single-copy-atomic read of the 64-bit global word ``{p}``
    word_load: ClassVar[str] = ""
    #: single-copy-atomic write of ``{v}`` to the 64-bit global word ``{p}``
    word_store: ClassVar[str] = ""
    #: the bits of float ``{v}`` as a 32-bit unsigned int, and back
    float_bits: ClassVar[str] = ""
    bits_float: ClassVar[str] = ""
    #: mask of the subgroup's work-items whose predicate ``{p}`` holds ("": emulated in local memory)
    ballot: ClassVar[str] = ""
    #: read of ``{v}`` from the work-item ``{d}`` lanes above in the subgroup ("": emulated)
    shuffle_down: ClassVar[str] = ""
    #: 1-based index of the lowest set bit of ``{v}`` (0 when none)
    find_first_set: ClassVar[str] = ""

    MATH = ("exp", "log", "log1p", "expm1", "sqrt", "tanh", "sin", "cos", "pow")

    def ctype(self, dtype: str) -> str:
        """C scalar type of a dtype."""
        return CTYPES[dtype]

    def literal(self, value: float, dtype: str) -> str:
        """A constant in ``dtype``, exact for every representable value."""
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "(-INFINITY)"
        text = repr(float(value))
        return f"{text}f" if dtype == "float32" else text

    def math_fn(self, name: str, dtype: str) -> str:
        """The C name of a math function for ``dtype``."""
        if name == "abs":
            return "fabsf" if dtype == "float32" and self.f32_suffix_math else "fabs"
        if name in ("max", "min"):
            base = "f" + name
            return base + "f" if dtype == "float32" and self.f32_suffix_math else base
        if name in ("sigmoid", "softplus", "silu"):
            return f"sw_{name}"
        return name + "f" if dtype == "float32" and self.f32_suffix_math else name

    def expr(self, e: Expr, load: Callable[[str], str], dtype: str) -> str:
        """C text of an h-free expression; ``load(name)`` reads an operand at the current element."""
        if e.op == "input":
            return load(e.name)
        if e.op == "const":
            return self.literal(e.value, dtype)
        if e.op == "neg":
            return f"(-{self.expr(e.args[0], load, dtype)})"
        if e.op in BINARY:
            lhs, rhs = (self.expr(a, load, dtype) for a in e.args)
            return f"({lhs} {BINARY[e.op]} {rhs})"
        if e.op == "call" and e.name == "sign":
            # Inline (no helper, so kernels without it are unchanged); the argument is pure, so
            # the compiler evaluates it once.
            v, T = self.expr(e.args[0], load, dtype), self.ctype(dtype)
            return f"(({T})({v} > 0) - ({T})({v} < 0))"
        if e.op == "call" and e.name in COMPARISONS:
            lhs, rhs = (self.expr(a, load, dtype) for a in e.args)
            return f"(({self.ctype(dtype)})({lhs} {COMPARISONS[e.name][1]} {rhs}))"
        if e.op == "call" and e.name == "where":
            c, a, b = (self.expr(x, load, dtype) for x in e.args)
            return f"(({c}) != 0 ? ({a}) : ({b}))"
        if e.op == "call":
            args = ", ".join(self.expr(a, load, dtype) for a in e.args)
            return f"{self.math_fn(e.name, dtype)}({args})"
        raise ValueError(f"{self.target} renderer: cannot render op {e.op!r} (state in an operand expression)")

    def helpers(self, dtype: str) -> str:
        """Definitions of the composite functions (sigmoid, softplus, silu) and of ``sw_carry`` for ``dtype``.

        ``sw_carry(a, u, h)`` is the state ``a*h + u`` after an aggregate pair (a, u) of many steps entered with
        the carry ``h``, the one place every chained scan applies a carry: a zero carry gives ``u`` even where
        the product ``a`` has overflowed (growing transitions), since ``inf * 0`` would be NaN and spread to
        every later output.
        """
        T = self.ctype(dtype)
        zero, one, thr = self.literal(0.0, dtype), self.literal(1.0, dtype), self.literal(20.0, dtype)
        ex, l1p = self.math_fn("exp", dtype), self.math_fn("log1p", dtype)
        fp = self.function_prefix
        return "\n".join([
            f"{fp}{T} sw_sigmoid({T} v) {{ return {one} / ({one} + {ex}(-v)); }}",
            f"{fp}{T} sw_softplus({T} v) {{ return v > {thr} ? v : {l1p}({ex}(v)); }}",
            f"{fp}{T} sw_silu({T} v) {{ return v * sw_sigmoid(v); }}",
            "/* a*h + u, a zero carry h giving u even where the product a has overflowed (inf * 0 is NaN) */",
            f"{fp}{T} sw_carry({T} a, {T} u, {T} h) {{ return h == {zero} ? u : a * h + u; }}",
        ])

    def feature_defines(self, stages: Stages) -> str:
        """``#define`` lines for the call-site features and the schedule's tunables."""
        f = stages.affine.features
        lines = [
            f"#define SW_T {self.ctype(stages.affine.dtype)}",
            f"#define SW_REVERSE {int(f.reverse)}",
            f"#define SW_HAS_H0 {int(f.has_h0)}",
            f"#define SW_HAS_RESET {int(f.has_reset)}",
            f"#define SW_RETURN_STATE {int(f.return_state)}",
        ]
        if stages.schedule is not None:
            for name, value in stages.schedule.params:
                if isinstance(value, int):
                    lines.append(f"#define SW_{name.upper()} {value}")
        return "\n".join(lines)

    def params(self, stages: Stages) -> list[str]:
        """The kernel parameter declarations, in ABI order."""
        T = self.ctype(stages.affine.dtype)
        g = self.global_prefix
        ps = [f"{g}const {T}* restrict in_{n}" for n in stages.affine.inputs]
        ps += [
            f"{g}{T}* restrict y",
            f"{g}const {T}* restrict h0",
            f"{g}{T}* restrict hlast",
            f"{g}const {self.byte_type}* restrict reset",
            f"const {self.index_type} nlanes",
            f"const {self.index_type} L",
        ]
        return ps

    def operand(self, stages: Stages, name: str, idx: str) -> str:
        """C text reading operand ``name`` at flat index ``idx``, as its layout lays it out in memory:
        one value (``scalar``), one per lane (``lane``: index ``idx / L``) or one per element."""
        layout = stages.affine.features.layout(name)
        if layout == "scalar":
            return f"in_{name}[0]"
        if layout == "lane":
            return f"in_{name}[({idx}) / {self.length_expr}]"
        return f"in_{name}[{idx}]"

    def element(self, stages: Stages, idx: str, dtype: str) -> tuple[str, str]:
        """C text of (A_t, U_t) for the element at flat index ``idx``, resets applied."""
        aff = stages.affine
        load = lambda n: self.operand(stages, n, idx)  # noqa: E731
        A = self.expr(aff.A, load, dtype)
        if aff.features.has_reset:
            A = f"(reset[{idx}] ? {self.literal(0.0, dtype)} : {A})"
        return A, self.expr(aff.U, load, dtype)

    def projection(self, stages: Stages, idx: str, states: list[tuple[Expr, str]], dtype: str) -> str:
        """C text of ``sum coefficient * state + const`` at flat index ``idx``, zero terms left out.

        ``states`` pairs each output coefficient with the C text of the state it scales.
        """
        load = lambda n: self.operand(stages, n, idx)  # noqa: E731
        terms = [f"{self.expr(coef, load, dtype)} * {state}" for coef, state in states if not is_const(coef, 0.0)]
        const = stages.affine.output.const
        if not is_const(const, 0.0):
            terms.append(self.expr(const, load, dtype))
        return " + ".join(terms) if terms else self.literal(0.0, dtype)

    def output(self, stages: Stages, idx: str, h: str, hprev: str, dtype: str) -> str:
        """C text of y_t from h_t and h_{t-1} at flat index ``idx``."""
        out = stages.affine.output
        if out.is_identity:
            return h
        return self.projection(stages, idx, [(out.new, h), (out.old, hprev)], dtype)

    def uses_prev_state(self, stages: Stages) -> bool:
        """True when y_t reads h_{t-1}, so kernels must keep it."""
        return not is_const(stages.affine.output.old, 0.0)

    def guarded_tunable_defines(self, stages: Stages) -> str:
        """Tunables as ``#ifndef``-guarded defines of their bare names, mapped to ``SW_<NAME>``.

        Kernel Tuner prepends ``#define <name> <value>`` for each tunable it
        searches; the guard lets those values win over the lowered ones.
        """
        lines = []
        if stages.schedule is not None:
            for name, value in stages.schedule.params:
                if isinstance(value, int) and not isinstance(value, bool):
                    lines += [f"#ifndef {name}", f"#define {name} {value}", "#endif",
                              f"#define SW_{name.upper()} ({name})"]
        return "\n".join(lines)


class DenseMixin:
    """Rendering of dense k x k transitions (``kind=dense``) for C-family targets.

    States are arrays ``h[K]``; ``A`` is filled row-major (``A[r*K + c]``).
    """

    def dense_element(self, stages: Stages, idx: str, dtype: str) -> list[str]:
        """C statements filling ``A[K*K]`` and ``U[K]`` for the element at flat index ``idx``."""
        aff = stages.affine
        load = lambda n: self.operand(stages, n, idx)  # noqa: E731
        lines = [f"A[{j}] = {self.expr(e, load, dtype)};" for j, e in enumerate(aff.A)]
        lines += [f"U[{j}] = {self.expr(e, load, dtype)};" for j, e in enumerate(aff.U)]
        if aff.features.has_reset:
            zero = self.literal(0.0, dtype)
            lines.append(f"if (reset[{idx}]) {{ for (int q = 0; q < {len(aff.A)}; ++q) A[q] = {zero}; }}")
        return lines

    def dense_output(self, stages: Stages, idx: str, h: str, hp: str, dtype: str) -> str:
        """C expression of y_t = sum_j new_j h_t[j] + old_j h_{t-1}[j] + const."""
        out = stages.affine.output
        states = [pair for j, (new, old) in enumerate(zip(out.new, out.old, strict=True))
                  for pair in ((new, f"{h}[{j}]"), (old, f"{hp}[{j}]"))]
        return self.projection(stages, idx, states, dtype)
