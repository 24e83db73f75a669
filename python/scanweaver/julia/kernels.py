"""ScanWeaver.jl kernels as Kernel Tuner problems (``lang="julia"``).

Kernel Tuner's Julia backend evaluates ``kernel_source`` inside a fresh module
(after ``using CUDA`` / ``AMDGPU`` / ``oneAPI`` / ``Metal`` for the device named
in ``compiler_options``), looks up ``kernel_name`` in it, builds
``kernel(backend, workgroupsize)`` from the ``block_size_names`` tunable and
launches ``kernel(args..., Val(p1), Val(p2), ...; ndrange)``, with one ``Val``
per tunable in the order of the ``tune_params`` dict.  ScanWeaver.jl's entry
point for each schedule is a launcher shaped like that
(``ScanWeaver.ScheduleLauncher``): it takes the arrays of :data:`KERNEL_ARGS`,
then one ``Val`` per tunable in the order of the schedule type's fields
(``Hybrid(workgroupsize, items_per_thread)``), bundles the arrays in one
``ScanOperands`` and launches the schedule's ``@kernel`` functions, which
receive the tunables as ``Val`` parameters again (compile-time constants).
:func:`kernel_tuner_problem` gives everything ``tune_kernel`` needs and
:func:`kernel_tuner_arguments` the argument list in the right layout.

The source imports the entry point from the installed package instead of
copying it, so what is tuned is exactly what ``selective_scan`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ScanInputError
from ..registry import Registry
from .devices import DEVICES

#: Arguments every schedule's entry point takes, before its ``Val`` tunables.
KERNEL_ARGS = ("y", "h_last", "a", "b", "x", "c", "h0", "reset", "reversed")

#: Julia's spelling of each Python tunable (KernelAbstractions says ``workgroupsize``); the Julia
#: schedule types' fields and ``Val`` parameters, and ``selective_scan``'s keywords, use these.
JULIA_KEYWORDS = {"workgroup_size": "workgroupsize", "items_per_thread": "items_per_thread", "chunk": "chunk"}


@dataclass(frozen=True)
class KernelSignature:
    """One ``@kernel function`` of ScanWeaver.jl: name, arguments, ``Val`` tunables (Julia names) in order."""

    name: str
    args: tuple[str, ...]
    vals: tuple[str, ...]


@dataclass(frozen=True)
class JuliaSchedule:
    """A ScanWeaver.jl schedule as Kernel Tuner sees it.

    Attributes:
        name: the Julia schedule (``:sequential`` ...), a key of ``ScanWeaver.SCHEDULES``.
        julia_type: its ``ScanSchedule`` type (``Hybrid``); the type's fields are the tunables.
        entry: what Kernel Tuner launches: the schedule's launcher (``hybrid_scan!``).
        tunables: the ``Val`` tunables in order, spelled as Python search spaces spell them
            (the ``tune_params`` key order; :data:`JULIA_KEYWORDS` gives the Julia names).
        kernels: the ``@kernel`` functions it runs.
        lane_per_workgroup: one workgroup per lane (ndrange = lanes * workgroup_size)
            rather than one work-item per lane or chunk.
    """

    name: str
    julia_type: str
    entry: str
    tunables: tuple[str, ...]
    kernels: tuple[KernelSignature, ...]
    lane_per_workgroup: bool

    @property
    def julia_tunables(self) -> tuple[str, ...]:
        """The tunables as the Julia type's fields and the kernels' ``Val`` parameters name them."""
        return tuple(JULIA_KEYWORDS[t] for t in self.tunables)


#: Arguments of the single-kernel schedules' ``@kernel`` functions (before their ``Val`` tunables).
SCAN_KERNEL_ARGS = ("y", "h_last", "ops", "reversed")


def _single(name: str, julia_type: str, tunables: tuple[str, ...], per_group: bool) -> JuliaSchedule:
    vals = tuple(JULIA_KEYWORDS[t] for t in tunables)
    kernel = KernelSignature(f"{name}_scan_kernel!", SCAN_KERNEL_ARGS, vals)
    return JuliaSchedule(name, julia_type, f"{name}_scan!", tunables, (kernel,), per_group)


_RTS = ("workgroupsize", "chunk")

#: Julia schedule name -> its type, entry point, tunables and kernels (mirrors ``SCHEDULES`` in
#: src/registry.jl; ``test/test_julia_facade.py`` checks both against the source).
SCHEDULES: Registry[JuliaSchedule] = Registry("Julia schedule")
for _schedule in (
    _single("sequential", "Sequential", ("workgroup_size",), False),
    _single("blelloch", "Blelloch", ("workgroup_size",), True),
    _single("hybrid", "Hybrid", ("workgroup_size", "items_per_thread"), True),
    JuliaSchedule(
        "reduce_then_scan", "ReduceThenScan", "reduce_then_scan!", ("workgroup_size", "chunk"),
        (
            KernelSignature("chunk_reduce_kernel!", ("agg", "ops", "reversed"), _RTS),
            KernelSignature("carry_scan_kernel!", ("carry", "h_last", "agg", "ops"), _RTS),
            KernelSignature("chunk_propagate_kernel!", ("y", "ops", "carry", "reversed"), _RTS),
        ),
        True,
    ),
):
    SCHEDULES.add(_schedule.name, _schedule)

#: Arguments of the fused Mamba-1 entry point ``mamba_scan!`` (Julia layouts), before its ``Val`` tunables.
MAMBA_ARGS = ("y", "h_last", "u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0", "reset", "delta_softplus")

_MAMBA_VALS = ("nstate", "workgroupsize", "chunk")

#: ScanWeaver.jl's fused Mamba-1 scan: ``MambaChunks(workgroupsize, chunk)`` launched by ``mamba_scan!``;
#: its kernels take the state count ``N`` as a ``Val`` too (registers), before the tunables.
MAMBA = JuliaSchedule(
    "mamba1", "MambaChunks", "mamba_scan!", ("workgroup_size", "chunk"),
    (
        KernelSignature("mamba_replay_kernel!", ("y", "h_last", "ops", "carry"), _MAMBA_VALS),
        KernelSignature("mamba_reduce_kernel!", ("agg", "ops"), _MAMBA_VALS),
        KernelSignature("mamba_carry_kernel!", ("carry", "h_last", "agg", "ops"), _MAMBA_VALS),
    ),
    False,
)


#: ScanWeaver.jl's matrix-state kernels (``src/matrix/``: ``matrix_state_scan``, ``matrix_state_backward``,
#: ``delta_rule_scan``); not yet a Kernel Tuner problem.
_MATRIX_FLAGS = ("decay", "bonus", "reversed", "workgroupsize")
MATRIX_STATE_KERNELS = (
    KernelSignature("matrix_state_kernel!", ("o", "hlast", "q", "k", "v", "g", "u", "h0", "cu_seqlens"),
                    ("nk", *_MATRIX_FLAGS)),
    KernelSignature("matrix_values_kernel!", ("dv", "dh0", "q", "k", "g", "u", "dout", "dhlast", "cu_seqlens",
                                              "nseq"), ("nk", *_MATRIX_FLAGS)),
    KernelSignature("matrix_keys_kernel!", ("dq", "dk", "rows", "du_rows", "q", "k", "v", "g", "u", "h0", "dout",
                                            "dhlast", "cu_seqlens", "nseq"), ("nv", *_MATRIX_FLAGS)),
    KernelSignature("delta_rule_kernel!", ("o", "hlast", "q", "k", "v", "g", "beta", "a", "b", "h0", "cu_seqlens"),
                    ("nk", "gate", "form", "l2norm", "workgroupsize")),
)


#: ScanWeaver.jl's chunked matrix-state kernels (``src/matrix/chunked.jl``, ``chunked_backward.jl``): run through
#: ``matrix_state_scan!`` / ``matrix_state_backward!`` with ``algorithm = :chunked``; not Kernel Tuner problems.
MATRIX_CHUNKED_KERNELS = (
    KernelSignature("matrix_chunk_carry_kernel!", ("S0", "hlast", "E", "D", "h0", "firsts"), ("decay", "backward")),
    KernelSignature("matrix_chunk_dA_kernel!", ("dAw", "dout", "v", "chunks", "slot"), ("reversed",)),
    KernelSignature("matrix_chunk_dg_kernel!", ("dg", "qa", "kb", "g", "hl", "dhlast", "chunks", "firsts"),
                                               ("S", "decay", "bonus", "reversed")),
    KernelSignature("matrix_chunk_dk_kernel!", ("dkh", "kb", "q", "k", "u", "v", "dS", "dAw", "G", "seg", "chunks",
                                                "slot"), ("decay", "bonus", "reversed")),
    KernelSignature("matrix_chunk_dq_kernel!", ("dqh", "qa", "q", "k", "u", "S0", "dAw", "dout", "G", "seg", "chunks",
                                                "slot"), ("decay", "bonus", "reversed")),
    KernelSignature("matrix_chunk_du_kernel!", ("du", "q", "k", "dAw", "slot"), ()),
    KernelSignature("matrix_chunk_dv_kernel!", ("dv", "kd", "dS", "Aw", "dout", "chunks", "slot"), ("reversed",)),
    KernelSignature("matrix_chunk_group_kernel!", ("dq", "dk", "dqh", "dkh"), ()),
    KernelSignature("matrix_chunk_intra_kernel!", ("Aw", "q", "k", "u", "G", "seg", "chunks", "slot"),
                                                  ("decay", "bonus", "reversed")),
    KernelSignature("matrix_chunk_output_kernel!", ("o", "qd", "S0", "Aw", "v", "chunks", "slot"), ("reversed",)),
    KernelSignature("matrix_chunk_prefix_kernel!", ("G", "seg", "D", "g", "chunks"), ("S", "decay", "reversed")),
    KernelSignature("matrix_chunk_scale_kernel!", ("qd", "kd", "q", "k", "G", "seg", "chunks", "slot"),
                                                  ("decay", "bonus", "reversed")),
    KernelSignature("matrix_chunk_state_kernel!", ("E", "kd", "v", "chunks"), ("reversed",)),
)


#: ScanWeaver.jl's chunked (WY) delta-rule kernels (``src/matrix/delta_chunked.jl``, beside the matrix chunked
#: form's prefix, scale and intra kernels, and the backward's adjoint carry, ``src/matrix/delta_chunked_backward.jl``):
#: run through ``delta_rule_scan!`` and ``delta_rule_backward!`` with ``algorithm = :chunked``; not Kernel Tuner
#: problems.
DELTA_CHUNKED_KERNELS = (
    KernelSignature("delta_chunk_adjoint_kernel!", ("Lc", "dout", "dhlast", "W", "kd", "Y", "bd", "D", "grow", "q",
                                                    "k", "g", "beta", "a", "bb", "chunks", "firsts"),
                    ("nk", "gate", "form", "l2norm")),
    KernelSignature("delta_chunk_readout_kernel!", ("Y", "qd", "W", "Aw", "Bq", "grow", "chunks", "slot"), ("form",)),
    KernelSignature("delta_chunk_carry_kernel!", ("S0", "U", "o", "hlast", "W", "Uv", "kd", "D", "grow", "h0", "q",
                                                  "k", "v", "g", "beta", "a", "bb", "bd", "chunks", "firsts"),
                    ("nk", "gate", "form", "l2norm")),
    KernelSignature("delta_chunk_grow_kernel!", ("grow", "g", "chunks"), ("decay",)),
    KernelSignature("delta_chunk_norm_kernel!", ("qn", "kn", "q", "k"), ()),
    KernelSignature("delta_chunk_output_kernel!", ("o", "qd", "S0", "Aw", "U", "grow", "chunks", "slot", "Bq", "v"),
                    ("form",)),
    KernelSignature("delta_chunk_solve_kernel!", ("W", "Uv", "N", "kg", "v", "beta", "grow", "chunks", "M"),
                    ("form",)),
)


#: ScanWeaver.jl's fused Mamba-1 backward (``src/mamba/backward.jl``); not yet a Kernel Tuner problem.
MAMBA_BACKWARD_KERNELS = (
    KernelSignature("mamba_backward_kernel!", ("grads", "ckpt", "hs", "ops", "dout", "dhlast"), _MAMBA_VALS),
)


def all_kernels() -> dict[str, KernelSignature]:
    """Every ``@kernel`` of ScanWeaver.jl by name: the schedules', the fused Mamba scan's (forward and
    backward), the matrix-state kernels' (recurrent and chunked) and the delta rule's chunked ones."""
    kernels = {k.name: k for s in (*SCHEDULES.values(), MAMBA) for k in s.kernels}
    fused = (*MAMBA_BACKWARD_KERNELS, *MATRIX_STATE_KERNELS, *MATRIX_CHUNKED_KERNELS, *DELTA_CHUNKED_KERNELS)
    return {**kernels, **{k.name: k for k in fused}}


DTYPES = {"float32": np.float32, "float64": np.float64, "complex64": np.complex64, "complex128": np.complex128}


def _lookup(schedule: str, dtype: str, device: str) -> tuple[JuliaSchedule, object]:
    if schedule not in SCHEDULES:
        raise ScanInputError(f"kernel_tuner_problem: unknown Julia schedule {schedule!r}; "
                             f"known: {', '.join(SCHEDULES)}")
    if device not in DEVICES:
        raise ScanInputError(f"kernel_tuner_problem: unknown device {device!r}; known: {', '.join(DEVICES)}")
    if dtype not in DEVICES[device].dtypes:
        raise ScanInputError(f"kernel_tuner_problem: device {device!r} runs {', '.join(DEVICES[device].dtypes)}, "
                             f"not {dtype}")
    return SCHEDULES[schedule], DEVICES[device]


def kernel_source(schedule: str) -> str:
    """The Julia source Kernel Tuner compiles for ``schedule``: it binds the kernel from ScanWeaver.jl."""
    entry = SCHEDULES[schedule].entry
    return f"using KernelAbstractions\nusing ScanWeaver: {entry}\n"


def kernel_tuner_problem(schedule: str, dtype: str = "float32", device: str = "cuda", lanes: int = 1) -> dict:
    """Everything ``kernel_tuner.tune_kernel(..., lang="julia")`` needs for one schedule.

    Args:
        schedule: a Julia schedule: ``sequential``, ``blelloch``, ``hybrid`` or ``reduce_then_scan``.
        dtype: ``float32``, ``float64``, ``complex64`` or ``complex128`` (checked against the device).
        device: ``cuda``, ``amdgpu``, ``oneapi``, ``metal`` or ``cpu``.
        lanes: number of lanes of the problem (sets ``problem_size``).

    Returns:
        A dict with ``kernel_name``, ``kernel_source``, ``arg_names`` (order of
        :func:`kernel_tuner_arguments`), ``tunable_order`` (build ``tune_params``
        with these keys in this order: they become the ``Val`` arguments),
        ``compiler_options`` (Kernel Tuner's name for the device),
        ``block_size_names``, ``problem_size``, ``grid_div_x``, ``lang`` and
        ``dtype``; pass all but the last four names straight to ``tune_kernel``.

    Example:
        >>> from scanweaver.julia.kernels import kernel_tuner_problem
        >>> p = kernel_tuner_problem("hybrid", "float32", "cuda", lanes=64)
        >>> p["kernel_name"], p["tunable_order"], p["compiler_options"]
        ('hybrid_scan!', ('workgroup_size', 'items_per_thread'), ['cuda'])
    """
    sched, dev = _lookup(schedule, dtype, device)
    return {
        "kernel_name": sched.entry,
        "kernel_source": kernel_source(schedule),
        "arg_names": KERNEL_ARGS,
        "tunable_order": sched.tunables,
        "compiler_options": [dev.kernel_tuner],
        "block_size_names": ["workgroup_size"],
        "problem_size": (int(lanes),),
        "grid_div_x": [] if sched.lane_per_workgroup else ["workgroup_size"],
        "lang": "julia",
        "dtype": dtype,
    }


def kernel_tuner_arguments(a, b, x, c=None, h0=None, reset=None, reverse: bool = False,
                           dtype: str = "float32") -> list:
    """The argument list (order :data:`KERNEL_ARGS`) for Kernel Tuner from ``(lanes, L)`` operands.

    Kernel Tuner copies each NumPy array into a Julia array of the same shape,
    so the ``(lanes, L)`` operands are passed transposed, as ``(L, lanes)``
    views (no copy: the memory of a C-order ``(lanes, L)`` array is Julia's
    column-major ``(L, lanes)``).  Absent optional operands are filled so every
    configuration runs the same kernel: ``c`` ones, ``h0`` zeros, ``reset`` zeros.

    Example:
        >>> import numpy as np
        >>> from scanweaver.julia.kernels import kernel_tuner_arguments
        >>> args = kernel_tuner_arguments(*(np.ones((4, 100)),) * 3)
        >>> args[0].shape, args[1].shape, args[-1]
        ((100, 4), (4,), False)
    """
    t = DTYPES[dtype]
    a = np.ascontiguousarray(a, dtype=t)
    if a.ndim != 2:
        raise ScanInputError(f"kernel_tuner_arguments: a has shape {a.shape}; it needs (lanes, L)")
    lanes, L = a.shape

    def operand(name, value, fill):
        if value is None:
            return np.full((L, lanes), fill, dtype=t, order="F")
        arr = np.ascontiguousarray(value, dtype=t)
        if arr.shape != (lanes, L):
            raise ScanInputError(f"kernel_tuner_arguments: {name} has shape {arr.shape}; it needs {(lanes, L)}")
        return arr.T

    mask = np.zeros((L, lanes), np.uint8, order="F") if reset is None else \
        np.ascontiguousarray(np.asarray(reset) != 0, dtype=np.uint8).T
    state = np.zeros(lanes, t) if h0 is None else np.ascontiguousarray(h0, dtype=t).reshape(lanes)
    return [np.zeros((L, lanes), t, order="F"), np.zeros(lanes, t), a.T, operand("b", b, 0),
            operand("x", x, 1), operand("c", c, 1), state, mask, bool(reverse)]


def mamba_kernel_tuner_arguments(shape: tuple[int, int, int, int], inputs: dict, dtype: str = "float32",
                                 softplus: bool = True) -> list:
    """The fused Mamba-1 launcher's arguments (order :data:`MAMBA_ARGS`) in Julia layouts, for Kernel Tuner.

    ``inputs`` holds the forward ABI's C-order arrays (``u``, ``delta``, ``z`` ``(batch, D, L)``, ``A``
    ``(D, N)``, ``B``/``C`` ``(batch, G, N, L)``, ``D``, ``delta_bias`` ``(D,)``); each is passed as its
    transpose, which is the Julia array of the same memory.  Kernel Tuner cannot pass ``nothing``, so an
    absent ``h0`` is zeros, an absent ``reset`` no flags, and absent ``D``, ``z`` or ``delta_bias`` a
    :class:`~scanweaver.errors.ScanInputError`.

    Example:
        >>> import numpy as np
        >>> from scanweaver.julia.kernels import mamba_kernel_tuner_arguments
        >>> ins = {k: np.ones(s, np.float32) for k, s in {"u": (1, 2, 5), "delta": (1, 2, 5), "A": (2, 3),
        ...     "B": (1, 1, 3, 5), "C": (1, 1, 3, 5), "D": (2,), "z": (1, 2, 5), "delta_bias": (2,)}.items()}
        >>> [a.shape for a in mamba_kernel_tuner_arguments((1, 2, 3, 5), ins)[:4]]
        [(5, 2, 1), (3, 2, 1), (5, 2, 1), (5, 2, 1)]
    """
    batch, dim, N, L = shape
    t = DTYPES[dtype]
    missing = [n for n in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias") if n not in inputs]
    if missing:
        raise ScanInputError(f"mamba_kernel_tuner_arguments: inputs lack {', '.join(missing)}")

    def julia(name):
        return np.ascontiguousarray(inputs[name], dtype=t).T

    return [np.zeros((L, dim, batch), t, order="F"), np.zeros((N, dim, batch), t, order="F"), julia("u"),
            julia("delta"), julia("A"), julia("B"), julia("C"), julia("D"), julia("z"), julia("delta_bias"),
            np.zeros((N, dim, batch), t, order="F"), np.zeros(L, np.uint8), bool(softplus)]


def render_call(schedule: str, config: dict[str, int]) -> str:
    """The Julia call that launches ``schedule`` with ``config`` (the ``kernel`` stage text)."""
    sched = SCHEDULES[schedule]
    vals = ", ".join(f"Val({config[t]})" for t in sched.tunables)
    fields = ", ".join(str(config[t]) for t in sched.tunables)
    wg = config["workgroup_size"]
    return (f"# ScanWeaver.jl schedule {sched.julia_type}({fields}); arrays are (L, lanes) column-major\n"
            f"# kernels: {', '.join(k.name for k in sched.kernels)}\n"
            f"using ScanWeaver: {sched.entry}\n"
            f"{sched.entry}(backend, {wg})({', '.join(KERNEL_ARGS)}, {vals})\n")
